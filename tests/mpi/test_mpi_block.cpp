// The MLA block on real MPI ranks (mpirun -np 2, 4, 8; tests/mpi/CMakeLists.txt). Every rank runs every
// test. For each layout x variant (explicit, absorbed mqa, absorbed expanded, laga, laga recompute kv) x
// kernel (eager, fused), float32:
//   - run_rank on the MPI communicator, gather_result, compare with reference_result computed on this
//     process alone (P = 1, same kernel): y, dx and every weight gradient within 1e-5 relative;
//   - the collectives this rank issued (RankRun::traffic) equal a closed form written here from
//     DESIGN.md section 3, and the library's own formula (expected_traffic) and plan (plan_rank);
//   - LAGA agrees with explicit at the same P; LAGA with K/V recomputation is bit-identical to LAGA and
//     keeps fewer bytes for backward;
//   - bad input is refused on every rank, with the same message, before any collective.
// Collectives are always called on every rank before assertions (no ASSERT that could return on one rank
// only); a rank that throws where the others would wait in a collective aborts the job instead of hanging.
// main() is in test_mpi_comm.cpp; its exit code is the AND over ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <tuple>
#include <map>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include "laga/backend.hpp"
#include "laga/block.hpp"
#include "laga/comm.hpp"
#include "laga/config.hpp"
#include "laga/errors.hpp"
#include "laga/mpi_comm.hpp"
#include "laga/plan.hpp"
#include "laga/problem.hpp"

namespace {

using namespace laga;

constexpr double kTolerance = 1e-5;  // float32, relative Frobenius
constexpr std::int64_t kBatch = 2;
constexpr std::uint64_t kSeed = 11;

// ---------------------------------------------------------------- what is run

const Variant kExplicit{.form = Form::Explicit};
const Variant kLaga{.form = Form::Laga};
const Variant kLagaRecompute{.form = Form::Laga, .recompute = Recompute::KV};

std::vector<Variant> all_variants() {
  return {kAllVariants.begin(), kAllVariants.end()};
}

struct Case {
  Layout layout = Layout::A2A;
  Variant variant;
  AttentionKernel kernel = AttentionKernel::fused;
  DType dtype = DType::f32;
  bool overlap = false;
  BlockOptions options() const {
    return BlockOptions{.form = variant.form, .layout = layout, .kernel = kernel, .recompute = variant.recompute,
                        .absorbed_attention = variant.absorbed, .dtype = dtype, .overlap = overlap};
  }
  std::string name() const {
    return std::string(layout_name(layout)) + "_" + variant.name() + "_" + kernel_name(kernel) +
           (dtype == DType::f32 ? "" : "_f64") + (overlap ? "_overlap" : "");
  }
};

// gtest prints parameters by name rather than as bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (Layout l : kAllLayouts)
    for (const Variant& v : all_variants())
      for (AttentionKernel k : kAllKernels) out.push_back(Case{l, v, k});
  for (const Variant& v : {kExplicit, kLaga}) out.push_back(Case{Layout::P2P, v, AttentionKernel::fused});
  return out;
}

int world_size() {
  static const int size = make_mpi_communicator()->size();
  return size;
}

// `tiny` (4 heads) when a2a can split its heads over P ranks, else tiny with P heads (P = 8).
MlaConfig config_for(int P) {
  MlaConfig c = preset("tiny");
  if (c.num_attention_heads % P != 0) {
    c.num_attention_heads = P;
    c.name = "tiny_" + std::to_string(P) + "_heads";
  }
  validate(c);
  return c;
}
std::int64_t seq_for(int P) { return 8 * P; }

// ---------------------------------------------------------------- running

// One rank's run of one case and the gathered global result. The backend outlives the run's tensors.
struct Outcome {
  std::unique_ptr<Backend> be;
  RankRun run;
  GlobalResult global;
  std::vector<double> local_raw;  // this rank's y, dx and gradients, for bit-identity checks
};

// A rank that throws here would leave the others in a collective: end the job rather than hang.
template <typename F>
auto or_abort(int rank, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s threw: %s; aborting every rank\n", rank, what.c_str(), e.what());
    std::fflush(nullptr);
    MpiSession::abort(1);
  }
}

std::shared_ptr<Outcome> run_case(const Case& c, Communicator& comm) {
  auto out = std::make_shared<Outcome>();
  const int P = comm.size();
  const BlockShape shape{.batch = kBatch, .seq = seq_for(P), .ranks = P, .rank = comm.rank()};
  or_abort(comm.rank(), c.name(), [&] {
    out->be = make_cpu_backend();
    out->run = run_rank(config_for(P), c.options(), shape, *out->be, comm, kSeed);
    out->global = gather_result(*out->be, comm, out->run);
    auto append = [&](const Tensor& t) {
      const std::vector<double> v = to_host(*out->be, t);
      out->local_raw.insert(out->local_raw.end(), v.begin(), v.end());
    };
    append(out->run.y);
    append(out->run.dx);
    for (const auto& [name, t] : out->run.grads.named()) append(*t);
    return 0;
  });
  return out;
}

// Runs are cached per process (every rank runs the same tests in the same order, so the caches agree).
std::shared_ptr<Outcome> outcome(const Case& c) {
  static std::map<std::string, std::shared_ptr<Outcome>> cache;
  auto& slot = cache[c.name()];
  if (!slot) {
    auto comm = make_mpi_communicator();
    slot = run_case(c, *comm);
  }
  return slot;
}

// The single-rank explicit result with the same kernel, on this process alone (no communication).
const GlobalResult& reference(AttentionKernel kernel) {
  static std::map<AttentionKernel, GlobalResult> cache;
  auto it = cache.find(kernel);
  if (it != cache.end()) return it->second;
  const int P = world_size();
  auto be = make_cpu_backend();
  GlobalResult ref = reference_result(config_for(P), DType::f32, kernel, kBatch, seq_for(P), *be, kSeed);
  return cache.emplace(kernel, std::move(ref)).first->second;
}

// ---------------------------------------------------------------- the closed form (DESIGN.md section 3)

// What this rank's CountingCommunicator must record, in call order, written from the design rather than
// from block.cpp's chunk arithmetic:
//   a2a:  a per-head tensor of width w per head has s*B*n_h*w values on this rank; (P-1)/P of them leave
//         (and as many arrive). explicit: q, k, v in, o out; laga/absorbed: q in, the latent all-gathered,
//         o out. Backward answers each all-to-all with an all-to-all (o, then k, v or the latent's
//         reduce-scatter, then q).
//   all_gather: queries stay; explicit gathers per-head K and V (every other rank receives this rank's
//         s*B*n_h*w values), laga/absorbed gather the latent (s*B*(r_kv + d_r)). Backward reduce-scatters.
std::vector<CollectiveRecord> design_traffic(const MlaConfig& cfg, const BlockOptions& opts, const BlockShape& sh) {
  const std::size_t P = std::size_t(sh.ranks), s = std::size_t(sh.seq / sh.ranks), B = std::size_t(sh.batch);
  const std::size_t e = dtype_size(opts.dtype), nh = std::size_t(cfg.num_attention_heads);
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
  auto gathered = [&](std::size_t width) { return (P - 1) * s * B * width * e; };

  // p2p: this rank's s*B*width values go round the ring, P-1 shifts in forward and again in backward, and
  // the gradient's accumulator P shifts back to its owner (float32 here: no wider accumulation dtype).
  auto ring = [&](Phase ph, const char* t, std::size_t width, std::size_t shifts) {
    if (P > 1) out.push_back(CollectiveRecord{ph, CollectiveKind::ring_shift, t, shifts * s * B * width * e,
                                              shifts * s * B * width * e, int(shifts)});
  };
  if (opts.layout == Layout::P2P) {
    if (latent) {
      ring(Phase::forward, "kv_latent", latent_w, P - 1);
      ring(Phase::backward, "kv_latent_resend", latent_w, P - 1);
      ring(Phase::backward, "kv_latent", latent_w, P);
    } else {
      ring(Phase::forward, "k", nh * k_w, P - 1);
      ring(Phase::forward, "v", nh * v_w, P - 1);
      ring(Phase::backward, "k_resend", nh * k_w, P - 1);
      ring(Phase::backward, "v_resend", nh * v_w, P - 1);
      ring(Phase::backward, "k", nh * k_w, P);
      ring(Phase::backward, "v", nh * v_w, P);
    }
  } else if (opts.layout == Layout::A2A) {
    add(Phase::forward, CollectiveKind::all_to_all, "q", a2a(q_w));
    if (latent) {
      add(Phase::forward, CollectiveKind::all_gather, "kv_latent", gathered(latent_w));
    } else {
      add(Phase::forward, CollectiveKind::all_to_all, "k", a2a(k_w));
      add(Phase::forward, CollectiveKind::all_to_all, "v", a2a(v_w));
    }
    add(Phase::forward, CollectiveKind::all_to_all, "o", a2a(o_w));
    add(Phase::backward, CollectiveKind::all_to_all, "o", a2a(o_w));
    if (latent) {
      add(Phase::backward, CollectiveKind::reduce_scatter, "kv_latent", gathered(latent_w));
    } else {
      add(Phase::backward, CollectiveKind::all_to_all, "k", a2a(k_w));
      add(Phase::backward, CollectiveKind::all_to_all, "v", a2a(v_w));
    }
    add(Phase::backward, CollectiveKind::all_to_all, "q", a2a(q_w));
  } else if (latent) {
    add(Phase::forward, CollectiveKind::all_gather, "kv_latent", gathered(latent_w));
    add(Phase::backward, CollectiveKind::reduce_scatter, "kv_latent", gathered(latent_w));
  } else {
    add(Phase::forward, CollectiveKind::all_gather, "k", gathered(nh * k_w));
    add(Phase::forward, CollectiveKind::all_gather, "v", gathered(nh * v_w));
    add(Phase::backward, CollectiveKind::reduce_scatter, "k", gathered(nh * k_w));
    add(Phase::backward, CollectiveKind::reduce_scatter, "v", gathered(nh * v_w));
  }
  return out;
}

std::string records_string(const std::vector<CollectiveRecord>& v) {
  std::string s;
  for (const auto& r : v)
    s += std::string(phase_name(r.phase)) + " " + collective_name(r.kind) + " " + r.tensor + " x" +
         std::to_string(r.calls) + " sent " + std::to_string(r.bytes_sent) + " recv " +
         std::to_string(r.bytes_received) + "\n";
  return s;
}

void expect_same_traffic(const std::vector<CollectiveRecord>& got, const std::vector<CollectiveRecord>& want,
                         const std::string& what) {
  EXPECT_EQ(records_string(got), records_string(want)) << what;
}

// ---------------------------------------------------------------- agreement between ranks

// Every rank's copy of `mine` (strings up to 512 characters), in rank order. A collective.
std::vector<std::string> gather_strings(Communicator& comm, const std::string& mine) {
  constexpr std::size_t N = 512;
  std::vector<double> send(N, 0.0), recv(N * comm.size());
  for (std::size_t i = 0; i < mine.size() && i < N; ++i) send[i] = double((unsigned char)mine[i]);
  comm.all_gather(send.data(), recv.data(), N, DType::f64);
  std::vector<std::string> out(comm.size());
  for (int p = 0; p < comm.size(); ++p)
    for (std::size_t i = 0; i < N && recv[p * N + i] != 0; ++i) out[p] += char(recv[p * N + i]);
  return out;
}

// Every rank's vector of doubles (all of the same length), in rank order. A collective.
std::vector<std::vector<double>> gather_doubles(Communicator& comm, const std::vector<double>& mine) {
  std::vector<double> recv(mine.size() * comm.size());
  comm.all_gather(mine.data(), recv.data(), mine.size(), DType::f64);
  std::vector<std::vector<double>> out;
  for (int p = 0; p < comm.size(); ++p)
    out.emplace_back(recv.begin() + p * mine.size(), recv.begin() + (p + 1) * mine.size());
  return out;
}

// ---------------------------------------------------------------- results vs the single-rank reference

class MpiBlock : public ::testing::TestWithParam<Case> {};

TEST_P(MpiBlock, MatchesSingleRankReferenceAndCountsTheDesignTraffic) {
  const Case c = GetParam();
  const int P = world_size();
  const MlaConfig cfg = config_for(P);
  auto comm = make_mpi_communicator();
  const BlockShape shape{.batch = kBatch, .seq = seq_for(P), .ranks = P, .rank = comm->rank()};
  std::shared_ptr<Outcome> o = outcome(c);
  const GlobalResult& ref = reference(c.kernel);

  // Output, input gradient and every weight gradient against the single-rank reference.
  const std::vector<Comparison> cmp = compare(o->global, ref);
  ASSERT_EQ(cmp.size(), 2 + o->run.grads.named().size());
  std::vector<double> errors;
  for (const auto& e : cmp) {
    EXPECT_LE(e.rel_error, kTolerance) << c.name() << ": " << e.tensor << " at P = " << P;
    errors.push_back(e.rel_error);
  }
  // Every rank holds the same global result, hence the same verdict.
  const auto all_errors = gather_doubles(*comm, errors);
  for (int p = 0; p < P; ++p) EXPECT_EQ(all_errors[p], errors) << "rank " << p << " computed other errors";

  // Traffic: the closed form from the design, the library's formula, and the plan.
  const std::vector<CollectiveRecord> want = design_traffic(cfg, c.options(), shape);
  expect_same_traffic(o->run.traffic, want, c.name() + ": traffic vs DESIGN.md closed form");
  expect_same_traffic(expected_traffic(cfg, c.options(), shape), want, c.name() + ": laga::expected_traffic");
  const RankPlan plan = plan_rank(cfg, c.options(), shape);
  expect_same_traffic(plan.traffic, want, c.name() + ": plan_rank traffic");
  EXPECT_EQ(plan.saved_bytes, o->run.saved_bytes) << c.name() << ": plan_rank's saved bytes vs the run's";
}

INSTANTIATE_TEST_SUITE_P(Mpi, MpiBlock, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

// ---------------------------------------------------------------- the forms among themselves at the same P

struct LayoutKernel {
  Layout layout;
  AttentionKernel kernel;
};

void PrintTo(const LayoutKernel& p, std::ostream* os) { *os << layout_name(p.layout) << "_" << kernel_name(p.kernel); }

class MpiForms : public ::testing::TestWithParam<LayoutKernel> {};

TEST_P(MpiForms, LagaMatchesExplicitAndRecomputeIsBitIdenticalWithFewerSavedBytes) {
  const auto [layout, kernel] = GetParam();
  const int P = world_size();
  auto ex = outcome(Case{layout, kExplicit, kernel});
  auto lg = outcome(Case{layout, kLaga, kernel});
  auto rc = outcome(Case{layout, kLagaRecompute, kernel});

  // LAGA vs explicit at the same P.
  for (const auto& e : compare(lg->global, ex->global))
    EXPECT_LE(e.rel_error, kTolerance) << "laga vs explicit, " << e.tensor << " at P = " << P;

  // Recompute: the same bits on this rank and in the global result.
  EXPECT_TRUE(rc->local_raw == lg->local_raw) << "laga recompute kv differs from laga on this rank";
  EXPECT_TRUE(rc->global.y == lg->global.y);
  EXPECT_TRUE(rc->global.dx == lg->global.dx);
  ASSERT_EQ(rc->global.grads.size(), lg->global.grads.size());
  for (std::size_t i = 0; i < rc->global.grads.size(); ++i)
    EXPECT_TRUE(rc->global.grads[i].second == lg->global.grads[i].second) << "gradient " << rc->global.grads[i].first;

  // ... while keeping fewer bytes: the gathered latent instead of per-head K and V.
  EXPECT_LT(rc->run.saved_bytes, lg->run.saved_bytes);
  auto has = [](const RankRun& r, const std::string& name) {
    for (const auto& s : r.saved)
      if (s.name == name) return true;
    return false;
  };
  EXPECT_TRUE(has(lg->run, "k_att") && has(lg->run, "v_att"));
  EXPECT_FALSE(has(rc->run, "k_att") || has(rc->run, "v_att"));
  EXPECT_TRUE(has(rc->run, "latent_gathered"));
  expect_same_traffic(rc->run.traffic, lg->run.traffic, "recompute moves what laga moves");

  // In the all_gather layout LAGA moves the latent (r_kv + d_r per token) instead of per-head K and V
  // (n_h (d_qk + d_v) per token): less at any P. (In a2a the latent's all-gather grows with P while
  // explicit's all-to-all does not: tiny at P = 4 moves exactly as much either way.)
  if (layout == Layout::AllGather) {
    std::size_t ex_sent = 0, lg_sent = 0;
    for (const auto& r : ex->run.traffic) ex_sent += r.bytes_sent;
    for (const auto& r : lg->run.traffic) lg_sent += r.bytes_sent;
    EXPECT_LT(lg_sent, ex_sent);
  }
}

// ---------------------------------------------------------------- collectives under compute

// BlockOptions::overlap starts each collective (nonblocking MPI) before the compute that does not need it:
// the same bits on every rank as the blocking order, in float32 and float64, and the same collectives.
class MpiOverlap : public ::testing::TestWithParam<Case> {};

TEST_P(MpiOverlap, BitwiseTheBlockingResult) {
  Case c = GetParam();
  auto blocking = outcome(c);
  c.overlap = true;
  auto overlapped = outcome(c);
  EXPECT_TRUE(overlapped->local_raw == blocking->local_raw) << "overlap changed this rank's result";
  EXPECT_TRUE(overlapped->global.y == blocking->global.y);
  EXPECT_TRUE(overlapped->global.dx == blocking->global.dx);
  EXPECT_TRUE(overlapped->global.grads == blocking->global.grads);
  auto sorted = [](std::vector<CollectiveRecord> v) {
    std::sort(v.begin(), v.end(), [](const CollectiveRecord& a, const CollectiveRecord& b) {
      return std::tie(a.phase, a.kind, a.tensor) < std::tie(b.phase, b.kind, b.tensor);
    });
    return v;
  };
  expect_same_traffic(sorted(overlapped->run.traffic), sorted(blocking->run.traffic), "overlap moves the same bytes");
}

// The ring in float64: explicit and LAGA against the single-rank explicit result in float64 (~1e-12: the ring
// only reorders sums), and against each other.
TEST(MpiRing, Float64MatchesSingleRankReference) {
  const int P = world_size();
  auto be = make_cpu_backend();
  const GlobalResult ref = reference_result(config_for(P), DType::f64, AttentionKernel::fused, kBatch, seq_for(P), *be,
                                            kSeed);
  std::vector<std::shared_ptr<Outcome>> runs;
  for (const Variant& v : {kExplicit, kLaga}) {
    runs.push_back(outcome(Case{Layout::P2P, v, AttentionKernel::fused, DType::f64}));
    for (const auto& e : compare(runs.back()->global, ref))
      EXPECT_LE(e.rel_error, 1e-12) << v.name() << ": " << e.tensor << " at P = " << P;
  }
  for (const auto& e : compare(runs[1]->global, runs[0]->global))
    EXPECT_LE(e.rel_error, 1e-12) << "laga vs explicit: " << e.tensor << " at P = " << P;
}

std::vector<Case> overlap_cases() {
  std::vector<Case> out;
  for (DType dt : {DType::f32, DType::f64})
    for (Layout l : kAllLayouts)
      for (const Variant& v : all_variants())
        for (AttentionKernel k : kAllKernels)
          if (dt == DType::f32 || k == AttentionKernel::fused) out.push_back(Case{l, v, k, dt});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Mpi, MpiOverlap, ::testing::ValuesIn(overlap_cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name(); });

INSTANTIATE_TEST_SUITE_P(
    Mpi, MpiForms,
    ::testing::Values(LayoutKernel{Layout::A2A, AttentionKernel::eager}, LayoutKernel{Layout::A2A, AttentionKernel::fused},
                      LayoutKernel{Layout::AllGather, AttentionKernel::eager},
                      LayoutKernel{Layout::AllGather, AttentionKernel::fused}),
    [](const ::testing::TestParamInfo<LayoutKernel>& i) {
      return std::string(layout_name(i.param.layout)) + "_" + kernel_name(i.param.kernel);
    });

// ---------------------------------------------------------------- bad input

// Forwards to MPI and counts every collective, to prove that none was entered.
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

std::vector<BadInput> bad_inputs(int P) {
  const MlaConfig cfg = config_for(P);
  BlockOptions laga_a2a{.form = Form::Laga, .layout = Layout::A2A, .dtype = DType::f32};
  BlockOptions laga_ag{.form = Form::Laga, .layout = Layout::AllGather, .dtype = DType::f32};
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
               BlockOptions{.form = Form::Explicit, .layout = Layout::A2A, .recompute = Recompute::KV,
                            .dtype = DType::f32},
               8 * P, {"recompute = kv", "explicit", "laga"}});
  v.push_back({"p2p with the eager kernel", cfg,
               BlockOptions{.form = Form::Laga, .layout = Layout::P2P, .kernel = AttentionKernel::eager,
                            .dtype = DType::f32},
               8 * P, {"kernel = eager with layout = p2p", "fused"}});
  v.push_back({"p2p with a sequence not in 2P chunks", cfg,
               BlockOptions{.form = Form::Laga, .layout = Layout::P2P, .dtype = DType::f32}, 3 * P,
               {"not divisible by 2 x sp", "p2p"}});
  return v;
}

TEST(MpiBlockBadInput, RefusedOnEveryRankWithTheSameMessageBeforeAnyCollective) {
  auto mpi = make_mpi_communicator();
  const int P = mpi->size();
  for (const BadInput& bad : bad_inputs(P)) {
    SCOPED_TRACE(bad.what);
    SpyCommunicator spy(*mpi);
    auto be = make_cpu_backend();
    const BlockShape shape{.batch = kBatch, .seq = bad.seq, .ranks = P, .rank = mpi->rank()};
    std::string message;
    bool refused = false;
    try {
      run_rank(bad.cfg, bad.opts, shape, *be, spy, kSeed);
    } catch (const InvalidArgument& e) {
      refused = true;
      message = e.what();
    } catch (const std::exception& e) {
      message = std::string("wrong exception type: ") + e.what();
    }
    EXPECT_TRUE(refused) << message;
    EXPECT_EQ(spy.calls, 0) << "a collective was entered before the refusal";
    for (const auto& part : bad.message_contains) EXPECT_NE(message.find(part), std::string::npos) << message;
    // The same message on every rank (this gather also shows that no rank is stuck in a collective).
    const auto all = gather_strings(*mpi, message);
    for (int p = 0; p < P; ++p) EXPECT_EQ(all[p], message) << "rank " << p;
  }
  mpi->barrier();
}

}  // namespace
