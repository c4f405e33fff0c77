// Host implementation of the backend's causal attention op (f32 and f64).
//
// Both kernels accept any strides in AttentionFwdParams / AttentionBwdParams: each (batch, head) slice is
// gathered into contiguous scratch, multiplied with OpenBLAS, and the results are scattered back, so
// only the described elements of the output buffers are ever written.
//   eager: softmax(scale * Q K^T) is materialised into p.probs and reused by the backward.
//   fused: FlashAttention-2 style tiles (online softmax forward, recompute-from-lse backward); only the
//          output and the log-sum-exp are kept.
// kv_heads must divide q_heads (MHA: equal, MQA: 1); dk/dv sum over the query heads sharing a kv head.
// Results are bitwise reproducible: every reduction runs in a fixed order.
#pragma once

#include "laga/backend.hpp"

namespace laga::cpu {

void attention_forward(const AttentionFwdParams& p);
void attention_backward(const AttentionBwdParams& p);

}  // namespace laga::cpu
