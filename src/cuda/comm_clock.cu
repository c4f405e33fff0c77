// The CUDA clock of the timed phantom communicator (include/laga/timed_comm.hpp): a hold is a one-thread
// kernel on the clock's communication stream that spins on %globaltimer (nanoseconds, the same clock on
// every SM) until its time has passed; events order it after the backend's stream and, at wait(), the
// backend's stream after it.
#include <cmath>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/stream_order.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/timed_comm.hpp"

namespace laga {
namespace {

__device__ __forceinline__ std::uint64_t global_timer_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void hold_kernel(std::uint64_t ns) {
  const std::uint64_t start = global_timer_ns();
  while (global_timer_ns() - start < ns) __nanosleep(256);
}

// The holds run on a stream of their own at the highest priority (so a hold's one block is scheduled as
// soon as an SM frees, as a communication kernel would be).
class CudaCommClock final : public CommClock {
 public:
  explicit CudaCommClock(Backend& backend)
      : device_(cuda_device_of(backend)), stream_(static_cast<cudaStream_t>(cuda_stream(backend))) {
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    comm_stream_ = cuda_detail::make_comm_stream();
  }
  ~CudaCommClock() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(comm_stream_);
    cudaStreamDestroy(comm_stream_);  // a destructor must not throw; errors here are ignored
  }
  CudaCommClock(const CudaCommClock&) = delete;
  CudaCommClock& operator=(const CudaCommClock&) = delete;

  const char* name() const override { return "cuda"; }
  CollectiveRequest start_hold(double seconds) override {
    LAGA_REQUIRE(std::isfinite(seconds) && seconds >= 0, "hold: seconds = ", seconds, ": must be >= 0");
    const auto ns = static_cast<std::uint64_t>(std::llround(seconds * 1e9));
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    cuda_detail::order_after(comm_stream_, stream_);
    if (ns > 0) {
      hold_kernel<<<1, 1, 0, comm_stream_>>>(ns);
      LAGA_CUDA_CHECK(cudaGetLastError());
    }
    return CollectiveRequest(std::make_unique<cuda_detail::StreamWait>(device_, stream_, comm_stream_));
  }

 private:
  int device_;
  cudaStream_t stream_;
  cudaStream_t comm_stream_ = nullptr;
};

}  // namespace

std::unique_ptr<CommClock> make_cuda_comm_clock(Backend& cuda_backend) {
  return std::make_unique<CudaCommClock>(cuda_backend);
}

}  // namespace laga
