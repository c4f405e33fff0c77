// The MLA block at P = 2, 4, 8 ranks as threads of this process (run_thread_group): every form (absorbed
// mqa and expanded, laga with and without K/V recomputation), both layouts and both kernels, in float32,
// against the single-rank explicit result, and LAGA-family forms against explicit at the same P.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "block_test_util.hpp"
#include "laga/errors.hpp"

namespace {

using namespace laga;
using namespace laga::block_test;

// s = 8..32 tokens per rank: several RoPE offsets and causal-mask cases per rank. `small` runs batch 1 to
// keep the file fast (batch > 1 is covered by `tiny`).
constexpr std::int64_t kSeq = 64;
constexpr std::uint64_t kSeed = 11;

struct ParParam {
  bool small;  // preset `small` (8 heads, d_n != d_r, r_q != r_kv) instead of `tiny`
  int ranks;
  Layout layout;
  Variant variant;
  AttentionKernel kernel;
  // a2a needs n_h divisible by P: `tiny` (4 heads) up to P = 4, an 8-head `tiny` at P = 8. all_gather keeps
  // `tiny` at P = 8 (4 heads over 8 ranks is allowed there).
  std::int64_t batch() const { return small ? 1 : 2; }
  std::string config() const {
    if (small) return "small";
    return layout == Layout::A2A && ranks == 8 ? "tiny_8_heads" : "tiny";
  }
};
std::string par_name(const ParParam& p) {
  return std::string(p.small ? "small_" : "") + "P" + std::to_string(p.ranks) + "_" + layout_name(p.layout) + "_" +
         p.variant.name() + "_" + kernel_name(p.kernel) + "_f32";
}
void PrintTo(const ParParam& p, std::ostream* os) { *os << par_name(p) << " (" << p.config() << ")"; }

std::vector<ParParam> par_params() {
  std::vector<ParParam> out;
  // `small` only at P = 8 (one head per rank in a2a, 8 tokens per rank): it costs ~10x `tiny` per case, and
  // the in-process ranks share 2 cores with multi-threaded OpenBLAS.
  for (bool small : {false, true})
    for (int P : {2, 4, 8})
      for (Layout l : kAllLayouts)
        for (const Variant& v : all_variants())
          for (AttentionKernel k : kAllKernels)
            if (!small || P == 8) out.push_back({small, P, l, v, k});
  return out;
}

// DESIGN.md section 5: every form and layout at P = 2..8 matches the single-rank explicit result within 1e-5
// relative Frobenius error in float32 (outputs, dx and the weight gradients summed over ranks).
//   Tolerance 1e-5: float32 rounding is 6e-8 per operation; the forms and P only reorder sums of at most a
//   few hundred terms (GEMM k, softmax rows, the rank sum of gradients), which gives ~1e-7..1e-6 relative.
//   A mis-routed chunk, a wrong RoPE offset or causal mask, or a missing rank's gradient is O(1e-1..1).
class BlockParallel : public ::testing::TestWithParam<ParParam> {};

TEST_P(BlockParallel, MatchesSingleRankExplicitAndExplicitAtSameP) {
  const ParParam& p = GetParam();
  const MlaConfig cfg = config_by_name(p.config());
  const BlockOptions opts = p.variant.options(p.layout, p.kernel, DType::f32);

  auto ref_backend = make_cpu_backend();
  const GlobalResult ref = reference_result(cfg, DType::f32, p.kernel, p.batch(), kSeq, *ref_backend, kSeed);
  const GroupRun g = run_thread_group(cfg, opts, p.batch(), kSeq, p.ranks, kSeed);

  ASSERT_EQ(int(g.ranks.size()), p.ranks);
  ASSERT_EQ(g.result.y.size(), std::size_t(kSeq * p.batch() * cfg.hidden_size));
  expect_close(g.result, ref, 1e-5, par_name(p) + " vs single-rank explicit");

  // Every rank really took part: it kept activations and exchanged data with the others.
  for (int r = 0; r < p.ranks; ++r) {
    EXPECT_GT(g.ranks[r].saved_bytes, 0u) << "rank " << r;
    std::size_t sent = 0, received = 0;
    for (const auto& c : g.ranks[r].traffic) sent += c.bytes_sent, received += c.bytes_received;
    EXPECT_GT(sent, 0u) << "rank " << r;
    EXPECT_EQ(sent, received) << "rank " << r;  // every collective here is symmetric
    EXPECT_EQ(g.ranks[r].y.shape(), (Shape{kSeq / p.ranks, p.batch(), cfg.hidden_size})) << "rank " << r;
  }

  // LAGA, absorbed and recompute against explicit at the same P (same layout and kernel): the claim that
  // the latent exchange computes the same block as the per-head exchange. Same tolerance, same reasons.
  if (p.variant.form != Form::Explicit) {
    const GroupRun e =
        run_thread_group(cfg, Variant{}.options(p.layout, p.kernel, DType::f32), p.batch(), kSeq, p.ranks, kSeed);
    expect_close(g.result, e.result, 1e-5, par_name(p) + " vs explicit at P=" + std::to_string(p.ranks));
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, BlockParallel, ::testing::ValuesIn(par_params()),
                         [](const ::testing::TestParamInfo<ParParam>& info) { return par_name(info.param); });

// Edge shapes: one token per rank (P = S), an odd number of tokens per rank, and a sequence longer than the
// CPU kernel's 64-row tile and not a multiple of it (in all_gather, rank r's 50 queries sit at offset 50 r in
// 200 keys). `tiny`, every variant, layout and kernel; same tolerance and reasons as above.
struct EdgeParam {
  std::int64_t seq, batch;
  int ranks;
  Layout layout;
  Variant variant;
  AttentionKernel kernel;
};
std::string edge_name(const EdgeParam& p) {
  return "S" + std::to_string(p.seq) + "_B" + std::to_string(p.batch) + "_P" + std::to_string(p.ranks) + "_" +
         layout_name(p.layout) + "_" + p.variant.name() + "_" + kernel_name(p.kernel) + "_f32";
}
void PrintTo(const EdgeParam& p, std::ostream* os) { *os << edge_name(p); }

std::vector<EdgeParam> edge_params() {
  std::vector<EdgeParam> out;
  for (auto [seq, batch, P] : {std::tuple<std::int64_t, std::int64_t, int>{4, 3, 4}, {12, 1, 4}, {200, 1, 4}})
    for (Layout l : kAllLayouts)
      for (const Variant& v : all_variants())
        for (AttentionKernel k : kAllKernels) out.push_back({seq, batch, P, l, v, k});
  return out;
}

class BlockParallelEdge : public ::testing::TestWithParam<EdgeParam> {};

TEST_P(BlockParallelEdge, MatchesSingleRankExplicit) {
  const EdgeParam& p = GetParam();
  const MlaConfig cfg = tiny();
  auto ref_backend = make_cpu_backend();
  const GlobalResult ref = reference_result(cfg, DType::f32, p.kernel, p.batch, p.seq, *ref_backend, kSeed);
  const GroupRun g =
      run_thread_group(cfg, p.variant.options(p.layout, p.kernel, DType::f32), p.batch, p.seq, p.ranks, kSeed);
  expect_close(g.result, ref, 1e-5, edge_name(p) + " vs single-rank explicit");
}

INSTANTIATE_TEST_SUITE_P(Threads, BlockParallelEdge, ::testing::ValuesIn(edge_params()),
                         [](const ::testing::TestParamInfo<EdgeParam>& info) { return edge_name(info.param); });

// The comparison above can fail: the reference of another seed is far away (guards against a vacuous
// comparison, e.g. both sides empty or all zero).
TEST(BlockParallelSanity, OtherSeedIsFarFromReference) {
  const MlaConfig cfg = tiny();
  auto be = make_cpu_backend();
  const GlobalResult ref = reference_result(cfg, DType::f32, AttentionKernel::fused, 2, kSeq, *be, kSeed);
  const GroupRun g = run_thread_group(
      cfg, Variant{.form = Form::Laga}.options(Layout::A2A, AttentionKernel::fused, DType::f32), 2, kSeq, 2, kSeed + 1);
  EXPECT_GT(rel_frobenius(g.result.y, ref.y), 1e-1);
  EXPECT_GT(rel_frobenius(g.result.dx, ref.dx), 1e-1);
}

}  // namespace
