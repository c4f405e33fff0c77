// The block's conformance suite (tests/conformance/block_conformance.hpp) on CPU backends, the ranks as
// threads of this process: `tiny` at P = 1, 2, 4, 8 in float32 and P = 1, 2, 4 in float64; `tiny` without query
// compression; `small` (8 heads, other widths) at P = 1 and 8; edge shapes.
#include <gtest/gtest.h>

#include "conformance/block_conformance.hpp"

namespace laga::conformance {
namespace {

// float32: rounding is 6e-8 per operation; the forms and P only reorder sums of at most a few hundred terms
// (GEMM k, softmax rows, the rank sum of gradients), ~1e-7..1e-6 relative against float64. float64: the
// same reorderings, ~1e-15; 1e-10 leaves five orders of margin. A mis-routed chunk, a wrong RoPE offset or
// causal mask, or a missing rank's gradient is O(1e-1..1).
double cpu_tolerance(DType t) { return t == DType::F64 ? 1e-10 : 1e-5; }

std::shared_ptr<const Suite> cpu_threads() {
  static const auto suite = std::make_shared<const Suite>(Suite{
      .platform = Platform{.name = "cpu", .make_backend = [](int) { return make_cpu_backend(); },
                           .tolerance = cpu_tolerance},
      .ranks = thread_ranks()});
  return suite;
}

std::vector<Param> cases() {
  std::vector<Case> shapes;
  // s = 8..64 tokens per rank: several RoPE offsets and causal-mask cases per rank; batch 2 (token-major rows
  // interleave the batch).
  for (int P : {1, 2, 4, 8}) shapes.push_back({.config = "tiny", .ranks = P, .dtype = DType::F32, .seq = 64});
  for (int P : {1, 2, 4}) shapes.push_back({.config = "tiny", .ranks = P, .dtype = DType::F64, .seq = 32});
  for (int P : {1, 2}) shapes.push_back({.config = "tiny_no_q_lora", .ranks = P, .dtype = DType::F32, .seq = 32});
  shapes.push_back({.config = "tiny_no_q_lora", .ranks = 1, .dtype = DType::F64, .seq = 32});
  // `small`: 8 heads, d_n != d_r, r_q != r_kv; at P = 8 one head per rank in a2a, 8 tokens per rank.
  for (DType t : {DType::F32, DType::F64}) shapes.push_back({.config = "small", .ranks = 1, .dtype = t, .seq = 32});
  shapes.push_back({.config = "small", .ranks = 8, .dtype = DType::F32, .batch = 1, .seq = 64});
  // Edge shapes: one token per rank (P = S), an odd number of tokens per rank, and a sequence longer than the
  // CPU kernel's 64-row tile and not a multiple of it (in all_gather, rank r's 50 queries sit at offset 50 r in
  // 200 keys).
  shapes.push_back({.config = "tiny", .ranks = 4, .dtype = DType::F32, .batch = 3, .seq = 4});
  shapes.push_back({.config = "tiny", .ranks = 4, .dtype = DType::F32, .batch = 1, .seq = 12});
  shapes.push_back({.config = "tiny", .ranks = 4, .dtype = DType::F32, .batch = 1, .seq = 200});
  return every_layout(cpu_threads(), shapes);
}

INSTANTIATE_TEST_SUITE_P(Threads, BlockConformance, testing::ValuesIn(cases()), param_name);

INSTANTIATE_TEST_SUITE_P(Threads, BlockRefusals,
                         testing::Values(Param{cpu_threads(), Case{.ranks = 2}}, Param{cpu_threads(), Case{.ranks = 8}}),
                         param_name);

// The comparisons can fail: the result of another seed is far from the reference (guards against a vacuous
// comparison, e.g. both sides empty or all zero).
TEST(BlockConformanceSanity, OtherSeedIsFarFromTheReference) {
  const MlaConfig cfg = preset("tiny");
  auto be = make_cpu_backend();
  const GlobalResult ref = reference_result(cfg, DType::F64, AttentionKernel::Fused, 2, 64, *be, 11);
  const GroupRun g = run_thread_group(
      cfg, Variant{.form = Form::Laga}.options(Layout::A2A, AttentionKernel::Fused, DType::F32), 2, 64, 2, 12);
  EXPECT_GT(relative_error(g.result.y, ref.y), 1e-1);
  EXPECT_GT(relative_error(g.result.dx, ref.dx), 1e-1);
}

}  // namespace
}  // namespace laga::conformance
