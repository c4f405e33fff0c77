// A CUDA backend hosted by a framework (laga/hosted.hpp, as the PyTorch module makes it) takes its kernel
// scratch and cuDNN's workspace from the host's allocator, so the host's counters see them: after a block's
// forward and backward, releasing the scratch hands the host back exactly the bytes the backend reports held.
#include <gtest/gtest.h>

#include <map>
#include <utility>

#include "gpu_test_util.hpp"
#include "laga/block.hpp"
#include "laga/comm.hpp"
#include "laga/hosted.hpp"

namespace laga::gpu_test {
namespace {

// The host: device memory from another allocator, every byte it hands out counted.
class CountingHost final : public Allocator {
 public:
  explicit CountingHost(Allocator& inner) : inner_(inner) {}
  Device device() const override { return inner_.device(); }
  std::size_t outstanding = 0;

 protected:
  void* raw_allocate(std::size_t bytes) override {
    void* p = nullptr;
    const std::uint64_t id = inner_.allocate(bytes, "host", MemoryKind::External, &p);
    held_[p] = {id, bytes};
    outstanding += bytes;
    return p;
  }
  void raw_free(void* p) override {
    const auto [id, bytes] = held_.at(p);
    held_.erase(p);
    inner_.free(id, p);
    outstanding -= bytes;
  }

 private:
  Allocator& inner_;
  std::map<void*, std::pair<std::uint64_t, std::size_t>> held_;
};

TEST(CudaHostedScratch, ComesFromTheHostsAllocator) {
  LAGA_REQUIRE_GPU();
  Backends be;
  CountingHost host(be.gpu->allocator());
  auto hosted = make_cuda_backend(0, host, nullptr);
  auto comm = make_single_rank_communicator(*hosted);
  const BlockOptions opts{.kernel = AttentionKernel::Fused, .dtype = DType::BF16};
  {
    const RankRun r = run_rank(mla_dims(), opts, BlockShape{.batch = 1, .seq = 128, .ranks = 1, .rank = 0}, *hosted,
                               *comm, 3);
  }
  const CudaScratchInfo info = cuda_scratch_info(*hosted);
  EXPECT_GT(info.held_bytes, 0u) << "the fused backward used no scratch";
  const std::size_t before = host.outstanding;
  EXPECT_GE(before, info.held_bytes);
  cuda_reset_scratch_peak(*hosted, /*release=*/true);
  EXPECT_EQ(before - host.outstanding, info.held_bytes);
}

}  // namespace
}  // namespace laga::gpu_test
