// The block's conformance suite (block_conformance.hpp says what it checks and who instantiates it).
// Every collective of a case runs inside Ranks::run on every rank; the assertions run afterwards, on the
// results this process holds, so no rank can leave the others waiting in a collective.
#include "conformance/block_conformance.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>
#include <utility>

#include "common/block_configs.hpp"
#include "laga/errors.hpp"
#include "laga/measure.hpp"
#include "laga/plan.hpp"

namespace laga::conformance {
namespace {

constexpr std::uint64_t kSeed = 11;

// ---------------------------------------------------------------- the case's problem

MlaConfig case_config(const Case& c, int P) {
  MlaConfig cfg = test::config_by_name(c.config);
  if (c.layout == Layout::A2A && cfg.num_attention_heads % P != 0) {  // a2a splits the heads over the ranks
    cfg.num_attention_heads = P;
    cfg.name += "_" + std::to_string(P) + "_heads";
    validate(cfg);
  }
  return cfg;
}
std::int64_t case_seq(const Case& c, int P) { return c.seq > 0 ? c.seq : 8 * std::int64_t(P); }

// The kernels a layout takes (p2p: the fused kernel only, whose log-sum-exp the ring merges).
std::vector<AttentionKernel> kernels_for(Layout l) {
  if (l == Layout::P2P) return {AttentionKernel::Fused};
  return {kAllKernels.begin(), kAllKernels.end()};
}

std::string dtype_tag(DType t) { return dtype_name(t); }

// The float64 single-rank explicit result on the CPU, computed once per process for each problem.
const GlobalResult& reference(const MlaConfig& cfg, AttentionKernel kernel, std::int64_t batch, std::int64_t seq) {
  static std::map<std::tuple<std::string, AttentionKernel, std::int64_t, std::int64_t>, GlobalResult> cache;
  const auto key = std::make_tuple(cfg.name, kernel, batch, seq);
  auto it = cache.find(key);
  if (it == cache.end()) {
    auto be = make_cpu_backend();
    it = cache.emplace(key, reference_result(cfg, DType::F64, kernel, batch, seq, *be, kSeed)).first;
  }
  return it->second;
}

// ---------------------------------------------------------------- running a variant on every rank

// What one rank measured and computed, kept after its backend is gone.
struct RankResult {
  std::vector<AllocationRecord> saved;
  std::size_t saved_bytes = 0;
  PassStats fwd, bwd;
  std::vector<CollectiveRecord> traffic;
  Shape y_shape;
  std::vector<double> local;  // this rank's y, dx and weight gradients
  GlobalResult global;        // as this rank assembled it
  std::vector<Comparison> errors;  // global against the reference
  bool errors_agree = false;       // every rank computed the same errors
};
// Indexed by rank; null for the ranks of other processes.
using Outcome = std::vector<std::shared_ptr<const RankResult>>;

// Every rank's `mine` (all of one length), concatenated in rank order. A collective over host buffers.
std::vector<double> gather_all(Communicator& host, const std::vector<double>& mine) {
  std::vector<double> all(mine.size() * std::size_t(host.size()));
  if (!mine.empty()) host.all_gather(mine.data(), all.data(), mine.size(), DType::F64);
  return all;
}

void append(Backend& be, const Tensor& t, std::vector<double>& out) {
  const std::vector<double> v = to_host(be, t);
  out.insert(out.end(), v.begin(), v.end());
}

struct Problem {
  MlaConfig cfg;
  int ranks = 1;
  std::int64_t batch = 1, seq = 0;
  BlockShape shape(int rank) const { return BlockShape{.batch = batch, .seq = seq, .ranks = ranks, .rank = rank}; }
};

Outcome run_variant(const Suite& suite, const Problem& pb, const BlockOptions& opts, const GlobalResult& ref) {
  Outcome out(std::size_t(pb.ranks));
  suite.ranks->run(pb.ranks, [&](int rank, Communicator& host) {
    auto res = std::make_shared<RankResult>();
    std::unique_ptr<Backend> be = suite.platform.make_backend(rank);
    std::unique_ptr<Communicator> own = suite.platform.make_comm ? suite.platform.make_comm(host, *be) : nullptr;
    {
      const RankRun run = run_rank(pb.cfg, opts, pb.shape(rank), *be, own ? *own : host, kSeed);
      res->saved = run.saved;
      res->saved_bytes = run.saved_bytes;
      res->fwd = run.fwd;
      res->bwd = run.bwd;
      res->traffic = run.traffic;
      res->y_shape = run.y.shape();
      append(*be, run.y, res->local);
      append(*be, run.dx, res->local);
      for (const auto& [name, t] : run.grads.named()) append(*be, *t, res->local);
      res->global = gather_result(*be, host, run);
    }
    res->errors = compare(res->global, ref);
    std::vector<double> mine;
    for (const auto& e : res->errors) mine.push_back(e.rel_error);
    const std::vector<double> all = gather_all(host, mine);
    res->errors_agree = true;
    for (int p = 0; p < host.size(); ++p)
      res->errors_agree = res->errors_agree &&
                          std::memcmp(all.data() + p * mine.size(), mine.data(), mine.size() * sizeof(double)) == 0;
    out[std::size_t(rank)] = std::move(res);
  });
  return out;
}

// The result of the lowest rank this process ran.
const RankResult& first(const Outcome& o) {
  for (const auto& r : o)
    if (r) return *r;
  throw std::logic_error("no rank ran in this process");
}

// ---------------------------------------------------------------- the closed form (DESIGN.md section 3)

// What one rank's CountingCommunicator must record, in call order, written from the design rather than
// from block.cpp's chunk arithmetic:
//   a2a: a per-head tensor of width w per head has s*B*n_h*w values on this rank; (P-1)/P of them leave (and
//     as many arrive). explicit: q, k, v in, o out; laga/absorbed: q in, the latent all-gathered, o out.
//     Backward answers each all-to-all with an all-to-all (o, then k, v or the latent's reduce-scatter,
//     then q).
//   all_gather: queries stay; explicit gathers per-head K and V (every other rank receives this rank's
//     s*B*n_h*w values), laga/absorbed gather the latent (s*B*(r_kv + d_r)). Backward reduce-scatters.
//   p2p: this rank's values go round the ring, P-1 shifts in forward and again in backward, and the
//     gradient's accumulator P shifts back to its owner (no shift at P = 1).
// The latent's gradient travels in the accumulation dtype (float32 for bf16); everything else in the
// storage dtype (the explicit form's K/V gradients too: BlockOptions::kv_grad_reduce_fp32 is off here).
std::vector<CollectiveRecord> design_traffic(const MlaConfig& cfg, const BlockOptions& opts, const BlockShape& sh) {
  const std::size_t P = std::size_t(sh.ranks), s = std::size_t(sh.seq / sh.ranks), B = std::size_t(sh.batch);
  const std::size_t e = dtype_size(opts.dtype), e_latent_grad = dtype_size(accum_dtype(opts.dtype));
  const std::size_t nh = std::size_t(cfg.num_attention_heads);
  const std::size_t q_w = std::size_t(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim), k_w = q_w;
  const std::size_t v_w = std::size_t(cfg.v_head_dim), o_w = v_w;
  const std::size_t latent_w = std::size_t(cfg.kv_lora_rank + cfg.qk_rope_head_dim);
  const bool latent = opts.form != Form::Explicit;

  std::vector<CollectiveRecord> out;
  auto add = [&](Phase ph, CollectiveKind k, const char* t, std::size_t bytes) {
    out.push_back(CollectiveRecord{ph, k, t, bytes, bytes, 1});
  };
  // (P-1)/P of this rank's s*B*n_h*w values, exact because n_h is divisible by P in a2a.
  auto a2a = [&](std::size_t w) { return s * B * (nh / P) * w * (P - 1) * e; };
  // Every other rank gets this rank's s*B*width values.
  auto gathered = [&](std::size_t width, std::size_t elem) { return (P - 1) * s * B * width * elem; };
  auto ring = [&](Phase ph, const char* t, std::size_t width, std::size_t elem, std::size_t shifts) {
    if (P > 1) out.push_back(CollectiveRecord{ph, CollectiveKind::RingShift, t, shifts * s * B * width * elem,
                                              shifts * s * B * width * elem, int(shifts)});
  };
  if (opts.layout == Layout::P2P) {
    if (latent) {
      ring(Phase::Forward, "kv_latent", latent_w, e, P - 1);
      ring(Phase::Backward, "kv_latent_resend", latent_w, e, P - 1);
      ring(Phase::Backward, "kv_latent", latent_w, e_latent_grad, P);
    } else {
      ring(Phase::Forward, "k", nh * k_w, e, P - 1);
      ring(Phase::Forward, "v", nh * v_w, e, P - 1);
      ring(Phase::Backward, "k_resend", nh * k_w, e, P - 1);
      ring(Phase::Backward, "v_resend", nh * v_w, e, P - 1);
      ring(Phase::Backward, "k", nh * k_w, e, P);
      ring(Phase::Backward, "v", nh * v_w, e, P);
    }
  } else if (opts.layout == Layout::A2A) {
    add(Phase::Forward, CollectiveKind::AllToAll, "q", a2a(q_w));
    if (latent) {
      add(Phase::Forward, CollectiveKind::AllGather, "kv_latent", gathered(latent_w, e));
    } else {
      add(Phase::Forward, CollectiveKind::AllToAll, "k", a2a(k_w));
      add(Phase::Forward, CollectiveKind::AllToAll, "v", a2a(v_w));
    }
    add(Phase::Forward, CollectiveKind::AllToAll, "o", a2a(o_w));
    add(Phase::Backward, CollectiveKind::AllToAll, "o", a2a(o_w));
    if (latent) {
      add(Phase::Backward, CollectiveKind::ReduceScatter, "kv_latent", gathered(latent_w, e_latent_grad));
    } else {
      add(Phase::Backward, CollectiveKind::AllToAll, "k", a2a(k_w));
      add(Phase::Backward, CollectiveKind::AllToAll, "v", a2a(v_w));
    }
    add(Phase::Backward, CollectiveKind::AllToAll, "q", a2a(q_w));
  } else if (latent) {
    add(Phase::Forward, CollectiveKind::AllGather, "kv_latent", gathered(latent_w, e));
    add(Phase::Backward, CollectiveKind::ReduceScatter, "kv_latent", gathered(latent_w, e_latent_grad));
  } else {
    add(Phase::Forward, CollectiveKind::AllGather, "k", gathered(nh * k_w, e));
    add(Phase::Forward, CollectiveKind::AllGather, "v", gathered(nh * v_w, e));
    add(Phase::Backward, CollectiveKind::ReduceScatter, "k", gathered(nh * k_w, e));
    add(Phase::Backward, CollectiveKind::ReduceScatter, "v", gathered(nh * v_w, e));
  }
  return out;
}

std::string traffic_string(const std::vector<CollectiveRecord>& v) {
  std::string s;
  for (const auto& r : v)
    s += std::string(phase_name(r.phase)) + " " + collective_name(r.kind) + " " + r.tensor + " x" +
         std::to_string(r.calls) + " sent " + std::to_string(r.bytes_sent) + " recv " +
         std::to_string(r.bytes_received) + "\n";
  return s;
}
std::vector<CollectiveRecord> sorted(std::vector<CollectiveRecord> v) {
  std::sort(v.begin(), v.end(), [](const CollectiveRecord& a, const CollectiveRecord& b) {
    return std::tie(a.phase, a.kind, a.tensor) < std::tie(b.phase, b.kind, b.tensor);
  });
  return v;
}
std::size_t sent(const RankResult& r) {
  std::size_t n = 0;
  for (const auto& c : r.traffic) n += c.bytes_sent;
  return n;
}
bool keeps(const RankResult& r, const std::string& name) {
  for (const auto& s : r.saved)
    if (s.name == name) return true;
  return false;
}

// ---------------------------------------------------------------- the checks of one variant

void expect_matches_reference(const Platform& platform, const Outcome& o, DType dtype, double tol,
                              const std::string& what) {
  for (std::size_t r = 0; r < o.size(); ++r) {
    if (!o[r]) continue;
    for (const auto& e : o[r]->errors) EXPECT_LE(e.rel_error, tol) << what << ": " << e.tensor << ", rank " << r;
    EXPECT_TRUE(o[r]->errors_agree) << what << ": rank " << r << " computed other errors than another rank";
  }
  if (platform.report)
    for (const auto& e : first(o).errors)
      std::printf("GPUCHECK Block/%s.%s %s %s rel_err=%.3e tol=%.1e\n", platform.name.c_str(), what.c_str(),
                  e.tensor.c_str(), dtype == DType::BF16 ? "bf16" : dtype == DType::F32 ? "f32" : "f64", e.rel_error,
                  tol);
}

// Every rank kept activations, exchanged as much as it received (more than nothing at P > 1), holds its shard
// of y, and issued the design's collectives; where the platform counts as the plan does, the plan of the same
// options equals the measurement.
void expect_measurement(const Platform& platform, const Problem& pb, const BlockOptions& opts, const Outcome& o,
                        const std::string& what) {
  // In call order; collectives under compute are issued in another order (the same ones).
  auto in_order = [&](std::vector<CollectiveRecord> v) { return traffic_string(opts.overlap ? sorted(std::move(v)) : v); };
  const std::string design = in_order(design_traffic(pb.cfg, opts, pb.shape(0)));
  EXPECT_EQ(in_order(expected_traffic(pb.cfg, opts, pb.shape(0))), design) << what << ": laga::expected_traffic";
  for (std::size_t r = 0; r < o.size(); ++r) {
    if (!o[r]) continue;
    const RankResult& rr = *o[r];
    SCOPED_TRACE(what + ", rank " + std::to_string(r));
    EXPECT_GT(rr.saved_bytes, 0u);
    std::size_t received = 0;
    for (const auto& c : rr.traffic) received += c.bytes_received;
    EXPECT_EQ(sent(rr), received);
    EXPECT_EQ(sent(rr) > 0, pb.ranks > 1);
    EXPECT_EQ(rr.y_shape, (Shape{pb.seq / pb.ranks, pb.batch, pb.cfg.hidden_size}));
    EXPECT_EQ(in_order(rr.traffic), design) << "traffic against DESIGN.md's closed form";
    const RankPlan plan = plan_rank(pb.cfg, opts, pb.shape(int(r)));
    EXPECT_EQ(traffic_string(plan.traffic), traffic_string(rr.traffic)) << "plan_rank's traffic";
    if (!platform.plan_exact) continue;
    EXPECT_EQ(plan.saved_bytes, rr.saved_bytes) << "plan_rank's saved bytes";
    EXPECT_EQ(plan.peak_forward, rr.fwd.peak_bytes) << "plan_rank's forward peak";
    EXPECT_EQ(plan.peak_backward, rr.bwd.peak_bytes) << "plan_rank's backward peak";
    for (int p = 0; p < kOpPhaseCount; ++p) {
      EXPECT_EQ(plan.fwd.flops[p], rr.fwd.flops[p]) << "forward FLOPs of " << op_phase_name(OpPhase(p));
      EXPECT_EQ(plan.bwd.flops[p], rr.bwd.flops[p]) << "backward FLOPs of " << op_phase_name(OpPhase(p));
    }
  }
}

// The same bits on every rank and in the global result.
void expect_same_bits(const Outcome& a, const Outcome& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t r = 0; r < a.size(); ++r) {
    if (!a[r] || !b[r]) continue;
    EXPECT_TRUE(a[r]->local == b[r]->local) << what << ": rank " << r << "'s y, dx or gradients differ";
    EXPECT_TRUE(a[r]->global.y == b[r]->global.y) << what << ": y differs";
    EXPECT_TRUE(a[r]->global.dx == b[r]->global.dx) << what << ": dx differs";
    EXPECT_TRUE(a[r]->global.grads == b[r]->global.grads) << what << ": a weight gradient differs";
  }
}

// Collectives under compute: the bits, collectives (in another order) and saved bytes of the blocking order.
void expect_overlap_is_blocking(const Outcome& overlapped, const Outcome& blocking, const std::string& what) {
  expect_same_bits(overlapped, blocking, what + ": overlap against the blocking order");
  for (std::size_t r = 0; r < blocking.size(); ++r) {
    if (!blocking[r]) continue;
    EXPECT_EQ(traffic_string(sorted(overlapped[r]->traffic)), traffic_string(sorted(blocking[r]->traffic)))
        << what << ": overlap moves other bytes, rank " << r;
    EXPECT_EQ(overlapped[r]->saved_bytes, blocking[r]->saved_bytes) << what << ": overlap keeps other bytes, rank " << r;
  }
}

// ---------------------------------------------------------------- the forms among themselves

void expect_forms_agree(const Problem& pb, Layout layout, double tol, const std::map<std::string, Outcome>& runs,
                        const std::string& what) {
  const Outcome& ex = runs.at(Variant{}.name());
  for (const auto& [name, o] : runs) {
    if (name == Variant{}.name()) continue;
    const bool laga_family = name.rfind("laga", 0) == 0;
    if (pb.ranks == 1 && laga_family) {
      // DESIGN.md section 5: at P = 1 LAGA runs exactly the explicit form's operations (the latent
      // all-gather is a copy, the K/V up-projection the same GEMMs).
      expect_same_bits(o, ex, what + " " + name + " against explicit at P = 1");
      continue;
    }
    for (const auto& e : compare(first(o).global, first(ex).global))
      EXPECT_LE(e.rel_error, tol) << what << " " << name << " against explicit at the same P: " << e.tensor;
  }
  const Variant laga{.form = Form::Laga}, kv{.form = Form::Laga, .recompute = Recompute::KV};
  if (runs.count(kv.name())) {
    const Outcome &lg = runs.at(laga.name()), &rc = runs.at(kv.name());
    // The same operations on the same data, K and V rebuilt in backward from the kept latent ...
    expect_same_bits(rc, lg, what + " laga recompute kv against laga");
    for (std::size_t r = 0; r < lg.size(); ++r) {
      if (!lg[r]) continue;
      SCOPED_TRACE(what + ", rank " + std::to_string(r));
      // ... keeping the gathered latent instead of per-head K and V, and moving the same bytes.
      EXPECT_LT(rc[r]->saved_bytes, lg[r]->saved_bytes);
      EXPECT_TRUE(keeps(*lg[r], "k_att") && keeps(*lg[r], "v_att"));
      EXPECT_FALSE(keeps(*rc[r], "k_att") || keeps(*rc[r], "v_att"));
      EXPECT_TRUE(keeps(*rc[r], "latent_gathered"));
      EXPECT_EQ(traffic_string(rc[r]->traffic), traffic_string(lg[r]->traffic));
    }
  }
  // all_gather: LAGA moves the latent (r_kv + d_r per token) instead of per-head K and V (n_h (d_qk + d_v) per
  // token), less at any P > 1. (In a2a the latent's all-gather grows with P while explicit's all-to-all does
  // not: tiny at P = 4 moves exactly as much either way.)
  if (layout == Layout::AllGather && pb.ranks > 1)
    EXPECT_LT(sent(first(runs.at(laga.name()))), sent(first(ex))) << what;
}

std::string case_tag(const Case& c, int P) {
  return c.config + "_P" + std::to_string(P) + "_S" + std::to_string(case_seq(c, P)) + "_B" + std::to_string(c.batch) +
         "_" + layout_name(c.layout) + "_" + dtype_tag(c.dtype);
}

}  // namespace

// ---------------------------------------------------------------- ranks, names, cases

namespace {
class ThreadRanks final : public Ranks {
 public:
  std::string name() const override { return "threads"; }
  int size(int wanted) const override { return wanted; }
  void run(int size, const std::function<void(int, Communicator&)>& fn) override {
    const int blas = set_cpu_blas_threads(1);  // P ranks share the cores
    run_thread_ranks(size, fn);
    set_cpu_blas_threads(blas);
  }
};
}  // namespace

std::shared_ptr<Ranks> thread_ranks() { return std::make_shared<ThreadRanks>(); }

std::string param_name(const testing::TestParamInfo<Param>& info) {
  const Case& c = info.param.c;
  std::string n = c.config + (c.ranks > 0 ? "_P" + std::to_string(c.ranks) : "") +
                  (c.seq > 0 ? "_S" + std::to_string(c.seq) : "") + "_B" + std::to_string(c.batch) + "_" +
                  layout_name(c.layout) + "_" + dtype_tag(c.dtype) + (c.kernel ? std::string("_") + kernel_name(*c.kernel) : "");
  return n;
}

void PrintTo(const Param& p, std::ostream* os) {
  *os << p.suite->platform.name << " on " << p.suite->ranks->name() << ": "
      << param_name(testing::TestParamInfo<Param>(p, 0));
}

std::vector<Param> every_layout(const std::shared_ptr<const Suite>& suite, const std::vector<Case>& shapes) {
  std::vector<Param> out;
  for (Case c : shapes)
    for (Layout l : {Layout::A2A, Layout::AllGather, Layout::P2P}) {
      // p2p cuts the sequence into 2P chunks (known here only when the case names P and S).
      if (l == Layout::P2P && c.ranks > 0 && c.seq > 0 && c.seq % (2 * c.ranks) != 0) continue;
      c.layout = l;
      out.push_back({suite, c});
    }
  return out;
}

// ---------------------------------------------------------------- the suite

TEST_P(BlockConformance, EveryVariantMatchesTheReference) {
  const Suite& suite = *GetParam().suite;
  const Case& c = GetParam().c;
  if (const std::string why = suite.platform.unavailable(); !why.empty()) GTEST_SKIP() << why;
  Problem pb;
  pb.ranks = suite.ranks->size(c.ranks);
  pb.cfg = case_config(c, pb.ranks);
  pb.batch = c.batch;
  pb.seq = case_seq(c, pb.ranks);
  const double tol = suite.platform.tolerance(c.dtype);
  for (AttentionKernel kernel : kernels_for(c.layout)) {
    if (c.kernel && kernel != *c.kernel) continue;
    const std::string tag = case_tag(c, pb.ranks) + "_" + kernel_name(kernel);
    const GlobalResult& ref = reference(pb.cfg, kernel, pb.batch, pb.seq);
    std::map<std::string, Outcome> runs;
    for (const Variant& v : variants_for(c.layout)) {
      const std::string what = tag + "_" + v.name();
      BlockOptions opts = v.options(c.layout, kernel, c.dtype);
      const Outcome blocking = run_variant(suite, pb, opts, ref);
      expect_matches_reference(suite.platform, blocking, c.dtype, tol, what);
      expect_measurement(suite.platform, pb, opts, blocking, what);
      opts.overlap = true;
      const Outcome overlapped = run_variant(suite, pb, opts, ref);
      expect_overlap_is_blocking(overlapped, blocking, what);
      if (suite.platform.plan_exact) expect_measurement(suite.platform, pb, opts, overlapped, what + " (overlap)");
      runs.emplace(v.name(), blocking);
    }
    expect_forms_agree(pb, c.layout, tol, runs, tag);
    // At P = 1 the all-gather of all_gather and the all-to-alls of a2a are copies: LAGA's bits are the same.
    if (pb.ranks == 1 && c.layout == Layout::AllGather) {
      const Variant laga{.form = Form::Laga};
      expect_same_bits(runs.at(laga.name()), run_variant(suite, pb, laga.options(Layout::A2A, kernel, c.dtype), ref),
                       tag + ": laga in all_gather against laga in a2a");
    }
  }
}

// ---------------------------------------------------------------- bad input

namespace {

// Forwards to the block's communicator and counts every collective, to prove that none was entered.
class SpyCommunicator final : public Communicator {
 public:
  explicit SpyCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* name() const override { return "spy"; }
  void all_gather(const void* s, void* r, std::size_t n, DType t) override { ++calls, inner_.all_gather(s, r, n, t); }
  void reduce_scatter(const void* s, void* r, std::size_t n, DType t) override {
    ++calls, inner_.reduce_scatter(s, r, n, t);
  }
  void all_to_all(const void* s, void* r, std::size_t n, DType t) override { ++calls, inner_.all_to_all(s, r, n, t); }
  void all_reduce(void* b, std::size_t n, DType t) override { ++calls, inner_.all_reduce(b, n, t); }
  void ring_shift(const void* s, void* r, std::size_t n, DType t) override { ++calls, inner_.ring_shift(s, r, n, t); }
  void barrier() override { ++calls, inner_.barrier(); }
  int calls = 0;

 private:
  Communicator& inner_;
};

struct BadInput {
  std::string what;
  MlaConfig cfg;
  BlockOptions opts;
  std::int64_t seq;
  std::vector<std::string> message_contains;  // the value and the rule
};

std::vector<BadInput> bad_inputs(const MlaConfig& cfg, int P, DType dtype) {
  BlockOptions laga_a2a{.form = Form::Laga, .layout = Layout::A2A, .dtype = dtype};
  BlockOptions laga_ag{.form = Form::Laga, .layout = Layout::AllGather, .dtype = dtype};
  MlaConfig odd_heads = cfg;
  odd_heads.num_attention_heads = P + 1;  // never divisible by P >= 2
  const std::string sp = "sp = " + std::to_string(P);
  std::vector<BadInput> v;
  v.push_back({"S not divisible by P", cfg, laga_ag, 8 * P + 1,
               {"seq = " + std::to_string(8 * P + 1), "not divisible by " + sp}});
  v.push_back({"P > S", cfg, laga_ag, P - 1, {sp, "> seq = " + std::to_string(P - 1), "P <= S"}});
  v.push_back({"heads not divisible by P (a2a)", odd_heads, laga_a2a, 8 * P,
               {"num_attention_heads = " + std::to_string(P + 1), "not divisible by " + sp, "a2a"}});
  v.push_back({"recompute without laga", cfg,
               BlockOptions{.form = Form::Explicit, .layout = Layout::A2A, .recompute = Recompute::KV, .dtype = dtype},
               8 * P, {"recompute = kv", "explicit", "laga"}});
  v.push_back({"p2p with the eager kernel", cfg,
               BlockOptions{.form = Form::Laga, .layout = Layout::P2P, .kernel = AttentionKernel::Eager, .dtype = dtype},
               8 * P, {"kernel = eager with layout = p2p", "fused"}});
  v.push_back({"p2p with a sequence not in 2P chunks", cfg,
               BlockOptions{.form = Form::Laga, .layout = Layout::P2P, .dtype = dtype}, 3 * P,
               {"not divisible by 2 x sp", "p2p"}});
  return v;
}

// Every rank's string (up to 512 characters), in rank order. A collective over host buffers.
std::vector<std::string> gather_strings(Communicator& host, const std::string& mine) {
  constexpr std::size_t N = 512;
  std::vector<double> send(N, 0.0);
  for (std::size_t i = 0; i < mine.size() && i < N; ++i) send[i] = double((unsigned char)mine[i]);
  const std::vector<double> recv = gather_all(host, send);
  std::vector<std::string> out(std::size_t(host.size()));
  for (std::size_t p = 0; p < out.size(); ++p)
    for (std::size_t i = 0; i < N && recv[p * N + i] != 0; ++i) out[p] += char(recv[p * N + i]);
  return out;
}

struct Refusal {
  bool refused = false;
  int collectives = 0;
  std::string message;
  std::vector<std::string> every_rank;  // the message of each rank
};

}  // namespace

TEST_P(BlockRefusals, OnEveryRankWithTheSameMessageBeforeAnyCollective) {
  const Suite& suite = *GetParam().suite;
  const Case& c = GetParam().c;
  if (const std::string why = suite.platform.unavailable(); !why.empty()) GTEST_SKIP() << why;
  const int P = suite.ranks->size(c.ranks);
  ASSERT_GE(P, 2) << "the refusals are those of P >= 2";
  Case a2a = c;
  a2a.layout = Layout::A2A;
  const std::vector<BadInput> bad = bad_inputs(case_config(a2a, P), P, c.dtype);
  std::vector<std::vector<Refusal>> got(bad.size(), std::vector<Refusal>(std::size_t(P)));
  suite.ranks->run(P, [&](int rank, Communicator& host) {
    std::unique_ptr<Backend> be = suite.platform.make_backend(rank);
    std::unique_ptr<Communicator> own = suite.platform.make_comm ? suite.platform.make_comm(host, *be) : nullptr;
    for (std::size_t i = 0; i < bad.size(); ++i) {
      Refusal& r = got[i][std::size_t(rank)];
      SpyCommunicator spy(own ? *own : host);
      try {
        const BlockShape shape{.batch = c.batch, .seq = bad[i].seq, .ranks = P, .rank = rank};
        run_rank(bad[i].cfg, bad[i].opts, shape, *be, spy, kSeed);
      } catch (const InvalidArgument& e) {
        r.refused = true;
        r.message = e.what();
      } catch (const std::exception& e) {
        r.message = std::string("wrong exception type: ") + e.what();
      }
      r.collectives = spy.calls;
      // The same message on every rank (this gather also shows that no rank is stuck in a collective).
      r.every_rank = gather_strings(host, r.message);
    }
  });
  for (std::size_t i = 0; i < bad.size(); ++i)
    for (int rank = 0; rank < P; ++rank) {
      const Refusal& r = got[i][std::size_t(rank)];
      if (r.every_rank.empty()) continue;  // a rank of another process
      SCOPED_TRACE(bad[i].what + ", rank " + std::to_string(rank));
      EXPECT_TRUE(r.refused) << r.message;
      EXPECT_EQ(r.collectives, 0) << "a collective was entered before the refusal";
      for (const auto& part : bad[i].message_contains) EXPECT_NE(r.message.find(part), std::string::npos) << r.message;
      for (int p = 0; p < P; ++p) EXPECT_EQ(r.every_rank[std::size_t(p)], r.message) << "rank " << p << "'s message";
    }
}

}  // namespace laga::conformance
