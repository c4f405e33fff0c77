// Ordering two CUDA streams with events (host code): what a collective started on a communication stream
// needs, so that it runs after the work queued before it and the caller's stream waits for it only at
// CollectiveRequest::wait().
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "cuda/cuda_check.hpp"
#include "laga/comm.hpp"

namespace laga::cuda_detail {

// `later` runs its next work after everything queued on `earlier` so far.
inline void order_after(cudaStream_t later, cudaStream_t earlier) {
  cudaEvent_t ready = nullptr;
  LAGA_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  LAGA_CUDA_CHECK(cudaEventRecord(ready, earlier));
  LAGA_CUDA_CHECK(cudaStreamWaitEvent(later, ready, 0));
  LAGA_CUDA_CHECK(cudaEventDestroy(ready));  // released once recorded work completes
}

// A request whose wait() makes `waiter` wait for what was queued on `comm` when it was made.
class StreamWait final : public CollectiveRequest::Pending {
 public:
  StreamWait(int device, cudaStream_t waiter, cudaStream_t comm) : device_(device), waiter_(waiter) {
    LAGA_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    LAGA_CUDA_CHECK(cudaEventRecord(done_, comm));
  }
  ~StreamWait() override { cudaEventDestroy(done_); }
  StreamWait(const StreamWait&) = delete;
  StreamWait& operator=(const StreamWait&) = delete;
  void wait() override {
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    LAGA_CUDA_CHECK(cudaStreamWaitEvent(waiter_, done_, 0));
  }

 private:
  int device_;
  cudaStream_t waiter_;
  cudaEvent_t done_ = nullptr;
};

// A stream for collectives at the highest priority (its kernels are scheduled as soon as an SM frees).
inline cudaStream_t make_comm_stream() {
  int least = 0, greatest = 0;
  LAGA_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  LAGA_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  return s;
}

}  // namespace laga::cuda_detail
