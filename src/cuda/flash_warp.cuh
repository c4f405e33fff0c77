// Warp-level GEMMs of the tensor-core attention kernels on bf16 shared tiles with XOR-swizzled 16-byte chunks
// (built on the primitives of flash_mma.cuh). The accumulator of two neighbouring n-tiles is the A fragment
// of one 16-wide k-step, so P (or dS) can feed the next GEMM from registers (FlashAttention-2).
#pragma once

#include <type_traits>

#include "cuda/flash_mma.cuh"

namespace laga::cuda::flash {

// ---------------------------------------------------------------- shared tiles
// Element offset of (row, col) in a shared bf16 tile of kCols columns. The 16-byte chunk index is XORed with
// a function of the row so that the 8 rows an ldmatrix phase reads (same logical chunk) land in 8 distinct
// bank groups: rows of >= 128 bytes XOR the low 3 chunk bits with row & 7; narrower rows (2 or 4 chunks, so
// 4 or 2 rows per 128-byte line) XOR with the row's line index.
template <int kCols>
__device__ __forceinline__ int swz(int row, int col) {
  static_assert(kCols % 8 == 0, "tiles hold whole 16-byte chunks");
  constexpr int kChunks = kCols / 8;
  static_assert(kChunks % 8 == 0 || kChunks == 1 || kChunks == 2 || kChunks == 4, "unsupported tile width");
  constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;
  constexpr int kMask = (kChunks >= 8 ? 8 : kChunks) - 1;
  return row * kCols + ((((col >> 3) ^ ((row / kRowsPerLine) & kMask))) << 3) + (col & 7);
}

// Element offset of (row, col) in a K-major tile laid out for wgmma's 128-byte swizzle: kCols / 64 slabs of
// [kRows][64] (128-byte rows), 16-byte chunks XORed with row % 8; the tile starts 1024-byte aligned.
template <int kRows>
__device__ __forceinline__ int swz_k64(int row, int col) {
  return (col >> 6) * (kRows * 64) + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

// ---------------------------------------------------------------- warp GEMMs
// acc[MT][NT] (a 16 MT x 8 NT tile of one warp) += A (16 MT x 16 KS) * B (16 KS x 8 NT), both from shared
// tiles, the k dimension starting at column (or row) 0 of each.
//   A: rows m0.. of s_a [m][k]; kAKMajor: s_a is [k][m] (ldmatrix.trans).
//   B: kBKMajor: s_b is [k][n], columns n0.. (as V in P V); else s_b is [n][k], rows n0.. (as K in Q K^T).
// Fragment addresses: lane l feeds row (l & 15) [or (l & 7) + 8 (l >> 4)] of the 8 x 8 matrices. Each lane
// computes a few swizzled base addresses once; every (tile, k-step) address is a base plus a compile-time
// offset, because moving 16 rows, or 8 G columns (G = the XOR group in chunks), commutes with the swizzle.
template <int kLd>
__host__ __device__ constexpr int swizzle_group() {  // chunks per XOR group
  return kLd / 8 >= 8 ? 8 : kLd / 8;
}

// Row-major operand (A [m][k], or B [n][k]): bases for the k-step phases q < G / 2.
template <int kLd, bool kIsB>
struct RowOperand {
  static constexpr int kPhases = swizzle_group<kLd>() / 2;
  static_assert(kPhases >= 1, "k tiles are at least 16 columns wide");
  u32 base[kPhases];
  __device__ __forceinline__ RowOperand(const bf16* s, int r0, int lane) {
    const int row = kIsB ? r0 + (lane & 7) + (lane >> 4) * 8 : r0 + (lane & 15);
    const int col = kIsB ? ((lane >> 3) & 1) * 8 : (lane >> 4) * 8;
#pragma unroll
    for (int q = 0; q < kPhases; ++q) base[q] = smem_u32(s + swz<kLd>(row, col + 16 * q));
  }
  // Rows r0 + 16 t.., k-step ks (a compile-time constant when unrolled).
  __device__ __forceinline__ u32 at(int t, int ks) const {
    return base[ks % kPhases] + 2u * u32(16 * t * kLd + (ks / kPhases) * 16 * kPhases);
  }
  // Moves every base by kSteps k-steps (kSteps a multiple of kPhases).
  __device__ __forceinline__ void advance(int k_steps) {
#pragma unroll
    for (int q = 0; q < kPhases; ++q) base[q] += 2u * u32(16 * k_steps);
  }
};

// k-major operand (A [k][m] or B [k][n]): one base per 16-wide column group t < kGroups.
template <int kLd, int kGroups, bool kIsB>
struct KMajorOperand {
  u32 base[kGroups];
  __device__ __forceinline__ KMajorOperand(const bf16* s, int c0, int lane) {
    const int row = kIsB ? (lane & 15) : (lane & 7) + (lane >> 4) * 8;
    const int col = kIsB ? (lane >> 4) * 8 : ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int t = 0; t < kGroups; ++t) base[t] = smem_u32(s + swz<kLd>(row, c0 + 16 * t + col));
  }
  __device__ __forceinline__ u32 at(int t, int ks) const { return base[t] + 2u * u32(16 * ks * kLd); }
  __device__ __forceinline__ void advance(int k_steps) {
#pragma unroll
    for (int t = 0; t < kGroups; ++t) base[t] += 2u * u32(16 * k_steps * kLd);
  }
  static constexpr int kPhases = 1;
};

// B fragments of every n-tile for k-step ks: pairs of n-tiles by ldmatrix.x4, an odd last tile by .x2
// (lanes 0-15 give its addresses, which match the .x4 pattern).
template <int NT, bool kBKMajor, class Op>
__device__ __forceinline__ void load_b(u32 (&b)[NT][2], const Op& op, int ks) {
#pragma unroll
  for (int nt = 0; nt + 1 < NT; nt += 2) {
    u32 r[4];
    if constexpr (kBKMajor)
      ldsm_x4_t(r, op.at(nt / 2, ks));
    else
      ldsm_x4(r, op.at(nt / 2, ks));
    b[nt][0] = r[0], b[nt][1] = r[1], b[nt + 1][0] = r[2], b[nt + 1][1] = r[3];
  }
  if constexpr (NT % 2 == 1) {
    if constexpr (kBKMajor)
      ldsm_x2_t(b[NT - 1], op.at(NT / 2, ks));
    else
      ldsm_x2(b[NT - 1], op.at(NT / 2, ks));
  }
}

template <int NT, bool kBKMajor, int kLdB>
using BOperand = std::conditional_t<kBKMajor, KMajorOperand<kLdB, (NT + 1) / 2, true>, RowOperand<kLdB, true>>;

// The k loop runs kInner k-steps unrolled (a multiple of the swizzle phases, so the addresses inside are
// base + constant) per iteration of a rolled outer loop: fully unrolling 36 k-steps lets the compiler hoist
// loads far ahead and spill the accumulators.
template <int KS, int kPhasesA, int kPhasesB>
__host__ __device__ constexpr int inner_k_steps() {
  constexpr int p = kPhasesA > kPhasesB ? kPhasesA : kPhasesB;
  return KS % 4 == 0 && p <= 4 ? 4 : p;
}

template <int MT, int NT, int KS, bool kAKMajor, bool kBKMajor, int kLdA, int kLdB>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], const bf16* s_a, int m0, const bf16* s_b, int n0,
                                         int lane) {
  using AOp = std::conditional_t<kAKMajor, KMajorOperand<kLdA, MT, false>, RowOperand<kLdA, false>>;
  using BOp = BOperand<NT, kBKMajor, kLdB>;
  AOp oa(s_a, m0, lane);
  BOp ob(s_b, n0, lane);
  constexpr int kInner = inner_k_steps<KS, AOp::kPhases, BOp::kPhases>();
  static_assert(KS % kInner == 0, "k steps must split evenly");
#pragma unroll 1
  for (int ko = 0; ko < KS / kInner; ++ko) {
#pragma unroll
    for (int ks = 0; ks < kInner; ++ks) {
      u32 a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        if constexpr (kAKMajor)
          ldsm_x4_t(a[mt], oa.at(mt, ks));
        else
          ldsm_x4(a[mt], oa.at(mt, ks));
      }
      u32 b[NT][2];
      load_b<NT, kBKMajor>(b, ob, ks);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
    }
    oa.advance(kInner);
    ob.advance(kInner);
  }
}

// The same with A from registers (a[mt][ks], e.g. P converted from an accumulator): fully unrolled (the
// register index must be a constant), KS is small.
template <int MT, int NT, int KS, bool kBKMajor, int kLdB>
__device__ __forceinline__ void warp_mma_ra(float (&acc)[MT][NT][4], const u32 (&a)[MT][KS][4], const bf16* s_b,
                                            int n0, int lane) {
  const BOperand<NT, kBKMajor, kLdB> ob(s_b, n0, lane);
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    u32 b[NT][2];
    load_b<NT, kBKMajor>(b, ob, ks);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[mt][nt], a[mt][ks], b[nt][0], b[nt][1]);
  }
}

// ---------------------------------------------------------------- warpgroup GEMMs (wgmma)
// Issued, committed and waited for in place (the accumulators are ready on return). Warp w of the group holds
// rows 64 mt + 16 (w % 4).. of each m64 tile in the mma.sync C layout. Every tile is in the swz_k64 layout.
template <int NT>
__device__ __forceinline__ void reg_fence_all(float (&acc)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT * 4; ++i) reg_fence(acc[i / 4][i % 4]);
}
template <int MT, int NT>
__device__ __forceinline__ void reg_fence_all(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) reg_fence_all(acc[mt]);
}

// The descriptor of the same operand `bytes` further on (a k step, an m tile, a slab): the start address is the
// descriptor's low 14 bits in 16-byte units and no shared-memory address reaches their top, so an add to the low
// word never carries. A wgmma's descriptors then cost an add each rather than the address's mask, shift and merge
// (which were a quarter of the 192/128 forward's loop).
__device__ __forceinline__ std::uint64_t desc_advance(std::uint64_t desc, u32 bytes) {
  return (desc & 0xFFFFFFFF00000000ull) | u32(u32(desc) + (bytes >> 4));
}

// Waits until at most kPending wgmma groups of this warpgroup are in flight; acc (of a finished group) is ready.
// acc: an accumulator array [MT][NT][4] or [NT][4].
template <int kPending, class Acc>
__device__ __forceinline__ void warpgroup_wait(Acc& acc) {
  wgmma_wait<kPending>();
  reg_fence_all(acc);
}

// acc[MT][N/8][4] = A B^T: A the rows m0 + 64 mt.. of a tile [kRowsA][kK], B a tile [N][kK] (as K in Q K^T).
// kFromAcc: acc += kScaleB A B^T (the accumulator's values are the start). Issued and committed as one group; acc
// is ready after warpgroup_wait.
template <int MT, int N, int kK, int kRowsA, bool kFromAcc = false, int kScaleB = 1>
__device__ __forceinline__ void warpgroup_mma_nt_async(float (&acc)[MT][N / 8][4], const bf16* s_a, int m0,
                                                       const bf16* s_b) {
  static_assert(kK % 64 == 0, "whole 64-column slabs");
  const std::uint64_t da0 = wgmma_desc_sw128(smem_u32(s_a) + u32(m0 * 128));
  const std::uint64_t db0 = wgmma_desc_sw128(smem_u32(s_b));
  reg_fence_all(acc);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    const std::uint64_t db = desc_advance(db0, u32((kk / 4) * N * 128 + (kk % 4) * 32));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      wgmma_ss<N, 0, 0, kScaleB>(acc[mt], desc_advance(da0, u32((kk / 4) * kRowsA * 128 + mt * 64 * 128 + (kk % 4) * 32)),
                           db, kFromAcc || kk > 0 ? 1 : 0);
  }
  wgmma_commit();
}
template <int MT, int N, int kK, int kRowsA, bool kFromAcc = false, int kScaleB = 1>
__device__ __forceinline__ void warpgroup_mma_nt(float (&acc)[MT][N / 8][4], const bf16* s_a, int m0, const bf16* s_b) {
  warpgroup_mma_nt_async<MT, N, kK, kRowsA, kFromAcc, kScaleB>(acc, s_a, m0, s_b);
  warpgroup_wait<0>(acc);
}

// acc[MT][N/8][4] += A B: A from registers (a[mt][ks], the mma.sync A fragments of each warp's 16 rows of m64
// tile mt), B (16 KS x N) the rows 0.. of a tile [kRowsB][N] read transposed (rows are k: as V in P V).
// Issued and committed as one group: acc is ready, and a may be reused, after warpgroup_wait.
template <int MT, int N, int KS, int kRowsB>
__device__ __forceinline__ void warpgroup_mma_rs_tb_async(float (&acc)[MT][N / 8][4], const u32 (&a)[MT][KS][4],
                                                          const bf16* s_b) {
  const std::uint64_t db0 = wgmma_desc_sw128_mn(smem_u32(s_b), u32(kRowsB * 128));
  reg_fence_all(acc);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const std::uint64_t db = desc_advance(db0, u32(ks * 16 * 128));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) wgmma_rs_tb<N>(acc[mt], a[mt][ks], db, 1);
  }
  wgmma_commit();
}
template <int MT, int N, int KS, int kRowsB>
__device__ __forceinline__ void warpgroup_mma_rs_tb(float (&acc)[MT][N / 8][4], const u32 (&a)[MT][KS][4],
                                                    const bf16* s_b) {
  warpgroup_mma_rs_tb_async<MT, N, KS, kRowsB>(acc, a, s_b);
  warpgroup_wait<0>(acc);
}

// acc[MT][N/8][4] += A B: A the rows m0 + 64 mt.. of a K-major tile [kRowsA][16 KS] (as P^T, keys x rows), B
// (16 KS x N) a tile [kRowsB][N] read transposed (as dO in P^T dO). Issued and committed as one group.
template <int MT, int N, int KS, int kRowsA, int kRowsB>
__device__ __forceinline__ void warpgroup_mma_ss_tb_async(float (&acc)[MT][N / 8][4], const bf16* s_a, int m0,
                                                          const bf16* s_b) {
  const std::uint64_t da0 = wgmma_desc_sw128(smem_u32(s_a) + u32(m0 * 128));
  const std::uint64_t db0 = wgmma_desc_sw128_mn(smem_u32(s_b), u32(kRowsB * 128));
  reg_fence_all(acc);
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const std::uint64_t db = desc_advance(db0, u32(ks * 16 * 128));
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      wgmma_ss<N, 0, 1>(acc[mt], desc_advance(da0, u32((ks / 4) * kRowsA * 128 + mt * 64 * 128 + (ks % 4) * 32)), db, 1);
  }
  wgmma_commit();
}

// acc[N/8][4] = A1 B1 + A2 B2, each product A B with A (64 x 16 KS) the transpose of the tile [kRowsA][64] at s_a
// (as dS from the dS^T tile [keys][rows], or P^T from the P tile [rows][keys]) and B (16 KS x N) the tile
// [kRowsB][*] read transposed from column s_b on (as K [keys][d] in dQ = dS K, or dO [rows][d] in P^T dO; s_b may
// point 32 columns into a slab when N = 32). kBoth false: A2 B2 alone (s_a1, s_b1 unused). Issued and committed
// as one group.
template <int N, int KS, int kRowsA, int kRowsB, bool kBoth>
__device__ __forceinline__ void warpgroup_mma_tt2_n_async(float (&acc)[N / 8][4], const bf16* s_a1, const bf16* s_b1,
                                                          const bf16* s_a2, const bf16* s_b2) {
  static_assert(N == 32 || N == 64, "wgmma SS both-transposed shapes in use: n32, n64");
  reg_fence_all(acc);
  wgmma_fence();
  auto product = [&](const bf16* s_a, const bf16* s_b, bool accumulate) {
    const std::uint64_t da0 = wgmma_desc_sw128_mn(smem_u32(s_a), u32(kRowsA * 128));
    const std::uint64_t db0 = wgmma_desc_sw128_mn(smem_u32(s_b), u32(kRowsB * 128));
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const std::uint64_t da = desc_advance(da0, u32(ks * 16 * 128));
      const std::uint64_t db = desc_advance(db0, u32(ks * 16 * 128));
      wgmma_ss<N, 1, 1>(acc, da, db, accumulate || ks > 0 ? 1 : 0);
    }
  };
  if constexpr (kBoth) product(s_a1, s_b1, false);
  product(s_a2, s_b2, kBoth);
  wgmma_commit();
}
// acc[N/8][4] = A B (one product of warpgroup_mma_tt2_n_async).
template <int N, int KS, int kRowsA, int kRowsB>
__device__ __forceinline__ void warpgroup_mma_tt_n_async(float (&acc)[N / 8][4], const bf16* s_a, const bf16* s_b) {
  warpgroup_mma_tt2_n_async<N, KS, kRowsA, kRowsB, false>(acc, nullptr, nullptr, s_a, s_b);
}

// A B, A (64 MT x 16 KS) and B (16 KS x 32) both read transposed: A^T the tile [kRows][64 MT] (m tile mt = slab
// mt), B^T the tile [kRows][64] whose columns start at s_b (which may point 32 columns into the slab). As
// dQ^T = K^T dS^T over the keys of a block.
// acc[4][4] = A B for the m tile (64-column slab) mt of A^T only: one group per slab keeps 16 accumulators live.
template <int KS, int kRows>
__device__ __forceinline__ void warpgroup_mma_tt_async(float (&acc)[4][4], const bf16* s_a, int mt, const bf16* s_b) {
  warpgroup_mma_tt_n_async<32, KS, kRows, kRows>(acc, s_a + mt * kRows * 64, s_b);
}

// An accumulator [MT][2 KS][4] (fp32) as A fragments [MT][KS][4] (bf16) of the next GEMM, k = its columns.
template <int MT, int KS>
__device__ __forceinline__ void acc_to_a(u32 (&a)[MT][KS][4], const float (&c)[MT][2 * KS][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      a[mt][ks][0] = pack_bf16(c[mt][2 * ks][0], c[mt][2 * ks][1]);
      a[mt][ks][1] = pack_bf16(c[mt][2 * ks][2], c[mt][2 * ks][3]);
      a[mt][ks][2] = pack_bf16(c[mt][2 * ks + 1][0], c[mt][2 * ks + 1][1]);
      a[mt][ks][3] = pack_bf16(c[mt][2 * ks + 1][2], c[mt][2 * ks + 1][3]);
    }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&c)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) c[mt][nt][0] = c[mt][nt][1] = c[mt][nt][2] = c[mt][nt][3] = 0.f;
}

}  // namespace laga::cuda::flash
