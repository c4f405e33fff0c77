// The causal rule of every attention kernel (CPU eager and fused; CUDA eager, generic fused and tensor-core):
// query i of a call sees keys 0 .. i + q_offset, clamped to [0, kv_len] (a negative offset gives empty rows).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define LAGA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LAGA_HOST_DEVICE inline
#endif

namespace laga {

LAGA_HOST_DEVICE constexpr std::int64_t visible_keys(std::int64_t i, std::int64_t q_offset, std::int64_t kv_len) {
  const std::int64_t n = i + q_offset + 1;
  return n < 0 ? 0 : (n > kv_len ? kv_len : n);
}

}  // namespace laga
