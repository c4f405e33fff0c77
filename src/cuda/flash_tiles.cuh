// The tile table (flash_kernels.cuh): per (d_qk, d_v) pair, which kernels run and their tiles and warps.
#pragma once

#include "cuda/flash_bwd_smem.cuh"
#include "cuda/flash_bwd_vk.cuh"
#include "cuda/flash_bwd_ws.cuh"
#include "cuda/flash_fwd.cuh"

namespace laga::cuda::flash {

// ================================================================ the tile table
// The (d_qk, d_v) pairs the tensor-core kernels take: MLA's per-head 192/128 (explicit, LAGA) and the absorbed
// form's latent 576/512, which also has a variant for V inside K (the first d_v columns of the same rows).
// tile_config gives each pair its tiles; flash_launch.cuh's dispatch instantiates the kernels of each.
struct HeadDims {
  int qk, v;
  bool v_in_k_variant;
};
inline constexpr HeadDims kHeadDims[] = {{192, 128, false}, {576, 512, true}};

constexpr bool has_head_dims(i64 dqk, i64 dv) {
  for (const HeadDims& d : kHeadDims)
    if (d.qk == dqk && d.v == dv) return true;
  return false;
}

// Tile configuration of one (d_qk, d_v) pair; the traits above say what each number means.
struct TileConfig {
  bool supported = false;
  // forward: rows x keys per step, warps, S warps along rows, O warps along rows, staging, blocks per SM
  int fwd_m = 0, fwd_n = 0, fwd_warps = 0, fwd_warps_ms = 0, fwd_warps_mo = 0;
  Pipe fwd_pipe = Pipe::paired;
  int fwd_min_blocks = 1;
  bool fwd_s_wgmma = false;  // S = Q K^T by wgmma
  bool fwd_o_wgmma = false;  // O += P V by wgmma
  bool fwd_o_split = false;  // 576/512 with V inside K: flash_fwd_split_kernel (the fwd_* tiles above unused)
  bool fwd_ws = false;       // flash_fwd_ws_kernel (FwdWsTraits) unless the launcher asks for flash_fwd_kernel
  // backward dK/dV: keys x rows per step, warps; registers layout (MHA) or shared layout with S^T warps
  // along keys (MQA)
  bool dkdv_regs = true;
  int dkdv_n = 0, dkdv_m = 0, dkdv_warps = 0, dkdv_warps_ns = 0, dkdv_min_blocks = 1;
  bool dkdv_wgmma = false;  // registers layout only (then FlashAttention-3's arrangement, 64-row steps)
  bool dq_fused = false;    // wgmma registers layout only: dQ added up inside the dK/dV kernel (no dQ kernel)
  bool dkdv_ws = false;     // with dq_fused: flash_bwd_ws_kernel (BwdWsTraits) for MHA on aligned views, unless
                            // the launcher asks for flash_bwd_dkdv_regs_kernel
  // backward dQ: rows x keys per step, warps, S warps along rows, dQ warps along rows
  int dq_m = 0, dq_n = 0, dq_warps = 0, dq_warps_ms = 0, dq_warps_mq = 0, dq_min_blocks = 1;
  bool dq_wgmma = false;
  bool dkv_sum = false;  // V inside K: flash_bwd_vk_kernel when the caller takes dK + [dV, 0] (dv_in_dk)
};

// The one place that chooses tiles. v_in_k: V is the first d_v columns of K (absorbed MLA), which halves the
// K/V staging and so allows larger key tiles.
constexpr TileConfig tile_config(int dqk, int dv, bool v_in_k) {
  TileConfig c;
  if (dqk == 192 && dv == 128) {
    // MHA (explicit MLA / LAGA), every GEMM on wgmma. Forward: flash_fwd_ws_kernel (128 rows x 128 keys, two
    // consumer warpgroups and a load warp); or 128 rows x 64 keys, one warpgroup (two m64 tiles), P in
    // registers, FlashAttention-2 staging (88 KB: two blocks per SM). dK/dV: 128 keys (two
    // warpgroups) x 64-row steps, P^T and dS^T through shared memory (194 KB); for MHA on aligned views the
    // warp-specialised flash_bwd_ws_kernel (the same steps, a loading warpgroup and a dQ warp). dQ: 128 rows x
    // 64 keys.
    c = {.supported = true, .fwd_m = 128, .fwd_n = 64, .fwd_warps = 4, .fwd_warps_ms = 4, .fwd_warps_mo = 4,
         .fwd_pipe = Pipe::split, .fwd_min_blocks = 2, .fwd_s_wgmma = true, .fwd_o_wgmma = true, .fwd_ws = true,
         .dkdv_regs = true, .dkdv_n = 128, .dkdv_m = 64, .dkdv_warps = 8, .dkdv_warps_ns = 8, .dkdv_min_blocks = 1,
         .dkdv_wgmma = true, .dq_fused = true, .dkdv_ws = true,
         .dq_m = 128, .dq_n = 64, .dq_warps = 8, .dq_warps_ms = 8, .dq_warps_mq = 8, .dq_min_blocks = 1,
         .dq_wgmma = true};
  } else if (dqk == 576 && dv == 512) {
    // Absorbed MQA: 64 rows (queries x heads). Forward with V inside K: two warpgroups on wgmma (S and O's first
    // half; loads and O's second half), flash_fwd_split_kernel. With a separate V: S = Q K^T by 4 x 2 warps, O by
    // 8 warps of 64 columns on mma.sync, P through shared memory. dK/dV: 32 keys, columns split over 8 warps (1088
    // fp32 accumulators per key). With V inside K and a caller that takes dK + [dV, 0]: flash_bwd_vk_kernel.
    c = {.supported = true, .fwd_m = 64, .fwd_n = v_in_k ? 64 : 32, .fwd_warps = 8, .fwd_warps_ms = 4,
         .fwd_warps_mo = 1, .fwd_pipe = Pipe::paired, .fwd_min_blocks = 1, .fwd_o_split = v_in_k,
         .dkdv_regs = false, .dkdv_n = 32, .dkdv_m = 64, .dkdv_warps = 8, .dkdv_warps_ns = 2, .dkdv_min_blocks = 1,
         .dq_m = 64, .dq_n = v_in_k ? 32 : 16, .dq_warps = 8, .dq_warps_ms = 4, .dq_warps_mq = 1, .dq_min_blocks = 1,
         .dkv_sum = v_in_k};
  }
  return c;
}

constexpr bool every_pair_has_tiles() {
  for (const HeadDims& d : kHeadDims)
    if (!tile_config(d.qk, d.v, false).supported || (d.v_in_k_variant && !tile_config(d.qk, d.v, true).supported))
      return false;
  return true;
}
static_assert(every_pair_has_tiles(), "a pair of kHeadDims without a tile configuration");

template <int kDqk, int kDv, bool kVInK>
struct Kernels {
  static constexpr TileConfig c = tile_config(kDqk, kDv, kVInK);
  static_assert(c.supported, "no tile configuration for these head dims");
  using Fwd = FwdTraits<kDqk, kDv, c.fwd_m, c.fwd_n, c.fwd_warps, c.fwd_warps_ms, c.fwd_warps_mo, c.fwd_pipe,
                        kVInK, c.fwd_min_blocks, c.fwd_s_wgmma, c.fwd_o_wgmma>;
  using FwdSplit = FwdSplitTraits<kDqk, kDv>;
  using FwdWs = FwdWsTraits<kDqk, kDv>;  // only instantiated when c.fwd_ws
  using DkdvRegs =
      BwdKvRegTraits<kDqk, kDv, c.dkdv_n, c.dkdv_m, c.dkdv_warps, kVInK, c.dkdv_min_blocks, c.dkdv_wgmma>;
  // The same dK/dV kernel with dQ added up inside it (when c.dq_fused; the separate dQ kernel otherwise).
  using DkdvRegsFusedDq = BwdKvRegTraits<kDqk, kDv, c.dkdv_n, c.dkdv_m, c.dkdv_warps, kVInK, c.dkdv_min_blocks,
                                         c.dkdv_wgmma, c.dq_fused>;
  using DkdvWs = BwdWsTraits<kDqk, kDv>;  // only instantiated when c.dkdv_ws
  using DkdvSmem = BwdKvSmemTraits<kDqk, kDv, c.dkdv_n, c.dkdv_m, c.dkdv_warps, c.dkdv_warps_ns, kVInK>;
  using Vk = BwdVkTraits<kDqk, kDv>;    // only instantiated when c.dkv_sum
  using Vkq = BwdVkqTraits<kDqk, kDv>;  // the same, rows resident
  using Dq = BwdQTraits<kDqk, kDv, c.dq_m, c.dq_n, c.dq_warps, c.dq_warps_ms, c.dq_warps_mq, kVInK,
                       c.dq_min_blocks, c.dq_wgmma>;
};

}  // namespace laga::cuda::flash
