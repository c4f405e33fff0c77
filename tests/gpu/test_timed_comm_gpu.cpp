// The timed phantom on the GPU: a hold occupies the backend's stream (events around it see at least its
// time) without blocking the host, and a block run through the timed phantom gives the plain phantom's bits.
#include <gtest/gtest.h>

#include <chrono>

#include "gpu_test_util.hpp"
#include "laga/block.hpp"
#include "laga/problem.hpp"
#include "laga/timed_comm.hpp"

namespace laga::gpu_test {
namespace {

TEST(CudaTimedPhantom, HoldOccupiesTheStream) {
  LAGA_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  auto clock = make_cuda_comm_clock(*be);
  be->synchronize();
  for (double s : {1e-4, 5e-3}) {
    const int a = be->mark();
    const auto t0 = std::chrono::steady_clock::now();
    clock->hold(s);
    const double host = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int b = be->mark();
    be->synchronize();
    EXPECT_GE(be->elapsed(a, b), s * 0.999) << "hold " << s;  // events resolve ~0.5 us
    if (s > 1e-3) EXPECT_LT(host, s / 2) << "the host waited for the hold";
    be->reset_marks();
  }
}

TEST(CudaTimedPhantom, BlockGivesThePhantomsBits) {
  LAGA_REQUIRE_GPU();
  const MlaConfig cfg = preset("small");
  auto be = make_cuda_backend(0);
  auto clock = make_cuda_comm_clock(*be);
  const BlockShape shape{.batch = 1, .seq = 64, .ranks = 4, .rank = 3};
  auto timed = make_timed_phantom_communicator(*be, 3, 4, TimedLinks{default_time_model(), 4}, *clock);
  auto plain = make_phantom_communicator(*be, 3, 4);
  for (Layout layout : kAllLayouts) {
    const BlockOptions opts = Variant{Form::Laga}.options(layout, AttentionKernel::Fused, DType::BF16);
    const RankRun a = run_rank(cfg, opts, shape, *be, *timed, 1);
    const RankRun b = run_rank(cfg, opts, shape, *be, *plain, 1);
    EXPECT_EQ(raw_bytes(*be, a.y), raw_bytes(*be, b.y));
    EXPECT_EQ(raw_bytes(*be, a.dx), raw_bytes(*be, b.dx));
    const int c = int(OpPhase::Communication);
    EXPECT_GE(a.fwd.seconds[c] + a.bwd.seconds[c], 0.999 * communication_seconds(default_time_model(), a.traffic, 4, 4));
  }
}

}  // namespace
}  // namespace laga::gpu_test
