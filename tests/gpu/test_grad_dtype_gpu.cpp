// The weight gradients' dtype and accumulation on the CUDA backend (BlockOptions::grad_dtype,
// accumulate_grads), bf16, P = 1, every form and layout at DeepSeek-V3's head dims:
//  - grad_dtype = bfloat16: y and dx bit for bit those of the default (float32 gradients), each gradient the
//    float32 one rounded once to bf16 (relative Frobenius error <= 4e-3; one rounding is <= 2^-9 per element,
//    a missing head slice or a lost ring step would be O(1));
//  - accumulate_grads: from gradients holding 1, two backward passes leave 1 + 2 g (g the float32 gradient)
//    within 1e-2 relative in bf16 storage and 1e-5 in float32.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "laga/block.hpp"
#include "laga/comm.hpp"

namespace laga::gpu_test {
namespace {

constexpr std::int64_t kBatch = 2, kSeq = 32;
constexpr std::uint64_t kSeed = 5;

struct GradParam {
  Variant variant;
  Layout layout;
};
std::string grad_param_name(const GradParam& p) { return p.variant.name() + "_" + layout_name(p.layout); }
void PrintTo(const GradParam& p, std::ostream* os) { *os << grad_param_name(p); }

std::vector<GradParam> grad_params() {
  std::vector<GradParam> out;
  for (const Variant& v : kAllVariants)
    for (Layout l : {Layout::A2A, Layout::AllGather, Layout::P2P})
      if (layout_supports(l, v)) out.push_back({v, l});
  return out;
}

BlockOptions bf16_options(const GradParam& p) {
  return p.variant.options(p.layout, AttentionKernel::Fused, DType::BF16);
}

GlobalResult run_with(Backend& be, const MlaConfig& cfg, const BlockOptions& opts) {
  auto comm = make_single_rank_communicator(be);
  const RankRun r = run_rank(cfg, opts, BlockShape{.batch = kBatch, .seq = kSeq, .ranks = 1, .rank = 0}, be, *comm,
                             kSeed);
  return gather_result(be, *comm, r);
}

class GpuGradDtype : public ::testing::TestWithParam<GradParam> {};

TEST_P(GpuGradDtype, Bf16GradientsAreTheFloat32OnesRoundedOnce) {
  LAGA_REQUIRE_GPU();
  Backends be;
  const MlaConfig cfg = mla_dims();
  BlockOptions opts = bf16_options(GetParam());
  const GlobalResult f32 = run_with(*be.gpu, cfg, opts);
  opts.grad_dtype = DType::BF16;
  const GlobalResult bf = run_with(*be.gpu, cfg, opts);
  EXPECT_EQ(bf.y, f32.y);
  EXPECT_EQ(bf.dx, f32.dx);
  ASSERT_EQ(bf.grads.size(), f32.grads.size());
  for (std::size_t i = 0; i < bf.grads.size(); ++i) {
    const double err = relative_error(bf.grads[i].second, f32.grads[i].second);
    std::printf("GPUCHECK grad_dtype %s %s bf16 vs f32 %.3e\n", grad_param_name(GetParam()).c_str(),
                bf.grads[i].first.c_str(), err);
    EXPECT_LE(err, 4e-3) << "gradient of " << bf.grads[i].first;
  }
}

TEST_P(GpuGradDtype, AccumulatesIntoWhatTheGradientsHold) {
  LAGA_REQUIRE_GPU();
  Backends be;
  const MlaConfig cfg = mla_dims();
  const BlockOptions plain = bf16_options(GetParam());
  const GlobalResult ref = run_with(*be.gpu, cfg, plain);
  for (DType gd : {DType::F32, DType::BF16}) {
    BlockOptions opts = plain;
    opts.grad_dtype = gd;
    opts.accumulate_grads = true;
    const BlockShape shape{.batch = kBatch, .seq = kSeq, .ranks = 1, .rank = 0};
    auto inner = make_single_rank_communicator(*be.gpu);
    CountingCommunicator comm(*inner);
    MlaBlock block(cfg, opts, shape, *be.gpu, comm);
    const MlaWeights w = make_weights(cfg, opts.dtype, *be.gpu, kSeed);
    const Tensor x = make_shard(cfg, shape, opts.dtype, *be.gpu, kSeed, DataStream::X, opts.layout);
    const Tensor dy = make_shard(cfg, shape, opts.dtype, *be.gpu, kSeed, DataStream::Dy, opts.layout);
    MlaGrads g = allocate_grads(cfg, opts, be.gpu->allocator());
    for (auto& [n, t] : g.named()) be.gpu->fill(*t, 1.0);
    for (int step = 0; step < 2; ++step) {
      SavedContext ctx;
      block.forward(ctx, x, w);
      block.backward(g, ctx, dy, x, w);
    }
    std::size_t i = 0;
    for (auto& [n, t] : g.named()) {
      std::vector<double> want = ref.grads.at(i++).second;
      for (double& v : want) v = 1.0 + 2.0 * v;
      const double err = relative_error(to_host(*be.gpu, *t), want);
      EXPECT_LE(err, gd == DType::BF16 ? 1e-2 : 1e-5) << "gradient of " << n << " in " << dtype_name(gd);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Bf16, GpuGradDtype, ::testing::ValuesIn(grad_params()),
                         [](const ::testing::TestParamInfo<GradParam>& info) { return grad_param_name(info.param); });

}  // namespace
}  // namespace laga::gpu_test
