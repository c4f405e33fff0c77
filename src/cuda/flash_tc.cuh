// The tensor-core fused attention (flash_kernels.cuh, launched through flash_launch.cuh) behind the fused
// kernel's entry points: bf16 and the (d_qk, d_v) pairs of the tile table; everything else keeps the generic
// kernels of cuda_flash.cu.
#pragma once

#include "cuda/cuda_common.cuh"

namespace laga::cuda {

// Whether the tensor-core kernels take this problem (dtype and head dims in the table).
bool flash_tc_supported(const AttentionFwdParams& p);

// Whether flash_tc_backward writes dK + [dV, 0] itself for dv_in_dk (576/512 with V inside K, fused dQ on).
bool flash_tc_takes_dv_in_dk(Context& ctx, const AttentionFwdParams& p);

// Called after validation, only when flash_tc_supported(p).
void flash_tc_forward(Context& ctx, const AttentionFwdParams& p);
void flash_tc_backward(Context& ctx, const AttentionBwdParams& p);

}  // namespace laga::cuda
