// The GEMM probe (include/laga/gemm_probe.hpp): it sees every GEMM the block issues and no other, leaves the
// results bit for bit, keeps its own marks and the block's Timer marks working across reset_marks(), and
// time_gemms_alone() runs each distinct recorded GEMM alone with the recorded arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <map>
#include <stdexcept>
#include <tuple>

#include "laga/bench.hpp"
#include "laga/errors.hpp"
#include "laga/gemm_probe.hpp"
#include "laga/problem.hpp"

namespace laga {
namespace {

constexpr std::int64_t kSeq = 16;

MlaConfig tiny() { return preset("tiny"); }

// GEMM FLOPs of a pass as the block counts them: everything but attention's kernel (which is not a GEMM call).
double gemm_flops(const PassStats& s) { return s.total_flops() - s.flops[int(OpPhase::Attention)]; }

struct PassSums {
  double flops = 0, seconds = 0;
  int calls = 0;
};

// Rank `rank` of `ranks` (phantom when ranks > 1) through the probe over a fresh CPU backend.
struct ProbedRun {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  GemmProbeBackend probe{*cpu};
  RankRun run;
  ProbedRun(const BlockOptions& opts, int ranks, int rank) {
    auto comm = ranks == 1 ? make_single_rank_communicator(*cpu) : make_phantom_communicator(*cpu, rank, ranks);
    run = run_rank(tiny(), opts, BlockShape{.batch = 1, .seq = kSeq, .ranks = ranks, .rank = rank}, probe, *comm, 3);
  }
};

TEST(GemmProbe, RecordsExactlyTheGemmsTheBlockCounts) {
  for (const Variant& v : kAllVariants)
    for (Layout layout : kAllLayouts)
      for (AttentionKernel kernel : kAllKernels)
        for (int ranks : {1, 2}) {
          SCOPED_TRACE(std::string(v.label()) + " " + layout_name(layout) + " " + kernel_name(kernel) + " P=" +
                       std::to_string(ranks));
          ProbedRun r(v.options(layout, kernel, DType::F32), ranks, ranks - 1);
          const std::vector<GemmRecord>& recs = r.probe.records();
          ASSERT_FALSE(recs.empty());
          std::array<PassSums, 2> sums{};
          for (const GemmRecord& rec : recs) {
            ASSERT_TRUE(rec.pass == 0 || rec.pass == 1) << "pass " << rec.pass << ": run_rank makes two";
            PassSums& s = sums[rec.pass];
            EXPECT_EQ(rec.index_in_pass, s.calls) << "issue order within the pass";
            EXPECT_GE(rec.seconds, 0.0);
            s.flops += rec.key.flops();
            s.seconds += rec.seconds;
            ++s.calls;
          }
          // Every GEMM the block counted, and only those: the FLOPs agree exactly (small integers in doubles).
          EXPECT_EQ(sums[0].flops, gemm_flops(r.run.fwd));
          EXPECT_EQ(sums[1].flops, gemm_flops(r.run.bwd));
          EXPECT_GT(sums[1].calls, sums[0].calls) << "backward has a dx and a dW GEMM for each forward product";
          // Each GEMM lies inside one of the block's Timer intervals, so their times cannot exceed the pass's.
          EXPECT_LE(sums[0].seconds, r.run.fwd.total_seconds() + 1e-9);
          EXPECT_LE(sums[1].seconds, r.run.bwd.total_seconds() + 1e-9);
        }
}

TEST(GemmProbe, ExplicitForwardIssuesSixGemmsByHand) {
  // src/mla/block.cpp forward, explicit at P = 1: x W_DQ, c_q W_UQ, x W_DKV, the K and V up-projections (a
  // batched GEMM over the heads each: kv_b_proj interleaves the heads' K and V rows), o W_O.
  ProbedRun r(Variant{Form::Explicit}.options(Layout::A2A, AttentionKernel::Fused, DType::F32), 1, 0);
  const MlaConfig c = tiny();
  const std::int64_t T = kSeq, nh = c.num_attention_heads, dqk = c.qk_head_dim(), dl = c.latent_dim();
  std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>> want = {
      {T, *c.q_lora_rank, c.hidden_size, 1},
      {T, nh * dqk, *c.q_lora_rank, 1},
      {T, dl, c.hidden_size, 1},
      {T, c.qk_nope_head_dim, c.kv_lora_rank, nh},
      {T, c.v_head_dim, c.kv_lora_rank, nh},
      {T, c.hidden_size, nh * c.v_head_dim, 1}};
  std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>> got;
  for (const GemmRecord& rec : r.probe.records())
    if (rec.pass == 0) got.emplace_back(rec.key.m, rec.key.n, rec.key.k, rec.key.batch);
  EXPECT_EQ(got, want);
}

TEST(GemmProbe, ForwardingLeavesResultsBitIdentical) {
  for (const Variant& v : kAllVariants)
    for (Layout layout : kAllLayouts) {
      SCOPED_TRACE(std::string(v.label()) + " " + layout_name(layout));
      const BlockOptions opts = v.options(layout, AttentionKernel::Fused, DType::F32);
      auto plain_be = make_cpu_backend();
      auto single = make_single_rank_communicator(*plain_be);
      const RankRun plain = run_rank(tiny(), opts, BlockShape{.batch = 1, .seq = kSeq}, *plain_be, *single, 3);
      ProbedRun probed(opts, 1, 0);
      EXPECT_EQ(to_host(*probed.cpu, probed.run.y), to_host(*plain_be, plain.y));
      EXPECT_EQ(to_host(*probed.cpu, probed.run.dx), to_host(*plain_be, plain.dx));
      const auto got = probed.run.grads.named();
      const auto want = plain.grads.named();
      ASSERT_EQ(got.size(), want.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(to_host(*probed.cpu, *got[i].second), to_host(*plain_be, *want[i].second)) << got[i].first;
      // The block's own accounting is unchanged by the probe.
      EXPECT_EQ(probed.run.fwd.flops, plain.fwd.flops);
      EXPECT_EQ(probed.run.bwd.flops, plain.bwd.flops);
      EXPECT_EQ(probed.run.saved_bytes, plain.saved_bytes);
      EXPECT_EQ(probed.run.bwd.peak_bytes, plain.bwd.peak_bytes);
    }
}

// A backend with a virtual clock: gemm() advances it by m, every other op is a no-op; marks are valid only
// until reset_marks() (as CUDA's reused events), and reading a forgotten one throws.
class ClockBackend final : public Backend {
 public:
  Device device() const override { return Device::Meta; }
  const char* name() const override { return "clock"; }
  Allocator& allocator() override { return alloc_; }
  void gemm(const GemmArgs& g) override { now_ += double(g.m); }
  void copy(const CopyArgs&) override {}
  void fill(const Tensor&, double) override {}
  void rmsnorm_forward(const RmsNormArgs&) override {}
  void rmsnorm_backward(const RmsNormArgs&) override {}
  void rope_forward(const RopeArgs&) override {}
  void rope_backward(const RopeArgs&) override {}
  void attention_forward(const AttentionFwdParams&) override { now_ += 1000; }
  void attention_backward(const AttentionBwdParams&) override {}
  void attention_merge(const AttentionMergeArgs&) override {}
  int mark() override {
    marks_.push_back(now_);
    return int(marks_.size()) - 1;
  }
  double elapsed(int a, int b) override {
    if (a < 0 || b < 0 || std::size_t(a) >= marks_.size() || std::size_t(b) >= marks_.size())
      throw std::out_of_range("mark read after reset_marks()");
    return marks_[b] - marks_[a];
  }
  void reset_marks() override { marks_.clear(); }

 private:
  MetaAllocator alloc_;
  double now_ = 0;
  std::vector<double> marks_;
};

TEST(GemmProbe, OwnMarksAndTheBlocksTimerMarksBothSurviveReset) {
  ClockBackend clock;
  GemmProbeBackend probe(clock);
  // Two passes as the block makes them: Timer marks around each op, read after synchronize(), then reset.
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<std::pair<int, int>> timer;
    for (std::int64_t m : {3, 5}) {
      const int start = probe.mark();
      probe.gemm(GemmArgs{.m = m, .n = 1, .k = 1});
      timer.emplace_back(start, probe.mark());
    }
    const int start = probe.mark();
    probe.attention_forward(AttentionFwdParams{});
    timer.emplace_back(start, probe.mark());
    probe.synchronize();
    EXPECT_EQ(probe.elapsed(timer[0].first, timer[0].second), 3.0);
    EXPECT_EQ(probe.elapsed(timer[1].first, timer[1].second), 5.0);
    EXPECT_EQ(probe.elapsed(timer[2].first, timer[2].second), 1000.0);
    probe.reset_marks();
  }
  const std::vector<GemmRecord>& recs = probe.records();
  ASSERT_EQ(recs.size(), 4u);
  for (std::size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].pass, int(i / 2));
    EXPECT_EQ(recs[i].index_in_pass, int(i % 2));
    EXPECT_EQ(recs[i].seconds, i % 2 == 0 ? 3.0 : 5.0) << "record " << i;
  }
  probe.clear();
  EXPECT_TRUE(probe.records().empty());
}

TEST(GemmProbe, OperandElementsFollowLeadingDimensionsAndStrides) {
  // A [m, k] = [4, 5] in rows of 7: 3 * 7 + 5; B^T stored [n, k] = [3, 5] in rows of 5; C [4, 3] in rows of 9.
  GemmKey g{.trans_b = Trans::Yes, .m = 4, .n = 3, .k = 5, .lda = 7, .ldb = 5, .ldc = 9};
  GemmOperandElements e = gemm_operand_elements(g);
  EXPECT_EQ(e.a, 26);
  EXPECT_EQ(e.b, 15);
  EXPECT_EQ(e.c, 30);
  // Batch of 3 interleaved heads (stride 2 < a matrix), A transposed [k, m] = [5, 4] in rows of 6, B shared.
  g = GemmKey{.trans_a = Trans::Yes, .m = 4, .n = 3, .k = 5, .batch = 3, .lda = 6, .stride_a = 2, .ldb = 3,
              .stride_b = 0, .ldc = 3, .stride_c = 12};
  e = gemm_operand_elements(g);
  EXPECT_EQ(e.a, 2 * 2 + 4 * 6 + 4);
  EXPECT_EQ(e.b, 4 * 3 + 3);
  EXPECT_EQ(e.c, 2 * 12 + 3 * 3 + 3);
}

using KeyTuple = std::tuple<int, int, int, int, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                            std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, double, double>;
KeyTuple as_tuple(const GemmKey& g) {
  return {int(g.dtype), int(g.c_dtype), int(g.trans_a), int(g.trans_b), g.m, g.n, g.k, g.batch, g.lda, g.stride_a,
          g.ldb, g.stride_b, g.ldc, g.stride_c, g.alpha, g.beta};
}

TEST(GemmProbe, TimesEachDistinctGemmAloneWithTheRecordedArguments) {
  const BlockOptions opts = Variant{Form::Laga}.options(Layout::A2A, AttentionKernel::Fused, DType::F32);
  auto cpu = make_cpu_backend();
  GemmProbeBackend probe(*cpu);
  auto single = make_single_rank_communicator(*cpu);
  for (int it = 0; it < 2; ++it)  // twice, so every GEMM occurs at least twice
    run_rank(tiny(), opts, BlockShape{.batch = 1, .seq = kSeq}, probe, *single, 3);
  const std::vector<GemmRecord> recs = probe.records();

  std::map<KeyTuple, std::vector<std::size_t>> distinct;  // derived here, not by the code under test
  std::vector<KeyTuple> first_issue;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    auto& occ = distinct[as_tuple(recs[i].key)];
    if (occ.empty()) first_issue.push_back(as_tuple(recs[i].key));
    occ.push_back(i);
  }

  // Run them alone through a second probe: it sees exactly warmup + repeats calls of each, as recorded.
  constexpr int kRepeats = 3, kWarmup = 1;
  GemmProbeBackend alone_probe(*cpu);
  const std::vector<GemmProbeResult> res = time_gemms_alone(alone_probe, recs, kRepeats, kWarmup);
  ASSERT_EQ(res.size(), distinct.size());
  std::map<KeyTuple, int> alone_calls;
  for (const GemmRecord& rec : alone_probe.records()) ++alone_calls[as_tuple(rec.key)];
  for (std::size_t i = 0; i < res.size(); ++i) {
    const GemmProbeResult& r = res[i];
    const KeyTuple key = as_tuple(r.key);
    EXPECT_EQ(key, first_issue[i]) << "results in first-issue order";
    EXPECT_EQ(r.occurrences, distinct[key]);
    EXPECT_EQ(r.occurrences.size() % 2, 0u);
    EXPECT_EQ(alone_calls[key], kRepeats + kWarmup);
    ASSERT_EQ(r.in_block_s.size(), r.occurrences.size());
    ASSERT_EQ(r.alone_s.size(), std::size_t(kRepeats));
    std::vector<double> in_block;
    for (std::size_t j : r.occurrences) in_block.push_back(recs[j].seconds);
    EXPECT_EQ(r.in_block_median, median(in_block));
    EXPECT_EQ(r.alone_median, median(r.alone_s));
    EXPECT_GT(r.in_block_median, 0.0);
    EXPECT_GT(r.alone_median, 0.0);
    EXPECT_DOUBLE_EQ(r.ratio(), r.in_block_median / r.alone_median);
    EXPECT_DOUBLE_EQ(r.alone_flops_per_s(), r.key.flops() / r.alone_median);
  }
  EXPECT_EQ(alone_probe.records().size(), res.size() * (kRepeats + kWarmup)) << "no other GEMM run alone";

  const GemmProbeSummary s = summarize_gemms(res);
  EXPECT_EQ(s.count, res.size());
  EXPECT_EQ(s.calls, recs.size());
  double in = 0, alone = 0, worst = 0;
  for (const GemmProbeResult& r : res) {
    in += double(r.occurrences.size()) * r.in_block_median;
    alone += double(r.occurrences.size()) * r.alone_median;
    worst = std::max(worst, r.ratio());
  }
  EXPECT_DOUBLE_EQ(s.time_weighted_ratio, in / alone);
  EXPECT_EQ(s.worst_ratio, worst);
  EXPECT_EQ(res[s.worst].ratio(), worst);
  EXPECT_EQ(s.within(0.10), in / alone <= 1.10);
}

TEST(GemmProbe, RejectsNoTimedRuns) {
  auto cpu = make_cpu_backend();
  EXPECT_THROW(time_gemms_alone(*cpu, {}, 0, 1), InvalidArgument);
  EXPECT_THROW(time_gemms_alone(*cpu, {}, 1, -1), InvalidArgument);
  EXPECT_TRUE(time_gemms_alone(*cpu, {}, 1, 0).empty());
}

}  // namespace
}  // namespace laga
