// The plan document: every variant's per-rank plan over a grid of (seq, sp), as JSON.
#include <algorithm>
#include <limits>

#include "laga/attention_provider.hpp"
#include "laga/errors.hpp"
#include "laga/report.hpp"

namespace laga {

std::vector<PlanPoint> plan_points(const PlanQuery& q) {
  LAGA_REQUIRE(q.layers >= 1, "layers = ", q.layers, ": must be >= 1");
  LAGA_REQUIRE(q.batch >= 1, "batch = ", q.batch, ": must be >= 1");
  for (auto P : q.sps)  // ranks are ints: a larger count must not wrap to another one
    LAGA_REQUIRE(P >= 1 && P <= std::numeric_limits<int>::max(), "sp = ", P, ": must be in [1, ",
                 std::numeric_limits<int>::max(), "]");
  validate(q.model);
  for (auto S : q.seqs)
    for (auto P : q.sps)
      for (const Variant& v : variants_for(q.base.layout))
        validate(q.cfg, with_variant(q.base, v), BlockShape{.batch = q.batch, .seq = S, .ranks = int(P), .rank = 0});
  std::vector<PlanPoint> points;
  for (auto S : q.seqs)
    for (auto P : q.sps) {
      // The busiest rank: under causal all_gather the last rank's queries see the most keys; memory and
      // traffic are the same on every rank.
      PlanPoint pt{.seq = S, .sp = P, .rank = int(P) - 1, .plans = {}};
      const BlockShape shape{.batch = q.batch, .seq = S, .ranks = int(P), .rank = pt.rank};
      for (const Variant& v : variants_for(q.base.layout)) pt.plans.push_back(plan_rank(q.cfg, with_variant(q.base, v), shape));
      points.push_back(std::move(pt));
    }
  return points;
}

namespace {
nlohmann::json traffic_json(const std::vector<CollectiveRecord>& records) {
  nlohmann::json traffic = nlohmann::json::array();
  for (const auto& c : records)
    traffic.push_back({{"phase", phase_name(c.phase)}, {"collective", collective_name(c.kind)}, {"tensor", c.tensor},
                       {"calls", c.calls}, {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received}});
  return traffic;
}

// The closed form of the collectives (DESIGN.md section 3): records and totals.
nlohmann::json closed_form_json(const RankPlan& p) {
  const std::vector<CollectiveRecord> records = expected_traffic(p.cfg, p.opts, p.shape);
  std::size_t sent = 0, received = 0;
  for (const auto& c : records) sent += c.bytes_sent, received += c.bytes_received;
  return {{"bytes_sent", sent}, {"bytes_received", received}, {"traffic", traffic_json(records)}};
}

// The plan's collectives priced by the model at each standard placement.
nlohmann::json modeled_json(const RankPlan& p, const TimeModel& model) {
  const int P = p.shape.ranks;
  nlohmann::json placements = nlohmann::json::array();
  for (const Placement& pl : standard_placements(model, P))
    placements.push_back({{"placement", pl.name}, {"ranks_per_node", pl.ranks_per_node},
                          {"nodes", (P + pl.ranks_per_node - 1) / pl.ranks_per_node},
                          {"collective_s", communication_seconds(model, p.traffic, P, pl.ranks_per_node)}});
  return {{"label", "modeled"},
          {"what", "the collectives of one block (forward + backward) priced by the alpha-beta model; no compute"},
          {"placements", placements}};
}

// The plan's traffic under the two other accountings of the latent (traffic_what_if).
nlohmann::json what_if_json(const TrafficWhatIf& w) {
  return {{"latent_grad_in_dtype_bytes_sent", w.latent_grad_in_dtype},
          {"latent_as_all_to_all_bytes_sent", w.latent_as_all_to_all}};
}

// Explicit's bytes sent over this plan's, as sent and under each accounting (this plan sends some).
nlohmann::json explicit_over_json(const RankPlan& p, const RankPlan& ex) {
  const TrafficWhatIf w = traffic_what_if(p), e = traffic_what_if(ex);
  return {{"bytes_sent", double(ex.bytes_sent()) / double(p.bytes_sent())},
          {"latent_grad_in_dtype_bytes_sent", double(e.latent_grad_in_dtype) / double(w.latent_grad_in_dtype)},
          {"latent_as_all_to_all_bytes_sent", e.latent_as_all_to_all / w.latent_as_all_to_all}};
}

nlohmann::json model_total_json(const ModelTotal& t) {
  return {{"num_hidden_layers", t.layers}, {"saved_bytes", t.saved_bytes}, {"bytes_sent", t.bytes_sent},
          {"bytes_received", t.bytes_received}, {"flops", t.flops}};
}

nlohmann::json link_json(const Link& l) {
  return {{"name", l.name}, {"bandwidth_bytes_per_s", l.bandwidth}, {"latency_s", l.latency}, {"source", l.source}};
}
}  // namespace

nlohmann::json time_model_json(const TimeModel& m) {
  return {{"label", "modeled"},
          {"description", "alpha-beta model: a collective's time = steps x latency + bytes sent "
                          "by the rank / bandwidth (ring all-gather/reduce-scatter and pairwise "
                          "all-to-all: P-1 steps; all-reduce 2(P-1)); across nodes ring collectives "
                          "go at InfiniBand's pace, all-to-all splits its bytes between NVLink "
                          "(peers on the node) and InfiniBand, concurrently. docs/bench.md"},
          {"node_size", m.node_size},
          {"intra", link_json(m.intra)},
          {"inter", link_json(m.inter)},
          {"placements", {{{"name", "node"}, {"ranks_per_node", "min(P, node_size)"}},
                          {{"name", "cross-node"}, {"ranks_per_node", 1}}}}};
}

nlohmann::json plan_to_json(const RankPlan& p, const DeviceFit& fit, const TimeModel& model, const RankPlan* ex) {
  nlohmann::json saved = nlohmann::json::array();
  for (const auto& t : p.saved)
    saved.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"bytes", t.bytes}});
  const nlohmann::json traffic = traffic_json(p.traffic);
  auto flops = [](const PassStats& s) {
    nlohmann::json j;
    for (int i = 0; i < kOpPhaseCount; ++i) j[op_phase_name(OpPhase(i))] = s.flops[i];
    return j;
  };
  nlohmann::json j = {
      {"saved_bytes", p.saved_bytes}, {"peak_forward_bytes", p.peak_forward}, {"peak_backward_bytes", p.peak_backward},
      {"bytes_sent", p.bytes_sent()}, {"bytes_received", p.bytes_received()}, {"saved", saved}, {"traffic", traffic},
      {"flops_forward", flops(p.fwd)}, {"flops_backward", flops(p.bwd)},
      {"device", {{"activation_peak_bytes", fit.activation_peak}, {"weights_and_grads_bytes", fit.weights_and_grads},
                  {"total_bytes", fit.total()}}},
      {"closed_form", closed_form_json(p)}, {"modeled", modeled_json(p, model)},
      {"traffic_what_if", what_if_json(traffic_what_if(p))}};
  if (ex && p.bytes_sent() > 0) j["explicit_over_this"] = explicit_over_json(p, *ex);
  if (const std::optional<ModelTotal> t = model_total(p)) j["model_total"] = model_total_json(*t);
  return j;
}

std::int64_t plan_cudnn_workspace(const PlanQuery& q, const PlanPoint& pt, bool deterministic) {
  if (q.base.kernel != AttentionKernel::Fused) return 0;
  const bool a2a = q.base.layout == Layout::A2A;
  const std::int64_t heads = a2a ? q.cfg.num_attention_heads / pt.sp : q.cfg.num_attention_heads;
  const AttentionShape s{.dtype = q.base.dtype, .d_qk = q.cfg.qk_head_dim(), .d_v = q.cfg.v_head_dim,
                         .q_heads = heads, .kv_heads = heads, .q_len = a2a ? pt.seq : pt.seq / pt.sp, .kv_len = pt.seq};
  const AttentionProviderTable& table = builtin_attention_provider_table();
  const AttentionTiming* near = table.nearest(s);
  if (!near || !(near->cudnn_fwd_ms > 0)) return 0;
  return table.cudnn_workspace(s, deterministic) * q.batch;
}

nlohmann::json plan_document(const PlanQuery& q, const std::vector<PlanPoint>& points) {
  nlohmann::json doc = {{"model", nlohmann::json::parse(config_to_json(q.cfg))},
                        {"layout", layout_name(q.base.layout)},
                        {"kernel", kernel_name(q.base.kernel)},
                        {"dtype", dtype_name(q.base.dtype)},
                        {"overlap", q.base.overlap},
                        {"batch", q.batch},
                        {"layers", q.layers},
                        {"time_model", time_model_json(q.model)},
                        {"points", nlohmann::json::array()}};
  if (q.gpu_mem_bytes > 0) doc["gpu_mem_bytes"] = q.gpu_mem_bytes;
  for (const PlanPoint& pt : points) {
    nlohmann::json point = {{"seq", pt.seq}, {"sp", pt.sp}, {"rank", pt.rank}, {"variants", nlohmann::json::object()}};
    const auto ex = std::find_if(pt.plans.begin(), pt.plans.end(), [](const RankPlan& p) { return p.opts.form == Form::Explicit; });
    const RankPlan* explicit_plan = ex == pt.plans.end() ? nullptr : &*ex;
    for (std::size_t i = 0; i < pt.plans.size(); ++i)
      point["variants"][variant_of(pt.plans[i].opts).label()] =
          plan_to_json(pt.plans[i], device_fit(pt.plans[i], q.layers), q.model, explicit_plan);
    if (const std::int64_t ws = plan_cudnn_workspace(q, pt); ws > 0) point["cudnn_workspace_bytes"] = ws;
    if (const std::int64_t ws = plan_cudnn_workspace(q, pt, false); ws > 0)
      point["cudnn_nondeterministic_workspace_bytes"] = ws;
    doc["points"].push_back(std::move(point));
  }
  return doc;
}

}  // namespace laga
