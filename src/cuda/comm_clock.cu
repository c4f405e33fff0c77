// The CUDA clock of the timed phantom communicator (include/laga/timed_comm.hpp): a hold is a one-thread
// kernel on the backend's stream that spins on %globaltimer (nanoseconds, the same clock on every SM)
// until its time has passed, so the stream -- and nothing else -- is busy for that long.
#include <cmath>
#include <cstdint>

#include "cuda/cuda_check.hpp"
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

class CudaCommClock final : public CommClock {
 public:
  explicit CudaCommClock(Backend& backend)
      : device_(cuda_device_of(backend)), stream_(static_cast<cudaStream_t>(cuda_stream(backend))) {}
  const char* name() const override { return "cuda"; }
  void hold(double seconds) override {
    LAGA_REQUIRE(std::isfinite(seconds) && seconds >= 0, "hold: seconds = ", seconds, ": must be >= 0");
    const auto ns = static_cast<std::uint64_t>(std::llround(seconds * 1e9));
    if (ns == 0) return;
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    hold_kernel<<<1, 1, 0, stream_>>>(ns);
    LAGA_CUDA_CHECK(cudaGetLastError());
  }

 private:
  int device_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<CommClock> make_cuda_comm_clock(Backend& cuda_backend) {
  return std::make_unique<CudaCommClock>(cuda_backend);
}

}  // namespace laga
