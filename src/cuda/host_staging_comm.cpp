// Device buffers through a host communicator (MPI): the way P ranks that share one GPU exchange data, since
// NCCL refuses two ranks on one device. Correctness first: every collective drains the backend's stream,
// copies its input to host memory, runs the host collective and copies the result back.
//
// bf16 travels as f32 (the MPI communicator has no bf16): widening is exact, so gathers and all-to-alls
// return the very bits that were sent; sums are taken in f32 and rounded to bf16 once (NCCL sums bf16
// pairwise in bf16 precision, so this is no less accurate).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "laga/backend.hpp"
#include "laga/comm.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/nccl_comm.hpp"

namespace laga {
namespace {

// Round to nearest even, NaN kept quiet (as the CUDA backend's __float2bfloat16_rn).
std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
float bf16_to_float(std::uint16_t h) {
  const std::uint32_t u = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The dtype a device dtype travels as on the host.
DType host_dtype(DType dt) { return dt == DType::BF16 ? DType::F32 : dt; }

class HostStagingCommunicator final : public Communicator {
 public:
  HostStagingCommunicator(Communicator& host, Backend& backend)
      : host_(host),
        device_(cuda_device_of(backend)),
        stream_(static_cast<cudaStream_t>(cuda_stream(backend))) {
    LAGA_REQUIRE(host.performs_traffic(), "host staging over communicator '", host.name(),
                 "': the host communicator must perform traffic (not a phantom)");
  }

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  const char* name() const override { return "mpi+host-staging"; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dt) override {
    if (count == 0) return;
    const std::size_t P = static_cast<std::size_t>(size());
    to_host(send, count, dt, send_h_);
    recv_h_.assign(P * count * dtype_size(host_dtype(dt)), 0);
    host_.all_gather(send_h_.data(), recv_h_.data(), count, host_dtype(dt));
    to_device(recv_h_, recv, P * count, dt);
  }

  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dt) override {
    if (count == 0) return;
    const std::size_t P = static_cast<std::size_t>(size());
    to_host(send, P * count, dt, send_h_);
    recv_h_.assign(count * dtype_size(host_dtype(dt)), 0);
    host_.reduce_scatter(send_h_.data(), recv_h_.data(), count, host_dtype(dt));
    to_device(recv_h_, recv, count, dt);
  }

  void all_to_all(const void* send, void* recv, std::size_t count, DType dt) override {
    if (count == 0) return;
    const std::size_t P = static_cast<std::size_t>(size());
    to_host(send, P * count, dt, send_h_);
    recv_h_.assign(P * count * dtype_size(host_dtype(dt)), 0);
    host_.all_to_all(send_h_.data(), recv_h_.data(), count, host_dtype(dt));
    to_device(recv_h_, recv, P * count, dt);
  }

  void all_reduce(void* buf, std::size_t count, DType dt) override {
    if (count == 0) return;
    to_host(buf, count, dt, send_h_);
    host_.all_reduce(send_h_.data(), count, host_dtype(dt));
    to_device(send_h_, buf, count, dt);
  }

  void ring_shift(const void* send, void* recv, std::size_t count, DType dt) override {
    if (count == 0) return;
    to_host(send, count, dt, send_h_);
    recv_h_.assign(count * dtype_size(host_dtype(dt)), 0);
    host_.ring_shift(send_h_.data(), recv_h_.data(), count, host_dtype(dt));
    to_device(recv_h_, recv, count, dt);
  }

  void barrier() override {
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    LAGA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    host_.barrier();
  }

 private:
  // `count` elements of device dtype `dt` at `dev` -> `out` in host_dtype(dt).
  void to_host(const void* dev, std::size_t count, DType dt, std::vector<char>& out) {
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    const std::size_t bytes = count * dtype_size(dt);
    if (dt != DType::BF16) {
      out.resize(bytes);
      LAGA_CUDA_CHECK(cudaMemcpyAsync(out.data(), dev, bytes, cudaMemcpyDeviceToHost, stream_));
      LAGA_CUDA_CHECK(cudaStreamSynchronize(stream_));
      return;
    }
    raw_.resize(bytes);
    LAGA_CUDA_CHECK(cudaMemcpyAsync(raw_.data(), dev, bytes, cudaMemcpyDeviceToHost, stream_));
    LAGA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    out.resize(count * sizeof(float));
    const auto* h = reinterpret_cast<const std::uint16_t*>(raw_.data());
    auto* f = reinterpret_cast<float*>(out.data());
    for (std::size_t i = 0; i < count; ++i) f[i] = bf16_to_float(h[i]);
  }

  // `count` elements of host_dtype(dt) in `in` -> device dtype `dt` at `dev`.
  void to_device(const std::vector<char>& in, void* dev, std::size_t count, DType dt) {
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    const std::size_t bytes = count * dtype_size(dt);
    const void* src = in.data();
    if (dt == DType::BF16) {
      raw_.resize(bytes);
      const auto* f = reinterpret_cast<const float*>(in.data());
      auto* h = reinterpret_cast<std::uint16_t*>(raw_.data());
      for (std::size_t i = 0; i < count; ++i) h[i] = float_to_bf16(f[i]);
      src = raw_.data();
    }
    LAGA_CUDA_CHECK(cudaMemcpyAsync(dev, src, bytes, cudaMemcpyHostToDevice, stream_));
    // The host buffers are reused by the next call: the copy must be done with them first.
    LAGA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  Communicator& host_;
  int device_;
  cudaStream_t stream_;
  std::vector<char> send_h_, recv_h_, raw_;
};

}  // namespace

std::unique_ptr<Communicator> make_host_staging_communicator(Communicator& host, Backend& cuda_backend) {
  return std::make_unique<HostStagingCommunicator>(host, cuda_backend);
}

}  // namespace laga
