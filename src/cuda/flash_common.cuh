// What the tensor-core attention kernels share (flash_kernels.cuh): the shared-memory budget, the grid's work
// order, a block's row tile or key block, tile loads into swizzled shared memory (synchronous, and the
// warp-specialised kernels' asynchronous ones), and a persistent grid's hand-over of work items.
#pragma once

#include <cmath>
#include <cstddef>

#include "core/causal.hpp"
#include "cuda/flash_softmax.cuh"
#include "cuda/flash_warp.cuh"
#include "laga/backend.hpp"

namespace laga::cuda::flash {

constexpr std::size_t kSmemBudget = 227 * 1024;  // Hopper's opt-in shared memory per block

// How a kernel stages the K/V (or Q/dO) tiles it walks.
enum class Pipe {
  split,   // one K and one V buffer: V_t loads during S_t, K_{t+1} during the softmax and the second GEMM
  paired,  // two stages, each a whole tile (K and V): tile t+1 loads during tile t
};

__host__ __device__ constexpr i64 imin(i64 a, i64 b) { return a < b ? a : b; }
__host__ __device__ constexpr i64 imax(i64 a, i64 b) { return a > b ? a : b; }
__host__ __device__ constexpr i64 ceil_div(i64 a, i64 b) { return (a + b - 1) / b; }

// Grid order. A kernel's blocks are (tile, kv head, batch entry) flattened into blockIdx.x. Within a group of
// kHeadGroup (kv head, batch) pairs the tile is slowest, tile 0 the most causal work (the last row tile; the
// first key tile), so the GPU issues blocks in decreasing work across the group's heads and the last wave is
// short tiles. (With the tile fastest, every head's short tiles ran before the next head's long ones: at
// S = 8k, h 16 the last wave held long tiles alone.) Groups run one after the other, so the blocks resident
// at a time share the K/V (or Q/dO) of at most kHeadGroup heads in L2: with every head in one group, 128
// heads x 32k keys of K/V streamed from HBM and the h128 S32k forward lost 16%. The warp-specialised kernels
// take their group size at run time (head_group): the forward's default is kForwardHeadGroup, 4 heads at a time,
// which on an H200 ran +1-4% over 16 at the perf shapes and +8-13% at the all_gather rank's 32k keys (its persistent
// blocks hand a head's row tiles out 4x closer together, so more of them read each K/V tile while L2 holds it;
// src/cuda/NOTES.md version 37); the warp-specialised backward's kBackwardHeadGroup, 8 heads at a time, which
// read 3x fewer HBM bytes than 16 at S = 32k and ran 1-4% faster at the power limit (version 38).
constexpr i64 kHeadGroup = 16;
constexpr i64 kForwardHeadGroup = 4;
constexpr i64 kBackwardHeadGroup = 8;
__host__ __device__ constexpr i64 grid_blocks(i64 tiles, i64 kv_heads, i64 batch) { return tiles * kv_heads * batch; }
struct TileWork {
  i64 tile, g, b;  // tile in work order (0: the most work), kv head, batch entry
};
__device__ __forceinline__ TileWork tile_work(i64 x, i64 tiles, i64 kv_heads, i64 batch, i64 head_group = kHeadGroup) {
  const i64 hb = kv_heads * batch;
  const i64 group = x / (tiles * head_group);  // every group but the last is full
  const i64 first = group * head_group, size = imin(head_group, hb - first);
  const i64 within = x - group * tiles * head_group;
  const i64 pair = first + within % size;  // (kv head, batch entry), kv head fastest
  return {within / size, pair % kv_heads, pair / kv_heads};
}
__device__ __forceinline__ TileWork tile_work(i64 tiles, i64 kv_heads, i64 batch) {
  return tile_work(i64(blockIdx.x), tiles, kv_heads, batch);
}

// Row r of a kv head's problem is query r / group of query head g * group + r % group. Divided in 32 bits
// (rows < 2^31, checked at launch), and not at all for MHA: the address of every prefetched row is formed in
// the kernels' loops, where a 64-bit division costs a ~70-instruction subroutine.
struct RowMap {
  u32 group;
  __device__ __forceinline__ i64 query(i64 row) const { return group == 1 ? row : i64(u32(row) / group); }
  __device__ __forceinline__ i64 head(i64 row) const { return group == 1 ? 0 : i64(u32(row) % group); }
};

// The work of a block of the row-tiled kernels (the forwards, the dQ kernel): kBM rows of kv head g and batch
// entry b, the longest rows first, and the keys they see: n_full by every row, n_tiles kBN-key tiles by the last.
template <int kBM, int kBN>
struct RowTile {
  i64 group, rows, row0, row_last, g, b, n_full;
  RowMap rm;
  int n_tiles;
  // Item x of the work order (a block per item: blockIdx.x), in groups of head_group (kv head, batch) pairs.
  __device__ __forceinline__ explicit RowTile(const AttentionFwdParams& p) : RowTile(p, i64(blockIdx.x)) {}
  __device__ __forceinline__ RowTile(const AttentionFwdParams& p, i64 x, i64 head_group = kHeadGroup)
      : group(p.q_heads / p.kv_heads), rows(p.q_len * group), rm{u32(group)} {
    const i64 tiles = ceil_div(rows, kBM);
    const TileWork w = tile_work(x, tiles, p.kv_heads, p.batch, head_group);
    row0 = (tiles - 1 - w.tile) * kBM, g = w.g, b = w.b;
    row_last = imin(row0 + kBM, rows) - 1;
    n_full = visible_keys(rm.query(row0), p.q_offset, p.kv_len);
    n_tiles = int(ceil_div(visible_keys(rm.query(row_last), p.q_offset, p.kv_len), kBN));
  }
  // Row r of the tile in a [head, token] view of the batch entry (base: its first element), null past the end.
  __device__ __forceinline__ const bf16* row_ptr(const bf16* base, i64 head_stride, i64 token_stride, int r) const {
    const i64 row = row0 + r;
    if (row >= rows) return nullptr;
    return base + (g * group + rm.head(row)) * head_stride + rm.query(row) * token_stride;
  }
};

// The work of a block of the fused-dQ backward kernels (flash_bwd_dkdv_regs_kernel, flash_bwd_ws_kernel): kBN keys
// of kv head g and batch entry b from key0 (key block `block`: the first keys are seen by the most rows), and
// the n_tiles kBM-row tiles that see them, aligned to row 0 (the tiles of dq_accum), walked from the last one
// down to the one holding the first row that sees key0: the diagonal, masked, tile comes last.
template <int kBN, int kBM>
struct KeyTile {
  i64 block, key0, g, b, group, rows, row_tiles, tile_base;  // tile_base: this (batch, kv head)'s first dQ tile
  RowMap rm;
  int n_tiles;
  // The block's key block (blockIdx.x), or item x of the work order (a persistent grid's blocks walk several) in
  // groups of head_group (kv head, batch) pairs.
  __device__ __forceinline__ explicit KeyTile(const AttentionFwdParams& p)
      : group(p.q_heads / p.kv_heads), rows(p.q_len * group), row_tiles(ceil_div(rows, kBM)), rm{u32(group)} {
    init(p, tile_work(ceil_div(p.kv_len, kBN), p.kv_heads, p.batch));
  }
  __device__ __forceinline__ KeyTile(const AttentionFwdParams& p, i64 x, i64 head_group = kHeadGroup)
      : group(p.q_heads / p.kv_heads), rows(p.q_len * group), row_tiles(ceil_div(rows, kBM)), rm{u32(group)} {
    init(p, tile_work(x, ceil_div(p.kv_len, kBN), p.kv_heads, p.batch, head_group));
  }
  __device__ __forceinline__ i64 step_row0(int t) const { return (row_tiles - 1 - t) * kBM; }

 private:
  __device__ __forceinline__ void init(const AttentionFwdParams& p, const TileWork& w) {
    block = w.tile, key0 = w.tile * kBN, g = w.g, b = w.b;
    tile_base = (b * p.kv_heads + g) * row_tiles;
    const i64 r_first = imin(imax(key0 - p.q_offset, 0), p.q_len) * group;  // first row that sees key0
    n_tiles = r_first < rows ? int(row_tiles - r_first / kBM) : 0;
  }
};

// kRows x kCols of a global view into a swizzled shared tile; src(r) is row r's first element, or null for
// rows past the end (zero-filled). kAligned: rows start 16-byte aligned (cp.async); else 2-byte loads.
// kSlab: the wgmma layout (swz_k64) instead of swz. tid: the thread's index among the kThreads that load.
template <int kRows, int kCols, int kThreads, bool kAligned, class RowSrc, bool kSlab = false>
__device__ __forceinline__ void load_tile(bf16* s, const RowSrc& src, const int tid) {
  constexpr int kChunks = kCols / 8;
  static_assert(kThreads % kRows == 0 || kRows % kThreads == 0, "threads and rows must nest");
  constexpr int kThreadsPerRow = kThreads >= kRows ? kThreads / kRows : 1;
  constexpr int kRowStep = kThreads / kThreadsPerRow;
  for (int r = tid / kThreadsPerRow; r < kRows; r += kRowStep) {
    const bf16* g = src(r);
#pragma unroll 4
    for (int c = tid % kThreadsPerRow; c < kChunks; c += kThreadsPerRow) {
      bf16* d = s + (kSlab ? swz_k64<kRows>(r, c * 8) : swz<kCols>(r, c * 8));
      if (g == nullptr)
        store_zero16(d);
      else if constexpr (kAligned)
        cp_async16(d, g + c * 8);
      else
        copy8_unaligned(d, g + c * 8);
    }
  }
}
template <int kRows, int kCols, int kThreads, bool kAligned, class RowSrc, bool kSlab = false>
__device__ __forceinline__ void load_tile(bf16* s, const RowSrc& src) {
  load_tile<kRows, kCols, kThreads, kAligned, RowSrc, kSlab>(s, src, int(threadIdx.x));
}

// Per-row fp32 values (lse, D) of rows row0.. into shared memory; `pad` for rows past the end.
template <int kRows, int kThreads>
__device__ __forceinline__ void load_row_values(float* s, const float* src, float pad, i64 row0, i64 rows, RowMap rm,
                                                i64 g, i64 b, const AttentionFwdParams& p) {
  const i64 group = rm.group;
  for (int r = threadIdx.x; r < kRows; r += kThreads) {
    const i64 row = row0 + r;
    if (row < rows)
      cp_async4(s + r, src + (b * p.q_heads + g * group + rm.head(row)) * p.q_len + rm.query(row));
    else
      s[r] = pad;
  }
}

template <bool kAligned>
__device__ __forceinline__ void store2(bf16* dst, float lo, float hi) {
  if constexpr (kAligned) {
    *reinterpret_cast<u32*>(dst) = pack_bf16(lo, hi);
  } else {
    dst[0] = float_to_bf16(lo);
    dst[1] = float_to_bf16(hi);
  }
}

// The loading warpgroup's copy of rows [r_begin, r_end) of a kRows x kCols tile of a global view into a swz_k64
// tile: rows past the end are zeroed by cp.async too (aligned views), so that the tile's mbarrier arrival covers
// them; unaligned views copy with plain loads and stores, which the caller publishes with a fence and an ordinary
// arrival.
template <int kRows, int kCols, int kThreads, bool kAligned, class RowSrc>
__device__ __forceinline__ void load_tile_async(bf16* s, const RowSrc& src, const void* any_global, int tid,
                                                int r_begin = 0, int r_end = kRows) {
  // Eight threads a row, 16 bytes each: a warp reads four rows' whole 128-byte lines (a thread a row would
  // read half of each 32-byte sector it touches per instruction) and writes eight distinct chunks of a
  // swizzled row per quarter-warp (no bank conflict).
  constexpr int kPerRow = 8;
  static_assert(kThreads % kPerRow == 0 && (kCols / 8) % kPerRow == 0, "whole 128-byte lines");
  for (int r = r_begin + tid / kPerRow; r < r_end; r += kThreads / kPerRow) {
    const bf16* g = src(r);
#pragma unroll
    for (int j = 0; j < kCols / 8 / kPerRow; ++j) {
      const int c = tid % kPerRow + j * kPerRow;
      bf16* d = s + swz_k64<kRows>(r, c * 8);
      if constexpr (kAligned) {
        if (g == nullptr)
          cp_async16_zero(d, any_global);
        else
          cp_async16(d, g + c * 8);
      } else {
        if (g == nullptr)
          store_zero16(d);
        else
          copy8_unaligned(d, g + c * 8);
      }
    }
  }
}

// The loading warpgroup's copy of kRows rows `stride` elements apart from `first` (rows from `valid` on zeroed),
// kCols wide, into a swz_k64 tile, eight threads a row (aligned views: cp.async). A thread's rows are
// tid / 8 + kStep i, whose swizzled chunk is the same (kStep is a multiple of 8), so past its first address every
// shared one is a constant offset and every global one an add a row: the loads of K and V at one instruction
// and a fraction a 16-byte copy (the general row-by-row form spent a dozen, and the consumers waited on them).
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void load_rows_async(bf16* s, const bf16* first, i64 stride, i64 valid, int tid) {
  constexpr int kPerRow = 8, kStep = kThreads / kPerRow;
  static_assert(kStep % 8 == 0 && kRows % kStep == 0 && kCols % 64 == 0, "whole row steps and slabs");
  const int r0 = tid / kPerRow, c = tid % kPerRow;
  bf16* d = s + swz_k64<kRows>(r0, c * 8);
  const bf16* g = first + r0 * stride + c * 8;
#pragma unroll
  for (int i = 0; i < kRows / kStep; ++i, g += kStep * stride) {
    const bool in = r0 + i * kStep < valid;
    const bf16* src = in ? g : first;  // not read when out
#pragma unroll
    for (int j = 0; j < kCols / 64; ++j) cp_async16_fill(d + i * kStep * 64 + j * kRows * 64, src + j * 64, in);
  }
}

// kRows rows `stride` elements apart from `first` (rows from `valid` on zeroed) into a swz_k64 tile by the loading
// warpgroup: load_rows_async on 16-byte aligned views, else load_tile_async's plain loads and stores row by row.
template <int kRows, int kCols, int kThreads, bool kAligned>
__device__ __forceinline__ void load_rows_any_async(bf16* s, const bf16* first, i64 stride, i64 valid, int tid) {
  if constexpr (kAligned) {
    load_rows_async<kRows, kCols, kThreads>(s, first, stride, valid, tid);
  } else {
    auto row = [&](int r) -> const bf16* { return r < valid ? first + r * stride : nullptr; };
    load_tile_async<kRows, kCols, kThreads, kAligned>(s, row, first, tid);
  }
}

// A persistent grid's hand-over of the work items its blocks walk (flash_fwd_ws_kernel's row tiles,
// flash_bwd_ws_kernel's key blocks): block c starts at item c; its n-th item (n > 0) comes from a ticket, which
// the first loading thread takes (tickets count the items handed out past the first gridDim.x) and writes into
// slot n % 2, `items` once past the end, when the readers have given that slot's item n - 2 back. Two slots and
// two mbarriers each in shared memory: full (one arrival) and free (every reader's).
struct ItemSlots {
  int* slot;
  std::uint64_t* full;
  std::uint64_t* free;
  // The first loading thread's side (ltid 0 of the loading threads); the loading threads then read the item
  // behind named barrier `bar` over `threads` of them, which also keeps the writer from reusing the slot (two
  // items on) before all of them have read it.
  __device__ __forceinline__ u32 hand_over(u32 n, int ltid, unsigned* taken, int items, int bar, int threads) const {
    const u32 s = n & 1u;
    if (ltid == 0) {
      const u32 next = gridDim.x + take_ticket(taken);
      if (n >= 3) mbar_wait(free + s, ((n - 3) >> 1) & 1u);  // item n - 2 read from the slot
      slot[s] = int(imin(next, items));
      mbar_arrive(full + s);
    }
    named_bar_sync(bar, threads);
    return u32(slot[s]);
  }
  // A reader's side: the block's n-th item (n > 0), the slot given back once read.
  __device__ __forceinline__ u32 read(u32 n) const {
    const u32 s = n & 1u;
    mbar_wait(full + s, ((n - 1) >> 1) & 1u);
    const u32 x = u32(slot[s]);
    mbar_arrive(free + s);
    return x;
  }
};

}  // namespace laga::cuda::flash
