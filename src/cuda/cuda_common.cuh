// Shared pieces of the CUDA backend: the check macros (cuda_check.hpp), element types and conversions, dtype dispatch, launch helpers, and the per-backend context (stream,
// cuBLASLt handle, scratch buffers) that the op files share.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "laga/backend.hpp"
#include "laga/errors.hpp"

#include "cuda/cuda_check.hpp"

namespace laga::cuda {

using i64 = std::int64_t;
using bf16 = __nv_bfloat16;

// ---------------------------------------------------------------- element conversions
template <typename T>
__device__ __forceinline__ float to_float(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_float<bf16>(bf16 v) {
  return __bfloat162float(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ bf16 from_float<bf16>(float v) {
  return __float2bfloat16_rn(v);
}

// The accumulation type of an element type: double for double, float otherwise.
template <typename T>
struct Accum {
  using type = float;
};
template <>
struct Accum<double> {
  using type = double;
};
template <typename T>
__device__ __forceinline__ typename Accum<T>::type to_acc(T v) {
  return to_float(v);
}
template <>
__device__ __forceinline__ double to_acc<double>(double v) {
  return v;
}
template <typename T>
__device__ __forceinline__ T from_acc(typename Accum<T>::type v) {
  return from_float<T>(v);
}
template <>
__device__ __forceinline__ double from_acc<double>(double v) {
  return v;
}

// ---------------------------------------------------------------- dtype dispatch
// The compute ops (GEMM, norms, RoPE, attention) run bf16 and f32.
template <typename F>
void dispatch_compute(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16{}); return;
    default:
      LAGA_REQUIRE(false, "dtype ", dtype_name(t), " is not supported by the cuda backend (", op,
                   "): use float32 or bfloat16");
  }
}
// Data movement (copy, fill) also takes f64: results are gathered to the host in float64 through copy.
template <typename F>
void dispatch_any(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::f64: f(double{}); return;
  }
}

// ---------------------------------------------------------------- launch helpers
constexpr int kElementwiseThreads = 256;

inline unsigned blocks_for(i64 n, int threads) {
  const i64 b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1LL << 30) ? (1LL << 30) : b));
}

// ---------------------------------------------------------------- context
// Reusable device buffers for an op's temporaries, one per purpose, grown on demand (never shrunk).
enum class ScratchSlot { scores, dscores, gather_q, gather_do, delta, norm_partial, gemm_fallback, count };

class Scratch {
 public:
  Scratch() : bufs_(static_cast<int>(ScratchSlot::count), {nullptr, 0}) {}
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  // At least `bytes` bytes; the previous contents are lost when it grows. `stream` is synchronized before
  // an old buffer is freed (work queued on it may still read it).
  void* get(ScratchSlot slot, std::size_t bytes, cudaStream_t stream);

 private:
  struct Buf {
    void* ptr;
    std::size_t bytes;
  };
  std::vector<Buf> bufs_;
};

class GemmRunner;

// What every op of one backend shares.
struct Context {
  int device = 0;
  cudaStream_t stream = nullptr;
  GemmRunner* gemm = nullptr;
  Scratch scratch;
  int max_smem_per_block = 0;  // opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin)
};

}  // namespace laga::cuda
