// The tensor-core attention backward's shared steps (flash_kernels.cuh): D = rowsum(dO * O), P^T recomputed
// from the log-sum-exp, dK and dV stored, the dK/dV kernel with P^T and dS^T in registers (dQ added up inside it
// or not) and the copy of the fp32 dQ tiles out.
#pragma once

#include "cuda/flash_common.cuh"

namespace laga::cuda::flash {

// ================================================================ backward: D = rowsum(dO * O)
// One warp per row of [b, h, i]; fp32.
template <bool kAligned>
__global__ void __launch_bounds__(256) flash_bwd_delta_kernel(const AttentionBwdParams p, float* delta) {
  const i64 row = i64(blockIdx.x) * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= p.batch * p.q_heads * p.q_len) return;
  const i64 i = row % p.q_len, bh = row / p.q_len, h = bh % p.q_heads, b = bh / p.q_heads;
  const bf16* o = static_cast<const bf16*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + i * p.o_token_stride;
  const bf16* d =
      static_cast<const bf16*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride + i * p.dout_token_stride;
  float acc = 0.f;
  if constexpr (kAligned) {
    for (i64 c = lane * 8; c < p.d_v; c += 32 * 8) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c), dv = *reinterpret_cast<const uint4*>(d + c);
      const bf16* oe = reinterpret_cast<const bf16*>(&ov);
      const bf16* de = reinterpret_cast<const bf16*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc = fmaf(bf16_to_float(de[e]), bf16_to_float(oe[e]), acc);
    }
  } else {
    for (i64 c = lane; c < p.d_v; c += 32) acc = fmaf(bf16_to_float(d[c]), bf16_to_float(o[c]), acc);
  }
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) acc += shfl_xor(acc, m);
  if (lane == 0) delta[row] = acc;
}

// ================================================================ backward: P^T recomputed, dK and dV stored

// P^T = exp2(S^T sl2 - lse log2e) over a warp's S^T fragment, in place: the dK/dV kernels' transposed
// probabilities recomputed from the saved log-sum-exp, zero where the row does not see the key. Fragment row
// mt * 16 + gid + 8 h is the warp's key wk0 + that of the block's keys from key0; column c0 + nt * 8 + 2 tig + e
// is that row of the tile of rows from r0, whose log-sum-exps `slse` holds. The causal mask is needed only
// when the block's last key lies past the tile's first row's visible prefix (core/causal.hpp).
template <int kBN, int kMT, int kNT>
__device__ __forceinline__ void recompute_pt(float (&pt)[kMT][kNT][4], const float* slse, int c0, float sl2,
                                             RowMap rm, i64 r0, const AttentionFwdParams& p, i64 key0, int wk0,
                                             int gid, int tig) {
  auto lse2 = [&](int nt, int e) { return slse[c0 + frag_col(nt, tig, e)] * kLog2e; };
  if (key0 + kBN - 1 > rm.query(r0) + p.q_offset)
    probs_from_lse_t(pt, sl2, gid, lse2, [&](int nt, int e) {  // keys this row sees, relative to the warp's first key
      return rm.query(r0 + c0 + frag_col(nt, tig, e)) + p.q_offset + 1 - key0 - wk0;
    });
  else
    probs_from_lse_t<false>(pt, sl2, gid, lse2, [](int, int) { return i64(0); });
}

// dP^T's accumulator before its product: the rows' D (= rowsum(dO o O), one per column), for a product that
// subtracts V dO^T (wgmma with B negated) and so leaves D - dP^T, with no subtraction waiting for the product.
// Each register pair its own load.
template <int kMT, int kNT>
__device__ __forceinline__ void d_into_acc(float (&ds)[kMT][kNT][4], const float* sdd, int tig) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt) {
      lds_f2(ds[mt][nt][0], ds[mt][nt][1], sdd + nt * 8 + 2 * tig);  // row gid
      lds_f2(ds[mt][nt][2], ds[mt][nt][3], sdd + nt * 8 + 2 * tig);  // row gid + 8
    }
}

// The dK/dV kernels' epilogue: dK = scale * acc_dk and dV = acc_dv of a warp's keys in bf16 (fragment row
// mt * 16 + gid + 8 h is key key0 + that; columns from dk_col0 and dv_col0), keys past kv_len skipped.
template <bool kAligned, int kMT, int kNTK, int kNTV>
__device__ __forceinline__ void store_dkdv(const AttentionBwdParams& p, i64 b, i64 g, i64 key0, int dk_col0,
                                           int dv_col0, const float (&acc_dk)[kMT][kNTK][4],
                                           const float (&acc_dv)[kMT][kNTV][4], int gid, int tig) {
  bf16* dk = static_cast<bf16*>(p.dk) + b * p.dk_batch_stride + g * p.dk_head_stride;
  bf16* dv = static_cast<bf16*>(p.dv) + b * p.dv_batch_stride + g * p.dv_head_stride;
  const float scale = float(p.scale);
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i64 key = key0 + mt * 16 + gid + 8 * h;
      if (key >= p.kv_len) continue;
#pragma unroll
      for (int nt = 0; nt < kNTK; ++nt)
        store2<kAligned>(dk + key * p.dk_token_stride + dk_col0 + nt * 8 + 2 * tig, scale * acc_dk[mt][nt][2 * h],
                         scale * acc_dk[mt][nt][2 * h + 1]);
#pragma unroll
      for (int nt = 0; nt < kNTV; ++nt)
        store2<kAligned>(dv + key * p.dv_token_stride + dv_col0 + nt * 8 + 2 * tig, acc_dv[mt][nt][2 * h],
                         acc_dv[mt][nt][2 * h + 1]);
    }
}

// ================================================================ backward: dK, dV, P^T and dS^T in registers
// kBlockN keys per block, 16 kMT per warp; kBlockM rows per step, Q/dO/lse/D in two stages. kWgmma: the four
// GEMMs by wgmma, FlashAttention-3's arrangement: each warpgroup 64 keys (warp w keeps keys 16 w..), every tile
// in the swz_k64 layout, P^T and dS^T through shared memory (bf16) so that dV += P^T dO and dK += dS^T Q are SS
// wgmmas and the registers hold only the dK/dV accumulators and one step's S^T, dP^T (64-row steps).
// Without kWgmma (mma.sync), P^T and dS^T stay in registers as the A operands of dV and dK.
template <int kDqk_, int kDv_, int kBlockN_, int kBlockM_, int kWarps_, bool kVInK_, int kMinBlocks_,
          bool kWgmma_ = false, bool kFuseDq_ = false>
struct BwdKvRegTraits {
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockN = kBlockN_, kBlockM = kBlockM_;
  static constexpr int kWarps = kWarps_, kThreads = 32 * kWarps, kMinBlocks = kMinBlocks_;
  static constexpr bool kVInK = kVInK_;
  static constexpr int kMT = kBlockN / kWarps / 16, kNTQ = kBlockM / 8;
  static constexpr int kLdV = kVInK ? kDqk : kDv;
  static constexpr int kKBytes = kBlockN * kDqk * 2, kVBytes = kVInK ? 0 : kBlockN * kDv * 2;
  static constexpr int kQBytes = kBlockM * kDqk * 2, kDoBytes = kBlockM * kDv * 2;
  static constexpr bool kWgmma = kWgmma_;
  // dQ in this kernel too (dq_accum, below): dQ^T = K^T dS^T per step, each warpgroup 32 of the 64 rows
  static constexpr bool kFuseDq = kFuseDq_;
  // Q | dO | lse | D, whole 1 KB units (the wgmma tiles start 1024-byte aligned)
  static constexpr int kStageBytes = (kQBytes + kDoBytes + 2 * kBlockM * 4 + 1023) / 1024 * 1024;
  static constexpr int kOffStage = kKBytes + kVBytes;
  static constexpr int kOffPt = kOffStage + 2 * kStageBytes;  // wgmma: P^T [kBlockN][kBlockM], then dS^T
  static constexpr int kPtBytes = kWgmma ? kBlockN * kBlockM * 2 : 0;
  static constexpr int kSmemBytes = kOffPt + 2 * kPtBytes;
  static_assert(!kWgmma || (kMT == 1 && kWarps % 4 == 0 && kBlockM == 64 && !kVInK &&
                            (kDv == 128 || kDv == 192) && (kDqk == 128 || kDqk == 192) && kDqk % 64 == 0 &&
                            kKBytes % 1024 == 0 && kOffStage % 1024 == 0 && kQBytes % 1024 == 0),
                "wgmma dK/dV: warpgroups of 64 keys, wgmma shapes in use, 1024-aligned tiles");
  static_assert(!kFuseDq || (kWgmma && kWarps == 8 && kBlockN == 128 && kThreads == 256),
                "fused dQ: the wgmma layout with two warpgroups (dq_accum_offset's fragment order)");
  static_assert(kBlockN % (16 * kWarps) == 0 && kBlockM % 16 == 0, "mma tile multiples");
  static_assert(kOffStage % 128 == 0 && kStageBytes % 128 == 0, "tile alignment");
  static_assert(!kVInK || kDv <= kDqk, "V inside K needs d_v <= d_qk");
  static_assert(std::size_t(kSmemBytes) <= kSmemBudget, "dK/dV tiles exceed shared memory");
};

// Fused dQ (FlashAttention-3's deterministic mode). Key block j adds dS K for its rows to an fp32 buffer of
// 64-row tiles (dq_accum, per (batch, kv head) ceil(rows / 64) tiles of 64 x d_qk floats), the key blocks of a
// row tile in increasing j: a counter per row tile holds how many have added theirs, block j waits for it to
// reach j and block 0 stores instead of adding (no zero fill). Blocks walk their row tiles from the last one
// down, so block j - 1 is one step ahead of block j on the same tile, and block j only waits on blocks issued
// before it (lower blockIdx: tile_work), never on one that may not be resident. A tile's floats are in the
// order of the wgmma accumulators (one 16-byte vector per thread and 8-column group), so that the adds are
// coalesced; flash_bwd_dq_convert_kernel scales them into dQ.
constexpr int kDqTileRows = 64;
__host__ __device__ constexpr i64 dq_row_tiles(i64 rows) { return (rows + kDqTileRows - 1) / kDqTileRows; }
// Offset in a tile of (row r, column d): warpgroup r / 32 holds rows 32 wg.., m tile d / 64 of dQ^T, the
// mma.sync C layout per warp (d = row of dQ^T, r = its column); ((m tile * 4 + n tile) * 256 + thread) * 4 + e.
__host__ __device__ constexpr int dq_accum_offset(int r, int d) {
  const int wg = r / 32, nt = (r % 32) / 8, tig = (r % 8) / 2, e_lo = r % 2;
  const int mt = d / 64, w4 = (d % 64) / 16, h = (d % 16) / 8, gid = d % 8;
  const int tid = 128 * wg + 32 * w4 + 4 * gid + tig;
  return ((mt * 4 + nt) * 256 + tid) * 4 + 2 * h + e_lo;
}

// The fp32 dQ row tiles of flash_bwd_vk_kernel: 64 rows x d_qk, (row r, column d) at the wgmma accumulator
// position of the thread that holds it (n tile d / 8, warp r / 16 of a warpgroup), so that a warpgroup's adds of
// an n tile are 2 KB contiguous whichever warpgroup holds the column.
__host__ __device__ constexpr int dq_accum_offset_rows(int r, int d) {
  const int j = d / 8, w4 = r / 16, gid = r % 8, h = (r % 16) / 8, tig = (d % 8) / 2;
  return (j * 128 + 32 * w4 + 4 * gid + tig) * 4 + 2 * h + d % 2;
}

// The fp32 dQ row tiles of flash_bwd_ws_kernel: per 64-column slab s of d and warpgroup wg (rows 32 wg..), 8 KB
// in the order of the warpgroup's dQ^T accumulators (one 16-byte vector per thread and n tile), so that each is
// one bulk operation from shared memory.
__host__ __device__ constexpr int dq_accum_offset_ws(int r, int d) {
  const int wg = r / 32, nt = (r % 32) / 8, tig = (r % 8) / 2, e_lo = r % 2;
  const int s = d / 64, w4 = (d % 64) / 16, h = (d % 16) / 8, gid = d % 8;
  return (((s * 2 + wg) * 4 + nt) * 128 + 32 * w4 + 4 * gid + tig) * 4 + 2 * h + e_lo;
}
// Which of the layouts above a dq_accum buffer has (flash_bwd_dq_convert_kernel).
enum class DqLayout { fused, rows, ws };

template <class Tr, bool kAligned>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    flash_bwd_dkdv_regs_kernel(const AttentionBwdParams p, const float* delta, float* dq_accum, unsigned* dq_count) {
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDqk = Tr::kDqk, kDv = Tr::kDv, kThreads = Tr::kThreads;
  constexpr int kMT = Tr::kMT, kNTQ = Tr::kNTQ;
  char* smem = dynamic_smem();
  bf16* s_k = reinterpret_cast<bf16*>(smem);
  const bf16* s_v = Tr::kVInK ? s_k : s_k + kBN * kDqk;
  auto s_q = [&](int st) { return reinterpret_cast<bf16*>(smem + Tr::kOffStage + st * Tr::kStageBytes); };
  auto s_do = [&](int st) { return s_q(st) + kBM * kDqk; };
  auto s_lse = [&](int st) { return reinterpret_cast<float*>(s_do(st) + kBM * kDv); };
  auto s_dd = [&](int st) { return s_lse(st) + kBM; };
  bf16* s_pt = reinterpret_cast<bf16*>(smem + Tr::kOffPt);  // wgmma: P^T, then dS^T
  bf16* s_dst = s_pt + kBN * kBM;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const KeyTile<kBN, kBM> kt(p);
  const auto& [block, key0, g, b, group, rows, row_tiles, tile_base, rm, n_tiles] = kt;
  auto step_row0 = [&](int t) { return kt.step_row0(t); };

  const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
  const bf16* v = static_cast<const bf16*>(p.v) + b * p.v_batch_stride + g * p.v_head_stride;
  const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_batch_stride;
  const bf16* dout = static_cast<const bf16*>(p.dout) + b * p.dout_batch_stride;
  constexpr bool kSlab = Tr::kWgmma;
  auto k_row = [&](int r) -> const bf16* { return key0 + r < p.kv_len ? k + (key0 + r) * p.k_token_stride : nullptr; };
  load_tile<kBN, kDqk, kThreads, kAligned, decltype(k_row), kSlab>(s_k, k_row);
  if constexpr (!Tr::kVInK) {
    auto v_row = [&](int r) -> const bf16* {
      return key0 + r < p.kv_len ? v + (key0 + r) * p.v_token_stride : nullptr;
    };
    load_tile<kBN, kDv, kThreads, kAligned, decltype(v_row), kSlab>(const_cast<bf16*>(s_v), v_row);
  }
  auto load_rows = [&](int t, int st) {
    const i64 r0 = step_row0(t);
    auto q_row = [&](int r) -> const bf16* {
      const i64 row = r0 + r;
      if (row >= rows) return nullptr;
      return q + (g * group + rm.head(row)) * p.q_head_stride + rm.query(row) * p.q_token_stride;
    };
    load_tile<kBM, kDqk, kThreads, kAligned, decltype(q_row), kSlab>(s_q(st), q_row);
    auto do_row = [&](int r) -> const bf16* {
      const i64 row = r0 + r;
      if (row >= rows) return nullptr;
      return dout + (g * group + rm.head(row)) * p.dout_head_stride + rm.query(row) * p.dout_token_stride;
    };
    load_tile<kBM, kDv, kThreads, kAligned, decltype(do_row), kSlab>(s_do(st), do_row);
    load_row_values<kBM, kThreads>(s_lse(st), static_cast<const float*>(p.lse), INFINITY, r0, rows, rm, g, b, p);
    load_row_values<kBM, kThreads>(s_dd(st), delta, 0.f, r0, rows, rm, g, b, p);
  };
  if (n_tiles > 0) load_rows(0, 0);
  cp_async_commit();

  float acc_dk[kMT][kDqk / 8][4], acc_dv[kMT][kDv / 8][4];
  zero(acc_dk);
  zero(acc_dv);
  const float sl2 = float(p.scale) * kLog2e;
  const int wk0 = warp * 16 * kMT;  // the warp's first key in the block

  for (int t = 0; t < n_tiles; ++t) {
    const int st = t & 1;
    const i64 r0 = step_row0(t);
    cp_async_wait<0>();
    if constexpr (Tr::kWgmma) fence_proxy_async();  // wgmma reads what cp.async and the stores wrote
    __syncthreads();
    // Every thread's dQ adds of the previous step were issued before this barrier.
    if constexpr (Tr::kFuseDq)
      if (tid == 0 && t > 0) release_counter(dq_count + tile_base + r0 / kBM + 1);
    const bf16* sq = s_q(st);
    const bf16* sdo = s_do(st);
    const float* slse = s_lse(st);
    const float* sdd = s_dd(st);

    // S^T = K Q^T; P^T = exp2(S^T sl2 - lse log2e), zero where the row does not see the key. With wgmma the
    // next step's rows are requested while S^T runs (their addresses are work off the tensor core's path).
    float pt[kMT][kNTQ][4], ds[kMT][kNTQ][4];
    zero(pt);
    if constexpr (Tr::kWgmma) {
      warpgroup_mma_nt_async<kMT, kBM, kDqk, kBN>(pt, s_k, 64 * (warp / 4), sq);
      if (t + 1 < n_tiles) load_rows(t + 1, st ^ 1);
      cp_async_commit();
      warpgroup_wait<0>(pt);
    } else {
      if (t + 1 < n_tiles) load_rows(t + 1, st ^ 1);
      cp_async_commit();
      warp_mma<kMT, kNTQ, kDqk / 16, false, false, kDqk, kDqk>(pt, s_k, wk0, sq, 0, lane);
    }
    recompute_pt<kBN>(pt, slse, 0, sl2, rm, r0, p, key0, wk0, gid, tig);
    if constexpr (Tr::kWgmma) {
      // P^T and dS^T (bf16) through shared memory, then dV += P^T dO and dK += dS^T Q from there. P^T is kept as
      // bf16 pairs and dP^T computed only now (the registers are what limits the step); dS^T = P^T (dP^T - D)
      // uses the bf16 P^T: dS^T is rounded to bf16 for its GEMM anyway.
      u32 ph[kNTQ][2];
#pragma unroll
      for (int nt = 0; nt < kNTQ; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          ph[nt][h] = pack_bf16(pt[0][nt][2 * h], pt[0][nt][2 * h + 1]);
          *reinterpret_cast<u32*>(s_pt + swz_k64<kBN>(wk0 + gid + 8 * h, nt * 8 + 2 * tig)) = ph[nt][h];
        }
      d_into_acc(ds, sdd, tig);
      warpgroup_mma_nt<kMT, kBM, kDv, kBN, true, -1>(ds, s_v, 64 * (warp / 4), sdo);  // D - dP^T = D - V dO^T
#pragma unroll
      for (int nt = 0; nt < kNTQ; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<u32*>(s_dst + swz_k64<kBN>(wk0 + gid + 8 * h, nt * 8 + 2 * tig)) =
              pack_bf16(-lo_bf16(ph[nt][h]) * ds[0][nt][2 * h], -hi_bf16(ph[nt][h]) * ds[0][nt][2 * h + 1]);
      fence_proxy_async();
      if constexpr (Tr::kFuseDq)  // the key blocks before this one have added theirs to this row tile
        if (tid == 0) wait_counter(dq_count + tile_base + r0 / kBM, unsigned(block));
      __syncthreads();  // each warpgroup's P^T and dS^T rows are in (written by its four warps)
      if constexpr (Tr::kFuseDq) {
        // dQ^T (d_qk x 32 rows per warpgroup) = K^T dS^T, one 64-column slab of d at a time (16 accumulators
        // live, not 48: the kernel is at 255 registers), interleaved with dV and dK so that the tensor pipe has
        // queued work while a slab's adds are issued. wgmma groups complete in order.
        static_assert(kDqk == 192, "three dQ^T slabs interleaved with dV and dK");
        float* dst = dq_accum + (tile_base + r0 / kBM) * (kBM * kDqk) + tid * 4;
        float acc_dq[4][4];
        auto add_slab = [&](int mt) {
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            const float* c = acc_dq[nt];
            if (block == 0)
              st_global_v4(dst + (mt * 4 + nt) * kThreads * 4, c[0], c[1], c[2], c[3]);
            else
              red_add_v4(dst + (mt * 4 + nt) * kThreads * 4, c[0], c[1], c[2], c[3]);
          }
        };
        const bf16* s_dst_wg = s_dst + 32 * (warp / 4);
        warpgroup_mma_tt_async<kBN / 16, kBN>(acc_dq, s_k, 0, s_dst_wg);
        warpgroup_mma_ss_tb_async<kMT, kDv, kBM / 16, kBN, kBM>(acc_dv, s_pt, 64 * (warp / 4), sdo);
        warpgroup_wait<1>(acc_dq);  // slab 0 done; dV in flight
        add_slab(0);
        warpgroup_mma_tt_async<kBN / 16, kBN>(acc_dq, s_k, 1, s_dst_wg);
        warpgroup_wait<1>(acc_dv);  // dV done; slab 1 in flight
        warpgroup_mma_ss_tb_async<kMT, kDqk, kBM / 16, kBN, kBM>(acc_dk, s_dst, 64 * (warp / 4), sq);
        warpgroup_wait<1>(acc_dq);  // slab 1 done; dK in flight
        add_slab(1);
        warpgroup_mma_tt_async<kBN / 16, kBN>(acc_dq, s_k, 2, s_dst_wg);
        warpgroup_wait<0>(acc_dq);  // dK and slab 2 done
        add_slab(2);
      } else {
        warpgroup_mma_ss_tb_async<kMT, kDv, kBM / 16, kBN, kBM>(acc_dv, s_pt, 64 * (warp / 4), sdo);
        warpgroup_mma_ss_tb_async<kMT, kDqk, kBM / 16, kBN, kBM>(acc_dk, s_dst, 64 * (warp / 4), sq);
      }
      warpgroup_wait<0>(acc_dv);
      reg_fence_all(acc_dk);
    } else {
      // dP^T = V dO^T, dS^T = P^T (dP^T - D); P^T and dS^T stay in registers as the A operands of dV and dK.
      zero(ds);
      warp_mma<kMT, kNTQ, kDv / 16, false, false, Tr::kLdV, kDv>(ds, s_v, wk0, sdo, 0, lane);
#pragma unroll
      for (int nt = 0; nt < kNTQ; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float d = sdd[nt * 8 + 2 * tig + e];
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) ds[mt][nt][2 * h + e] = pt[mt][nt][2 * h + e] * (ds[mt][nt][2 * h + e] - d);
        }
      u32 pa[kMT][kBM / 16][4], dsa[kMT][kBM / 16][4];
      acc_to_a(pa, pt);
      acc_to_a(dsa, ds);
      warp_mma_ra<kMT, kDv / 8, kBM / 16, true, kDv>(acc_dv, pa, sdo, 0, lane);
      warp_mma_ra<kMT, kDqk / 8, kBM / 16, true, kDqk>(acc_dk, dsa, sq, 0, lane);
    }
  }
  if constexpr (Tr::kFuseDq)
    if (n_tiles > 0) {
      __syncthreads();  // every thread's adds to the last tile are issued
      if (tid == 0) release_counter(dq_count + tile_base + step_row0(n_tiles - 1) / kBM);
    }

  store_dkdv<kAligned>(p, b, g, key0 + wk0, 0, 0, acc_dk, acc_dv, gid, tig);
}

// dQ = scale * dq_accum, one block per (row tile, kv head, batch entry) in dq_accum's order; a tile no key
// block added to (rows that see no key) is zeros. The tile goes through shared memory (kRows x kDqk floats),
// from the accumulator order to rows, whose layout kLayout names (DqLayout). kKeys: the tiles are
// flash_bwd_vkq_kernel's dK + [dV, 0] (a key for a row, DqLayout::rows), written into dk, in `copies` copies (its
// splits: a (batch, kv head)'s copies one after another) summed in copy order.
template <int kDqk, bool kAligned, DqLayout kLayout = DqLayout::fused, bool kKeys = false>
__global__ void __launch_bounds__(256) flash_bwd_dq_convert_kernel(const AttentionBwdParams p, const float* dq_accum,
                                                                   const unsigned* dq_count, int copies) {
  constexpr int kRows = kDqTileRows, kThreads = 256;
  static_assert(!kKeys || kLayout == DqLayout::rows, "key tiles are in the rows layout");
  float* s = reinterpret_cast<float*>(dynamic_smem());
  const i64 group = kKeys ? 1 : p.q_heads / p.kv_heads, rows = kKeys ? p.kv_len : p.q_len * group;
  const i64 row_tiles = dq_row_tiles(rows);
  const RowMap rm{u32(group)};
  const i64 tile = blockIdx.x, pair = tile / row_tiles, row0 = (tile % row_tiles) * kRows;
  const i64 g = pair % p.kv_heads, b = pair / p.kv_heads;
  const int n_copies = kKeys ? copies : 1;
  bool added = false;
  for (int c = 0; c < n_copies; ++c) {
    const i64 at = (pair * n_copies + c) * row_tiles + tile % row_tiles;
    if (dq_count[at] == 0) continue;
    const float4* src = reinterpret_cast<const float4*>(dq_accum + at * (kRows * kDqk));
    for (int i = threadIdx.x; i < kRows * kDqk / 4; i += kThreads) {
      const float4 v = src[i];
      float4& d = reinterpret_cast<float4*>(s)[i];
      d = added ? float4{d.x + v.x, d.y + v.y, d.z + v.z, d.w + v.w} : v;
    }
    added = true;
  }
  __syncthreads();
  bf16* out = kKeys ? static_cast<bf16*>(p.dk) + b * p.dk_batch_stride + g * p.dk_head_stride
                    : static_cast<bf16*>(p.dq) + b * p.dq_batch_stride;
  const float scale = kLayout == DqLayout::rows ? 1.f : float(p.scale);
  auto offset = [](int r, int d) {
    if constexpr (kLayout == DqLayout::rows) return dq_accum_offset_rows(r, d);
    if constexpr (kLayout == DqLayout::ws) return dq_accum_offset_ws(r, d);
    return dq_accum_offset(r, d);
  };
  for (int i = threadIdx.x; i < kRows * kDqk / 2; i += kThreads) {
    const int r = i / (kDqk / 2), d = 2 * (i % (kDqk / 2));
    const i64 row = row0 + r;
    if (row >= rows) continue;
    const float lo = added ? scale * s[offset(r, d)] : 0.f;
    const float hi = added ? scale * s[offset(r, d + 1)] : 0.f;
    const i64 at = kKeys ? row * p.dk_token_stride
                         : (g * group + rm.head(row)) * p.dq_head_stride + rm.query(row) * p.dq_token_stride;
    store2<kAligned>(out + at + d, lo, hi);
  }
}

}  // namespace laga::cuda::flash
