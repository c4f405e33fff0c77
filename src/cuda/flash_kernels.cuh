// Tensor-core fused attention (bf16 in, fp32 accumulate; FlashAttention-2 structure) for the (d_qk, d_v)
// pairs of MLA; launched by flash_launch.cuh. The tile table (flash_tiles.cuh) chooses, per pair, tiles and warps and
// whether a GEMM runs on wgmma (Hopper's warpgroup MMA, operands straight from 128-byte-swizzled shared
// tiles: 192/128, every GEMM) or on mma.sync with ldmatrix fragments (576/512).
//
// Rows. The query heads that share a kv head are folded into the rows of one problem: row r of kv head g is
// query r / group of query head g * group + r % group (query-major). For MHA (group 1) a row is a query; for
// MQA a tile of 64 rows is 64 / group queries times group heads, so every head reuses the K/V tiles that one
// block loads (the MQA arithmetic-intensity trick). Causality follows the row's query: query i sees key j
// iff j <= i + q_offset (and j < kv_len).
//
// Kernels (every reduction in a fixed order by default, so results are bitwise reproducible; the
// non-deterministic mode lets the warp-specialised 192/128 and the rows-resident 576/512 backwards add their
// fp32 sums across blocks in any order):
//   fwd:        a block owns kBlockM rows and walks the visible key tiles (online softmax, exp2 domain);
//               writes o and the fp32 log-sum-exp.
//   bwd_dkdv:   a block owns kBlockN keys and walks the rows that see them, recomputing P^T = exp(S^T - lse)
//               and dS^T = P^T (dP^T - D) in the transposed orientation, so that they are A operands of
//               dV += P^T dO and dK += dS^T Q. Two layouts: "regs" (each warp 16 keys; with mma.sync P^T/dS^T
//               stay in registers, with wgmma they go through shared memory as in FlashAttention-3: MHA) and
//               "smem" (the warps split the key x row tile for S^T and the d columns for
//               dK/dV, P^T/dS^T go through shared memory: MQA's 1088 accumulator columns per key). The smem
//               kernel can split the rows over blocks (fp32 partials, summed in a fixed order by
//               bwd_dkdv_reduce).
//   bwd_dq:     a block owns kBlockM rows and walks the visible key tiles: dQ += dS K.
//   bwd_ws:     192/128 MHA: bwd_dkdv's arithmetic warp-specialised, dQ added up inside it (see its comment).
//   bwd_vk:     576/512 with V inside K, for a caller that takes dK + [dV, 0] (dv_in_dk): one accumulator per key
//               and column, dQ added up inside it; bwd_vkq the same with a row tile's dQ resident instead.
//
// Shared tiles are bf16, XOR-swizzled (flash_warp.cuh: swz for ldmatrix, swz_k64 for wgmma), filled by cp.async
// (16-byte aligned views) or by 16-byte stores of 2-byte loads (any other strides); rows past the end are
// zero-filled.
//
// One header per family: flash_common.cuh (grid order, a block's tile, loads), flash_fwd.cuh, flash_bwd.cuh
// (the backward's shared steps, bwd_dkdv "regs" and the fp32 dQ tiles' copy), flash_bwd_ws.cuh, flash_bwd_vk.cuh,
// flash_bwd_smem.cuh (bwd_dkdv "smem", bwd_dq) and flash_tiles.cuh (the tile table, which includes the others).
#pragma once

#include "cuda/flash_tiles.cuh"
