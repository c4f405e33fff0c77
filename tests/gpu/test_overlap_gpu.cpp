// BlockOptions::overlap on the GPU: collectives started on a communication stream and waited for through
// events give the bits of the blocking order. NCCL at P = 1 (its collectives copy on the communicator's
// stream, so reading a result before the wait would show) and the timed phantom at P = 8 (its holds run
// on the clock's stream beside the compute), every form and layout, bf16 and f32.
#include <gtest/gtest.h>

#include <string>

#include "gpu_test_util.hpp"
#include "laga/block.hpp"
#include "laga/nccl_comm.hpp"
#include "laga/problem.hpp"
#include "laga/timed_comm.hpp"

namespace laga::gpu_test {
namespace {

std::vector<std::uint8_t> result_bytes(Backend& be, const RankRun& run) {
  std::vector<std::uint8_t> out = raw_bytes(be, run.y);
  auto add = [&](const Tensor& t) {
    const std::vector<std::uint8_t> b = raw_bytes(be, t);
    out.insert(out.end(), b.begin(), b.end());
  };
  add(run.dx);
  for (const auto& [name, t] : run.grads.named()) add(*t);
  return out;
}

TEST(CudaOverlap, NcclBitwiseTheBlockingOrder) {
  LAGA_REQUIRE_GPU();
  if (!nccl_available()) GTEST_SKIP() << "laga was built without NCCL";
  const MlaConfig cfg = preset("small");
  const BlockShape shape{.batch = 2, .seq = 128, .ranks = 1, .rank = 0};
  auto cpu = make_cpu_backend();
  auto host = make_single_rank_communicator(*cpu);
  auto gpu = make_cuda_backend(0);
  auto nccl = make_nccl_communicator(*host, *gpu);
  for (DType dt : {DType::BF16, DType::F32})
    for (Layout layout : kAllLayouts)
      for (const Variant& v : kAllVariants) {
        SCOPED_TRACE(std::string(layout_name(layout)) + " " + v.label() + " " + dtype_tag(dt));
        BlockOptions opts = v.options(layout, AttentionKernel::Fused, dt);
        const RankRun blocking = run_rank(cfg, opts, shape, *gpu, *nccl, 3);
        opts.overlap = true;
        const RankRun overlapped = run_rank(cfg, opts, shape, *gpu, *nccl, 3);
        EXPECT_TRUE(result_bytes(*gpu, overlapped) == result_bytes(*gpu, blocking));
      }
}

TEST(CudaOverlap, TimedPhantomBitwiseTheBlockingOrder) {
  LAGA_REQUIRE_GPU();
  const MlaConfig cfg = preset("small");
  const BlockShape shape{.batch = 1, .seq = 256, .ranks = 8, .rank = 7};
  auto gpu = make_cuda_backend(0);
  auto clock = make_cuda_comm_clock(*gpu);
  auto comm = make_timed_phantom_communicator(*gpu, 7, 8, TimedLinks{default_time_model(), 1}, *clock);
  for (Layout layout : kAllLayouts)
    for (const Variant& v : kAllVariants) {
      SCOPED_TRACE(std::string(layout_name(layout)) + " " + v.label());
      BlockOptions opts = v.options(layout, AttentionKernel::Fused, DType::BF16);
      const RankRun blocking = run_rank(cfg, opts, shape, *gpu, *comm, 3);
      opts.overlap = true;
      const RankRun overlapped = run_rank(cfg, opts, shape, *gpu, *comm, 3);
      EXPECT_TRUE(result_bytes(*gpu, overlapped) == result_bytes(*gpu, blocking));
    }
}

}  // namespace
}  // namespace laga::gpu_test
