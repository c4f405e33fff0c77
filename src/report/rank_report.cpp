// The report of a rank's run, and the statistics of repeated runs: the JSON `laga run`, `laga bench` and the
// PyTorch module write (docs/bench.md).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/report.hpp"

namespace laga {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

json phases_json(const std::array<double, kOpPhaseCount>& v) {
  json j = json::object();
  for (int i = 0; i < kOpPhaseCount; ++i) j[op_phase_name(OpPhase(i))] = v[i];
  return j;
}

// Seconds rounded to the nanosecond (the clock's resolution), so the document stays short.
double ns(double seconds) { return std::round(seconds * 1e9) / 1e9; }

template <class F>
std::vector<double> each(const std::vector<TimedRepeat>& reps, F f) {
  std::vector<double> v;
  for (const TimedRepeat& r : reps) v.push_back(f(r));
  return v;
}

ojson pass_report(const std::vector<TimedRepeat>& reps, bool forward) {
  auto pick = [&](const TimedRepeat& r) -> const PassStats& { return forward ? r.fwd : r.bwd; };
  ojson by_phase = ojson::object();
  for (int ph = 0; ph < kOpPhaseCount; ++ph)
    by_phase[op_phase_name(OpPhase(ph))] =
        summary_report(summarize(each(reps, [&](const TimedRepeat& r) { return pick(r).seconds[ph]; })));
  // span: the pass from its first op's start to its last op's end, the gaps between ops included (what events
  // around the pass would see); total: the ops alone.
  return {{"total", summary_report(summarize(each(reps, [&](const TimedRepeat& r) { return pick(r).total_seconds(); })))},
          {"span", summary_report(summarize(each(reps, [&](const TimedRepeat& r) { return pick(r).span_seconds; })))},
          {"by_phase", by_phase}};
}

double block_of(const TimedRepeat& r) { return r.block_seconds(); }
double compute_of(const TimedRepeat& r) { return r.compute_seconds(); }

}  // namespace

std::size_t bytes_sent(const std::vector<CollectiveRecord>& traffic) {
  std::size_t b = 0;
  for (const auto& c : traffic) b += c.bytes_sent;
  return b;
}
std::size_t bytes_received(const std::vector<CollectiveRecord>& traffic) {
  std::size_t b = 0;
  for (const auto& c : traffic) b += c.bytes_received;
  return b;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

json cudnn_info_report(const CudnnInfo& c) {
  json j = {{"compiled", c.compiled}, {"loaded", c.loaded}};
  if (c.loaded) j["version"] = c.version;  // cudnnGetVersion() of the library that ran
  if (c.compiled) j["compiled_version"] = c.compiled_version;
  if (!c.error.empty()) j["error"] = c.error;
  return j;
}

json rank_report(const RankRun& run, int rank, const DeviceMemory& mem, int gpu) {
  json saved = json::array();
  for (const auto& t : run.saved)
    saved.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"bytes", t.bytes}});
  json traffic = json::array();
  for (const auto& c : run.traffic)
    traffic.push_back({{"phase", phase_name(c.phase)}, {"collective", collective_name(c.kind)}, {"tensor", c.tensor},
                       {"calls", c.calls}, {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received},
                       {"seconds", c.seconds},
                       {"bus_bytes_per_s", c.seconds > 0 ? double(c.bytes_sent) / c.seconds : 0.0}});
  json j = {{"rank", rank},
            {"hostname", host_name()},
            {"saved_bytes", run.saved_bytes},
            {"saved", saved},
            {"peak_forward_bytes", run.fwd.peak_bytes},
            {"peak_backward_bytes", run.bwd.peak_bytes},
            {"bytes_sent", bytes_sent(run.traffic)},
            {"bytes_received", bytes_received(run.traffic)},
            {"traffic", traffic},
            {"flops_forward", phases_json(run.fwd.flops)},
            {"flops_backward", phases_json(run.bwd.flops)},
            {"seconds_forward", phases_json(run.fwd.seconds)},
            {"seconds_backward", phases_json(run.bwd.seconds)},
            {"seconds_forward_total", run.fwd.total_seconds()},
            {"seconds_backward_total", run.bwd.total_seconds()},
            {"seconds_forward_span", run.fwd.span_seconds},
            {"seconds_backward_span", run.bwd.span_seconds}};
  if (mem.have) {
    j["gpu"] = gpu;
    j["device_used_before_bytes"] = mem.used_before;
    j["device_peak_used_bytes"] = mem.peak_used;
    j["backend_scratch_peak_bytes"] = mem.scratch_peak;
  }
  return j;
}

// ---------------------------------------------------------------- statistics of repeats

double TimedRepeat::compute_seconds() const {
  const int c = int(OpPhase::Communication);
  return block_seconds() - fwd.seconds[c] - bwd.seconds[c];
}

ojson summary_report(const Summary& s) {
  return {{"median", ns(s.median)}, {"q1", ns(s.q1)}, {"q3", ns(s.q3)}, {"min", ns(s.min)}, {"max", ns(s.max)},
          {"mean", ns(s.mean)}, {"n", s.n}};
}

ojson repeats_report(const std::vector<std::vector<TimedRepeat>>& by_rank, int rank, int warmup) {
  const std::vector<TimedRepeat>& reps = by_rank.size() == 1 ? by_rank[0] : by_rank.at(std::size_t(rank));
  ojson j = {{"what", "statistics over the timed repeats (warm-ups excluded) of rank `rank`: each pass's ops summed "
                      "(total), its span and its phases, the block (forward + backward: their ops, and their spans), "
                      "its compute and its communication phase"},
             {"unit", "s"},
             {"clock", "marks on the backend's queue around each op (CUDA events on the GPU, the host clock on the "
                       "CPU), read once per pass, summed by phase"},
             {"rank", rank},
             {"repeats", reps.size()},
             {"warmup", warmup},
             {"forward", pass_report(reps, true)},
             {"backward", pass_report(reps, false)},
             {"block", summary_report(summarize(each(reps, block_of)))},
             {"block_span", summary_report(summarize(each(reps, [](const TimedRepeat& r) {
                return r.block_span_seconds();
              })))},
             {"compute", summary_report(summarize(each(reps, compute_of)))},
             {"communication", summary_report(summarize(each(reps, [](const TimedRepeat& r) {
                return r.block_seconds() - r.compute_seconds();
              })))}};
  if (by_rank.size() > 1) {  // every rank measured: each rank's block, and the slowest rank of each repeat
    ojson blocks = ojson::array();
    for (const auto& rr : by_rank) blocks.push_back(summary_report(summarize(each(rr, block_of))));
    std::vector<double> slowest;
    for (std::size_t it = 0; it < reps.size(); ++it) {
      double s = 0;
      for (const auto& rr : by_rank) s = std::max(s, rr.at(it).block_seconds());
      slowest.push_back(s);
    }
    j["block_by_rank"] = blocks;
    j["block_slowest_rank"] = summary_report(summarize(slowest));
  }
  return j;
}

ojson modeled_report(const TimeModel& model, int ranks, const std::vector<CollectiveRecord>& traffic,
                     const std::vector<TimedRepeat>& reps) {
  const double compute_median = summarize(each(reps, compute_of)).median;
  ojson placements = ojson::array();
  for (const Placement& pl : standard_placements(model, ranks)) {
    const double c = communication_seconds(model, traffic, ranks, pl.ranks_per_node);
    placements.push_back({{"placement", pl.name}, {"ranks_per_node", pl.ranks_per_node},
                          {"nodes", (ranks + pl.ranks_per_node - 1) / pl.ranks_per_node},
                          {"collective_s", ns(c)}, {"block_s", ns(compute_median + c)}});
  }
  return {{"label", "modeled"},
          {"what", "block time = measured compute (median, this rank, communication phase excluded) + "
                   "collectives priced by the alpha-beta model; no overlap of compute and communication"},
          {"compute_s", ns(compute_median)},
          {"placements", placements}};
}

ojson exposed_report(const TimeModel& model, int ranks, const std::vector<CollectiveRecord>& traffic,
                     const std::vector<TimedRepeat>& instant, const std::vector<TimedPlacement>& timed) {
  const Summary base = summarize(each(instant, block_of));
  ojson links = ojson::array();
  for (const TimedPlacement& t : timed) {
    const Summary s = summarize(each(t.repeats, block_of));
    const double modeled = communication_seconds(model, traffic, ranks, t.placement.ranks_per_node);
    const double exposed = s.median - base.median;
    links.push_back({{"placement", t.placement.name}, {"ranks_per_node", t.placement.ranks_per_node},
                     {"modeled_collective_s", ns(modeled)}, {"timed_block", summary_report(s)},
                     {"exposed_s", ns(exposed)}, {"exposed_fraction", exposed / s.median},
                     {"hidden_fraction", modeled > 0 ? 1.0 - exposed / modeled : 0.0}});
  }
  return {{"what", "rank P-1 alone twice: collectives instant (the phantom) and timed (each call holds its queue for "
                   "the alpha-beta model's time of its bytes); exposed = median timed block - median instant block"},
          {"instant_block", summary_report(base)},
          {"links", links}};
}

ojson gemms_report(const std::vector<GemmProbeResult>& gemms, const std::vector<GemmRecord>& records, int repeats,
                   int warmup_alone) {
  ojson list = ojson::array();
  for (const GemmProbeResult& r : gemms) {
    LAGA_CHECK(r.occurrences.size() % std::size_t(repeats) == 0, "a GEMM occurs ", r.occurrences.size(),
               " times in ", repeats, " repeats: every repeat must issue the same GEMMs");
    const std::size_t calls = r.occurrences.size() / std::size_t(repeats);
    ojson issued = ojson::array();  // where in the first repeat: run_rank makes two passes, forward then backward
    for (std::size_t i = 0; i < calls; ++i) {
      const GemmRecord& rec = records[r.occurrences[i]];
      issued.push_back({{"pass", rec.pass % 2 == 0 ? "forward" : "backward"}, {"index", rec.index_in_pass}});
    }
    const GemmKey& g = r.key;
    list.push_back({{"m", g.m}, {"n", g.n}, {"k", g.k}, {"batch", g.batch}, {"trans_a", g.trans_a == Trans::Yes},
                    {"trans_b", g.trans_b == Trans::Yes}, {"dtype", dtype_name(g.dtype)},
                    {"c_dtype", dtype_name(g.c_dtype)}, {"lda", g.lda}, {"ldb", g.ldb}, {"ldc", g.ldc},
                    {"stride_a", g.stride_a}, {"stride_b", g.stride_b}, {"stride_c", g.stride_c},
                    {"alpha", g.alpha}, {"beta", g.beta}, {"calls", calls}, {"issued", issued},
                    {"flops", r.flops()}, {"in_block_s", r.in_block_median}, {"alone_s", r.alone_median},
                    {"in_block_flops_per_s", r.in_block_flops_per_s()}, {"alone_flops_per_s", r.alone_flops_per_s()},
                    {"ratio", r.ratio()}});
  }
  const GemmProbeSummary sum = summarize_gemms(gemms);
  ojson summary = {{"count", sum.count},
                   {"calls", sum.calls / std::size_t(repeats)},
                   {"in_block_s", sum.in_block_s / repeats},
                   {"alone_s", sum.alone_s / repeats},
                   {"time_weighted_ratio", sum.time_weighted_ratio},
                   {"worst_ratio", sum.worst_ratio},
                   {"worst", sum.worst},
                   {"within_10pct", sum.within(kGemmTolerance)}};
  return {{"what", "every GEMM the block issued in --repeat extra forward+backward runs after the timed ones "
                   "(through a probe backend: marks just before and after each call), against the same arguments "
                   "run alone on the same backend and buffers of the same sizes; medians; ratio = in block / alone"},
          {"repeats_in_block", repeats},
          {"repeats_alone", repeats},
          {"warmup_alone", warmup_alone},
          {"list", list},
          {"summary", summary}};
}

ojson ops_report(const std::vector<OpRecord>& records, int repeats) {
  const std::vector<OpProfileRow> rows = summarize_ops(records, repeats);
  ojson passes = {{"forward", ojson::array()}, {"backward", ojson::array()}};
  ojson by_op = {{"forward", ojson::object()}, {"backward", ojson::object()}};
  for (const OpProfileRow& r : rows) {
    const char* pass = r.backward ? "backward" : "forward";
    passes[pass].push_back({{"index", r.index}, {"op", r.op}, {"what", r.what}, {"seconds", r.median_s}});
    ojson& k = by_op[pass][r.op];
    if (k.is_null()) k = {{"calls", 0}, {"seconds", 0.0}};
    k["calls"] = k["calls"].get<int>() + 1;
    k["seconds"] = k["seconds"].get<double>() + r.median_s;
  }
  return {{"what", "every op the block issued in --repeat extra forward+backward runs after the timed ones (through a "
                   "profile backend: marks just before and after each call), median seconds per op in issue order, "
                   "and summed by kind of op"},
          {"repeats", repeats},
          {"forward", passes["forward"]},
          {"backward", passes["backward"]},
          {"by_op", by_op}};
}

bool bit_identical(const GlobalResult& a, const GlobalResult& b) {
  return a.y == b.y && a.dx == b.dx && a.grads == b.grads;
}

std::string bench_document_text(const ojson& doc) {
  ojson head = doc;
  head["points"] = ojson::array();
  std::string text = head.dump(1);
  std::string points = "[";
  for (std::size_t i = 0; i < doc["points"].size(); ++i) points += (i ? ",\n  " : "\n  ") + doc["points"][i].dump();
  points += doc["points"].empty() ? "]" : "\n ]";
  const std::string key = "\"points\": []";
  const auto at = text.find(key);
  LAGA_CHECK(at != std::string::npos, "points missing from the document");
  return text.replace(at, key.size(), "\"points\": " + points);
}

}  // namespace laga
