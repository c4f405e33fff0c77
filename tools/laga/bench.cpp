// `laga bench`: sweeps sequence length, P, micro-batch, form, layout and kernel on this machine (CPU ranks as
// threads, or one rank of P alone -- a phantom rank -- on the CPU or a GPU), repeats each point, and writes one
// JSON document (docs/bench.md) while printing a table as it goes. Collective time on links this machine does
// not have is priced by the alpha-beta model of include/laga/bench.hpp and labelled "modeled" everywhere.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>

#include "commands.hpp"
#include "format.hpp"
#include "provider.hpp"
#include "laga/bench.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/gemm_probe.hpp"
#include "laga/measure.hpp"
#include "laga/op_profile.hpp"
#include "laga/report.hpp"
#include "laga/timed_comm.hpp"

namespace laga::cli {
namespace {

using json = nlohmann::ordered_json;

struct BenchOptions {
  std::string model = "small";
  std::vector<std::string> seq{"256"}, sp{"1"}, batch{"1"};
  std::vector<std::string> form{"all"}, layout{"all"}, kernel{"all"};
  std::vector<std::string> sweep;
  std::string device = "cpu", dtype;  // dtype default: float32 on cpu, bfloat16 on cuda
  int gpu = 0;
  bool phantom = false;
  std::string phantom_comm = "instant";         // or "timed": also measure with timed collectives
  std::vector<std::string> phantom_link{"node"};  // placements the timed collectives are priced for
  int repeat = 5, warmup = 1;
  bool check = false;
  bool gemm_check = false;
  bool op_profile = false;
  bool kv_grad_reduce_fp32 = false;
  std::string grad_dtype;  // "": the accumulation dtype
  std::string attention_provider = "auto";
  bool nondeterministic = false;  // the attention backward may add its sums in any order
  bool overlap = false;
  std::uint64_t seed = 1;
  std::string out;
  TimeModelOptions time_model;
};

// ---------------------------------------------------------------- parsing the sweep

std::string join(const std::vector<std::string>& v, const char* sep = ",") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

// --sweep KEY=V1,V2 replaces the list of KEY.
void apply_sweeps(BenchOptions& o) {
  for (const std::string& item : o.sweep) {
    const auto eq = item.find('=');
    LAGA_REQUIRE(eq != std::string::npos && eq + 1 < item.size(), "sweep = '", item,
                 "': expected KEY=V1,V2,... with KEY one of seq, sp, batch, form, layout, kernel");
    const std::string key = item.substr(0, eq);
    const std::vector<std::string> values = split(item.substr(eq + 1), ',');
    if (key == "seq") o.seq = values;
    else if (key == "sp") o.sp = values;
    else if (key == "batch") o.batch = values;
    else if (key == "form") o.form = values;
    else if (key == "layout") o.layout = values;
    else if (key == "kernel") o.kernel = values;
    else LAGA_REQUIRE(false, "sweep key '", key, "': expected one of seq, sp, batch, form, layout, kernel");
  }
}

// ---------------------------------------------------------------- one point

struct Point {
  std::int64_t seq, batch;
  int sp;
  Layout layout;
  AttentionKernel kernel;
  std::size_t variant;  // into kAllVariants
};

// A point measured: its record's content, and with --check its gathered result.
struct Measured : BenchPoint {
  GlobalResult result;  // rank order, gathered
  bool have_result = false;
};

// Per-rank state kept across points: a backend, its weights (made once), and the current point's input.
struct RankState {
  std::unique_ptr<Backend> be;
  MlaWeights w;
  Tensor x, dy;
  BlockShape shape{};
  Layout layout = Layout::A2A;  // whose tokens x and dy hold
  ProblemInputs inputs() const { return {&w, &x, &dy}; }
};

struct Bench {
  BenchOptions o;
  MlaConfig cfg;
  DType dtype = DType::F32;
  Device device = Device::Cpu;
  TimeModel model;
  std::vector<RankState> ranks;  // threads: rank r; phantom or P = 1: element 0
  int default_blas_threads = 1;

  std::unique_ptr<Backend> new_backend() {
    if (device != Device::Cuda) return make_cpu_backend();
    auto be = make_cuda_backend(o.gpu);
    cuda_set_attention_provider(*be, parse_attention_provider(o.attention_provider));
    cuda_set_attention_deterministic(*be, !o.nondeterministic);
    return be;
  }

  RankState& state(std::size_t i) {
    while (ranks.size() <= i) {
      RankState s;
      s.be = new_backend();
      s.w = make_weights(cfg, dtype, *s.be, o.seed);
      ranks.push_back(std::move(s));
    }
    return ranks[i];
  }

  // Input shards of this shape on state i (kept while the shape does not change).
  void prepare(RankState& s, const BlockShape& shape, Layout layout) {
    if (s.x.defined() && s.shape.seq == shape.seq && s.shape.batch == shape.batch && s.shape.ranks == shape.ranks &&
        s.shape.rank == shape.rank && s.layout == layout)
      return;
    s.x = Tensor();
    s.dy = Tensor();
    s.x = make_shard(cfg, shape, dtype, *s.be, o.seed, DataStream::X, layout);
    s.dy = make_shard(cfg, shape, dtype, *s.be, o.seed, DataStream::Dy, layout);
    s.shape = shape;
    s.layout = layout;
  }

  BlockOptions options(const Point& p) const {
    return with_variant({.layout = p.layout, .kernel = p.kernel, .dtype = dtype, .kv_grad_reduce_fp32 = o.kv_grad_reduce_fp32,
                         .overlap = o.overlap,
                         .grad_dtype = o.grad_dtype.empty() ? std::nullopt : std::optional(parse_dtype(o.grad_dtype))},
                        kAllVariants[p.variant]);
  }

  bool timed() const { return o.phantom_comm == "timed"; }

  // The placements --phantom-link names, for P ranks.
  std::vector<Placement> timed_placements(int P) const {
    std::vector<Placement> out;
    for (const std::string& name : o.phantom_link)
      for (const Placement& pl : standard_placements(model, P))
        if (pl.name == name) out.push_back(pl);
    return out;
  }

  // The timed repeats of rank P-1 alone with each placement's timed phantom (after the same warm-ups).
  void measure_timed(const Point& p, Measured& m) {
    if (!timed() || p.sp == 1) return;
    RankState& s = state(0);
    const BlockShape shape{.batch = p.batch, .seq = p.seq, .ranks = p.sp, .rank = p.sp - 1};
    prepare(s, shape, p.layout);
    std::unique_ptr<CommClock> clock = device == Device::Cuda ? make_cuda_comm_clock(*s.be) : make_host_comm_clock();
    for (const Placement& pl : timed_placements(p.sp)) {
      auto comm = make_timed_phantom_communicator(*s.be, shape.rank, p.sp, TimedLinks{model, pl.ranks_per_node}, *clock);
      m.timed.push_back(
          {pl, measure_repeated(cfg, options(p), shape, *s.be, *comm, o.seed, o.warmup, o.repeat, s.inputs()).repeats});
    }
  }

  // A point's record before it is measured: where it sits in the sweep, and what the options add.
  Measured start(const Point& p) const {
    Measured m;
    m.seq = p.seq;
    m.batch = p.batch;
    m.sp = p.sp;
    m.opts = options(p);
    m.ranks_run = o.phantom && p.sp > 1 ? "phantom" : p.sp == 1 ? "single" : "threads";
    m.rank = p.sp - 1;
    m.gemm_check = o.gemm_check;
    m.op_profile = o.op_profile;
    return m;
  }

  // One rank alone: P = 1, or rank P-1 of P as a phantom.
  Measured measure_alone(const Point& p) {
    Measured m = start(p);
    const int rank = m.rank;
    RankState& s = state(0);
    const BlockShape shape{.batch = p.batch, .seq = p.seq, .ranks = p.sp, .rank = rank};
    prepare(s, shape, p.layout);
    auto comm = p.sp == 1 ? make_single_rank_communicator(*s.be) : make_phantom_communicator(*s.be, rank, p.sp);
    if (device == Device::Cpu) set_cpu_blas_threads(default_blas_threads);
    if (device == Device::Cuda) cuda_reset_attention_provider_counts(*s.be);
    RepeatedMeasurement rm = measure_repeated(cfg, options(p), shape, *s.be, *comm, o.seed, o.warmup, o.repeat, s.inputs());
    m.runs.push_back(std::move(rm.last.run));
    m.memory = rm.last.memory;
    m.repeats.push_back(std::move(rm.repeats));
    if (o.check && p.sp == 1) {
      m.result = gather_result(*s.be, *comm, m.runs[0]);
      m.have_result = true;
    }
    if (o.gemm_check) {
      GemmProbeBackend probe(*s.be);
      for (int it = 0; it < o.repeat; ++it) run_rank(cfg, options(p), shape, probe, *comm, o.seed, &s.w, &s.x, &s.dy);
      m.gemm_records = probe.records();
      gemms_alone(m, *s.be);
    }
    if (o.op_profile) {
      OpProfileBackend profile(*s.be);
      for (int it = 0; it < o.repeat; ++it) run_rank(cfg, options(p), shape, profile, *comm, o.seed, &s.w, &s.x, &s.dy);
      m.op_records = profile.records();
    }
    return m;
  }

  // --gemm-check: the GEMMs of the instrumented repeats again, each alone on the same backend (after at least
  // one warm-up, as the in-block ones are warm: they follow the timed repeats).
  void gemms_alone(Measured& m, Backend& be) {
    m.gemms = laga::time_gemms_alone(be, m.gemm_records, o.repeat, std::max(1, o.warmup));
  }

  // One rank of a thread group: the warm-ups and timed repeats (each after a barrier, so the ranks start
  // together), the gathered result with --check, and with --gemm-check the instrumented repeats (every
  // rank repeats, for the collectives; rank P-1 through the probe).
  void thread_rank(const BlockOptions& opts, int r, Communicator& comm, Measured& m, GlobalResult& result) {
    RankState& s = ranks[r];
    RepeatedMeasurement rm =
        measure_repeated(cfg, opts, s.shape, *s.be, comm, o.seed, o.warmup, o.repeat, s.inputs(), /*barrier=*/true);
    m.repeats[r] = std::move(rm.repeats);
    m.runs[r] = std::move(rm.last.run);
    if (o.check) result = gather_result(*s.be, comm, m.runs[r]);
    if (!o.gemm_check) return;
    std::optional<GemmProbeBackend> probe;
    if (r == m.rank) probe.emplace(*s.be);
    Backend& be = probe ? static_cast<Backend&>(*probe) : *s.be;
    for (int it = 0; it < o.repeat; ++it) {
      comm.barrier();
      run_rank(cfg, opts, s.shape, be, comm, o.seed, &s.w, &s.x, &s.dy);
    }
    if (probe) m.gemm_records = probe->records();
  }

  // P ranks as threads of this process (CPU): real in-process collectives.
  Measured measure_threads(const Point& p) {
    Measured m = start(p);
    for (int r = 0; r < p.sp; ++r) prepare(state(r), BlockShape{.batch = p.batch, .seq = p.seq, .ranks = p.sp, .rank = r}, p.layout);
    m.repeats.assign(p.sp, {});
    m.runs.assign(p.sp, {});
    std::vector<GlobalResult> results(p.sp);
    set_cpu_blas_threads(1);  // P ranks share the cores
    const BlockOptions opts = options(p);
    run_thread_ranks(p.sp, [&](int r, Communicator& comm) { thread_rank(opts, r, comm, m, results[r]); });
    if (o.gemm_check) gemms_alone(m, *ranks[m.rank].be);  // with one BLAS thread, as the rank had in the block
    set_cpu_blas_threads(default_blas_threads);
    if (o.check) {
      m.result = std::move(results[0]);
      m.have_result = true;
    }
    return m;
  }

  Measured measure(const Point& p) {
    if (p.sp == 1 || o.phantom) {
      Measured m = measure_alone(p);
      measure_timed(p, m);
      return m;
    }
    return measure_threads(p);
  }
};

// ---------------------------------------------------------------- one point: the document's and the table's

// printf into a string.
template <class... A>
std::string text(const char* f, A... a) {
  const int n = std::snprintf(nullptr, 0, f, a...);
  std::string s(std::size_t(std::max(n, 0)), '\0');
  std::snprintf(s.data(), s.size() + 1, f, a...);
  return s;
}

// A point's table row and the lines under it, read from its record.
struct PointResult {
  json doc;
  double saved = 0, peak_bwd = 0, sent = 0, gflop = 0;
  double fwd = 0, bwd = 0, spread = 0;  // medians (s); spread: relative IQR of the block
  double modeled_node = 0, modeled_cross = 0;
  std::string check;
  std::string gemms;  // --gemm-check's line
  std::vector<std::string> ops;  // --op-profile's lines
  std::vector<std::string> exposed;  // --phantom-comm timed: a line per placement
};

std::string gemms_line(const json& g) {
  const json& sum = g["summary"];
  if (g["list"].empty()) return "";
  const json& w = g["list"][sum["worst"].get<std::size_t>()];
  return text("gemms: %zu distinct, %zu calls a fwd+bwd; in block / alone: %.3f time-weighted (%s 10%%), worst %.3f "
             "(m %lld n %lld k %lld batch %lld, %s #%d)",
             sum["count"].get<std::size_t>(), sum["calls"].get<std::size_t>(), sum["time_weighted_ratio"].get<double>(),
             sum["within_10pct"].get<bool>() ? "within" : "NOT within", sum["worst_ratio"].get<double>(),
             (long long)w["m"].get<std::int64_t>(), (long long)w["n"].get<std::int64_t>(),
             (long long)w["k"].get<std::int64_t>(), (long long)w["batch"].get<std::int64_t>(),
             w["issued"][0]["pass"].get<std::string>().c_str(), w["issued"][0]["index"].get<int>());
}

std::vector<std::string> ops_lines(const json& ops) {
  std::vector<std::string> lines;
  for (const char* pass : {"forward", "backward"}) {
    std::string line = std::string("ops ") + (pass[0] == 'f' ? "fwd:" : "bwd:");
    for (const auto& [op, k] : ops["by_op"][pass].items())
      line += text(" %s %.3f ms (%d)", op.c_str(), k["seconds"].get<double>() * 1e3, k["calls"].get<int>());
    lines.push_back(line);
  }
  std::vector<json> costly;
  for (const char* pass : {"forward", "backward"})
    for (json r : ops[pass]) {
      r["pass"] = pass[0] == 'f' ? "fwd" : "bwd";
      costly.push_back(r);
    }
  std::stable_sort(costly.begin(), costly.end(),
                   [](const json& a, const json& c) { return a["seconds"].get<double>() > c["seconds"].get<double>(); });
  for (std::size_t i = 0; i < costly.size() && i < 24; ++i)
    lines.push_back(text("  %s #%-3d %8.3f ms  %-18s %s", costly[i]["pass"].get<std::string>().c_str(),
                        costly[i]["index"].get<int>(), costly[i]["seconds"].get<double>() * 1e3,
                        costly[i]["op"].get<std::string>().c_str(), costly[i]["what"].get<std::string>().c_str()));
  return lines;
}

std::vector<std::string> exposed_lines(const json& e) {
  std::vector<std::string> lines;
  const double base = e["instant_block"]["median"].get<double>();
  for (const json& l : e["links"]) {
    const double timed = l["timed_block"]["median"].get<double>(), exposed = l["exposed_s"].get<double>();
    const double modeled = l["modeled_collective_s"].get<double>();
    lines.push_back(text("timed %-10s block %9.2f ms, instant %9.2f ms: exposed %8.2f ms = %5.1f%% of the block "
                        "(collectives %.2f ms modeled, %.0f%% hidden)",
                        l["placement"].get<std::string>().c_str(), timed * 1e3, base * 1e3, exposed * 1e3,
                        100 * exposed / timed, modeled * 1e3, 100 * l["hidden_fraction"].get<double>()));
  }
  return lines;
}

// --check's cell: the largest error against the single-rank explicit result, and for LAGA at P = 1 whether it
// equals explicit bit for bit.
std::string check_cell(const json& doc) {
  std::string cell;
  for (const json& c : doc["check"]) {
    double worst = 0;
    for (const json& t : c["tensors"]) worst = std::max(worst, t["rel_error"].get<double>());
    cell = fmt("%.1e", worst);
  }
  if (doc.contains("bit_identical_to_explicit") && doc["form"] == "laga")
    cell += doc["bit_identical_to_explicit"].get<bool>() ? ", bitwise = explicit" : ", DIFFERS from explicit";
  return cell;
}

// --check: the point's result against the single-rank explicit result, held to the tolerance laga run's check
// would use, and at P = 1 a form other than explicit against explicit's result bit for bit.
void check_point(const Bench& b, Measured& m, const GlobalResult* reference, const GlobalResult* explicit_p1) {
  if (!b.o.check || !m.have_result) return;
  m.checks.emplace();
  if (reference)
    m.checks->push_back(check_against(CheckReference::SingleRank, m.result, *reference,
                                      check_policy(m.opts, m.sp, b.device, 0).single_rank));
  if (explicit_p1 && m.sp == 1 && m.opts.form != Form::Explicit)
    m.bit_identical_to_explicit = bit_identical(m.result, *explicit_p1);
}

// The point's record (laga::bench_point_report), and the table's row and lines read from it.
PointResult point_json(const Bench& b, const Measured& m) {
  PointResult pr;
  json doc = bench_point_report(m, b.model, b.o.repeat, b.o.warmup, b.o.gpu, *b.ranks.at(0).be);
  if (doc.contains("check")) pr.check = check_cell(doc);
  if (doc.contains("gemms")) pr.gemms = gemms_line(doc["gemms"]);
  if (doc.contains("ops")) pr.ops = ops_lines(doc["ops"]);
  if (doc.contains("exposed_communication")) pr.exposed = exposed_lines(doc["exposed_communication"]);
  const json& mine = doc["ranks"][m.runs.size() == 1 ? 0 : std::size_t(m.rank)];
  const json& rep = doc["repeats"];
  pr.saved = mine["saved_bytes"].get<double>();
  pr.peak_bwd = mine["peak_backward_bytes"].get<double>();
  pr.sent = mine["bytes_sent"].get<double>();
  for (const char* k : {"flops_forward", "flops_backward"})
    for (const auto& [ph, f] : mine[k].items()) pr.gflop += f.get<double>() * 1e-9;
  pr.fwd = rep["forward"]["total"]["median"].get<double>();
  pr.bwd = rep["backward"]["total"]["median"].get<double>();
  const json& blk = rep["block"];
  pr.spread = blk["median"].get<double>() != 0
                  ? (blk["q3"].get<double>() - blk["q1"].get<double>()) / blk["median"].get<double>() : 0.0;
  for (const json& pl : doc["modeled"]["placements"])
    (pl["placement"] == "node" ? pr.modeled_node : pr.modeled_cross) = pl["block_s"].get<double>();
  pr.doc = std::move(doc);
  return pr;
}

std::string canonical_command(const BenchOptions& o, const std::string& dtype) {
  std::ostringstream c;
  c << "laga bench --model " << o.model << " --device " << o.device << " --dtype " << dtype << " --seq "
    << join(o.seq) << " --sp " << join(o.sp) << " --batch " << join(o.batch) << " --form " << join(o.form)
    << " --layout " << join(o.layout) << " --kernel " << join(o.kernel) << " --repeat " << o.repeat << " --warmup "
    << o.warmup << " --seed " << o.seed;
  if (o.phantom) c << " --phantom";
  if (o.phantom_comm != "instant") c << " --phantom-comm " << o.phantom_comm << " --phantom-link " << join(o.phantom_link);
  if (o.check) c << " --check";
  if (o.gemm_check) c << " --gemm-check";
  if (o.op_profile) c << " --op-profile";
  if (o.kv_grad_reduce_fp32) c << " --kv-grad-reduce-in-fp32";
  if (!o.grad_dtype.empty()) c << " --grad-dtype " << o.grad_dtype;
  if (o.device == "cuda") c << " --attention-provider " << o.attention_provider;
  if (o.nondeterministic) c << " --nondeterministic";
  if (o.overlap) c << " --overlap";
  if (o.device == "cuda") c << " --gpu " << o.gpu;
  return c.str();
}

void write_atomically(const std::string& path, const json& doc) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    LAGA_REQUIRE(f.good(), "out = '", path, "': cannot open ", tmp, " for writing");
    f << bench_document_text(doc) << "\n";
    LAGA_CHECK(f.good(), "writing ", tmp, " failed");
  }
  std::filesystem::rename(tmp, path);
}

std::string ms(double seconds) { return fmt("%.2f", seconds * 1e3); }

// The grid of a sweep, parsed.
struct Grid {
  std::vector<std::int64_t> seqs, batches;
  std::vector<int> sps;
  std::vector<Layout> layouts;
  std::vector<AttentionKernel> kernels;
  std::vector<std::size_t> variants;  // into kAllVariants
  bool all_forms = false;             // --form all
  bool all_kernels = false;           // --kernel all
};

// The device, dtype, repeats, model and time model; throws InvalidArgument. Returns the dtype's name.
std::string configure(const BenchOptions& o, Bench& b) {
  b.device = parse_device(o.device);
  const std::string dtype_text = o.dtype.empty() ? dtype_name(default_dtype(b.device)) : o.dtype;
  b.dtype = parse_dtype(dtype_text);
  require_dtype_runs_on(b.dtype, b.device);
  LAGA_REQUIRE(o.repeat >= 1, "repeat = ", o.repeat, ": must be >= 1");
  LAGA_REQUIRE(o.warmup >= 0, "warmup = ", o.warmup, ": must be >= 0");
  b.cfg = resolve_model(o.model);
  b.model = time_model_of(o.time_model);
  return dtype_text;
}

Grid parse_grid(const BenchOptions& o) {
  Grid g;
  for (const auto& s : o.seq) g.seqs.push_back(parse_count("seq", s));
  for (const auto& s : o.batch) g.batches.push_back(parse_count("batch", s));
  for (const auto& s : o.sp) {
    const std::int64_t v = parse_count("sp", s);
    LAGA_REQUIRE(v <= 4096, "sp = ", v, ": at most 4096");
    g.sps.push_back(int(v));
  }
  g.layouts = parse_layouts(o.layout);
  g.kernels = parse_kernels(o.kernel);
  g.variants = parse_variant_ids(o.form);
  g.all_forms = std::find(o.form.begin(), o.form.end(), "all") != o.form.end();
  g.all_kernels = std::find(o.kernel.begin(), o.kernel.end(), "all") != o.kernel.end();
  return g;
}

// Whether a sweep covers (layout, kernel, variant): --form all and --kernel all cover what each layout runs
// (p2p: explicit and laga, fused); what was named explicitly is validated (and refused) as given.
bool swept(const Grid& g, Layout l, AttentionKernel k, std::size_t v) {
  if (g.all_forms && !layout_supports(l, kAllVariants[v])) return false;
  return !(g.all_kernels && l == Layout::P2P && k != AttentionKernel::Fused);
}

// The ranks each sp asks for: on cuda, and for --op-profile, one rank alone (P = 1 or a phantom).
void check_ranks(const BenchOptions& o, const Bench& b, const Grid& g) {
  if (b.device == Device::Cuda) {
    LAGA_REQUIRE(cuda_available(), "device = cuda: ", cuda_device_count() == 0 ? "no usable GPU (or laga was built without CUDA)" : "CUDA is not available");
    for (int P : g.sps)
      LAGA_REQUIRE(P == 1 || o.phantom, "sp = ", P, " on device cuda: bench runs P = 1 or one rank of P alone "
                   "(--phantom); real ranks on several GPUs run under mpirun with `laga run`");
  }
  for (int P : g.sps)
    LAGA_REQUIRE(!o.op_profile || P == 1 || o.phantom, "op-profile with sp = ", P, ": the profile is one rank's alone "
                 "(add --phantom)");
}

// Every point of the grid, validated before anything runs.
std::vector<Point> grid_points(const BenchOptions& o, const Bench& b, const Grid& g) {
  check_attention_provider(o.attention_provider, b.device == Device::Cuda);
  check_ranks(o, b, g);
  LAGA_REQUIRE(o.phantom_comm == "instant" || o.phantom_comm == "timed", "phantom-comm = '", o.phantom_comm,
               "': expected instant or timed");
  LAGA_REQUIRE(o.phantom_comm == "instant" || o.phantom, "phantom-comm = timed: timed collectives are a phantom "
               "rank's (add --phantom)");
  LAGA_REQUIRE(!o.phantom_link.empty(), "phantom-link: give node, cross-node or both");
  for (const std::string& l : o.phantom_link)
    LAGA_REQUIRE(l == "node" || l == "cross-node", "phantom-link = '", l, "': expected node or cross-node");
  LAGA_REQUIRE(!(o.check && o.phantom), "check with phantom: a phantom rank's collectives return stand-in data, "
               "so its result cannot be compared (drop --check or --phantom)");
  std::vector<Point> points;
  for (auto S : g.seqs)
    for (int P : g.sps)
      for (auto B : g.batches)
        for (Layout l : g.layouts)
          for (AttentionKernel k : g.kernels)
            for (std::size_t v : g.variants) {
              if (!swept(g, l, k, v)) continue;
              Point p{S, B, P, l, k, v};
              validate(b.cfg, b.options(p), BlockShape{.batch = B, .seq = S, .ranks = P, .rank = 0});
              points.push_back(p);
            }
  return points;
}

json config_json(const BenchOptions& o, const Bench& b, const Grid& g, const std::string& dtype_text) {
  json config = {{"command", canonical_command(o, dtype_text)},
                 {"model", json::parse(config_to_json(b.cfg))},
                 {"device", device_name(b.device)},
                 {"dtype", dtype_name(b.dtype)},
                 {"seq", g.seqs},
                 {"sp", g.sps},
                 {"batch", g.batches},
                 {"layouts", json::array()},
                 {"kernels", json::array()},
                 {"variants", json::array()},
                 {"repeat", o.repeat},
                 {"warmup", o.warmup},
                 {"seed", o.seed},
                 {"ranks", o.phantom ? "phantom: rank P-1 of P alone on this device (collectives counted, not performed)"
                                     : "P = 1 alone; P > 1 as threads of this process with in-process collectives"},
                 {"cpu_threads_per_rank", b.device == Device::Cpu ? json(b.default_blas_threads) : json(nullptr)},
                 {"check", o.check},
                 {"gemm_check", o.gemm_check},
                 {"op_profile", o.op_profile},
                 {"kv_grad_reduce_in_fp32", o.kv_grad_reduce_fp32},
                 {"grad_dtype", o.grad_dtype.empty() ? json(nullptr) : json(o.grad_dtype)},
                 {"overlap", o.overlap},
                 {"phantom_comm", o.phantom_comm},
                 {"phantom_links", o.phantom_comm == "timed" ? json(o.phantom_link) : json::array()}};
  if (b.device == Device::Cuda) {
    config["gpu"] = o.gpu;
    config["attention_provider"] = o.attention_provider;
    config["deterministic"] = !o.nondeterministic;
  }
  for (Layout l : g.layouts) config["layouts"].push_back(layout_name(l));
  for (AttentionKernel k : g.kernels) config["kernels"].push_back(kernel_name(k));
  for (std::size_t v : g.variants)
    config["variants"].push_back({{"id", variant_id(kAllVariants[v])}, {"label", kAllVariants[v].label()}});
  return config;
}

const char* kRowFormat = "%-9s %5s %6s %3s %3s %-10s %-5s %-19s %10s %10s %10s %8s %9s %9s %6s %9s %9s%s\n";

void print_bench_header(const Bench& b, std::size_t points) {
  const BenchOptions& o = b.o;
  std::printf("laga bench: model '%s', %s, %s, %zu points x (%d warm-up + %d timed), %s\n", b.cfg.name.c_str(),
              device_name(b.device), dtype_name(b.dtype), points, o.warmup, o.repeat,
              o.phantom ? "phantom ranks (rank P-1 of P alone)" : "P > 1 as threads of this process");
  std::printf("modeled collectives: %d GPUs a node, %s %.0f GB/s + %.1f us a step within a node, %s %.0f GB/s "
              "+ %.1f us a step across nodes\n",
              b.model.node_size, b.model.intra.name.c_str(), b.model.intra.bandwidth * 1e-9, b.model.intra.latency * 1e6,
              b.model.inter.name.c_str(), b.model.inter.bandwidth * 1e-9, b.model.inter.latency * 1e6);
  std::printf("times: median over the timed repeats of rank P-1 (spread = IQR / median of fwd + bwd); "
              "'modeled' = measured compute + modeled collectives\n\n");
  std::printf(kRowFormat, "point", "left", "S", "P", "B", "layout", "kern", "variant", "saved", "peak bwd", "sent", "GFLOP",
              "fwd ms", "bwd ms", "spread", "node ms*", "xnode ms*", o.check ? "  check" : "");
  std::fflush(stdout);
}

void print_point_row(const Bench& b, std::size_t i, std::size_t n, const Point& p, const PointResult& pr) {
  char prog[32];
  std::snprintf(prog, sizeof prog, "%zu/%zu", i + 1, n);
  std::printf(kRowFormat, prog, std::to_string(n - i - 1).c_str(), std::to_string(p.seq).c_str(), std::to_string(p.sp).c_str(),
              std::to_string(p.batch).c_str(), layout_name(p.layout), kernel_name(p.kernel), kAllVariants[p.variant].label(),
              human_bytes(pr.saved).c_str(), human_bytes(pr.peak_bwd).c_str(), human_bytes(pr.sent).c_str(),
              fmt("%.3f", pr.gflop).c_str(), ms(pr.fwd).c_str(), ms(pr.bwd).c_str(),
              fmt("%.0f%%", 100 * pr.spread).c_str(), fmt("%.2f", pr.modeled_node * 1e3).c_str(),
              fmt("%.2f", pr.modeled_cross * 1e3).c_str(), b.o.check ? ("  " + pr.check).c_str() : "");
  if (!pr.gemms.empty()) std::printf("%9s %s\n", "", pr.gemms.c_str());
  for (const std::string& line : pr.ops) std::printf("%9s %s\n", "", line.c_str());
  for (const std::string& line : pr.exposed) std::printf("%9s %s\n", "", line.c_str());
  std::fflush(stdout);
}

void print_bench_footer(const Bench& b) {
  std::printf("\nsaved: activation bytes kept for backward; peak bwd: highest live activation bytes in backward; "
              "sent: bytes the rank sent, fwd + bwd.\n"
              "* MODELED, not measured: node ms* = measured compute + collectives priced for P ranks on nodes of %d "
              "(%s within a node; P > %d fills several nodes); xnode ms* = the same with one rank a node (%s).\n",
              b.model.node_size, b.model.intra.name.c_str(), b.model.node_size, b.model.inter.name.c_str());
  if (b.timed())
    std::printf("timed: rank P-1 again with collectives that hold its queue for the model's time of their bytes "
                "(placement node: %s; cross-node: %s); exposed = timed - instant block (medians), hidden = the "
                "part of the modeled collective time that did not show.\n",
                b.model.intra.name.c_str(), b.model.inter.name.c_str());
  if (b.o.gemm_check)
    std::printf("gemms: each distinct GEMM's median time in the block (extra instrumented repeats after the timed "
                "ones) / alone on the same backend; time-weighted = sum over calls in block / alone; within 10%% "
                "when <= 1.10 (docs/bench.md).\n");
  if (b.o.check)
    std::printf("check: largest relative error of y, dx and every weight gradient (summed over ranks) against the "
                "single-rank explicit result; at P = 1 whether LAGA is bit-identical to explicit.\n");
}

// --check's references, kept across points: the single-rank explicit result by (S, B, kernel), and
// explicit's result at P = 1 by (S, B, layout, kernel), which LAGA's must equal bit for bit.
struct References {
  std::map<std::tuple<std::int64_t, std::int64_t, int>, GlobalResult> single_rank;
  std::map<std::tuple<std::int64_t, std::int64_t, int, int>, GlobalResult> explicit_p1;

  const GlobalResult* reference(Bench& b, const Point& p) {
    auto key = std::make_tuple(p.seq, p.batch, int(p.kernel));
    auto it = single_rank.find(key);
    if (it == single_rank.end()) {
      auto ref_be = b.new_backend();
      it = single_rank.emplace(key, reference_result(b.cfg, b.dtype, p.kernel, p.batch, p.seq, *ref_be, b.o.seed)).first;
    }
    return &it->second;
  }
  // Records explicit's P = 1 result; returns the one this point compares with, if any.
  const GlobalResult* explicit_result(const Point& p, const Measured& m) {
    const auto group = std::make_tuple(p.seq, p.batch, int(p.layout), int(p.kernel));
    if (p.sp == 1 && kAllVariants[p.variant].form == Form::Explicit && m.have_result) explicit_p1[group] = m.result;
    const auto ex = explicit_p1.find(group);
    return ex == explicit_p1.end() ? nullptr : &ex->second;
  }
};

int run_bench(BenchOptions o) {
  apply_sweeps(o);
  Bench b;
  const std::string dtype_text = configure(o, b);
  const Grid grid = parse_grid(o);
  const std::vector<Point> points = grid_points(o, b, grid);
  if (!o.out.empty()) {
    std::ofstream f(o.out, std::ios::app);
    LAGA_REQUIRE(f.good(), "out = '", o.out, "': cannot open for writing");
  }
  b.o = o;
  b.default_blas_threads = set_cpu_blas_threads(1);
  set_cpu_blas_threads(b.default_blas_threads);
  json doc = bench_document(b.device, config_json(o, b, grid, dtype_text), b.model);
  print_bench_header(b, points.size());

  const auto t0 = std::chrono::steady_clock::now();
  References refs;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const Point& p = points[i];
    const GlobalResult* reference = o.check ? refs.reference(b, p) : nullptr;
    Measured m = b.measure(p);
    check_point(b, m, reference, refs.explicit_result(p, m));
    const PointResult pr = point_json(b, m);
    doc["points"].push_back(pr.doc);
    print_point_row(b, i, points.size(), p, pr);
    if (!o.out.empty()) write_atomically(o.out, doc);
  }
  doc["complete"] = true;
  doc["elapsed_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.out.empty()) {
    write_atomically(o.out, doc);
    std::printf("\nwrote %s (%zu points; schema docs/bench.md). Plots: python3 scripts/plot_bench.py %s\n",
                o.out.c_str(), points.size(), o.out.c_str());
  }
  print_bench_footer(b);
  std::printf("bench took %.1f s.\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return kExitOk;
}

}  // namespace

std::function<int()> add_bench(CLI::App& app, CLI::App*& sub) {
  auto o = std::make_shared<BenchOptions>();
  sub = app.add_subcommand("bench", "Sweep sizes, P, forms, layouts and kernels; repeat each point; write one JSON "
                                    "document (docs/bench.md) and print a table as it goes");
  sub->add_option("--model", o->model, "Preset or path to a config.json")->capture_default_str();
  sub->add_option("--seq", o->seq, "Sequence lengths S, comma separated; 16k = 16384")->delimiter(',')->capture_default_str();
  sub->add_option("--sp", o->sp, "Sequence-parallel ranks P, comma separated")->delimiter(',')->capture_default_str();
  sub->add_option("--batch", o->batch, "Micro-batch sizes, comma separated")->delimiter(',')->capture_default_str();
  sub->add_option("--form", o->form, "all, or a list of explicit, absorbed, absorbed-expanded, laga, laga-recompute")
      ->delimiter(',')->capture_default_str();
  sub->add_option("--layout", o->layout, "all (a2a, all_gather), or a list of a2a, all_gather, p2p")->delimiter(',')->capture_default_str();
  sub->add_option("--kernel", o->kernel, "all, or a list of eager, fused")->delimiter(',')->capture_default_str();
  sub->add_option("--sweep", o->sweep, "KEY=V1,V2,... (KEY: seq, sp, batch, form, layout, kernel); repeatable, "
                                       "replaces that list");
  sub->add_option("--device", o->device, "cpu or cuda")->capture_default_str();
  sub->add_option("--gpu", o->gpu, "CUDA device index")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "float32, float64 or bfloat16 (default: float32 on cpu, bfloat16 on cuda)");
  sub->add_flag("--phantom", o->phantom, "Run rank P-1 of P alone (collectives counted, not performed): one device "
                                         "measures any P; the only way to P > 1 on cuda here");
  sub->add_option("--phantom-comm", o->phantom_comm, "instant (collectives cost nothing) or timed (each point also "
                  "measured with collectives that hold the queue for the model's time of their bytes; reports the "
                  "exposed communication); timed needs --phantom")->capture_default_str();
  sub->add_option("--phantom-link", o->phantom_link, "Placements timed collectives are priced for: node (NVLink "
                  "within a node), cross-node (InfiniBand), comma separated")->delimiter(',')->capture_default_str();
  sub->add_option("--repeat", o->repeat, "Timed repeats of each point (median and spread reported)")->capture_default_str();
  sub->add_option("--warmup", o->warmup, "Untimed runs before the repeats")->capture_default_str();
  sub->add_flag("--check", o->check, "Also record each point's error against the single-rank explicit result, and "
                                     "whether LAGA at P = 1 is bit-identical to explicit");
  sub->add_flag("--gemm-check", o->gemm_check, "Also time every GEMM of the block (in extra instrumented repeats "
                                               "after the timed ones) against the same GEMM alone; adds \"gemms\" "
                                               "to each point");
  sub->add_flag("--op-profile", o->op_profile, "Also time every op of the block (GEMMs, copies, norms, RoPE, "
                                               "attention) in extra instrumented repeats after the timed ones; adds "
                                               "\"ops\" to each point (one rank alone: P = 1 or --phantom)");
  sub->add_option("--attention-provider", o->attention_provider,
                  "Who runs the fused attention on cuda: auto (per shape, by bench/attention-providers.json within "
                  "the scratch cap), laga or cudnn")->capture_default_str();
  sub->add_flag("--nondeterministic", o->nondeterministic,
                "Let the attention backward add its float32 sums in any order (cuDNN's default backward, as "
                "PyTorch's SDPA runs it, with a small workspace; laga's kernels without waiting for the blocks "
                "before them): faster, and reruns differ in the last bits");
  sub->add_option("--grad-dtype", o->grad_dtype,
                  "The weight gradients' dtype: the weights' or their accumulation dtype (the default; as laga run)");
  sub->add_flag("--kv-grad-reduce-in-fp32", o->kv_grad_reduce_fp32,
                "all_gather: explicit reduce-scatters its K/V gradients in float32 (as `laga run`)");
  sub->add_flag("--overlap", o->overlap, "Start each collective as soon as its input exists, computing what does not "
                                         "need it meanwhile (as laga run --overlap)");
  sub->add_option("--seed", o->seed, "Seed of the deterministic weights and inputs")->capture_default_str();
  sub->add_option("--out", o->out, "The JSON document (rewritten after every point; complete: true at the end)");
  add_time_model_options(sub, o->time_model);
  return [o] { return run_bench(*o); };
}

}  // namespace laga::cli
