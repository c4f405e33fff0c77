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
    case DType::F32: f(float{}); return;
    case DType::BF16: f(bf16{}); return;
    default:
      LAGA_REQUIRE(false, "dtype ", dtype_name(t), " is not supported by the cuda backend (", op,
                   "): use float32 or bfloat16");
  }
}
// Data movement (copy, fill) also takes f64: results are gathered to the host in float64 through copy.
template <typename F>
void dispatch_any(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::BF16: f(bf16{}); return;
    case DType::F64: f(double{}); return;
  }
}

// Ops that read one dtype and write another: the same dtype twice (any of the above), or bfloat16 with
// float32 either way (bf16 gradients accumulated into float32 ones, float32 gradients read into bf16 ops).
template <typename F>
void dispatch_pair(DType a, DType b, const char* op, F&& f) {
  if (a == b) return dispatch_any(a, [&](auto z) { f(z, z); });
  if (a == DType::BF16 && b == DType::F32) return f(bf16{}, float{});
  if (a == DType::F32 && b == DType::BF16) return f(float{}, bf16{});
  LAGA_REQUIRE(false, op, ": dtypes ", dtype_name(a), " and ", dtype_name(b),
               " cannot be mixed (the cuda backend mixes only bfloat16 with float32)");
}

// ---------------------------------------------------------------- launch helpers
constexpr int kElementwiseThreads = 256;

// Whether `stream` is capturing a CUDA graph (or its capture was invalidated): then nothing may wait for it,
// allocate or free device memory. An error from the query (the legacy stream while another stream captures)
// counts as capturing.
inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

inline unsigned blocks_for(i64 n, int threads) {
  const i64 b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > (1LL << 30) ? (1LL << 30) : b));
}

// ---------------------------------------------------------------- context
// Reusable device buffers for an op's temporaries, one per purpose ("slot"), grown on demand and kept (never
// shrunk). They are not activations of the backend's accounting allocator, so they are counted here: the bytes
// held (sum over slots) and its high-water mark, reported through laga/cuda.hpp (cuda_scratch_info). A backend
// hosted by a framework takes them from the framework's allocator (Scratch::hosted); its own, from cudaMalloc.
//   scores         eager attention: fp32 scores [heads, rows, kv_len] of one chunk of heads/query rows; in the
//                  backward fp32 dP followed by dS (storage dtype). Kept at or under Context::eager_scratch_cap.
//   gather_q/_do   eager backward, GQA/MQA: a kv head's query heads of Q / dO stacked into one operand
//   dk_accum       eager backward: fp32 dK of one kv head, when its sum is split over chunks
//   delta          fused backward: D = rowsum(dO * O)
//   split_partial  fused tensor-core backward, 576/512: the dK/dV partial sums of the row splits
//   dq_accum       fused tensor-core backward, 192/128 and 576/512 (V inside K, dv_in_dk): fp32 dQ added up by
//                  the dK/dV kernel, 64-row tiles
//   dq_count       its per-tile counters (how many key blocks have added theirs)
//   taken          the persistent 192/128 warp-specialised kernels' count of the work items (the forward's row
//                  tiles, the backward's key blocks) their blocks have taken
//   dv_sum         attention backward with dv_in_dk on a path that writes dV apart: that dV, added into dK
//   norm_partial   RMSNorm backward: dgamma partial sums
//   gemm_fallback  reserved for the GEMM fallback
//   cudnn_workspace  the cuDNN attention provider's workspace (the largest its plans have asked for)
enum class ScratchSlot {
  scores,
  gather_q,
  gather_do,
  dk_accum,
  delta,
  split_partial,
  dq_accum,
  dq_count,
  taken,
  dv_sum,
  norm_partial,
  gemm_fallback,
  cudnn_workspace,
  count
};
const char* scratch_slot_name(ScratchSlot);

class Scratch {
 public:
  Scratch();
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  // At least `bytes` bytes; the previous contents are lost when it grows. `stream` is synchronized before
  // an old buffer is freed (work queued on it may still read it). While `stream` captures a CUDA graph the
  // buffer is handed out as it is (a growth then throws InvalidArgument: the captured work must have run once
  // before), and the graph keeps it: it is never freed before the Scratch (a later growth or release sets it
  // aside instead, still counted as held), since a replay of the graph writes to it.
  void* get(ScratchSlot slot, std::size_t bytes, cudaStream_t stream);
  // Frees every buffer (after synchronizing `stream`) but those a captured graph uses; the marks are not changed.
  void release(cudaStream_t stream);
  // Sets the high-water marks (total and per slot) to the bytes held now.
  void reset_peak();

  std::size_t held_bytes() const { return held_; }
  std::size_t peak_bytes() const { return peak_; }
  std::size_t slot_bytes(ScratchSlot s) const { return bufs_.at(static_cast<std::size_t>(s)).bytes; }
  std::size_t slot_peak_bytes(ScratchSlot s) const { return bufs_.at(static_cast<std::size_t>(s)).peak; }

  // Called after each growth (the backend samples the device's used memory there); may be empty.
  void (*on_grow)(void* user) = nullptr;
  void* on_grow_user = nullptr;
  // A hosting framework's allocator (the PyTorch module's caching allocator): the buffers come from it, as
  // external memory named "scratch.<slot>", so the framework's counters see them and the two allocators do
  // not compete for the device; null: cudaMalloc.
  Allocator* hosted = nullptr;

 private:
  struct Buf {
    void* ptr = nullptr;
    std::size_t bytes = 0;
    std::size_t peak = 0;
    std::uint64_t id = 0;   // the hosted allocator's
    bool captured = false;  // handed out while a CUDA graph was captured: kept until the Scratch goes
  };
  void free_buf(Buf& b);  // frees it, or sets it aside in kept_ when a graph uses it; held_ drops by what is freed
  cudaError_t free_now(const Buf& b);  // cudaFree's error (cudaSuccess for the hosted allocator)
  std::vector<Buf> bufs_;
  std::vector<Buf> kept_;  // buffers of captured graphs, no longer in a slot
  std::size_t held_ = 0, peak_ = 0;
};

class GemmRunner;

// What every op of one backend shares.
struct Context {
  int device = 0;
  cudaStream_t stream = nullptr;
  GemmRunner* gemm = nullptr;
  Scratch scratch;
  // Eager attention works on chunks of heads (or of one head's query rows) so that the scores slot stays at or
  // under this many bytes (at least one query row). Set from cuda_default_eager_scratch_cap().
  std::size_t eager_scratch_cap = std::size_t(1) << 30;
  int max_smem_per_block = 0;  // opt-in limit (cudaDevAttrMaxSharedMemoryPerBlockOptin)
  int multiprocessors = 0;     // the device's SMs (cuda_multiprocessor_count)
  // Tensor-core 192/128 backward: dQ added up inside the dK/dV kernel (else the separate dQ kernel).
  bool flash_fused_dq = true;
  int flash_row_splits = 0;  // 576/512 dK/dV row splits: 0 chooses (flash::dkdv_row_splits), else this many
  bool flash_ws_forward = true;  // 192/128 forward: the warp-specialised kernel (else flash_fwd_kernel)
  int flash_forward_blocks = 0;  // its persistent grid: 0 one block per SM, else at most this many
  int flash_forward_head_group = 0;  // its work order: row tiles of this many heads at a time (0: 4)
  bool flash_ws_backward = true;  // 192/128 fused-dQ backward, MHA: flash_bwd_ws_kernel (else the dK/dV kernel)
  int flash_backward_blocks = 0;  // its persistent grid: 0 one block per SM, else at most this many
  int flash_backward_head_group = 0;  // its work order: key blocks of this many heads at a time (0: chooses)
  bool flash_vk_rows = true;      // 576/512 summed dK + [dV, 0] backward: flash_bwd_vkq_kernel (else flash_bwd_vk_kernel)
  // flash_bwd_ws_kernel's dQ and flash_bwd_vkq_kernel's dK + [dV, 0]: added into each fp32 tile in a fixed order
  // (reruns bitwise identical), else in whichever order the blocks reach it
  bool flash_ordered_dq = true;
};

}  // namespace laga::cuda
