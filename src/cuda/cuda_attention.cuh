// Causal attention on the GPU, with the CPU backend's semantics (src/cpu/cpu_attention.cpp):
//   eager (cuda_attention.cu): per batch entry, fp32 scores Q K^T through cuBLASLt, a masked softmax into
//          `probs` (storage dtype), then P V through cuBLASLt; backward from the saved probabilities.
//   fused (cuda_flash.cu): flash-style tiled kernels, fp32 accumulation throughout. Forward: online
//          softmax, writes o and the fp32 log-sum-exp. Backward (FlashAttention-2, deterministic): D =
//          rowsum(dO * O); one kernel owns a key tile and loops over the query heads sharing its kv head and
//          over the query tiles (dK, dV: MQA sums over heads without atomics); another owns a query tile and
//          loops over the key tiles (dQ).
// Any strides; MHA, GQA or MQA (kv_heads divides q_heads); v may alias k; causal with q_offset (query i
// sees key j iff j <= i + q_offset, negative offsets included).
#pragma once

#include "cuda/cuda_common.cuh"

namespace laga::cuda {

// Largest head dimension (d_qk and d_v) of the fused kernels: MLA's absorbed MQA has d_qk = 576.
constexpr int kFlashMaxHeadDim = 576;

void attention_forward(Context&, const AttentionFwdParams&);
void attention_backward(Context&, const AttentionBwdParams&);

// The fused kernels (called by the two above after validation; p.kernel == fused, batch and q_len > 0).
void flash_forward(Context&, const AttentionFwdParams&);
void flash_backward(Context&, const AttentionBwdParams&);

}  // namespace laga::cuda
