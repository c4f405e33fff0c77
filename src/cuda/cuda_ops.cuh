// The elementwise and row ops of the CUDA backend (copy, fill, RMSNorm, RoPE) and the reductions they share
// with the attention kernels. Every reduction runs in a fixed order (warp shuffles in a fixed tree, then a
// fixed combination of the warps), so results are bitwise reproducible run to run.
#pragma once

#include <cmath>

#include "cuda/cuda_common.cuh"

namespace laga::cuda {

// ---------------------------------------------------------------- reductions (device)
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or max) over the block; every thread receives the result. `red` holds blockDim.x / 32 floats.
// Contains __syncthreads(): call from every thread of the block.
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = kMax ? warp_max(v) : warp_sum(v);
  __syncthreads();  // `red` may still be read by a previous reduction
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < warps; ++w) r = kMax ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

// ---------------------------------------------------------------- host entry points
// copy: batched strided assign or accumulate (a dst batch stride of 0 with accumulate sums over the batch,
// each thread owning one (row, col) and looping over the batch). Host pointers (either side) are allowed
// for assign: they go through cudaMemcpy2DAsync and the call returns when the copy is done.
void copy_op(Context&, const CopyArgs&);
// n elements of `dtype` at ptr = value.
void fill_op(Context&, void* ptr, i64 n, DType dtype, double value);
void rmsnorm_forward_op(Context&, const RmsNormArgs&);
void rmsnorm_backward_op(Context&, const RmsNormArgs&);
// inv_freq_device: the [dim / 2] frequencies in device memory (double).
void rope_op(Context&, const RopeArgs&, const double* inv_freq_device, bool backward);
// Ring attention's merge of a partial output and log-sum-exp into the running ones (Backend::attention_merge).
void attention_merge_op(Context&, const AttentionMergeArgs&);

}  // namespace laga::cuda
