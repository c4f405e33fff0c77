// The 576/512 attention backward with V inside K (flash_kernels.cuh): dK + [dV, 0] in one accumulator, with
// the key blocks resident (flash_bwd_vk_kernel) or the rows resident (flash_bwd_vkq_kernel).
#pragma once

#include "cuda/flash_bwd.cuh"

namespace laga::cuda::flash {

// ================================================================ backward, V inside K: dK + dV in one accumulator
// The absorbed MQA (576/512, V = K[:, :512]) on wgmma. The caller wants the gradient of the tensor K and V share,
// dKV = dK + [dV, 0] (AttentionBwdParams::dv_in_dk), so one fp32 accumulator per (key, column) serves both:
//   dKV[:, :d_v] += P^T dO + dS^T Q[:, :d_v],   dKV[:, d_v:] += dS^T Q[:, d_v:]
// with dS^T already scaled (scale P^T (dP^T - D)): 576 columns a key, not 1088. A block owns 64 keys and walks
// the 64-row tiles that see them (from the last one down, as the fused dQ of flash_bwd_dkdv_regs_kernel), two
// warpgroups, each all 64 keys and half of the columns. Per step: warpgroup 0 computes S^T = K Q^T and P^T
// (bf16 into shared memory), warpgroup 1 dP^T = V dO^T at the same time; (B) then both issue their P^T dO chains
// while warpgroup 1 forms dS^T from the shared P^T; (C) dO_{t+1} loads while both issue dS^T Q; (D) Q_{t+1} loads
// while both form dQ = dS K by 64-column chunks (two accumulators in turn), added to fp32 row tiles with 16-byte
// reds in the key blocks' order (the counters of the fused dQ above). The row tiles of a key block may split
// over blocks (fixed ranges of tiles, the same for every key block; fp32 partials summed in split order by
// flash_bwd_dkdv_reduce_kernel). Columns (64-column slabs of d_qk):
//   warpgroup 0: dKV [0, 256) n256 and [256, 288) n32;  dQ 4 x n64 over [0, 256), n32 [256, 288)
//   warpgroup 1: dKV [288, 320) n32, [320, 512) n192, [512, 576) n64 (dS^T Q only);  dQ n32 [288, 320), 4 x n64
// 144 accumulators a thread for dKV in both warpgroups. Shared memory: K 72 KB, Q 72 KB, dO 64 KB (one stage
// each), P^T and dS^T 8 KB each, lse and D.
// The 576 columns of a row's accumulator split between the two warpgroups of flash_bwd_vk_kernel (dKV) and
// flash_bwd_vkq_kernel (dQ): warpgroup 0 [0, 256) and [256, 288); warpgroup 1 [288, 320), [320, 512) and
// [512, 576). A: the wide block (kNA columns from kColA), B: the 32 columns from kColB, C: warpgroup 1's [512, 576)
// (warpgroup 0 keeps one unused n tile).
template <int kWg>
struct Cols576 {
  static constexpr int kNA = kWg == 0 ? 256 : 192, kColA = kWg == 0 ? 0 : 320, kColB = kWg == 0 ? 256 : 288;
  using AccA = float[1][kNA / 8][4];
  using AccB = float[1][4][4];
  using AccC = float[1][kWg == 0 ? 1 : 8][4];
};

// acc += A B over the warpgroup's Cols576 columns (warpgroup 0: A then B; warpgroup 1: B, A, then C), each block
// one committed group: A as warpgroup_mma_ss_tb_async's (K-major, kRowsA rows, 16 KS deep), B the columns of a
// [kRowsB][576] tile in 64-column slabs.
template <int kWg, int KS, int kRowsA, int kRowsB>
__device__ __forceinline__ void warpgroup_mma_cols576_async(typename Cols576<kWg>::AccA& acc_a,
                                                            typename Cols576<kWg>::AccB& acc_b,
                                                            typename Cols576<kWg>::AccC& acc_c, const bf16* s_a,
                                                            const bf16* s_b) {
  using Cols = Cols576<kWg>;
  auto col = [&](int c) { return s_b + (c / 64) * kRowsB * 64 + c % 64; };
  if constexpr (kWg == 0) {
    warpgroup_mma_ss_tb_async<1, Cols::kNA, KS, kRowsA, kRowsB>(acc_a, s_a, 0, col(Cols::kColA));
    warpgroup_mma_ss_tb_async<1, 32, KS, kRowsA, kRowsB>(acc_b, s_a, 0, col(Cols::kColB));
  } else {
    warpgroup_mma_ss_tb_async<1, 32, KS, kRowsA, kRowsB>(acc_b, s_a, 0, col(Cols::kColB));
    warpgroup_mma_ss_tb_async<1, Cols::kNA, KS, kRowsA, kRowsB>(acc_a, s_a, 0, col(Cols::kColA));
    warpgroup_mma_ss_tb_async<1, 64, KS, kRowsA, kRowsB>(acc_c, s_a, 0, col(512));
  }
}

template <int kDqk_, int kDv_>
struct BwdVkTraits {
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockN = 64, kBlockM = 64, kThreads = 256;
  static constexpr int kKBytes = kBlockN * kDqk * 2, kQBytes = kBlockM * kDqk * 2, kDoBytes = kBlockM * kDv * 2;
  static constexpr int kOffQ = kKBytes, kOffDo = kOffQ + kQBytes, kOffPt = kOffDo + kDoBytes;
  static constexpr int kOffDst = kOffPt + kBlockN * kBlockM * 2, kOffLse = kOffDst + kBlockN * kBlockM * 2;
  static constexpr int kSmemBytes = kOffLse + 2 * kBlockM * 4;
  static_assert(kDqk == 576 && kDv == 512, "the warpgroups' column split is 576/512's");
  static_assert(kKBytes % 1024 == 0 && kOffDo % 1024 == 0 && kOffPt % 1024 == 0 && kOffDst % 1024 == 0,
                "1024-aligned wgmma tiles");
  static_assert(std::size_t(kSmemBytes) <= kSmemBudget, "dKV tiles exceed shared memory");
};

// The columns [kCol0, kCol0 + 8 NT) of a warpgroup's dKV (rows = its keys from key0) to dk in bf16.
template <bool kAligned, int kCol0, int NT>
__device__ __forceinline__ void store_dkv(const AttentionBwdParams& p, bf16* dk, i64 key0, const float (&acc)[NT][4],
                                          int gid, int tig) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const i64 key = key0 + gid + 8 * h;
    if (key >= p.kv_len) continue;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      store2<kAligned>(dk + key * p.dk_token_stride + kCol0 + nt * 8 + 2 * tig, acc[nt][2 * h], acc[nt][2 * h + 1]);
  }
}

// The same into the fp32 partials of a row split (rows of kDqk floats per key).
template <int kCol0, int NT>
__device__ __forceinline__ void store_dkv_partial(const AttentionBwdParams& p, float* part, i64 key0,
                                                  const float (&acc)[NT][4], int gid, int tig) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const i64 key = key0 + gid + 8 * h;
    if (key >= p.kv_len) continue;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      *reinterpret_cast<float2*>(part + key * p.d_qk + kCol0 + nt * 8 + 2 * tig) =
          make_float2(acc[nt][2 * h], acc[nt][2 * h + 1]);
  }
}

// A dQ chunk's accumulators (columns [kCol0, kCol0 + 8 NT) of the step's 64 rows) into its fp32 row tile: stored
// by key block 0, added by the others.
template <int kCol0, int NT>
__device__ __forceinline__ void add_dq_chunk(float* tile, int t128, bool first, const float (&acc)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    store_or_add_v4(tile + ((kCol0 / 8 + nt) * 128 + t128) * 4, first, acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
  }
}

// The last product of a step in both kernels (flash_bwd_vk_kernel's dQ, flash_bwd_vkq_kernel's dK + [dV, 0]), its
// 576 columns by the warpgroup's five chunks (warpgroup 0 [0, 64), [64, 128), [128, 192), [192, 256), [256, 288);
// warpgroup 1 [288, 320), [320, 384), [384, 448), [448, 512), [512, 576)), two 64-column accumulators in turn and a
// 32-column one, each added into `tile` (add_dq_chunk). issue(acc, c0) issues chunk c0's wgmma chain (c0 an
// integral_constant) as one committed group; every next chunk is issued before the one before it is waited for and
// added, so that the adds run under the tensor cores; after_first() runs once the first chunk is issued (the tensor
// cores start before the next step's loads are requested).
template <int kWg, class Issue, class AfterFirst>
__device__ __forceinline__ void chunks576_into_tile(float* tile, int t128, bool first, Issue&& issue,
                                                    AfterFirst&& after_first) {
  using std::integral_constant;
  float qa[8][4], qb[8][4], qc[4][4];
  auto next = [&](auto& acc, auto c0, auto& done, auto done_c0) {
    issue(acc, c0);
    warpgroup_wait<1>(done);
    add_dq_chunk<decltype(done_c0)::value>(tile, t128, first, done);
  };
  if constexpr (kWg == 0) {
    issue(qa, integral_constant<int, 0>{});
    after_first();
    next(qb, integral_constant<int, 64>{}, qa, integral_constant<int, 0>{});
    next(qa, integral_constant<int, 128>{}, qb, integral_constant<int, 64>{});
    next(qb, integral_constant<int, 192>{}, qa, integral_constant<int, 128>{});
    next(qc, integral_constant<int, 256>{}, qb, integral_constant<int, 192>{});
    warpgroup_wait<0>(qc);
    add_dq_chunk<256>(tile, t128, first, qc);
  } else {
    issue(qc, integral_constant<int, 288>{});
    after_first();
    next(qa, integral_constant<int, 320>{}, qc, integral_constant<int, 288>{});
    next(qb, integral_constant<int, 384>{}, qa, integral_constant<int, 320>{});
    next(qa, integral_constant<int, 448>{}, qb, integral_constant<int, 384>{});
    next(qb, integral_constant<int, 512>{}, qa, integral_constant<int, 448>{});
    warpgroup_wait<0>(qb);
    add_dq_chunk<512>(tile, t128, first, qb);
  }
}

// The accumulators x of a warpgroup's 64 x 64 product (its warp's rows r0 + gid, + 8) into s_p in bf16, a
// [kRows][64] tile in the swz_k64 layout: P^T (flash_bwd_vk_kernel) or P (flash_bwd_vkq_kernel) for the GEMMs.
template <int kRows, int kNT>
__device__ __forceinline__ void store_p_bf16(bf16* s_p, const float (&x)[1][kNT][4], int r0, int gid, int tig) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<u32*>(s_p + swz_k64<kRows>(r0 + gid + 8 * h, nt * 8 + 2 * tig)) =
          pack_bf16(x[0][nt][2 * h], x[0][nt][2 * h + 1]);
}

// dS = scale P (dP - D) into s_ds (store_p_bf16's layout) from the bf16 P in s_p (dS is rounded to bf16 for its
// GEMMs anyway) and dP in x; d_of(nt, d) gives d[h][j], D of the element at row r0 + gid + 8 h, column
// nt * 8 + 2 tig + j (D is a query's: a column's in flash_bwd_vk_kernel's transposed tiles, a row's in
// flash_bwd_vkq_kernel's).
template <int kRows, int kNT, class DOf>
__device__ __forceinline__ void store_ds_bf16(bf16* s_ds, const bf16* s_p, const float (&x)[1][kNT][4], float scale,
                                              int r0, int gid, int tig, DOf&& d_of) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    float d[2][2];
    d_of(nt, d);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int off = swz_k64<kRows>(r0 + gid + 8 * h, nt * 8 + 2 * tig);
      const u32 ph = *reinterpret_cast<const u32*>(s_p + off);
      *reinterpret_cast<u32*>(s_ds + off) = pack_bf16(scale * lo_bf16(ph) * (x[0][nt][2 * h] - d[h][0]),
                                                      scale * hi_bf16(ph) * (x[0][nt][2 * h + 1] - d[h][1]));
    }
  }
}

// One warpgroup's part of flash_bwd_vk_kernel (its own loop: the code between each wgmma's issue and wait touches
// none of the accumulators in flight). The two meet at the same four barriers a step.
template <int kWg, class Tr, bool kAligned>
__device__ __forceinline__ void bwd_vk_role(const AttentionBwdParams& p, const float* delta, float* dq_accum,
                                            unsigned* dq_count, int splits, float* partial) {
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDqk = Tr::kDqk, kDv = Tr::kDv, kThreads = Tr::kThreads;
  constexpr int kNT = kBM / 8;
  char* smem = dynamic_smem();
  const bf16* s_k = reinterpret_cast<const bf16*>(smem);
  bf16* s_q = reinterpret_cast<bf16*>(smem + Tr::kOffQ);
  bf16* s_do = reinterpret_cast<bf16*>(smem + Tr::kOffDo);
  bf16* s_pt = reinterpret_cast<bf16*>(smem + Tr::kOffPt);    // [kBN][kBM]
  bf16* s_dst = reinterpret_cast<bf16*>(smem + Tr::kOffDst);  // [kBN][kBM], scaled
  float* s_lse = reinterpret_cast<float*>(smem + Tr::kOffLse);
  float* s_dd = s_lse + kBM;
  // Column c of a [kBM][*] (or [kBN][*]) tile in the swz_k64 layout: its slab, plus c % 64 inside it (32 at most).
  auto col = [](const bf16* s, int rows, int c) { return s + (c / 64) * rows * 64 + c % 64; };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int t128 = tid & 127, wk0 = 16 * (warp & 3);  // the warp's keys in the block (both warpgroups: all 64)
  const TileWork w = tile_work(ceil_div(p.kv_len, kBN) * splits, p.kv_heads, p.batch);  // key block * splits + split
  const int split = int(w.tile % splits);
  const i64 kblock = w.tile / splits, key0 = kblock * kBN, g = w.g, b = w.b;
  const i64 group = p.q_heads / p.kv_heads, rows = p.q_len * group;
  const RowMap rm{u32(group)};
  const i64 r_first = imin(imax(key0 - p.q_offset, 0), p.q_len) * group;  // first row that sees key0
  // The 64-row tiles (aligned to row 0, the dQ tiles) from the one holding r_first, within split `split` of the
  // row tiles' `splits` fixed ranges (the same for every key block, so that on each range key block j - 1 walks
  // the tiles one step ahead of key block j: the dQ order), walked from the range's last tile down.
  const i64 row_tiles = ceil_div(rows, kBM), per_split = ceil_div(row_tiles, splits);
  const i64 t_begin = imax(r_first / kBM, split * per_split), t_end = imin((split + 1) * per_split, row_tiles);
  const int n_tiles = r_first < rows ? int(imax(t_end - t_begin, 0)) : 0;
  auto step_row0 = [&](int t) { return (t_end - 1 - t) * kBM; };
  const i64 tile_base = (b * p.kv_heads + g) * row_tiles;

  const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_batch_stride;
  const bf16* dout = static_cast<const bf16*>(p.dout) + b * p.dout_batch_stride;
  auto load_q = [&](int t) {  // Q and lse of step t
    const i64 r0 = step_row0(t);
    auto q_row = [&](int r) -> const bf16* {
      const i64 row = r0 + r;
      if (row >= rows) return nullptr;
      return q + (g * group + rm.head(row)) * p.q_head_stride + rm.query(row) * p.q_token_stride;
    };
    load_tile<kBM, kDqk, kThreads, kAligned, decltype(q_row), true>(s_q, q_row, tid);
    load_row_values<kBM, kThreads>(s_lse, static_cast<const float*>(p.lse), INFINITY, r0, rows, rm, g, b, p);
  };
  auto load_do = [&](int t) {  // dO and D of step t
    const i64 r0 = step_row0(t);
    auto do_row = [&](int r) -> const bf16* {
      const i64 row = r0 + r;
      if (row >= rows) return nullptr;
      return dout + (g * group + rm.head(row)) * p.dout_head_stride + rm.query(row) * p.dout_token_stride;
    };
    load_tile<kBM, kDv, kThreads, kAligned, decltype(do_row), true>(s_do, do_row, tid);
    load_row_values<kBM, kThreads>(s_dd, delta, 0.f, r0, rows, rm, g, b, p);
  };
  {
    const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
    auto k_row = [&](int r) -> const bf16* { return key0 + r < p.kv_len ? k + (key0 + r) * p.k_token_stride : nullptr; };
    load_tile<kBN, kDqk, kThreads, kAligned, decltype(k_row), true>(const_cast<bf16*>(s_k), k_row, tid);
  }
  if (n_tiles > 0) load_q(0), load_do(0);
  cp_async_commit();

  // dKV accumulators (Cols576's split).
  using Cols = Cols576<kWg>;
  constexpr int kColA = Cols::kColA, kColB = Cols::kColB;
  typename Cols::AccA acc_a;
  typename Cols::AccB acc_b;
  typename Cols::AccC acc_c;
  zero(acc_a);
  zero(acc_b);
  zero(acc_c);
  const float sl2 = float(p.scale) * kLog2e, scale = float(p.scale);

  for (int t = 0; t < n_tiles; ++t) {
    const i64 r0 = step_row0(t);
    float* dq_tile = dq_accum + (tile_base + r0 / kBM) * (kBM * kDqk);
    cp_async_wait<0>();
    fence_proxy_async();  // wgmma reads what cp.async and the stores wrote
    __syncthreads();      // (A) Q_t, dO_t, lse_t and D_t are in; every dQ add of step t - 1 is issued

    float x[1][kNT][4];  // warpgroup 0: S^T, then P^T; warpgroup 1: dP^T
    if constexpr (kWg == 0) {
      warpgroup_mma_nt_async<1, kBM, kDqk, kBN>(x, s_k, 0, s_q);
      warpgroup_wait<0>(x);
      recompute_pt<kBN>(x, s_lse, 0, sl2, rm, r0, p, key0, wk0, gid, tig);
      store_p_bf16<kBN>(s_pt, x, wk0, gid, tig);
      fence_proxy_async();
    } else {
      warpgroup_mma_nt_async<1, kBM, kDv, kBN>(x, s_k, 0, s_do);
      // Row tile t - 1 is done (A): released while dP^T runs, so that the release's wait for this block's adds
      // to drain holds no wgmma back.
      release_counter_if(t128 == 0 && t > 0, dq_count + tile_base + r0 / kBM + 1);
      warpgroup_wait<0>(x);
    }
    __syncthreads();  // (B) P^T is in
    // dKV[:, :d_v] += P^T dO over the warpgroup's columns; warpgroup 1 forms dS^T = scale P^T (dP^T - D) from the
    // bf16 P^T (dS^T is rounded to bf16 for its GEMMs anyway) while its chains run.
    if constexpr (kWg == 0) {
      warpgroup_mma_ss_tb_async<1, 256, kBM / 16, kBN, kBM>(acc_a, s_pt, 0,
                                                            col(s_do, kBM, kColA));
      warpgroup_mma_ss_tb_async<1, 32, kBM / 16, kBN, kBM>(acc_b, s_pt, 0,
                                                           col(s_do, kBM, kColB));
      wgmma_wait<0>();
    } else {
      warpgroup_mma_ss_tb_async<1, 32, kBM / 16, kBN, kBM>(acc_b, s_pt, 0,
                                                           col(s_do, kBM, kColB));
      warpgroup_mma_ss_tb_async<1, 192, kBM / 16, kBN, kBM>(acc_a, s_pt, 0,
                                                            col(s_do, kBM, kColA));
      store_ds_bf16<kBN>(s_dst, s_pt, x, scale, wk0, gid, tig, [&](int nt, float (&d)[2][2]) {
        const float d0 = s_dd[nt * 8 + 2 * tig], d1 = s_dd[nt * 8 + 2 * tig + 1];  // the columns' queries
        d[0][0] = d[1][0] = d0, d[0][1] = d[1][1] = d1;
      });
      fence_proxy_async();
      wgmma_wait<0>();
    }
    reg_fence_all(acc_a);
    reg_fence_all(acc_b);
    __syncthreads();  // (C) dS^T is in; dO_t and D_t are no longer read

    // dKV += dS^T Q over the warpgroup's columns; then dQ = dS K by chunks, two accumulators in turn.
    const bool first = kblock == 0;
    warpgroup_mma_cols576_async<kWg, kBM / 16, kBN, kBM>(acc_a, acc_b, acc_c, s_dst, s_q);
    if (t + 1 < n_tiles) load_do(t + 1);  // requested while dS^T Q runs
    cp_async_commit();
    // The key blocks before this one have added theirs to the row tile: warpgroup 1 waits (every thread, the
    // same count) while its chains run; barrier D passes it on.
    if constexpr (kWg == 1) wait_counter(dq_count + tile_base + r0 / kBM, unsigned(kblock));
    wgmma_wait<0>();
    reg_fence_all(acc_a);
    reg_fence_all(acc_b);
    reg_fence_all(acc_c);
    __syncthreads();  // (D) Q_t and lse_t are no longer read; this row tile's earlier key blocks have added theirs
    // dQ's first chunk is issued before Q_{t+1} is requested (the tensor cores start first). The adds choose
    // store or red without a branch (a divergent path with wgmma in flight serialises them: C7518).
    chunks576_into_tile<kWg>(
        dq_tile, t128, first,
        [&](auto& acc, auto c0) {
          constexpr int kN = sizeof(acc) / (4 * sizeof(float)) * 8;
          warpgroup_mma_tt_n_async<kN, kBN / 16, kBN, kBN>(acc, s_dst, col(s_k, kBN, decltype(c0)::value));
        },
        [&] {
          if (t + 1 < n_tiles) load_q(t + 1);
          cp_async_commit();
        });
  }

  if (splits == 1) {
    bf16* dk = static_cast<bf16*>(p.dk) + b * p.dk_batch_stride + g * p.dk_head_stride;
    store_dkv<kAligned, kColA>(p, dk, key0 + wk0, acc_a[0], gid, tig);
    store_dkv<kAligned, kColB>(p, dk, key0 + wk0, acc_b[0], gid, tig);
    if constexpr (kWg == 1) store_dkv<kAligned, kDv>(p, dk, key0 + wk0, acc_c[0], gid, tig);
  } else {  // fp32 partials [split][b][g][key][d_qk], summed in split order by flash_bwd_dkdv_reduce_kernel
    float* part = partial + ((i64(split) * p.batch + b) * p.kv_heads + g) * p.kv_len * kDqk;
    store_dkv_partial<kColA>(p, part, key0 + wk0, acc_a[0], gid, tig);
    store_dkv_partial<kColB>(p, part, key0 + wk0, acc_b[0], gid, tig);
    if constexpr (kWg == 1) store_dkv_partial<kDv>(p, part, key0 + wk0, acc_c[0], gid, tig);
  }
  if (n_tiles > 0) {
    __syncthreads();  // every thread's adds to the last tile are issued
    if (kWg == 0 && t128 == 0) release_counter(dq_count + tile_base + step_row0(n_tiles - 1) / kBM);
  }
}

template <class Tr, bool kAligned>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_bwd_vk_kernel(const AttentionBwdParams p, const float* delta, float* dq_accum, unsigned* dq_count,
                        int splits, float* partial) {
  if (threadIdx.x < 128)
    bwd_vk_role<0, Tr, kAligned>(p, delta, dq_accum, dq_count, splits, partial);
  else
    bwd_vk_role<1, Tr, kAligned>(p, delta, dq_accum, dq_count, splits, partial);
}

// ================================================================ 576/512 backward, rows resident
// flash_bwd_vkq_kernel: flash_bwd_vk_kernel's arithmetic with the roles of rows and keys exchanged. A block owns a
// 64-row tile (RowTile's: the rows with the most keys first) and keeps its dQ in registers (warpgroup 0 columns
// [0, 288), warpgroup 1 [288, 576)); it loads its Q and dO tiles once and walks the key blocks its rows see from
// the first, loading K (V inside) once a step: 72 KB a step where flash_bwd_vk_kernel loads 136 KB of Q and dO,
// for the same 144 KB of fp32 adds. Per step: S = Q K^T (warpgroup 0) and dP = dO V^T (warpgroup 1) at the same
// time; P from the saved log-sum-exp (warpgroup 0) and dS = scale P (dP - D) (warpgroup 1) into shared memory;
// dQ += dS K over each warpgroup's columns; then dK + [dV, 0] of the key block by 64-column chunks (P^T dO +
// dS^T Q below column 512, dS^T Q above; two accumulators in turn), added into the key block's fp32 tile (keys
// in dq_accum_offset_rows' order) in the row tiles' order: the first stores, each next adds once the tile's
// counter says that the ones before it have. The row tiles before this one in that order see every key block
// this one sees, so its place in each key block's order is its place in the work order. The adds to a key block
// are a chain as long as the row tiles that see it; `splits` shortens it: the row tiles are dealt round robin
// to that many copies of the key tiles, each with its own order, and the copy kernel sums the copies in order.
template <int kDqk_, int kDv_>
struct BwdVkqTraits {
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockM = 64, kBlockN = 64, kThreads = 256;
  static constexpr int kQBytes = kBlockM * kDqk * 2, kDoBytes = kBlockM * kDv * 2, kKBytes = kBlockN * kDqk * 2;
  static constexpr int kOffDo = kQBytes, kOffK = kOffDo + kDoBytes, kOffP = kOffK + kKBytes;
  static constexpr int kOffDs = kOffP + kBlockM * kBlockN * 2, kSmemBytes = kOffDs + kBlockM * kBlockN * 2;
  static_assert(kDqk == 576 && kDv == 512, "the warpgroups' column split is 576/512's");
  static_assert(kOffDo % 1024 == 0 && kOffK % 1024 == 0 && kOffP % 1024 == 0 && kOffDs % 1024 == 0,
                "1024-aligned wgmma tiles");
  static_assert(std::size_t(kSmemBytes) <= kSmemBudget, "Q, dO and K tiles exceed shared memory");
};

// One warpgroup's part of flash_bwd_vkq_kernel (the two meet at four barriers a step).
template <int kWg, class Tr, bool kAligned>
__device__ __forceinline__ void bwd_vkq_role(const AttentionBwdParams& p, const float* delta, float* dkv_accum,
                                             unsigned* dkv_count, int splits, bool ordered) {
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDqk = Tr::kDqk, kDv = Tr::kDv, kThreads = Tr::kThreads;
  constexpr int kNT = kBN / 8;
  char* smem = dynamic_smem();
  bf16* s_q = reinterpret_cast<bf16*>(smem);
  bf16* s_do = reinterpret_cast<bf16*>(smem + Tr::kOffDo);
  bf16* s_k = reinterpret_cast<bf16*>(smem + Tr::kOffK);
  bf16* s_p = reinterpret_cast<bf16*>(smem + Tr::kOffP);    // [kBM][kBN]
  bf16* s_ds = reinterpret_cast<bf16*>(smem + Tr::kOffDs);  // [kBM][kBN], scaled
  auto col = [](const bf16* s, int rows, int c) { return s + (c / 64) * rows * 64 + c % 64; };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int t128 = tid & 127, wr0 = 16 * (warp & 3);  // the warp's rows in the tile (both warpgroups: all 64)
  const RowTile<kBM, kBN> rt(p);
  const auto& [group, rows, row0, row_last, g, b, n_full, rm, n_tiles] = rt;
  // The row tiles of a (batch, kv head) in work order, dealt round robin to `splits` copies of the key tiles: the
  // split's copy and the tile's place in each key block's adds to it.
  const unsigned order = unsigned(ceil_div(rows, kBM) - 1 - row0 / kBM), split = order % unsigned(splits);
  const unsigned place = order / unsigned(splits);
  const i64 tile_base = ((b * p.kv_heads + g) * splits + split) * ceil_div(p.kv_len, kBN);  // the copy's first tile

  const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
  auto load_k = [&](int t) {
    const i64 n0 = i64(t) * kBN;
    auto k_row = [&](int r) -> const bf16* { return n0 + r < p.kv_len ? k + (n0 + r) * p.k_token_stride : nullptr; };
    load_tile<kBN, kDqk, kThreads, kAligned, decltype(k_row), true>(s_k, k_row, tid);
  };
  {
    const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_batch_stride;
    const bf16* dout = static_cast<const bf16*>(p.dout) + b * p.dout_batch_stride;
    auto q_row = [&](int r) { return rt.row_ptr(q, p.q_head_stride, p.q_token_stride, r); };
    load_tile<kBM, kDqk, kThreads, kAligned, decltype(q_row), true>(s_q, q_row, tid);
    auto do_row = [&](int r) { return rt.row_ptr(dout, p.dout_head_stride, p.dout_token_stride, r); };
    load_tile<kBM, kDv, kThreads, kAligned, decltype(do_row), true>(s_do, do_row, tid);
  }
  if (n_tiles > 0) load_k(0);
  cp_async_commit();

  // The thread's two rows' values: warpgroup 0 their log-sum-exps times log2(e), warpgroup 1 their D.
  float rv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const i64 row = row0 + wr0 + gid + 8 * h;
    const i64 at = (b * p.q_heads + g * group + rm.head(row)) * p.q_len + rm.query(row);
    if constexpr (kWg == 0)
      rv[h] = row < rows ? static_cast<const float*>(p.lse)[at] * kLog2e : INFINITY;
    else
      rv[h] = row < rows ? delta[at] : 0.f;
  }

  // dQ accumulators (Cols576's split).
  using Cols = Cols576<kWg>;
  constexpr int kColA = Cols::kColA, kColB = Cols::kColB;
  typename Cols::AccA acc_a;
  typename Cols::AccB acc_b;
  typename Cols::AccC acc_c;
  zero(acc_a);
  zero(acc_b);
  zero(acc_c);
  const float sl2 = float(p.scale) * kLog2e, scale = float(p.scale);

  for (int t = 0; t < n_tiles; ++t) {
    const i64 n0 = i64(t) * kBN;
    float* dkv_tile = dkv_accum + (tile_base + t) * (kBN * kDqk);
    cp_async_wait<0>();
    fence_proxy_async();  // wgmma reads what cp.async and the stores wrote
    __syncthreads();      // (A) K_t is in (and Q, dO at t = 0); every add of step t - 1 is issued

    float x[1][kNT][4];  // warpgroup 0: S, then P; warpgroup 1: dP
    if constexpr (kWg == 0) {
      warpgroup_mma_nt_async<1, kBN, kDqk, kBM>(x, s_q, 0, s_k);
      warpgroup_wait<0>(x);
      const bool masked = n0 + kBN > n_full;
      probs_from_lse(
          x, sl2, tig, [&](int, int h) { return rv[h]; },
          [&](int, int h) {
            return masked ? visible_keys(rm.query(imin(row0 + wr0 + gid + 8 * h, row_last)), p.q_offset, p.kv_len) - n0
                          : i64(kBN);
          });
      store_p_bf16<kBM>(s_p, x, wr0, gid, tig);
      fence_proxy_async();
    } else {
      warpgroup_mma_nt_async<1, kBN, kDv, kBM>(x, s_do, 0, s_k);  // V = K's first d_v columns
      // Key block t - 1 is done (A): released while dP runs (the release waits for this block's adds to drain).
      release_counter_if(t128 == 0 && t > 0, dkv_count + tile_base + t - 1);
      warpgroup_wait<0>(x);
    }
    __syncthreads();  // (B) P is in
    if constexpr (kWg == 1) {  // dS = scale P (dP - D)
      store_ds_bf16<kBM>(s_ds, s_p, x, scale, wr0, gid, tig, [&](int, float (&d)[2][2]) {
        d[0][0] = d[0][1] = rv[0], d[1][0] = d[1][1] = rv[1];  // the rows' queries
      });
      fence_proxy_async();
    }
    __syncthreads();  // (C) dS is in

    // dQ += dS K over the warpgroup's columns. Warpgroup 1 waits (every thread, the same count) until the row
    // tiles before this one have added theirs to key block t (not `ordered`: only the first, which stores),
    // while its chains run; barrier D passes it on.
    warpgroup_mma_cols576_async<kWg, kBN / 16, kBM, kBN>(acc_a, acc_b, acc_c, s_ds, s_k);
    if constexpr (kWg == 1) wait_counter(dkv_count + tile_base + t, ordered || place == 0 ? place : 1u, !ordered);
    wgmma_wait<0>();
    reg_fence_all(acc_a);
    reg_fence_all(acc_b);
    reg_fence_all(acc_c);
    __syncthreads();  // (D) K_t is no longer read; the row tiles before this one have added theirs to key block t

    // dK + [dV, 0] of key block t by chunks of columns: keys x columns, the tile's rows the sum (P^T dO + dS^T Q
    // below column 512, dS^T Q above). The first chunk is issued before K_{t+1} is requested (the tensor cores
    // start first).
    chunks576_into_tile<kWg>(
        dkv_tile, t128, place == 0,
        [&](auto& acc, auto c0) {
          constexpr int kC0 = decltype(c0)::value, kN = sizeof(acc) / (4 * sizeof(float)) * 8;
          warpgroup_mma_tt2_n_async<kN, kBM / 16, kBM, kBM, (kC0 < kDv)>(
              acc, s_p, col(s_do, kBM, kC0 < kDv ? kC0 : 0), s_ds, col(s_q, kBM, kC0));
        },
        [&] {
          if (t + 1 < n_tiles) load_k(t + 1);
          cp_async_commit();
        });
  }
  if (n_tiles > 0) {
    __syncthreads();  // every thread's adds to the last key block are issued
    if (kWg == 0 && t128 == 0) release_counter(dkv_count + tile_base + n_tiles - 1);
  }

  // dQ in bf16 (dS carried the scale)
  bf16* dq = static_cast<bf16*>(p.dq) + b * p.dq_batch_stride;
  auto store = [&](auto c0, const auto& acc) {
    constexpr int kC0 = decltype(c0)::value, kN = sizeof(acc) / (4 * sizeof(float));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i64 row = row0 + wr0 + gid + 8 * h;
      if (row >= rows) continue;
      bf16* out = dq + (g * group + rm.head(row)) * p.dq_head_stride + rm.query(row) * p.dq_token_stride + kC0;
#pragma unroll
      for (int nt = 0; nt < kN; ++nt)
        store2<kAligned>(out + nt * 8 + 2 * tig, acc[0][nt][2 * h], acc[0][nt][2 * h + 1]);
    }
  };
  store(std::integral_constant<int, kColA>{}, acc_a);
  store(std::integral_constant<int, kColB>{}, acc_b);
  if constexpr (kWg == 1) store(std::integral_constant<int, kDv>{}, acc_c);
}

template <class Tr, bool kAligned>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_bwd_vkq_kernel(const AttentionBwdParams p, const float* delta, float* dkv_accum, unsigned* dkv_count,
                         int splits, bool ordered) {
  if (threadIdx.x < 128)
    bwd_vkq_role<0, Tr, kAligned>(p, delta, dkv_accum, dkv_count, splits, ordered);
  else
    bwd_vkq_role<1, Tr, kAligned>(p, delta, dkv_accum, dkv_count, splits, ordered);
}

}  // namespace laga::cuda::flash
