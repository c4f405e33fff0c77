// The causal mask and the online softmax of the tensor-core attention kernels, on a warp's fragment of a score
// tile: an array [MT][NT][4] in the mma.sync m16n8 C layout, which is also how a wgmma m64nN accumulator lies in
// each warp of its warpgroup (warp w holds rows 16 w.. of every m64 tile). Element [mt][nt][2 h + e] is fragment
// row (mt, h) -- row 16 mt + gid + 8 h of the warp's rows in the mma.sync layout, 64 mt + 16 w + gid + 8 h of a
// wgmma tile -- and column nt * 8 + 2 tig + e of the warp's columns (gid = lane / 4, tig = lane % 4): the four
// lanes of a quad hold one row's columns between them. The kernels say which row and key each (mt, h) and
// column are; these functions hold what is the same in all of them (the exp2 domain: sl2 = scale log2(e)). The
// row's finish, 1 / l and the log-sum-exp, is core/softmax.hpp's, shared with the eager and generic kernels.
#pragma once

#include <cmath>

#include "core/softmax.hpp"
#include "cuda/flash_warp.cuh"

namespace laga::cuda::flash {

constexpr float kLog2e = 1.4426950408889634f;

// The column (within the warp's columns) of fragment element [.][nt][2 h + e].
__device__ __forceinline__ int frag_col(int nt, int tig, int e) { return nt * 8 + 2 * tig + e; }

// A count of visible columns as the bound of a 32-bit compare: every fragment column or row is below 1024, so
// clamping to [0, 1024] keeps each comparison's result and makes it one instruction instead of a 64-bit pair.
__device__ __forceinline__ int col_bound(i64 v) { return int(v < 0 ? 0 : v > 1024 ? 1024 : v); }

// The causal mask: s = -inf where the row does not see the key. vis(mt, h): how many of the warp's columns, from
// its first, fragment row (mt, h) sees (core/causal.hpp's visible_keys of the row's query, less the key of the
// warp's first column; may be <= 0 or past the tile).
template <int MT, int NT, class Vis>
__device__ __forceinline__ void mask_scores(float (&s)[MT][NT][4], int tig, Vis vis) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int v = col_bound(vis(mt, h));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (frag_col(nt, tig, e) >= v) s[mt][nt][2 * h + e] = -INFINITY;
    }
}

// The backward's probabilities from the saved log-sum-exp, in place: p = exp2(s sl2 - lse2(mt, h)) where the row
// sees the key, 0 elsewhere. lse2(mt, h): the row's log-sum-exp times log2(e); vis as for mask_scores.
template <int MT, int NT, class Lse2, class Vis>
__device__ __forceinline__ void probs_from_lse(float (&s)[MT][NT][4], float sl2, int tig, Lse2 lse2, Vis vis) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l2 = lse2(mt, h);
      const int v = col_bound(vis(mt, h));
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = exp2_approx(fmaf(s[mt][nt][2 * h + e], sl2, -l2));
          s[mt][nt][2 * h + e] = frag_col(nt, tig, e) < v ? pv : 0.f;
        }
    }
}

// The same on a transposed fragment (S^T, as the dK/dV kernels compute it): fragment row (mt, h) is a key, column
// (nt, e) = nt * 8 + 2 tig + e a score row. lse2(nt, e): that row's log-sum-exp times log2(e); vis(nt, e): how
// many of the warp's keys, from its first, that row sees. kMask false: every row sees every key (vis unused).
template <bool kMask = true, int MT, int NT, class Lse2, class Vis>
__device__ __forceinline__ void probs_from_lse_t(float (&pt)[MT][NT][4], float sl2, int gid, Lse2 lse2, Vis vis) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float l2 = lse2(nt, e);
      const int v = kMask ? col_bound(vis(nt, e)) : 0;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float pv = exp2_approx(fmaf(pt[mt][nt][2 * h + e], sl2, -l2));
          pt[mt][nt][2 * h + e] = !kMask || mt * 16 + gid + 8 * h < v ? pv : 0.f;
        }
    }
}

// Reductions over the quad of lanes that holds a row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, shfl_xor(x, 1));
  return fmaxf(x, shfl_xor(x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += shfl_xor(x, 1);
  return x + shfl_xor(x, 2);
}

// Row maxima of the warp's columns: over the thread's columns, then the quad.
template <int MT, int NT>
__device__ __forceinline__ void row_max(float (&mx)[MT][2], const float (&s)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float x = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) x = fmaxf(x, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
      mx[mt][h] = quad_max(x);
    }
}

// The online softmax (below) before the first key tile: maxima -inf, sums 0. The state is two arrays the kernel
// owns rather than an object: held in a struct, the same code cost the 192/128 forward a different register
// allocation (8 more SASS instructions).
template <int MT>
__device__ __forceinline__ void online_softmax_init(float (&m)[MT][2], float (&l)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
}

// The forward's online softmax, one key tile of MT x 2 fragment rows: running maxima m (of the unscaled scores;
// -inf before the first visible key) and sums l (of the thread's own columns; quad_sum adds up the row's at the
// end, 0 before the first visible key). s, masked to -inf, with mx its row maxima over every column of the row,
// becomes P = exp2(s sl2 - m_new sl2) in place; l is rescaled and added to; corr = exp2((m_old - m_new) sl2) is
// the factor of the output's rescale (exactly 1 where the maximum did not move).
template <int MT, int NT>
__device__ __forceinline__ void online_softmax_step(float (&m)[MT][2], float (&l)[MT][2], float (&s)[MT][NT][4],
                                                    const float (&mx)[MT][2], float sl2, float (&corr)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[mt][h], mx[mt][h]);
      const float ms = m_new == -INFINITY ? 0.f : m_new * sl2;  // a row with nothing visible yet stays empty
      corr[mt][h] = exp2_approx(m[mt][h] * sl2 - ms);
      m[mt][h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pv = exp2_approx(fmaf(s[mt][nt][2 * h + e], sl2, -ms));
          s[mt][nt][2 * h + e] = pv;
          sum += pv;
        }
      l[mt][h] = l[mt][h] * corr[mt][h] + sum;
    }
}

// The output's rescale, acc *= corr of each fragment row, skipped when no row of the warp moved its maximum:
// corr is exactly 1 then (exp2 of 0), so skipping changes no bit and saves 4 NT MT multiplies a thread.
template <int MT, int NT>
__device__ __forceinline__ void rescale_rows(float (&acc)[MT][NT][4], const float (&corr)[MT][2]) {
  bool moved = false;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) moved = moved || corr[mt][0] != 1.f || corr[mt][1] != 1.f;
  if (warp_any(moved)) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] *= corr[mt][e >> 1];
  }
}

}  // namespace laga::cuda::flash
