// Tensor-core fused attention (bf16 in, fp32 accumulate; FlashAttention-2 structure) for the (d_qk, d_v)
// pairs of MLA; launched by flash_launch.cuh. The tile table at the end chooses, per pair, tiles and warps and
// whether a GEMM runs on wgmma (Hopper's warpgroup MMA, operands straight from 128-byte-swizzled shared
// tiles: 192/128, every GEMM) or on mma.sync with ldmatrix fragments (576/512).
//
// Rows. The query heads that share a kv head are folded into the rows of one problem: row r of kv head g is
// query r / group of query head g * group + r % group (query-major). For MHA (group 1) a row is a query; for
// MQA a tile of 64 rows is 64 / group queries times group heads, so every head reuses the K/V tiles that one
// block loads (the MQA arithmetic-intensity trick). Causality follows the row's query: query i sees key j
// iff j <= i + q_offset (and j < kv_len).
//
// Kernels (every reduction in a fixed order, no atomics: results are bitwise reproducible):
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
//   bwd_vk:     576/512 with V inside K, for a caller that takes dK + [dV, 0] (dv_in_dk): one accumulator per key
//               and column, dQ added up inside it (see its comment).
//
// Shared tiles are bf16, XOR-swizzled (flash_warp.cuh: swz for ldmatrix, swz_k64 for wgmma), filled by cp.async
// (16-byte aligned views) or by 16-byte stores of 2-byte loads (any other strides); rows past the end are
// zero-filled.
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
// heads x 32k keys of K/V streamed from HBM and the h128 S32k forward lost 16%. The warp-specialised forward
// takes its group size at run time (head_group; its row tiles have no order to keep between blocks).
constexpr i64 kHeadGroup = 16;
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

// ================================================================ forward
// kBlockM rows x kBlockN keys per step, kWarps warps. S = Q K^T: kWarpsMS x (kWarps / kWarpsMS) warps;
// O += P V: kWarpsMO x (kWarps / kWarpsMO) warps over (rows, d_v). P stays in registers when both layouts
// give each warp whole rows of the same row range.
// kSWgmma: S = Q K^T by wgmma (one warpgroup, m64 tiles, 64 keys; Q and K in the swz_k64 layout); warp w then
// holds rows 64 mt + 16 w.. of each 64-row tile instead of 16 kMTS consecutive rows. kOWgmma: O += P V by
// wgmma too (P from registers, V in the swz_k64 layout read transposed; d_v 128).
template <int kDqk_, int kDv_, int kBlockM_, int kBlockN_, int kWarps_, int kWarpsMS_, int kWarpsMO_, Pipe kPipe_,
          bool kVInK_, int kMinBlocks_, bool kSWgmma_ = false, bool kOWgmma_ = false>
struct FwdTraits {
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_, kThreads = 32 * kWarps, kMinBlocks = kMinBlocks_;
  static constexpr Pipe kPipe = kPipe_;
  static constexpr bool kVInK = kVInK_;  // V is the first d_v columns of K's rows (absorbed MLA)
  static constexpr int kWarpsMS = kWarpsMS_, kWarpsNS = kWarps / kWarpsMS;
  static constexpr int kRowsS = kBlockM / kWarpsMS, kColsS = kBlockN / kWarpsNS;
  static constexpr int kMTS = kRowsS / 16, kNTS = kColsS / 8;
  static constexpr int kWarpsMO = kWarpsMO_, kWarpsNO = kWarps / kWarpsMO;
  static constexpr int kRowsO = kBlockM / kWarpsMO, kColsO = kDv / kWarpsNO;
  static constexpr int kMTO = kRowsO / 16, kNTO = kColsO / 8;
  static constexpr bool kPInRegs = kWarpsNS == 1 && kWarpsNO == 1 && kWarpsMS == kWarpsMO;
  static constexpr bool kSWgmma = kSWgmma_, kOWgmma = kOWgmma_;
  static constexpr int kLdV = kVInK ? kDqk : kDv;  // row width of the shared tile V is read from
  // Shared memory plan (bytes): Q | K/V stages | P | row statistics.
  static constexpr int kQBytes = kBlockM * kDqk * 2;
  static constexpr int kKBytes = kBlockN * kDqk * 2;
  static constexpr int kStageBytes = kKBytes + (kVInK ? 0 : kBlockN * kDv * 2);
  static constexpr int kStages = kPipe == Pipe::paired ? 2 : 1;
  static constexpr int kPBytes = kPInRegs ? 0 : kBlockM * kBlockN * 2;
  static constexpr int kStatFloats = (2 * kWarpsNS + 2) * kBlockM;  // partial max, partial sum, corr, max
  static constexpr int kOffKv = kQBytes;
  static constexpr int kOffP = kOffKv + kStages * kStageBytes;
  static constexpr int kOffStat = kOffP + kPBytes;
  static constexpr int kSmemBytes = kOffStat + kStatFloats * 4;

  static_assert(kWarps % kWarpsMS == 0 && kWarps % kWarpsMO == 0, "warp layouts must tile the warps");
  static_assert(kRowsS % 16 == 0 && kColsS % 8 == 0 && kRowsO % 16 == 0 && kColsO % 8 == 0, "mma tile multiples");
  static_assert(kBlockN % 16 == 0 && kDqk % 16 == 0 && kDv % 16 == 0, "k steps of 16");
  static_assert(!kPInRegs || kMTS == kMTO, "P in registers needs the same rows in both GEMMs");
  static_assert(!(kVInK && kPipe == Pipe::split), "V inside K needs paired stages");
  static_assert(!kVInK || kDv <= kDqk, "V inside K needs d_v <= d_qk");
  static_assert(kOffKv % 128 == 0 && kStageBytes % 128 == 0 && kOffStat % 16 == 0, "tile alignment");
  static_assert(std::size_t(kSmemBytes) <= kSmemBudget, "forward tiles exceed shared memory");
  static_assert(!kSWgmma || (kWarps == 4 && kPInRegs && kBlockN == 64 && kBlockM % 64 == 0 && kDqk % 64 == 0 &&
                             kOffKv % 1024 == 0 && kStageBytes % 1024 == 0 && !kVInK),
                "wgmma S: one warpgroup, P in registers, 64-key tiles, 1024-aligned Q and K tiles");
  static_assert(!kOWgmma || (kSWgmma && kDv == 128 && (kOffKv + kKBytes) % 1024 == 0),
                "wgmma P V: after wgmma S, d_v 128, a 1024-aligned V tile");
};

template <class Tr, bool kAligned>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) flash_fwd_kernel(const AttentionFwdParams p) {
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDqk = Tr::kDqk, kDv = Tr::kDv, kThreads = Tr::kThreads;
  constexpr bool kPaired = Tr::kPipe == Pipe::paired;
  char* smem = dynamic_smem();
  bf16* s_q = reinterpret_cast<bf16*>(smem);
  bf16* s_p = reinterpret_cast<bf16*>(smem + Tr::kOffP);
  float* s_max = reinterpret_cast<float*>(smem + Tr::kOffStat);  // [kWarpsNS][kBM]
  float* s_sum = s_max + Tr::kWarpsNS * kBM;                      // [kWarpsNS][kBM]
  float* s_corr = s_sum + Tr::kWarpsNS * kBM;                     // [kBM]
  float* s_m = s_corr + kBM;                                      // [kBM]
  auto stage = [&](int st) { return reinterpret_cast<bf16*>(smem + Tr::kOffKv + st * Tr::kStageBytes); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int wms = warp / Tr::kWarpsNS, wns = warp % Tr::kWarpsNS;
  const int wmo = warp / Tr::kWarpsNO, wno = warp % Tr::kWarpsNO;
  // First row (in the block) of the warp's m-tile mt of S, and of O.
  auto srow = [&](int mt) { return Tr::kSWgmma ? 64 * mt + 16 * warp : wms * Tr::kRowsS + 16 * mt; };
  auto orow = [&](int mt) { return Tr::kPInRegs ? srow(mt) : wmo * Tr::kRowsO + 16 * mt; };
  const RowTile<kBM, kBN> rt(p);
  const auto& [group, rows, row0, row_last, g, b, n_full, rm, n_tiles] = rt;

  const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_batch_stride;
  const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
  const bf16* v = static_cast<const bf16*>(p.v) + b * p.v_batch_stride + g * p.v_head_stride;
  auto q_row = [&](int r) { return rt.row_ptr(q, p.q_head_stride, p.q_token_stride, r); };
  load_tile<kBM, kDqk, kThreads, kAligned, decltype(q_row), Tr::kSWgmma>(s_q, q_row);
  auto load_k = [&](int t, bf16* dst) {
    const i64 n0 = i64(t) * kBN;
    auto k_row = [&](int r) -> const bf16* { return n0 + r < p.kv_len ? k + (n0 + r) * p.k_token_stride : nullptr; };
    load_tile<kBN, kDqk, kThreads, kAligned, decltype(k_row), Tr::kSWgmma>(dst, k_row);
  };
  auto load_v = [&](int t, bf16* dst) {
    const i64 n0 = i64(t) * kBN;
    auto v_row = [&](int r) -> const bf16* { return n0 + r < p.kv_len ? v + (n0 + r) * p.v_token_stride : nullptr; };
    load_tile<kBN, kDv, kThreads, kAligned, decltype(v_row), Tr::kOWgmma>(dst, v_row);
  };
  if (n_tiles > 0) {
    load_k(0, stage(0));
    if constexpr (kPaired && !Tr::kVInK) load_v(0, stage(0) + kBN * kDqk);
  }
  cp_async_commit();

  float acc_o[Tr::kMTO][Tr::kNTO][4];
  zero(acc_o);
  float m_i[Tr::kMTS][2], l_i[Tr::kMTS][2];
  online_softmax_init(m_i, l_i);
  const float sl2 = float(p.scale) * kLog2e;

  for (int t = 0; t < n_tiles; ++t) {
    const i64 n0 = i64(t) * kBN;
    bf16* s_k = stage(kPaired ? (t & 1) : 0);
    const bf16* s_v = Tr::kVInK ? s_k : s_k + kBN * kDqk;
    cp_async_wait<0>();
    if constexpr (Tr::kSWgmma) fence_proxy_async();  // wgmma reads what cp.async and the stores wrote
    __syncthreads();  // tile t is in; every warp is done with tile t - 1
    if constexpr (kPaired) {
      if (t + 1 < n_tiles) {
        load_k(t + 1, stage((t + 1) & 1));
        if constexpr (!Tr::kVInK) load_v(t + 1, stage((t + 1) & 1) + kBN * kDqk);
      }
    } else {
      load_v(t, s_k + kBN * kDqk);
    }
    cp_async_commit();

    // S = Q K^T (unscaled), masked to -inf.
    float s[Tr::kMTS][Tr::kNTS][4];
    zero(s);
    if constexpr (Tr::kSWgmma)
      warpgroup_mma_nt<Tr::kMTS, kBN, kDqk, kBM>(s, s_q, 0, s_k);
    else
      warp_mma<Tr::kMTS, Tr::kNTS, kDqk / 16, false, false, kDqk, kDqk>(s, s_q, wms * Tr::kRowsS, s_k,
                                                                          wns * Tr::kColsS, lane);
    if constexpr (!kPaired) {
      // K_t is done with once every warp has its S: K_{t+1} loads during the softmax and P V (V_t, requested
      // first, is waited for alone before P V).
      __syncthreads();
      if (t + 1 < n_tiles) load_k(t + 1, s_k);
      cp_async_commit();
    }
    if (n0 + kBN > n_full)
      mask_scores(s, tig, [&](int mt, int h) {
        const i64 row = imin(row0 + srow(mt) + gid + 8 * h, row_last);
        return visible_keys(rm.query(row), p.q_offset, p.kv_len) - n0 - wns * Tr::kColsS;
      });
    // Row maxima: over the thread's columns, the quad, then the warps sharing the rows.
    float mx[Tr::kMTS][2];
    row_max(mx, s);
    if constexpr (Tr::kWarpsNS > 1) {
      if (tig == 0)
#pragma unroll
        for (int mt = 0; mt < Tr::kMTS; ++mt)
#pragma unroll
          for (int h = 0; h < 2; ++h) s_max[wns * kBM + srow(mt) + gid + 8 * h] = mx[mt][h];
      __syncthreads();
#pragma unroll
      for (int mt = 0; mt < Tr::kMTS; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = srow(mt) + gid + 8 * h;
          float x = s_max[lr];
#pragma unroll
          for (int w = 1; w < Tr::kWarpsNS; ++w) x = fmaxf(x, s_max[w * kBM + lr]);
          mx[mt][h] = x;
        }
    }
    // P = exp2(S sl2 - m sl2); the running sums and the output rescale by exp2((m_old - m_new) sl2).
    float corr[Tr::kMTS][2];
    online_softmax_step(m_i, l_i, s, mx, sl2, corr);

    if constexpr (Tr::kPInRegs) {
      rescale_rows(acc_o, corr);
      u32 pa[Tr::kMTS][kBN / 16][4];
      acc_to_a(pa, s);
      if constexpr (!kPaired) {
        cp_async_wait<1>();  // V_t (K_{t+1} may still be in flight)
        if constexpr (Tr::kOWgmma) fence_proxy_async();
        __syncthreads();  // V_t is in
      }
      if constexpr (Tr::kOWgmma)
        warpgroup_mma_rs_tb<Tr::kMTO, kDv, kBN / 16, kBN>(acc_o, pa, s_v);
      else
        warp_mma_ra<Tr::kMTO, Tr::kNTO, kBN / 16, true, Tr::kLdV>(acc_o, pa, s_v, 0, lane);
    } else {
#pragma unroll
      for (int mt = 0; mt < Tr::kMTS; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = srow(mt) + gid + 8 * h;
#pragma unroll
          for (int nt = 0; nt < Tr::kNTS; ++nt)
            *reinterpret_cast<u32*>(s_p + swz<kBN>(lr, wns * Tr::kColsS + nt * 8 + 2 * tig)) =
                pack_bf16(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]);
          if (wns == 0 && tig == 0) s_corr[lr] = corr[mt][h];
        }
      if constexpr (!kPaired) cp_async_wait<1>();
      __syncthreads();  // P and the corrections are in (and V_t)
#pragma unroll
      for (int mt = 0; mt < Tr::kMTO; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float c = s_corr[wmo * Tr::kRowsO + mt * 16 + gid + 8 * h];
#pragma unroll
          for (int nt = 0; nt < Tr::kNTO; ++nt) acc_o[mt][nt][2 * h] *= c, acc_o[mt][nt][2 * h + 1] *= c;
        }
      warp_mma<Tr::kMTO, Tr::kNTO, kBN / 16, false, true, kBN, Tr::kLdV>(acc_o, s_p, wmo * Tr::kRowsO, s_v,
                                                                         wno * Tr::kColsO, lane);
    }
  }

  // Row sums (quad, then the warps sharing the rows) and maxima through shared memory.
#pragma unroll
  for (int mt = 0; mt < Tr::kMTS; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = quad_sum(l_i[mt][h]);
      const int lr = srow(mt) + gid + 8 * h;
      if (tig == 0) {
        s_sum[wns * kBM + lr] = l;
        if (wns == 0) s_m[lr] = m_i[mt][h];
      }
    }
  __syncthreads();
  bf16* o = static_cast<bf16*>(p.o) + b * p.o_batch_stride;
#pragma unroll
  for (int mt = 0; mt < Tr::kMTO; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int lr = orow(mt) + gid + 8 * h;
      const i64 row = row0 + lr;
      if (row >= rows) continue;
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < Tr::kWarpsNS; ++w) l += s_sum[w * kBM + lr];
      const float inv = softmax_inv(l);
      bf16* out = o + (g * group + rm.head(row)) * p.o_head_stride + rm.query(row) * p.o_token_stride + wno * Tr::kColsO;
#pragma unroll
      for (int nt = 0; nt < Tr::kNTO; ++nt)
        store2<kAligned>(out + nt * 8 + 2 * tig, acc_o[mt][nt][2 * h] * inv, acc_o[mt][nt][2 * h + 1] * inv);
    }
  float* lse = static_cast<float*>(p.lse);
  for (int lr = tid; lr < kBM; lr += kThreads) {
    const i64 row = row0 + lr;
    if (row >= rows) continue;
    float l = 0.f;
    for (int w = 0; w < Tr::kWarpsNS; ++w) l += s_sum[w * kBM + lr];
    lse[(b * p.q_heads + g * group + rm.head(row)) * p.q_len + rm.query(row)] = softmax_lse(s_m[lr] * float(p.scale), l);
  }
}

// ================================================================ forward, O split over two warpgroups
// The absorbed MQA (576/512, V = K[:, :512]) on wgmma, in FlashMLA's arrangement: 64 rows x 64 keys per step, two
// warpgroups, K tiles double-buffered (V is read from the same tiles). Warpgroup 0 computes S = Q K^T (SS, Q and
// K in the swz_k64 layout) and the online softmax over whole rows (warp w holds rows 16 w.. of every key: no row
// statistics cross warps), writes P (bf16) and the rows' corrections to shared memory, then adds P V into the
// first d_v / 2 columns of O with P from registers. Warpgroup 1 loads the next K tile during S, then adds P V
// into the other d_v / 2 columns with P from shared memory. Both read V transposed from the K tile (MN-major).
template <int kDqk_, int kDv_>
struct FwdSplitTraits {
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockM = 64, kBlockN = 64, kHalf = kDv / 2;
  static constexpr int kWarps = 8, kThreads = 256;
  // Shared memory plan (bytes): Q | two K stages | P | corrections, row sums, row maxima.
  static constexpr int kQBytes = kBlockM * kDqk * 2;
  static constexpr int kKBytes = kBlockN * kDqk * 2;
  static constexpr int kPBytes = kBlockM * kBlockN * 2;
  static constexpr int kOffK = kQBytes;
  static constexpr int kOffP = kOffK + 2 * kKBytes;
  static constexpr int kOffStat = kOffP + kPBytes;
  static constexpr int kSmemBytes = kOffStat + 3 * kBlockM * 4;
  static_assert(kDqk % 64 == 0 && kDv <= kDqk && kHalf == 256, "two warpgroups of n256 over O, V inside K");
  static_assert(kQBytes % 1024 == 0 && kKBytes % 1024 == 0 && kOffP % 1024 == 0, "1024-aligned wgmma tiles");
  static_assert(std::size_t(kSmemBytes) <= kSmemBudget, "forward tiles exceed shared memory");
};

template <class Tr, bool kAligned>
__global__ void __launch_bounds__(Tr::kThreads, 1) flash_fwd_split_kernel(const AttentionFwdParams p) {
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDqk = Tr::kDqk, kHalf = Tr::kHalf;
  constexpr int kNT = kBN / 8, kNTO = kHalf / 8;
  char* smem = dynamic_smem();
  bf16* s_q = reinterpret_cast<bf16*>(smem);
  bf16* s_p = reinterpret_cast<bf16*>(smem + Tr::kOffP);
  float* s_corr = reinterpret_cast<float*>(smem + Tr::kOffStat);  // [kBM]
  float* s_sum = s_corr + kBM;                                    // [kBM]
  float* s_m = s_sum + kBM;                                       // [kBM]
  auto stage = [&](int st) { return reinterpret_cast<bf16*>(smem + Tr::kOffK + st * Tr::kKBytes); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int wg = warp >> 2;                  // 0: S, softmax, O[:, :kHalf]; 1: loads, O[:, kHalf:]
  const int r_lo = 16 * (warp & 3) + gid;    // the thread's rows r_lo and r_lo + 8 (wgmma's C layout)
  const RowTile<kBM, kBN> rt(p);
  const auto& [group, rows, row0, row_last, g, b, n_full, rm, n_tiles] = rt;

  const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_batch_stride;
  const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
  auto q_row = [&](int r) { return rt.row_ptr(q, p.q_head_stride, p.q_token_stride, r); };
  const i64 kv_len = p.kv_len, k_ts = p.k_token_stride;
  auto k_rows = [=](int t) {
    const i64 n0 = i64(t) * kBN;
    return [=](int r) -> const bf16* { return n0 + r < kv_len ? k + (n0 + r) * k_ts : nullptr; };
  };
  // Q and K_0 by every thread; later K tiles by warpgroup 1 alone.
  load_tile<kBM, kDqk, Tr::kThreads, kAligned, decltype(q_row), true>(s_q, q_row, tid);
  if (n_tiles > 0) load_tile<kBN, kDqk, Tr::kThreads, kAligned, decltype(k_rows(0)), true>(stage(0), k_rows(0), tid);
  cp_async_commit();

  float acc_o[1][kNTO][4];
  zero(acc_o);
  float m_i[1][2], l_i[1][2];
  online_softmax_init(m_i, l_i);
  const float sl2 = float(p.scale) * kLog2e;
  // The two warpgroups run their own loops, meeting at the same two barriers a step: (A) K_t is in and both are
  // done with tile t - 1 (its stage, P and corrections), (B) P_t and its corrections are in. Separate loops keep
  // each warpgroup's code between a wgmma's issue and its wait free of accesses to its accumulators.
  if (wg == 0) {
    for (int t = 0; t < n_tiles; ++t) {
      const i64 n0 = i64(t) * kBN;
      const bf16* s_k = stage(t & 1);
      cp_async_wait<0>();
      fence_proxy_async();  // wgmma reads what cp.async and the stores wrote
      __syncthreads();      // (A)
      // S = Q K^T (unscaled), masked to -inf.
      float s[1][kNT][4];
      warpgroup_mma_nt<1, kBN, kDqk, kBM>(s, s_q, 0, s_k);
      if (n0 + kBN > n_full)
        mask_scores(s, tig, [&](int, int h) {
          return visible_keys(rm.query(imin(row0 + r_lo + 8 * h, row_last)), p.q_offset, p.kv_len) - n0;
        });
      // Row maxima (the quad holds a whole row), P = exp2(S sl2 - m sl2), the running sums and corrections.
      float mx[1][2], corr[1][2];
      row_max(mx, s);
      online_softmax_step(m_i, l_i, s, mx, sl2, corr);
      rescale_rows(acc_o, corr);
      // O[:, :kHalf] += P V is issued before P goes to shared memory: the tensor cores start while the stores,
      // the fence and the barrier run. P is rounded once (the same bf16 pairs in registers and shared memory).
      u32 pa[1][kBN / 16][4];
      acc_to_a(pa, s);
      warpgroup_mma_rs_tb_async<1, kHalf, kBN / 16, kBN>(acc_o, pa, s_k);
#pragma unroll
      for (int ks = 0; ks < kBN / 16; ++ks)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          *reinterpret_cast<u32*>(s_p + swz_k64<kBM>(r_lo + 8 * (j & 1), 16 * ks + 8 * (j >> 1) + 2 * tig)) =
              pa[0][ks][j];
      if (tig == 0) s_corr[r_lo] = corr[0][0], s_corr[r_lo + 8] = corr[0][1];
      fence_proxy_async();  // warpgroup 1's wgmma reads P
      __syncthreads();      // (B)
      warpgroup_wait<0>(acc_o);
    }
  } else {
    for (int t = 0; t < n_tiles; ++t) {
      const bf16* s_k = stage(t & 1);
      cp_async_wait<0>();
      fence_proxy_async();
      __syncthreads();  // (A)
      if (t + 1 < n_tiles)
        load_tile<kBN, kDqk, 128, kAligned, decltype(k_rows(0)), true>(stage((t + 1) & 1), k_rows(t + 1), tid - 128);
      cp_async_commit();
      __syncthreads();  // (B)
      const float corr[1][2] = {{s_corr[r_lo], s_corr[r_lo + 8]}};
      rescale_rows(acc_o, corr);
      warpgroup_mma_ss_tb_async<1, kHalf, kBN / 16, kBM, kBN>(acc_o, s_p, 0, s_k + (kHalf / 64) * kBN * 64);
      warpgroup_wait<0>(acc_o);
    }
  }

  // Row sums (quad) and maxima from warpgroup 0 through shared memory; each warpgroup writes its half of O.
  if (wg == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = quad_sum(l_i[0][h]);
      if (tig == 0) s_sum[r_lo + 8 * h] = l, s_m[r_lo + 8 * h] = m_i[0][h];
    }
  }
  __syncthreads();
  bf16* o = static_cast<bf16*>(p.o) + b * p.o_batch_stride;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int lr = r_lo + 8 * h;
    const i64 row = row0 + lr;
    if (row >= rows) continue;
    const float inv = softmax_inv(s_sum[lr]);
    bf16* out = o + (g * group + rm.head(row)) * p.o_head_stride + rm.query(row) * p.o_token_stride + wg * kHalf;
#pragma unroll
    for (int nt = 0; nt < kNTO; ++nt)
      store2<kAligned>(out + nt * 8 + 2 * tig, acc_o[0][nt][2 * h] * inv, acc_o[0][nt][2 * h + 1] * inv);
  }
  float* lse = static_cast<float*>(p.lse);
  for (int lr = tid; lr < kBM; lr += Tr::kThreads) {
    const i64 row = row0 + lr;
    if (row >= rows) continue;
    lse[(b * p.q_heads + g * group + rm.head(row)) * p.q_len + rm.query(row)] =
        softmax_lse(s_m[lr] * float(p.scale), s_sum[lr]);
  }
}

// ================================================================ forward, warp-specialised (192/128)
// FlashAttention-3's arrangement on cp.async: a block owns 128 rows at a time and walks 128-key tiles with three
// roles; the grid is persistent (a block per SM takes row tiles one after another, the next untaken in the work
// order each time), so a row tile's loads run under the previous one's last products and output.
// Warpgroup 2 loads (eight threads a row): each row tile's Q, then K_t and V_t into two stages each, every tile
// announced by an mbarrier that its copies complete (cp.async.mbarrier.arrive), every stage handed back by an
// mbarrier the consumers arrive at (K_t once S_t is computed, V_t once P_t V_t is; each warpgroup's half of Q once
// it has computed the row tile's last S), so loads run up to two tiles ahead. Warpgroups 0 and 1 each own 64
// rows: S = Q K^T (SS, n128), the online softmax in registers, O += P V (P from registers, n128). Within a
// warpgroup, S_t is issued together with O += P_{t-1} V_{t-1}, and the softmax of S_t runs while that product
// does. Between the two warpgroups, two named barriers make them take turns at issuing their products, so one
// warpgroup's softmax runs under the other's products (ping-pong). 128 keys a step (against 64 in
// flash_fwd_kernel) halve the shared-memory reads of Q per multiply-add.
template <int kDqk_, int kDv_>
struct FwdWsTraits {
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockM = 128, kBlockN = 128;
  // Two computing warpgroups and a loading one. Registers: 168 a thread at launch (384 threads); the loaders give
  // theirs down to kLoadRegs, the others take kMmaRegs (per register file: 56 x 32 + 2 x 224 x 32 = 16128 of
  // 16384).
  static constexpr int kConsumerThreads = 256, kLoadThreads = 128, kThreads = kConsumerThreads + kLoadThreads;
  static constexpr int kLoadRegs = 56, kMmaRegs = 224;
  static_assert(kLoadRegs + 2 * kMmaRegs <= 3 * (65536 / kThreads / 8 * 8),
                "the computing warpgroups take only what the loading one gives back");
  static constexpr int kQBytes = kBlockM * kDqk * 2, kKBytes = kBlockN * kDqk * 2, kVBytes = kBlockN * kDv * 2;
  static constexpr int kOffK = kQBytes;                  // K stages 0, 1
  static constexpr int kOffV = kOffK + 2 * kKBytes;      // V stages 0, 1
  static constexpr int kOffBar = kOffV + 2 * kVBytes;    // mbarriers: Q, K, V, row tile full and free, two of each
  static constexpr int kOffSink = kOffBar + 16 * 8 + 8;  // past them, two row tile slots; then two floats a
                                                         // computing thread (sched_sink)
  static constexpr int kSmemBytes = kOffSink + kConsumerThreads * 8;
  static_assert(kDqk % 64 == 0 && kDv % 64 == 0 && kDv <= 256, "whole 64-column slabs; O in one n-chain");
  static_assert(kOffK % 1024 == 0 && kKBytes % 1024 == 0 && kOffV % 1024 == 0 && kVBytes % 1024 == 0,
                "1024-aligned wgmma tiles");
  static_assert(std::size_t(kSmemBytes) <= kSmemBudget, "warp-specialised forward tiles exceed shared memory");
};

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

template <class Tr, bool kAligned>
__global__ void __launch_bounds__(Tr::kThreads, 1) flash_fwd_ws_kernel(const AttentionFwdParams p, const int items,
                                                                          unsigned* taken, const int head_group) {
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDqk = Tr::kDqk, kDv = Tr::kDv;
  char* smem = dynamic_smem();
  bf16* s_q = reinterpret_cast<bf16*>(smem);
  auto s_k = [&](int st) { return reinterpret_cast<bf16*>(smem + Tr::kOffK + st * Tr::kKBytes); };
  auto s_v = [&](int st) { return reinterpret_cast<bf16*>(smem + Tr::kOffV + st * Tr::kVBytes); };
  std::uint64_t* bar = reinterpret_cast<std::uint64_t*>(smem + Tr::kOffBar);
  std::uint64_t* q_full = bar;      // [2]: Q's rows 64 h.. (warpgroup h's)
  std::uint64_t* q_free = bar + 2;  // [2]
  std::uint64_t* k_full = bar + 4;  // [2]
  std::uint64_t* k_free = bar + 6;  // [2]
  std::uint64_t* v_full = bar + 8;  // [2]
  std::uint64_t* v_free = bar + 10;  // [2]
  std::uint64_t* item_full = bar + 12;  // [2]: the block's n-th row tile's index in its slot (ItemSlots)
  std::uint64_t* item_free = bar + 14;  // [2]
  const ItemSlots items_of{reinterpret_cast<int*>(bar + 16), item_full, item_free};

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  const int wg = warp >> 2;  // 0, 1: consumers; 2: loads
  // The grid is persistent: block c starts at row tile c of the work order and takes the next untaken one each
  // time it finishes one (*taken counts those handed out past the first gridDim.x, zeroed by the launcher), as
  // the GPU would issue blocks, heaviest first. The loading warpgroup takes it and hands it to the others through
  // items_of (ItemSlots); the three roles walk the same row tiles, the stages' phases counted over all of them.
  // The work order walks head_group (kv head, batch) pairs at a time (tile_work); any order gives the same bits.

  constexpr int kLoad = Tr::kLoadThreads, kHalf = Tr::kConsumerThreads / 2;
  if (tid == 0) {
    for (int st = 0; st < 2; ++st) {
      mbar_init(q_full + st, kLoad), mbar_init(k_full + st, kLoad), mbar_init(v_full + st, kLoad);
      mbar_init(q_free + st, kHalf);
      mbar_init(k_free + st, Tr::kConsumerThreads), mbar_init(v_free + st, Tr::kConsumerThreads);
      mbar_init(item_full + st, 1), mbar_init(item_free + st, Tr::kConsumerThreads);
    }
  }
  __syncthreads();  // the only block-wide barrier: the roles meet at mbarriers from here on

  if (wg == 2) {
    setmaxnreg_dec<Tr::kLoadRegs>();
    const int ltid = tid - Tr::kConsumerThreads;
    // Tile t's copies, then the arrival that announces them.
    auto announce = [&](std::uint64_t* full) {
      if constexpr (kAligned) {
        cp_async_mbar_arrive(full);
      } else {
        fence_proxy_async();  // plain stores, read next by wgmma
        mbar_arrive(full);
      }
    };
    u32 it = 0, qs = 0;  // K/V tiles and Q tiles loaded so far
    for (u32 n = 0, x = blockIdx.x;; ++n) {  // the block's n-th row tile: x
      // The next one (also the one past the end, which ends the walk), read behind named barrier 3.
      if (n > 0) x = items_of.hand_over(n, ltid, taken, items, 3, kLoad);
      if (x >= u32(items)) break;
      const RowTile<kBM, kBN> rt(p, x, head_group);
      if (rt.n_tiles == 0) continue;
      const bf16* q = static_cast<const bf16*>(p.q) + rt.b * p.q_batch_stride;
      const bf16* k = static_cast<const bf16*>(p.k) + rt.b * p.k_batch_stride + rt.g * p.k_head_stride;
      const bf16* v = static_cast<const bf16*>(p.v) + rt.b * p.v_batch_stride + rt.g * p.v_head_stride;
      auto q_row = [&](int r) { return rt.row_ptr(q, p.q_head_stride, p.q_token_stride, r); };
      // The row tile's Q, each warpgroup's half once that warpgroup has computed the previous row tile's last S:
      // it loads while the consumers finish that row tile.
      for (int h = 0; h < 2; ++h) {
        if (qs > 0) mbar_wait(q_free + h, (qs - 1) & 1u);
        load_tile_async<kBM, kDqk, kLoad, kAligned>(s_q, q_row, q, ltid, 64 * h, 64 * h + 64);
        announce(q_full + h);
      }
      for (int t = 0; t < rt.n_tiles; ++t, ++it) {
        const int st = it & 1;
        const u32 free_parity = u32((it >> 1) - 1) & 1u;  // the phase in which tile it - 2 left the stage
        const i64 n0 = i64(t) * kBN;
        if (it >= 2) mbar_wait(k_free + st, free_parity);
        const i64 valid = p.kv_len - n0;  // keys of the tile that exist
        load_rows_any_async<kBN, kDqk, kLoad, kAligned>(s_k(st), k + n0 * p.k_token_stride, p.k_token_stride, valid,
                                                         ltid);
        announce(k_full + st);
        if (it >= 2) mbar_wait(v_free + st, free_parity);
        load_rows_any_async<kBN, kDv, kLoad, kAligned>(s_v(st), v + n0 * p.v_token_stride, p.v_token_stride, valid,
                                                        ltid);
        announce(v_full + st);
      }
      ++qs;
    }
    cp_async_wait<0>();  // nothing in flight when the warp exits
    return;
  }

  // A consumer warpgroup: rows 64 wg.. of each row tile; warp w4 of it holds rows 16 w4 + gid (+ 8) of them.
  setmaxnreg_inc<Tr::kMmaRegs>();
  const int w4 = warp & 3;
  const float sl2 = float(p.scale) * kLog2e;
  // Turns at the tensor cores: warpgroup wg issues after bar.sync on barrier 1 + wg, then lets the other go.
  // Every row tile has n_tiles + 1 issue points per warpgroup (S_0; S_t with P_{t-1} V_{t-1}; the last P V), and
  // the turns run on across the block's row tiles (warpgroup 0's first issue of a row tile follows warpgroup 1's
  // last of the one before). Warpgroup 1 lets warpgroup 0 start, and warpgroup 0 takes warpgroup 1's last
  // hand-over at its end, so arrivals and syncs pair up exactly.
  auto my_turn = [&] { named_bar_sync(1 + wg, Tr::kConsumerThreads); };
  auto pass_turn = [&] { named_bar_arrive(2 - wg, Tr::kConsumerThreads); };
  u32 it = 0, qs = 0;  // K/V tiles and Q tiles consumed so far
  for (u32 n = 0, x = blockIdx.x;; ++n) {  // the block's n-th row tile: x
    if (n > 0) x = items_of.read(n);
    if (x >= u32(items)) break;
    const RowTile<kBM, kBN> rt(p, x, head_group);
    const auto& [group, rows, row0, row_last, g, b, n_full, rm, n_tiles] = rt;
    const i64 frag_row0 = row0 + 64 * wg + 16 * w4 + gid;
    float acc_o[1][kDv / 8][4];
    zero(acc_o);
    float m_i[1][2], l_i[1][2];
    online_softmax_init(m_i, l_i);

    // The softmax of tile t's scores in place (masked where some row of the block does not see every key),
    // corrections of O out.
    auto softmax = [&](float (&s)[1][kBN / 8][4], int t, float (&corr)[1][2]) {
      const i64 n0 = i64(t) * kBN;
      if (n0 + kBN > n_full)
        mask_scores(s, tig, [&](int, int h) {
          return visible_keys(rm.query(imin(frag_row0 + 8 * h, row_last)), p.q_offset, p.kv_len) - n0;
        });
      float mx[1][2];
      row_max(mx, s);
      online_softmax_step(m_i, l_i, s, mx, sl2, corr);
    };

    if (n_tiles > 0) {
      u32 pa[1][kBN / 16][4];
      float s[1][kBN / 8][4];
      float corr[1][2];
      if (wg == 1 && qs == 0) named_bar_arrive(1, Tr::kConsumerThreads);  // the block's first issue: warpgroup 0's
      mbar_wait(q_full + wg, qs & 1u);
      mbar_wait(k_full + (it & 1), (it >> 1) & 1u);
      fence_proxy_async();  // cp.async wrote the tiles (generic proxy); wgmma reads them (async proxy)
      my_turn();
      warpgroup_mma_nt_async<1, kBN, kDqk, kBM>(s, s_q, 64 * wg, s_k(it & 1));
      pass_turn();
      warpgroup_wait<0>(s);
      mbar_arrive(k_free + (it & 1));
      if (n_tiles == 1) mbar_arrive(q_free + wg);
      softmax(s, 0, corr);
      acc_to_a(pa, s);
      for (int t = 1; t < n_tiles; ++t) {
        const u32 u = it + t;
        const int st = u & 1, pst = st ^ 1;
        mbar_wait(k_full + st, (u >> 1) & 1u);
        mbar_wait(v_full + pst, ((u - 1) >> 1) & 1u);
        fence_proxy_async();
        my_turn();
        warpgroup_mma_nt_async<1, kBN, kDqk, kBM>(s, s_q, 64 * wg, s_k(st));
        warpgroup_mma_rs_tb_async<1, kDv, kBN / 16, kBN>(acc_o, pa, s_v(pst));
        pass_turn();
        warpgroup_wait<1>(s);  // S_t is done (groups complete in order); P_{t-1} V_{t-1} may still run
        mbar_arrive(k_free + st);
        if (t == n_tiles - 1) mbar_arrive(q_free + wg);  // the row tile's last S: its Q may be replaced
        softmax(s, t, corr);
        // The row sums depend on every exp2 of the step: their store keeps the softmax under P_{t-1} V_{t-1}.
        sched_sink(reinterpret_cast<float*>(smem + Tr::kOffSink) + 2 * tid, l_i[0][0], l_i[0][1]);
        warpgroup_wait<0>(acc_o);
        mbar_arrive(v_free + pst);
        rescale_rows(acc_o, corr);
        acc_to_a(pa, s);
      }
      const u32 u = it + n_tiles - 1;
      const int st = u & 1;
      mbar_wait(v_full + st, (u >> 1) & 1u);
      fence_proxy_async();
      my_turn();
      warpgroup_mma_rs_tb_async<1, kDv, kBN / 16, kBN>(acc_o, pa, s_v(st));
      pass_turn();
      warpgroup_wait<0>(acc_o);
      mbar_arrive(v_free + st);
      it += n_tiles, ++qs;
    }

    // O / l and the log-sum-exp; each warp holds whole rows (a quad per row).
    bf16* o = static_cast<bf16*>(p.o) + b * p.o_batch_stride;
    float* lse = static_cast<float*>(p.lse);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float l = quad_sum(l_i[0][h]);
      const i64 row = frag_row0 + 8 * h;
      if (row >= rows) continue;
      const float inv = softmax_inv(l);
      bf16* out = o + (g * group + rm.head(row)) * p.o_head_stride + rm.query(row) * p.o_token_stride;
#pragma unroll
      for (int nt = 0; nt < kDv / 8; ++nt)
        store2<kAligned>(out + nt * 8 + 2 * tig, acc_o[0][nt][2 * h] * inv, acc_o[0][nt][2 * h + 1] * inv);
      if (tig == 0)
        lse[(b * p.q_heads + g * group + rm.head(row)) * p.q_len + rm.query(row)] =
            softmax_lse(m_i[0][h] * float(p.scale), l);
    }
  }
  if (wg == 0 && qs > 0) my_turn();  // warpgroup 1's last hand-over
}

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

// ================================================================ backward, warp-specialised (192/128, MHA)
// flash_bwd_dkdv_regs_kernel's arithmetic with dQ fused (the same 128 keys a block, 64-row steps walked from
// the last row tile down, the same wgmma chains and the same dK, dV bits), its roles split as in
// FlashAttention-3's backward: two computing warpgroups (keys 64 wg..) and a third that gives its registers
// away and feeds them. Its first two warps load K and V once and then Q, dO, lse and D a step ahead into two
// stages announced by mbarriers (the computing warps neither issue copies nor wait at block barriers for
// them); its other two write dQ, one per computing warpgroup: that warpgroup stores each 64-column slab of its
// half of dQ^T (32 rows) to shared memory (registers free at once, where a 16-byte red held them until it had
// read them) and its dQ warp adds it to the fp32 row tile by one bulk reduction, in the key blocks' order (it
// waits for the tile's counter before the step's first slab and adds its one once its three slabs are
// written). dQ^T reads both warpgroups' halves of dS^T (all 128 keys), so a step's dQ^T runs in the next
// step, from one of two dS^T buffers announced and handed back by mbarriers: the computing warpgroups never
// wait for each other's work of the same step. They run half a step apart, taking turns at issuing S^T, so that
// one's elementwise work (P^T, dS^T) falls under the other's GEMMs. Rows are queries of one head (MHA) and the
// views 16-byte aligned; other problems take flash_bwd_dkdv_regs_kernel. The work order takes head_group (kv
// head, batch) pairs at a time (tile_work): any group size keeps each head's key blocks in increasing order, the
// order the dQ counters wait in, and gives the same bits.
template <int kDqk_, int kDv_>
struct BwdWsTraits {
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockN = 128, kBlockM = 64;
  static constexpr int kConsumerThreads = 256, kLoadThreads = 64, kThreads = 384;
  // 168 a thread at launch (65536 / 384, down to a multiple of 8); setmaxnreg moves registers within the block,
  // 24 + 2 x 240 = 3 x 168 (per register file 24 x 32 + 2 x 240 x 32 = 16128 of 16384). On the persistent grid the
  // loading warps carry the walk's state in those 24 too (ptxas spills 488 / 792 B, against 204 / 368 on a block
  // per key block; the extra ones outside the computing loop).
  static constexpr int kLoadRegs = 24, kMmaRegs = 240;
  static_assert(kLoadRegs + 2 * kMmaRegs <= 3 * (65536 / kThreads / 8 * 8),
                "the computing warpgroups take only what the loading one gives back");
  static constexpr int kKBytes = kBlockN * kDqk * 2, kVBytes = kBlockN * kDv * 2;
  static constexpr int kQBytes = kBlockM * kDqk * 2, kDoBytes = kBlockM * kDv * 2;
  static constexpr int kStageBytes = (kQBytes + kDoBytes + 2 * kBlockM * 4 + 1023) / 1024 * 1024;  // Q | dO | lse | D
  static constexpr int kPtBytes = kBlockN * kBlockM * 2;        // dS^T, bf16 [keys][rows]
  static constexpr int kDqSlabBytes = kBlockM / 2 * 64 * 4;     // a warpgroup's dQ^T slab: 64 columns x 32 rows
  static constexpr int kOffV = kKBytes;
  static constexpr int kOffStage = kOffV + kVBytes;            // stages 0, 1
  static constexpr int kOffDst = kOffStage + 2 * kStageBytes;  // dS^T, buffers 0, 1
  static constexpr int kOffDq = kOffDst + 2 * kPtBytes;        // dQ^T slabs: warpgroups 0, 1 x buffers 0, 1
  // mbarriers: K/V full; stage full x2, stage free x2; dS^T buffer full x2 (both warpgroups' halves written),
  // dS^T buffer free x2 (both warpgroups' dQ^T have read it); then for the persistent grid K free (the key block's
  // last dQ^T done), V free (its last dP^T done), key block full x2, key block free x2 (the hand-over); then two
  // key block slots.
  static constexpr int kOffBar = kOffDq + 4 * kDqSlabBytes;
  static constexpr int kSmemBytes = kOffBar + 15 * 8 + 8;
  // Named barriers: 1 warpgroup 1's turn at a step's S^T (warpgroup 0 has issued that step's dP^T), 10 warpgroup
  // 0's (warpgroup 1 has issued the previous step's dP^T), each over both computing warpgroups; 2 + 2 wg + buf a
  // dQ^T slab of warpgroup wg stored in buffer buf, 6 + 2 wg + buf that buffer read by its bulk operation (each
  // over the warpgroup and its dQ warp).
  // 11: the loading warps, over the two of them (the key block they read from a slot).
  static constexpr int kBarTurn1 = 1, kBarDqFull = 2, kBarDqFree = 6, kBarTurn0 = 10, kBarLoad = 11;
  static constexpr int kDqBarThreads = 128 + 32, kItemReaders = kConsumerThreads + 64;  // computing and dQ warps
  static_assert(kDqk == 192 && kDv == 128, "three dQ^T slabs interleaved with dV and dK, as the fused kernel");
  static_assert(kOffStage % 1024 == 0 && kStageBytes % 1024 == 0 && kOffDst % 1024 == 0 &&
                    kQBytes % 1024 == 0,
                "1024-aligned wgmma tiles");
  static_assert(std::size_t(kSmemBytes) <= kSmemBudget, "warp-specialised backward tiles exceed shared memory");
};

template <class Tr, bool kPersistent>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_bwd_ws_kernel(const AttentionBwdParams p, const float* delta, float* dq_accum, unsigned* dq_count,
                        bool ordered, const int items, unsigned* taken, const int head_group) {
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDqk = Tr::kDqk, kDv = Tr::kDv;
  using Keys = KeyTile<kBN, kBM>;
  char* smem = dynamic_smem();
  bf16* s_k = reinterpret_cast<bf16*>(smem);
  bf16* s_v = reinterpret_cast<bf16*>(smem + Tr::kOffV);
  auto s_q = [&](int st) { return reinterpret_cast<bf16*>(smem + Tr::kOffStage + st * Tr::kStageBytes); };
  auto s_do = [&](int st) { return s_q(st) + kBM * kDqk; };
  auto s_lse = [&](int st) { return reinterpret_cast<float*>(s_do(st) + kBM * kDv); };
  auto s_dd = [&](int st) { return s_lse(st) + kBM; };
  auto s_dst = [&](int buf) { return reinterpret_cast<bf16*>(smem + Tr::kOffDst + buf * Tr::kPtBytes); };
  auto s_dq = [&](int wg, int buf) {
    return reinterpret_cast<float*>(smem + Tr::kOffDq + (2 * buf + wg) * Tr::kDqSlabBytes);
  };
  std::uint64_t* bar = reinterpret_cast<std::uint64_t*>(smem + Tr::kOffBar);
  std::uint64_t* kv_full = bar;
  std::uint64_t* stage_full = bar + 1;  // [2]
  std::uint64_t* stage_free = bar + 3;  // [2]
  std::uint64_t* ds_full = bar + 5;     // [2]
  std::uint64_t* ds_free = bar + 7;     // [2]
  std::uint64_t* k_free = bar + 9;      // persistent grid only, as the four below
  std::uint64_t* v_free = bar + 10;
  std::uint64_t* item_full = bar + 11;  // [2]: the block's n-th key block's index in its slot (ItemSlots)
  std::uint64_t* item_free = bar + 13;  // [2]
  const ItemSlots items_of{reinterpret_cast<int*>(bar + 15), item_full, item_free};

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  const int wg = warp >> 2;  // 0, 1: keys 64 wg..; 2: loads and dQ
  const RowMap rm{1u};  // MHA (the launcher's rule): a row is a query, at compile time

  // One key block's work for each role; `sc` counts the block's steps before it (the stages' and dS^T buffers'
  // phases run on across key blocks), `kvs` its key blocks before it that loaded K and V.
  // The loading warps: K and V, then each step's Q, dO, lse and D a step ahead. After the block's first key
  // block, the first stage loads first, then V once the previous key block's last dP^T has read V, then K once
  // its last dQ^T has read K (under which V loads).
  auto load_key_block = [&](const Keys& kt, u32 sc, u32 kvs, int ltid) {
    const i64 b = kt.b, g = kt.g, key0 = kt.key0, rows = kt.rows;
    const int n_tiles = kt.n_tiles;
    const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
    const bf16* v = static_cast<const bf16*>(p.v) + b * p.v_batch_stride + g * p.v_head_stride;
    auto load_k = [&] {
      load_rows_async<kBN, kDqk, Tr::kLoadThreads>(s_k, k + key0 * p.k_token_stride, p.k_token_stride,
                                                   p.kv_len - key0, ltid);
    };
    auto load_v = [&] {
      load_rows_async<kBN, kDv, Tr::kLoadThreads>(s_v, v + key0 * p.v_token_stride, p.v_token_stride,
                                                  p.kv_len - key0, ltid);
    };
    if (kvs == 0) {
      load_k();
      load_v();
      cp_async_mbar_arrive(kv_full);
    }
    const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_batch_stride + g * p.q_head_stride;
    const bf16* dout = static_cast<const bf16*>(p.dout) + b * p.dout_batch_stride + g * p.dout_head_stride;
    const i64 lse0 = (b * p.q_heads + g) * p.q_len;  // this head's first lse and D
    auto load_stage = [&](int t) {
      const u32 u = sc + u32(t);
      const int st = int(u & 1u);
      if (u >= 2) mbar_wait(stage_free + st, ((u >> 1) - 1) & 1u);
      const i64 r0 = kt.step_row0(t);
      load_rows_async<kBM, kDqk, Tr::kLoadThreads>(s_q(st), q + r0 * p.q_token_stride, p.q_token_stride, rows - r0,
                                                  ltid);
      load_rows_async<kBM, kDv, Tr::kLoadThreads>(s_do(st), dout + r0 * p.dout_token_stride, p.dout_token_stride,
                                                 rows - r0, ltid);
      // Rows past the end: lse = D = 0, so P^T = 1 against zero Q and dO rows, and their dS^T, dV and dK terms
      // are 0 (dQ of those rows is never written out).
      static_assert(kBM == Tr::kLoadThreads, "a row's lse and D per loading thread");
      const bool in = r0 + ltid < rows;
      const i64 r = in ? r0 + ltid : 0;
      cp_async4_fill(s_lse(st) + ltid, static_cast<const float*>(p.lse) + lse0 + r, in);
      cp_async4_fill(s_dd(st) + ltid, delta + lse0 + r, in);
      cp_async_mbar_arrive(stage_full + st);
    };
    if (kvs > 0) {
      load_stage(0);
      mbar_wait(v_free, (kvs - 1) & 1u);
      load_v();
      mbar_wait(k_free, (kvs - 1) & 1u);
      load_k();
      cp_async_mbar_arrive(kv_full);
    }
    for (int t = kvs > 0 ? 1 : 0; t < n_tiles; ++t) load_stage(t);
  };

  // dQ: warp 2 + h of this warpgroup adds computing warpgroup h's half of each slab (rows 32 h.. of the tile),
  // so that the two computing warpgroups hand over their slabs independently. Per step: wait until the key
  // blocks before this one have added both halves of theirs to the row tile (its counter counts halves; not
  // `ordered`: only key block 0, which stores, and the others add in whichever order they come), then the three
  // slabs as they come, by one bulk operation each (a store for key block 0, an add after it), then count this
  // half once its writes are done (not `ordered`: key block 0 only). Slab n of the key block (3 t + s) is in
  // buffer n % 2; a buffer goes back once its bulk operation has read it (slab n's when slab n + 1 is issued, the
  // step's last at the step's end, before the wait for the writes), except where no slab of the key block follows
  // to use it, so that arrivals and syncs pair up; each key block starts by giving both buffers (read by then).
  auto add_dq = [&](const Keys& kt, int ltid) {
    const i64 block = kt.block, tile_base = kt.tile_base;
    const int n_tiles = kt.n_tiles;
    const int h = (ltid - Tr::kLoadThreads) / 32;
    float* tiles = dq_accum + tile_base * (kBM * kDqk);
    constexpr u32 kSlab = Tr::kDqSlabBytes;
    constexpr int kSlabFloats = Tr::kDqSlabBytes / 4;
    const int n_slabs = 3 * n_tiles;
    auto give_back = [&](int n) {  // slab n's buffer, once read
      __syncwarp();
      if (n + 2 < n_slabs) named_bar_arrive(Tr::kBarDqFree + 2 * h + (n & 1), Tr::kDqBarThreads);
    };
    for (int buf = 0; buf < 2; ++buf) named_bar_arrive(Tr::kBarDqFree + 2 * h + buf, Tr::kDqBarThreads);
    for (int t = 0; t < n_tiles; ++t) {
      const i64 tile = kt.step_row0(t) / kBM;
      float* dst = tiles + tile * (kBM * kDqk) + h * kSlabFloats;
      if (lane == 0) {
        wait_counter(dq_count + tile_base + tile, ordered || block == 0 ? 2 * unsigned(block) : 2u, true);
        fence_proxy_async_global();
      }
      for (int s = 0; s < 3; ++s) {
        const int n = 3 * t + s;
        named_bar_sync(Tr::kBarDqFull + 2 * h + (n & 1), Tr::kDqBarThreads);
        if (lane == 0) {
          if (block == 0)
            bulk_store(dst + s * 2 * kSlabFloats, s_dq(h, n & 1), kSlab);
          else
            bulk_reduce_add(dst + s * 2 * kSlabFloats, s_dq(h, n & 1), kSlab);
          bulk_commit();
        }
        if (s > 0) {
          if (lane == 0) bulk_wait_read<1>();  // slab n - 1's group (groups complete in order)
          give_back(n - 1);
        }
      }
      // The step's last buffer goes back once read, before the wait for the writes (which outlasts a slab).
      if (lane == 0) bulk_wait_read<0>();
      give_back(3 * t + 2);
      // Count this half as added once its writes are done: for the key blocks after this one (ordered), or
      // for those after key block 0 and for the conversion, which reads a tile only where it was stored to.
      if (lane == 0 && (ordered || block == 0)) {
        bulk_wait<0>();
        fence_proxy_async_global();
        release_counter(dq_count + tile_base + tile);
      }
    }
  };

  // A computing warpgroup: keys 64 wg.. of the key block; warp w of it keys 16 w + gid (+ 8). Step t computes
  // S^T, P^T, dP^T, dS^T, dV and dK of row tile t and then dQ^T of row tile t - 1, whose dS^T both warpgroups
  // wrote a step before: the warpgroups do not meet, so one's elementwise work can run under the other's GEMMs
  // (warpgroup 1 half a step behind, by the turns at S^T). Then dK and dV out.
  auto compute_key_block = [&](const Keys& kt, u32 sc, u32 kvs) {
    const i64 key0 = kt.key0, g = kt.g, b = kt.b;
    const int n_tiles = kt.n_tiles;
    const int wk0 = warp * 16, m0 = 64 * wg, wtid = tid & 127;
    float acc_dk[1][kDqk / 8][4], acc_dv[1][kDv / 8][4];
    zero(acc_dk);
    zero(acc_dv);
    const float sl2 = float(p.scale) * kLog2e;
    mbar_wait(kv_full, kvs & 1u);
    for (int t = 0; t <= n_tiles; ++t) {
      const u32 ut = sc + u32(t);  // the block's step
      const int st = int(ut & 1u);
      if (t < n_tiles) {
        const i64 r0 = kt.step_row0(t);
        mbar_wait(stage_full + st, (ut >> 1) & 1u);
        fence_proxy_async();  // cp.async wrote the tiles (generic proxy); wgmma reads them (async proxy)
        const bf16* sq = s_q(st);
        const bf16* sdo = s_do(st);
        const float* slse = s_lse(st);
        const float* sdd = s_dd(st);
        bf16* sdst = s_dst(st);

        // S^T = K Q^T; P^T = exp2(S^T sl2 - lse log2e), bf16 in registers as the A operand of dV += P^T dO;
        // D - dP^T = D - V dO^T (the accumulator starts at D: its loads run under dV, and no subtraction is left
        // for after the wait); dS^T = P^T (dP^T - D), bf16 in registers as the A operand of dK += dS^T Q and into
        // this step's dS^T buffer for dQ (once both warpgroups' dQ^T of step t - 2 have read it).
        float pt[1][kBM / 8][4];
        // Turns: warpgroup 1 issues S^T of a step once warpgroup 0 has issued that step's dP^T, warpgroup 0 once
        // warpgroup 1 has issued the previous step's (of the key block), so that each one's softmax and dS^T
        // fall under the other's GEMMs.
        if (wg == 1) named_bar_sync(Tr::kBarTurn1, Tr::kConsumerThreads);
        if (wg == 0 && t > 0) named_bar_sync(Tr::kBarTurn0, Tr::kConsumerThreads);
        warpgroup_mma_nt_async<1, kBM, kDqk, kBN>(pt, s_k, m0, sq);
        warpgroup_wait<0>(pt);
        recompute_pt<kBN>(pt, slse, 0, sl2, rm, r0, p, key0, wk0, gid, tig);
        u32 pa[1][kBM / 16][4];
        acc_to_a(pa, pt);
        warpgroup_mma_rs_tb_async<1, kDv, kBM / 16, kBM>(acc_dv, pa, sdo);
        float ds[1][kBM / 8][4];
        d_into_acc(ds, sdd, tig);
        warpgroup_mma_nt_async<1, kBM, kDv, kBN, true, -1>(ds, s_v, m0, sdo);
        if (wg == 0) named_bar_arrive(Tr::kBarTurn1, Tr::kConsumerThreads);
        if (wg == 1 && t + 1 < n_tiles) named_bar_arrive(Tr::kBarTurn0, Tr::kConsumerThreads);
        warpgroup_wait<0>(ds);  // dV (issued first) and D - dP^T done
        if (kPersistent && t == n_tiles - 1) mbar_arrive(v_free);  // the key block's last read of V
        u32 dsa[1][kBM / 16][4];
#pragma unroll
        for (int nt = 0; nt < kBM / 8; ++nt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const u32 ph = pa[0][nt / 2][(nt % 2) * 2 + h];  // P^T of rows gid + 8 h, columns nt * 8 + 2 tig (+ 1)
            dsa[0][nt / 2][(nt % 2) * 2 + h] =
                pack_bf16(-lo_bf16(ph) * ds[0][nt][2 * h], -hi_bf16(ph) * ds[0][nt][2 * h + 1]);
          }
        }
        warpgroup_mma_rs_tb_async<1, kDqk, kBM / 16, kBM>(acc_dk, dsa, sq);
        // dS^T into this step's buffer for dQ while dK runs (once both warpgroups' dQ^T of step t - 2 have read
        // it), four 8x8 matrices a stmatrix: dsa[0][i][j] holds rows gid + 8 (j % 2), columns 8 (2 i + j / 2) +
        // 2 tig (+ 1); lane l addresses row l % 8 of matrix l / 8.
        if (ut >= 2) mbar_wait(ds_free + st, ((ut >> 1) - 1) & 1u);
#pragma unroll
        for (int i = 0; i < kBM / 16; ++i) {
          const int j = lane >> 3;
          stsm_x4(smem_u32(sdst + swz_k64<kBN>(wk0 + (lane & 7) + 8 * (j & 1), 8 * (2 * i + (j >> 1)))), dsa[0][i]);
        }
        fence_proxy_async();  // the other warpgroup's dQ^T wgmma (async proxy) reads these stores
        mbar_arrive(ds_full + st);
        if (t == 0) {  // no dQ^T this step: this stage's Q and dO are read once dK is done
          warpgroup_wait<0>(acc_dk);
          mbar_arrive(stage_free + st);
          continue;
        }
      }

      // dQ^T of step u = t - 1 (d_qk x 32 rows per warpgroup) = K^T dS^T a 64-column slab at a time (two
      // accumulators in turn), each slab to shared memory for the dQ warp while the next one runs.
      const int u = t - 1;
      const u32 uu = ut - 1;  // the block's step u
      mbar_wait(ds_full + (uu & 1u), (uu >> 1) & 1u);
      float acc_dq[2][4][4];
      auto store_slab = [&](const float (&acc)[4][4], int s) {  // slab 3 u + s, in buffer (3 u + s) % 2
        const int buf = (3 * u + s) & 1;
        named_bar_sync(Tr::kBarDqFree + 2 * wg + buf, Tr::kDqBarThreads);
        float* d = s_dq(wg, buf) + wtid * 4;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) st_shared_v4(d + nt * 128 * 4, acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
        fence_proxy_async();  // the bulk reduction (async proxy) reads what these stores wrote
        named_bar_arrive(Tr::kBarDqFull + 2 * wg + buf, Tr::kDqBarThreads);
      };
      const bf16* s_dst_wg = s_dst(int(uu & 1u)) + 32 * wg;
      warpgroup_mma_tt_async<kBN / 16, kBN>(acc_dq[0], s_k, 0, s_dst_wg);
      warpgroup_wait<0>(acc_dq[0]);  // slab 0 done, and dK of step t: this stage's Q and dO are read
      if (t < n_tiles) {
        reg_fence_all(acc_dk);
        mbar_arrive(stage_free + st);
      }
      warpgroup_mma_tt_async<kBN / 16, kBN>(acc_dq[1], s_k, 1, s_dst_wg);
      store_slab(acc_dq[0], 0);
      warpgroup_mma_tt_async<kBN / 16, kBN>(acc_dq[0], s_k, 2, s_dst_wg);
      warpgroup_wait<1>(acc_dq[1]);
      store_slab(acc_dq[1], 1);
      warpgroup_wait<0>(acc_dq[0]);
      mbar_arrive(ds_free + (uu & 1u));  // this warpgroup's dQ^T has read dS^T buffer u % 2
      if (kPersistent && t == n_tiles) mbar_arrive(k_free);  // the key block's last read of K
      store_slab(acc_dq[0], 2);
    }
    store_dkdv<true>(p, b, g, key0 + wk0, 0, 0, acc_dk, acc_dv, gid, tig);
  };

  // No row sees these keys: dK = dV = 0, nothing added to dQ.
  auto zero_key_block = [&](const Keys& kt) {
    float acc_dk[1][Tr::kDqk / 8][4], acc_dv[1][Tr::kDv / 8][4];
    zero(acc_dk), zero(acc_dv);
    store_dkdv<true>(p, kt.b, kt.g, kt.key0 + warp * 16, 0, 0, acc_dk, acc_dv, gid, tig);
  };

  if constexpr (!kPersistent) {  // a block per key block
    const Keys kt(p, i64(blockIdx.x), head_group);
    if (tid == 0) {
      mbar_init(kv_full, Tr::kLoadThreads);
      for (int st = 0; st < 2; ++st) {
        mbar_init(stage_full + st, Tr::kLoadThreads), mbar_init(stage_free + st, Tr::kConsumerThreads);
        mbar_init(ds_full + st, Tr::kConsumerThreads), mbar_init(ds_free + st, Tr::kConsumerThreads);
      }
    }
    __syncthreads();  // the only block-wide barrier
    if (kt.n_tiles == 0) {
      if (wg < 2) zero_key_block(kt);
      return;
    }
    if (wg == 2) {
      setmaxnreg_dec<Tr::kLoadRegs>();
      const int ltid = tid - Tr::kConsumerThreads;
      if (ltid < Tr::kLoadThreads) {
        load_key_block(kt, 0, 0, ltid);
        cp_async_wait<0>();
      } else {
        add_dq(kt, ltid);
        if (lane == 0) bulk_wait<0>();  // every add done before the block ends
      }
      return;
    }
    setmaxnreg_inc<Tr::kMmaRegs>();
    compute_key_block(kt, 0, 0);
  } else {
    // A persistent grid: block c starts at key block c of the work order and takes the next untaken one each
    // time its loading warps have issued one's loads (*taken counts those handed out past the first gridDim.x,
    // zeroed by the launcher), heaviest first, as the GPU would issue blocks. Key blocks are taken in the work
    // order and a block walks its own in that order, so the key block that a dQ counter waits for is always one
    // a block is walking or has walked. The first loading thread takes it and hands it to the others through
    // items_of (ItemSlots); the roles walk the same key blocks.
    if (tid == 0) {
      mbar_init(kv_full, Tr::kLoadThreads);
      mbar_init(k_free, Tr::kConsumerThreads), mbar_init(v_free, Tr::kConsumerThreads);
      for (int st = 0; st < 2; ++st) {
        mbar_init(stage_full + st, Tr::kLoadThreads), mbar_init(stage_free + st, Tr::kConsumerThreads);
        mbar_init(ds_full + st, Tr::kConsumerThreads), mbar_init(ds_free + st, Tr::kConsumerThreads);
        mbar_init(item_full + st, 1), mbar_init(item_free + st, Tr::kItemReaders);
      }
    }
    __syncthreads();  // the only block-wide barrier
    if (wg == 2) {
      setmaxnreg_dec<Tr::kLoadRegs>();
      const int ltid = tid - Tr::kConsumerThreads;
      if (ltid < Tr::kLoadThreads) {
        u32 sc = 0, kvs = 0;  // steps and K/V tiles loaded so far
        for (u32 n = 0, x = blockIdx.x;; ++n) {
          // The next one (also the one past the end, which ends the walk).
          if (n > 0) x = items_of.hand_over(n, ltid, taken, items, Tr::kBarLoad, Tr::kLoadThreads);
          if (x >= u32(items)) break;
          const Keys kt(p, x, head_group);
          if (kt.n_tiles == 0) continue;
          load_key_block(kt, sc, kvs, ltid);
          sc += u32(kt.n_tiles), ++kvs;
        }
        cp_async_wait<0>();
      } else {
        for (u32 n = 0, x = blockIdx.x;; ++n) {
          if (n > 0) x = items_of.read(n);
          if (x >= u32(items)) break;
          const Keys kt(p, x, head_group);
          if (kt.n_tiles > 0) add_dq(kt, ltid);
        }
        if (lane == 0) bulk_wait<0>();  // every add done before the block ends
      }
      return;
    }
    setmaxnreg_inc<Tr::kMmaRegs>();
    u32 sc = 0, kvs = 0;  // steps and K/V tiles consumed so far
    for (u32 n = 0, x = blockIdx.x;; ++n) {
      if (n > 0) x = items_of.read(n);
      if (x >= u32(items)) break;
      const Keys kt(p, x, head_group);
      if (kt.n_tiles == 0) {
        zero_key_block(kt);
        continue;
      }
      compute_key_block(kt, sc, kvs);
      sc += u32(kt.n_tiles), ++kvs;
    }
  }
}

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
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<u32*>(s_pt + swz_k64<kBN>(wk0 + gid + 8 * h, nt * 8 + 2 * tig)) =
              pack_bf16(x[0][nt][2 * h], x[0][nt][2 * h + 1]);
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
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const float d0 = s_dd[nt * 8 + 2 * tig], d1 = s_dd[nt * 8 + 2 * tig + 1];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int off = swz_k64<kBN>(wk0 + gid + 8 * h, nt * 8 + 2 * tig);
          const u32 ph = *reinterpret_cast<const u32*>(s_pt + off);
          *reinterpret_cast<u32*>(s_dst + off) = pack_bf16(scale * lo_bf16(ph) * (x[0][nt][2 * h] - d0),
                                                           scale * hi_bf16(ph) * (x[0][nt][2 * h + 1] - d1));
        }
      }
      fence_proxy_async();
      wgmma_wait<0>();
    }
    reg_fence_all(acc_a);
    reg_fence_all(acc_b);
    __syncthreads();  // (C) dS^T is in; dO_t and D_t are no longer read

    // dKV += dS^T Q over the warpgroup's columns; then dQ = dS K by chunks, two accumulators in turn.
    float qa[8][4], qb[8][4], qc[4][4];
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
    if constexpr (kWg == 0)
      warpgroup_mma_tt_n_async<64, kBN / 16, kBN, kBN>(qa, s_dst, col(s_k, kBN, 0));
    else
      warpgroup_mma_tt_n_async<32, kBN / 16, kBN, kBN>(qc, s_dst, col(s_k, kBN, 288));
    if (t + 1 < n_tiles) load_q(t + 1);
    cp_async_commit();
    if constexpr (kWg == 0) {
      warpgroup_mma_tt_n_async<64, kBN / 16, kBN, kBN>(qb, s_dst, col(s_k, kBN, 64));
      warpgroup_wait<1>(qa);
      add_dq_chunk<0>(dq_tile, t128, first, qa);
      warpgroup_mma_tt_n_async<64, kBN / 16, kBN, kBN>(qa, s_dst, col(s_k, kBN, 128));
      warpgroup_wait<1>(qb);
      add_dq_chunk<64>(dq_tile, t128, first, qb);
      warpgroup_mma_tt_n_async<64, kBN / 16, kBN, kBN>(qb, s_dst, col(s_k, kBN, 192));
      warpgroup_wait<1>(qa);
      add_dq_chunk<128>(dq_tile, t128, first, qa);
      warpgroup_mma_tt_n_async<32, kBN / 16, kBN, kBN>(qc, s_dst, col(s_k, kBN, 256));
      warpgroup_wait<1>(qb);
      add_dq_chunk<192>(dq_tile, t128, first, qb);
      warpgroup_wait<0>(qc);
      add_dq_chunk<256>(dq_tile, t128, first, qc);
    } else {  // chunks: qc [288, 320), qa [320, 384), qb [384, 448), qa [448, 512), qb [512, 576)
      warpgroup_mma_tt_n_async<64, kBN / 16, kBN, kBN>(qa, s_dst, col(s_k, kBN, 320));
      warpgroup_wait<1>(qc);
      add_dq_chunk<288>(dq_tile, t128, first, qc);
      warpgroup_mma_tt_n_async<64, kBN / 16, kBN, kBN>(qb, s_dst, col(s_k, kBN, 384));
      warpgroup_wait<1>(qa);
      add_dq_chunk<320>(dq_tile, t128, first, qa);
      warpgroup_mma_tt_n_async<64, kBN / 16, kBN, kBN>(qa, s_dst, col(s_k, kBN, 448));
      warpgroup_wait<1>(qb);
      add_dq_chunk<384>(dq_tile, t128, first, qb);
      warpgroup_mma_tt_n_async<64, kBN / 16, kBN, kBN>(qb, s_dst, col(s_k, kBN, 512));
      warpgroup_wait<1>(qa);
      add_dq_chunk<448>(dq_tile, t128, first, qa);
      warpgroup_wait<0>(qb);
      add_dq_chunk<512>(dq_tile, t128, first, qb);
    }
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
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<u32*>(s_p + swz_k64<kBM>(wr0 + gid + 8 * h, nt * 8 + 2 * tig)) =
              pack_bf16(x[0][nt][2 * h], x[0][nt][2 * h + 1]);
      fence_proxy_async();
    } else {
      warpgroup_mma_nt_async<1, kBN, kDv, kBM>(x, s_do, 0, s_k);  // V = K's first d_v columns
      // Key block t - 1 is done (A): released while dP runs (the release waits for this block's adds to drain).
      release_counter_if(t128 == 0 && t > 0, dkv_count + tile_base + t - 1);
      warpgroup_wait<0>(x);
    }
    __syncthreads();  // (B) P is in
    if constexpr (kWg == 1) {  // dS = scale P (dP - D), from the bf16 P (dS is rounded to bf16 for its GEMMs anyway)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int off = swz_k64<kBM>(wr0 + gid + 8 * h, nt * 8 + 2 * tig);
          const u32 ph = *reinterpret_cast<const u32*>(s_p + off);
          *reinterpret_cast<u32*>(s_ds + off) = pack_bf16(scale * lo_bf16(ph) * (x[0][nt][2 * h] - rv[h]),
                                                          scale * hi_bf16(ph) * (x[0][nt][2 * h + 1] - rv[h]));
        }
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

    // dK + [dV, 0] of key block t by chunks of columns: keys x columns, the tile's rows the sum. The first chunk is
    // issued before K_{t+1} is requested (the tensor cores start first).
    float qa[8][4], qb[8][4], qc[4][4];
    const bool first = place == 0;
    auto chunk = [&](auto& acc, auto c0) {
      constexpr int kC0 = decltype(c0)::value, kN = sizeof(acc) / (4 * sizeof(float)) * 8;
      warpgroup_mma_tt2_n_async<kN, kBM / 16, kBM, kBM, (kC0 < kDv)>(acc, s_p, col(s_do, kBM, kC0 < kDv ? kC0 : 0),
                                                                       s_ds, col(s_q, kBM, kC0));
    };
    auto add = [&](auto& acc, auto c0) {
      warpgroup_wait<0>(acc);
      add_dq_chunk<decltype(c0)::value>(dkv_tile, t128, first, acc);
    };
    // The next chunk issued, then the previous one (the older group) added while it runs.
    auto next = [&](auto& acc, auto c0, auto& done, auto done_c0) {
      chunk(acc, c0);
      warpgroup_wait<1>(done);
      add_dq_chunk<decltype(done_c0)::value>(dkv_tile, t128, first, done);
    };
    using std::integral_constant;
    if constexpr (kWg == 0) {  // chunks: qa [0, 64), qb [64, 128), qa [128, 192), qb [192, 256), qc [256, 288)
      chunk(qa, integral_constant<int, 0>{});
      if (t + 1 < n_tiles) load_k(t + 1);
      cp_async_commit();
      next(qb, integral_constant<int, 64>{}, qa, integral_constant<int, 0>{});
      next(qa, integral_constant<int, 128>{}, qb, integral_constant<int, 64>{});
      next(qb, integral_constant<int, 192>{}, qa, integral_constant<int, 128>{});
      next(qc, integral_constant<int, 256>{}, qb, integral_constant<int, 192>{});
      add(qc, integral_constant<int, 256>{});
    } else {  // chunks: qc [288, 320), qa [320, 384), qb [384, 448), qa [448, 512), qb [512, 576)
      chunk(qc, integral_constant<int, 288>{});
      if (t + 1 < n_tiles) load_k(t + 1);
      cp_async_commit();
      next(qa, integral_constant<int, 320>{}, qc, integral_constant<int, 288>{});
      next(qb, integral_constant<int, 384>{}, qa, integral_constant<int, 320>{});
      next(qa, integral_constant<int, 448>{}, qb, integral_constant<int, 384>{});
      next(qb, integral_constant<int, 512>{}, qa, integral_constant<int, 448>{});
      add(qb, integral_constant<int, 512>{});
    }
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

// ================================================================ backward: dK, dV through shared memory
// kBlockN keys per block, kBlockM rows per step (one stage: Q/lse load during dV, dO/D during S^T).
// S^T and dP^T: kWarpsNS (keys) x kWarps / kWarpsNS (rows) warps; dK and dV: every warp all kBlockN keys and
// a 1/kWarps slice of the d_qk and d_v columns. Splits > 1 (tiles = key blocks x splits): the rows are cut
// into `splits` contiguous ranges and each block writes fp32 partials [split][b][g][key][d_qk + d_v] (dK
// already scaled), summed by flash_bwd_dkdv_reduce_kernel.
template <int kDqk_, int kDv_, int kBlockN_, int kBlockM_, int kWarps_, int kWarpsNS_, bool kVInK_>
struct BwdKvSmemTraits {
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockN = kBlockN_, kBlockM = kBlockM_;
  static constexpr int kWarps = kWarps_, kThreads = 32 * kWarps, kMinBlocks = 1;
  static constexpr bool kVInK = kVInK_;
  static constexpr int kWarpsNS = kWarpsNS_, kWarpsMS = kWarps / kWarpsNS;
  static constexpr int kKeysS = kBlockN / kWarpsNS, kRowsS = kBlockM / kWarpsMS;
  static constexpr int kMTS = kKeysS / 16, kNTS = kRowsS / 8;
  static constexpr int kMT = kBlockN / 16;  // dK/dV phase: every warp all keys
  static constexpr int kColsK = kDqk / kWarps, kColsV = kDv / kWarps;
  static constexpr int kNTK = kColsK / 8, kNTV = kColsV / 8;
  static constexpr int kLdV = kVInK ? kDqk : kDv;
  static constexpr int kKBytes = kBlockN * kDqk * 2, kVBytes = kVInK ? 0 : kBlockN * kDv * 2;
  static constexpr int kOffQ = kKBytes + kVBytes;
  static constexpr int kOffDo = kOffQ + kBlockM * kDqk * 2;
  static constexpr int kOffPt = kOffDo + kBlockM * kDv * 2;
  static constexpr int kOffDst = kOffPt + kBlockN * kBlockM * 2;
  static constexpr int kOffLse = kOffDst + kBlockN * kBlockM * 2;
  static constexpr int kSmemBytes = kOffLse + 2 * kBlockM * 4;
  static_assert(kWarps % kWarpsNS == 0 && kKeysS % 16 == 0 && kRowsS % 8 == 0, "S^T warp layout");
  static_assert(kColsK % 8 == 0 && kColsV % 8 == 0 && kBlockM % 16 == 0 && kBlockN % 16 == 0, "dK/dV warp layout");
  static_assert(kOffQ % 128 == 0 && kOffDo % 128 == 0 && kOffPt % 128 == 0 && kOffLse % 16 == 0, "tile alignment");
  static_assert(!kVInK || kDv <= kDqk, "V inside K needs d_v <= d_qk");
  static_assert(std::size_t(kSmemBytes) <= kSmemBudget, "dK/dV tiles exceed shared memory");
};

// Rows [begin, end) of split s for the key block starting at key0 (ranges are whole kBlockM tiles).
struct RowRange {
  i64 begin, end;
};
__host__ __device__ inline RowRange split_rows(i64 key0, i64 q_offset, i64 q_len, i64 group, int splits, int s,
                                               int block_m) {
  const i64 rows = q_len * group;
  const i64 first = imin(imax(key0 - q_offset, 0), q_len) * group;
  const i64 chunk = ceil_div(ceil_div(rows - first, splits), block_m) * block_m;
  const i64 begin = imin(first + s * chunk, rows);
  return {begin, imin(begin + chunk, rows)};
}

template <class Tr, bool kAligned>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    flash_bwd_dkdv_smem_kernel(const AttentionBwdParams p, const float* delta, int splits, float* partial) {
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDqk = Tr::kDqk, kDv = Tr::kDv, kThreads = Tr::kThreads;
  char* smem = dynamic_smem();
  bf16* s_k = reinterpret_cast<bf16*>(smem);
  bf16* s_vbuf = s_k + kBN * kDqk;
  const bf16* s_v = Tr::kVInK ? s_k : s_vbuf;
  bf16* s_q = reinterpret_cast<bf16*>(smem + Tr::kOffQ);
  bf16* s_do = reinterpret_cast<bf16*>(smem + Tr::kOffDo);
  bf16* s_pt = reinterpret_cast<bf16*>(smem + Tr::kOffPt);    // [kBN][kBM]
  bf16* s_dst = reinterpret_cast<bf16*>(smem + Tr::kOffDst);  // [kBN][kBM]
  float* s_lse = reinterpret_cast<float*>(smem + Tr::kOffLse);
  float* s_dd = s_lse + kBM;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int wks = warp / Tr::kWarpsMS, wms = warp % Tr::kWarpsMS;
  const TileWork w = tile_work(ceil_div(p.kv_len, kBN) * splits, p.kv_heads, p.batch);  // key block * splits + split
  const int split = int(w.tile % splits);
  const i64 key0 = (w.tile / splits) * kBN, g = w.g, b = w.b;
  const i64 group = p.q_heads / p.kv_heads, rows = p.q_len * group;
  const RowMap rm{u32(group)};
  const RowRange range = split_rows(key0, p.q_offset, p.q_len, group, splits, split, kBM);
  const int n_tiles = int(ceil_div(range.end - range.begin, kBM));

  const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
  const bf16* v = static_cast<const bf16*>(p.v) + b * p.v_batch_stride + g * p.v_head_stride;
  const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_batch_stride;
  const bf16* dout = static_cast<const bf16*>(p.dout) + b * p.dout_batch_stride;
  auto load_q = [&](int t) {
    const i64 r0 = range.begin + i64(t) * kBM;
    load_tile<kBM, kDqk, kThreads, kAligned>(s_q, [&](int r) -> const bf16* {
      const i64 row = r0 + r;
      if (row >= rows) return nullptr;
      return q + (g * group + rm.head(row)) * p.q_head_stride + rm.query(row) * p.q_token_stride;
    });
    load_row_values<kBM, kThreads>(s_lse, static_cast<const float*>(p.lse), INFINITY, r0, rows, rm, g, b, p);
  };
  auto load_do = [&](int t) {
    const i64 r0 = range.begin + i64(t) * kBM;
    load_tile<kBM, kDv, kThreads, kAligned>(s_do, [&](int r) -> const bf16* {
      const i64 row = r0 + r;
      if (row >= rows) return nullptr;
      return dout + (g * group + rm.head(row)) * p.dout_head_stride + rm.query(row) * p.dout_token_stride;
    });
    load_row_values<kBM, kThreads>(s_dd, delta, 0.f, r0, rows, rm, g, b, p);
  };
  load_tile<kBN, kDqk, kThreads, kAligned>(s_k, [&](int r) -> const bf16* {
    return key0 + r < p.kv_len ? k + (key0 + r) * p.k_token_stride : nullptr;
  });
  if constexpr (!Tr::kVInK)
    load_tile<kBN, kDv, kThreads, kAligned>(s_vbuf, [&](int r) -> const bf16* {
      return key0 + r < p.kv_len ? v + (key0 + r) * p.v_token_stride : nullptr;
    });
  if (n_tiles > 0) load_q(0);
  cp_async_commit();
  if (n_tiles > 0) load_do(0);
  cp_async_commit();

  float acc_dk[Tr::kMT][Tr::kNTK][4], acc_dv[Tr::kMT][Tr::kNTV][4];
  zero(acc_dk);
  zero(acc_dv);
  const float sl2 = float(p.scale) * kLog2e;
  const int wk0 = wks * Tr::kKeysS, wr0 = wms * Tr::kRowsS;  // the warp's S^T tile in the block

  for (int t = 0; t < n_tiles; ++t) {
    const i64 r0 = range.begin + i64(t) * kBM;
    cp_async_wait<1>();
    __syncthreads();  // K, V, Q_t and lse_t are in
    float pt[Tr::kMTS][Tr::kNTS][4];
    zero(pt);
    warp_mma<Tr::kMTS, Tr::kNTS, kDqk / 16, false, false, kDqk, kDqk>(pt, s_k, wk0, s_q, wr0, lane);
    recompute_pt<kBN>(pt, s_lse, wr0, sl2, rm, r0, p, key0, wk0, gid, tig);
    cp_async_wait<0>();
    __syncthreads();  // dO_t and D_t are in
    float ds[Tr::kMTS][Tr::kNTS][4];
    zero(ds);
    warp_mma<Tr::kMTS, Tr::kNTS, kDv / 16, false, false, Tr::kLdV, kDv>(ds, s_v, wk0, s_do, wr0, lane);
#pragma unroll
    for (int mt = 0; mt < Tr::kMTS; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int kr = wk0 + mt * 16 + gid + 8 * h;
#pragma unroll
        for (int nt = 0; nt < Tr::kNTS; ++nt) {
          const int c = wr0 + nt * 8 + 2 * tig;
          const float d0 = pt[mt][nt][2 * h] * (ds[mt][nt][2 * h] - s_dd[c]);
          const float d1 = pt[mt][nt][2 * h + 1] * (ds[mt][nt][2 * h + 1] - s_dd[c + 1]);
          *reinterpret_cast<u32*>(s_pt + swz<kBM>(kr, c)) = pack_bf16(pt[mt][nt][2 * h], pt[mt][nt][2 * h + 1]);
          *reinterpret_cast<u32*>(s_dst + swz<kBM>(kr, c)) = pack_bf16(d0, d1);
        }
      }
    __syncthreads();  // P^T and dS^T are in
    warp_mma<Tr::kMT, Tr::kNTK, kBM / 16, false, true, kBM, kDqk>(acc_dk, s_dst, 0, s_q, warp * Tr::kColsK, lane);
    __syncthreads();  // Q_t is no longer read
    if (t + 1 < n_tiles) load_q(t + 1);
    cp_async_commit();
    warp_mma<Tr::kMT, Tr::kNTV, kBM / 16, false, true, kBM, kDv>(acc_dv, s_pt, 0, s_do, warp * Tr::kColsV, lane);
    __syncthreads();  // dO_t is no longer read
    if (t + 1 < n_tiles) load_do(t + 1);
    cp_async_commit();
  }

  if (splits == 1)
    return store_dkdv<kAligned>(p, b, g, key0, warp * Tr::kColsK, warp * Tr::kColsV, acc_dk, acc_dv, gid, tig);
  const float scale = float(p.scale);
  constexpr int kW = kDqk + kDv;
  float* part = partial + ((i64(split) * p.batch + b) * p.kv_heads + g) * p.kv_len * kW;
#pragma unroll
  for (int mt = 0; mt < Tr::kMT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i64 key = key0 + mt * 16 + gid + 8 * h;
      if (key >= p.kv_len) continue;
      float* row = part + key * kW;
#pragma unroll
      for (int nt = 0; nt < Tr::kNTK; ++nt)
        *reinterpret_cast<float2*>(row + warp * Tr::kColsK + nt * 8 + 2 * tig) =
            make_float2(scale * acc_dk[mt][nt][2 * h], scale * acc_dk[mt][nt][2 * h + 1]);
#pragma unroll
      for (int nt = 0; nt < Tr::kNTV; ++nt)
        *reinterpret_cast<float2*>(row + kDqk + warp * Tr::kColsV + nt * 8 + 2 * tig) =
            make_float2(acc_dv[mt][nt][2 * h], acc_dv[mt][nt][2 * h + 1]);
    }
}

// dK, dV = sum over the splits (in split order) of the partials; one thread per pair of columns. kDv = 0: rows of
// kDqk columns into dk alone (flash_bwd_vk_kernel's dK + [dV, 0]).
template <int kDqk, int kDv, bool kAligned>
__global__ void __launch_bounds__(256) flash_bwd_dkdv_reduce_kernel(const AttentionBwdParams p, int splits,
                                                                    const float* partial) {
  constexpr int kW = kDqk + kDv;
  const i64 idx = i64(blockIdx.x) * 256 + threadIdx.x;  // over [b][g][key][kW / 2]
  const i64 per_split = p.batch * p.kv_heads * p.kv_len * kW;
  if (idx >= per_split / 2) return;
  const i64 c = (idx % (kW / 2)) * 2, r = idx / (kW / 2);
  const i64 key = r % p.kv_len, bg = r / p.kv_len, g = bg % p.kv_heads, b = bg / p.kv_heads;
  float x = 0.f, y = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float2 v = *reinterpret_cast<const float2*>(partial + s * per_split + r * kW + c);
    x += v.x;
    y += v.y;
  }
  if (c < kDqk)
    store2<kAligned>(
        static_cast<bf16*>(p.dk) + b * p.dk_batch_stride + g * p.dk_head_stride + key * p.dk_token_stride + c, x, y);
  else
    store2<kAligned>(static_cast<bf16*>(p.dv) + b * p.dv_batch_stride + g * p.dv_head_stride + key * p.dv_token_stride +
                         (c - kDqk),
                     x, y);
}

// ================================================================ backward: dQ
// kBlockM rows x kBlockN keys per step; K/V in two stages. S and dP: kWarpsMS x (kWarps / kWarpsMS) warps;
// dQ += dS K: kWarpsMQ x (kWarps / kWarpsMQ) warps over (rows, d_qk). dS stays in registers when the two
// layouts give each warp whole rows of the same row range. kWgmma: the three GEMMs by wgmma (each warpgroup 64
// rows, warp w keeps rows 16 w..; all tiles in the swz_k64 layout; K is both the K-major B of S and the
// transposed B of dQ).
template <int kDqk_, int kDv_, int kBlockM_, int kBlockN_, int kWarps_, int kWarpsMS_, int kWarpsMQ_, bool kVInK_,
          int kMinBlocks_, bool kWgmma_ = false>
struct BwdQTraits {
  static constexpr int kDqk = kDqk_, kDv = kDv_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  static constexpr int kWarps = kWarps_, kThreads = 32 * kWarps, kMinBlocks = kMinBlocks_;
  static constexpr bool kVInK = kVInK_;
  static constexpr int kWarpsMS = kWarpsMS_, kWarpsNS = kWarps / kWarpsMS;
  static constexpr int kRowsS = kBlockM / kWarpsMS, kColsS = kBlockN / kWarpsNS;
  static constexpr int kMTS = kRowsS / 16, kNTS = kColsS / 8;
  static constexpr int kWarpsMQ = kWarpsMQ_, kWarpsNQ = kWarps / kWarpsMQ;
  static constexpr int kRowsQ = kBlockM / kWarpsMQ, kColsQ = kDqk / kWarpsNQ;
  static constexpr int kMTQ = kRowsQ / 16, kNTQ = kColsQ / 8;
  static constexpr bool kDsInRegs = kWarpsNS == 1 && kWarpsNQ == 1 && kWarpsMS == kWarpsMQ;
  static constexpr bool kWgmma = kWgmma_;
  static constexpr int kLdV = kVInK ? kDqk : kDv;
  static constexpr int kOffDo = kBlockM * kDqk * 2;
  static constexpr int kOffKv = kOffDo + kBlockM * kDv * 2;
  static constexpr int kStageBytes = kBlockN * kDqk * 2 + (kVInK ? 0 : kBlockN * kDv * 2);
  static constexpr int kOffDs = kOffKv + 2 * kStageBytes;
  static constexpr int kOffLse = kOffDs + (kDsInRegs ? 0 : kBlockM * kBlockN * 2);
  static constexpr int kSmemBytes = kOffLse + 2 * kBlockM * 4;
  static_assert(kWarps % kWarpsMS == 0 && kWarps % kWarpsMQ == 0, "warp layouts must tile the warps");
  static_assert(kRowsS % 16 == 0 && kColsS % 8 == 0 && kRowsQ % 16 == 0 && kColsQ % 8 == 0, "mma tile multiples");
  static_assert(kBlockN % 16 == 0, "k steps of 16");
  static_assert(!kDsInRegs || kMTS == kMTQ, "dS in registers needs the same rows in both GEMMs");
  static_assert(kOffDo % 128 == 0 && kOffKv % 128 == 0 && kStageBytes % 128 == 0 && kOffLse % 16 == 0, "alignment");
  static_assert(!kVInK || kDv <= kDqk, "V inside K needs d_v <= d_qk");
  static_assert(std::size_t(kSmemBytes) <= kSmemBudget, "dQ tiles exceed shared memory");
  static_assert(!kWgmma || (kDsInRegs && kMTS == 1 && kWarps % 4 == 0 && kBlockN == 64 && !kVInK &&
                            (kDqk == 128 || kDqk == 192) && kDqk % 64 == 0 && kDv % 64 == 0 && kOffDo % 1024 == 0 &&
                            kOffKv % 1024 == 0 && kStageBytes % 1024 == 0),
                "wgmma dQ: warpgroups of 64 rows, 64-key tiles, dS in registers, 1024-aligned tiles");
};

template <class Tr, bool kAligned>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks)
    flash_bwd_dq_kernel(const AttentionBwdParams p, const float* delta) {
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kDqk = Tr::kDqk, kDv = Tr::kDv, kThreads = Tr::kThreads;
  char* smem = dynamic_smem();
  bf16* s_q = reinterpret_cast<bf16*>(smem);
  bf16* s_do = reinterpret_cast<bf16*>(smem + Tr::kOffDo);
  bf16* s_ds = reinterpret_cast<bf16*>(smem + Tr::kOffDs);
  float* s_lse = reinterpret_cast<float*>(smem + Tr::kOffLse);
  float* s_dd = s_lse + kBM;
  auto stage = [&](int st) { return reinterpret_cast<bf16*>(smem + Tr::kOffKv + st * Tr::kStageBytes); };

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
  const int wms = warp / Tr::kWarpsNS, wns = warp % Tr::kWarpsNS;
  const int wmq = warp / Tr::kWarpsNQ, wnq = warp % Tr::kWarpsNQ;
  const RowTile<kBM, kBN> rt(p);
  const auto& [group, rows, row0, row_last, g, b, n_full, rm, n_tiles] = rt;

  const bf16* q = static_cast<const bf16*>(p.q) + b * p.q_batch_stride;
  const bf16* dout = static_cast<const bf16*>(p.dout) + b * p.dout_batch_stride;
  const bf16* k = static_cast<const bf16*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
  const bf16* v = static_cast<const bf16*>(p.v) + b * p.v_batch_stride + g * p.v_head_stride;
  constexpr bool kSlab = Tr::kWgmma;
  auto q_row = [&](int r) { return rt.row_ptr(q, p.q_head_stride, p.q_token_stride, r); };
  load_tile<kBM, kDqk, kThreads, kAligned, decltype(q_row), kSlab>(s_q, q_row);
  auto do_row = [&](int r) { return rt.row_ptr(dout, p.dout_head_stride, p.dout_token_stride, r); };
  load_tile<kBM, kDv, kThreads, kAligned, decltype(do_row), kSlab>(s_do, do_row);
  load_row_values<kBM, kThreads>(s_lse, static_cast<const float*>(p.lse), INFINITY, row0, rows, rm, g, b, p);
  load_row_values<kBM, kThreads>(s_dd, delta, 0.f, row0, rows, rm, g, b, p);
  auto load_kv = [&](int t, bf16* dst) {
    const i64 n0 = i64(t) * kBN;
    auto k_row = [&](int r) -> const bf16* { return n0 + r < p.kv_len ? k + (n0 + r) * p.k_token_stride : nullptr; };
    load_tile<kBN, kDqk, kThreads, kAligned, decltype(k_row), kSlab>(dst, k_row);
    if constexpr (!Tr::kVInK) {
      auto v_row = [&](int r) -> const bf16* { return n0 + r < p.kv_len ? v + (n0 + r) * p.v_token_stride : nullptr; };
      load_tile<kBN, kDv, kThreads, kAligned, decltype(v_row), kSlab>(dst + kBN * kDqk, v_row);
    }
  };
  if (n_tiles > 0) load_kv(0, stage(0));
  cp_async_commit();

  float acc_dq[Tr::kMTQ][Tr::kNTQ][4];
  zero(acc_dq);
  const float sl2 = float(p.scale) * kLog2e;
  const int wr0 = wms * Tr::kRowsS, wc0 = wns * Tr::kColsS;

  for (int t = 0; t < n_tiles; ++t) {
    const i64 n0 = i64(t) * kBN;
    const bf16* s_k = stage(t & 1);
    const bf16* s_v = Tr::kVInK ? s_k : s_k + kBN * kDqk;
    cp_async_wait<0>();
    if constexpr (Tr::kWgmma) fence_proxy_async();  // wgmma reads what cp.async and the stores wrote
    __syncthreads();
    if (t + 1 < n_tiles) load_kv(t + 1, stage((t + 1) & 1));
    cp_async_commit();

    float s[Tr::kMTS][Tr::kNTS][4], dp[Tr::kMTS][Tr::kNTS][4];
    zero(s);
    zero(dp);
    if constexpr (Tr::kWgmma) {  // S and dP in flight together; P computed while dP runs
      warpgroup_mma_nt_async<Tr::kMTS, kBN, kDqk, kBM>(s, s_q, 64 * (warp / 4), s_k);
      warpgroup_mma_nt_async<Tr::kMTS, kBN, kDv, kBM>(dp, s_do, 64 * (warp / 4), s_v);
      warpgroup_wait<1>(s);
    } else {
      warp_mma<Tr::kMTS, Tr::kNTS, kDqk / 16, false, false, kDqk, kDqk>(s, s_q, wr0, s_k, wc0, lane);
      warp_mma<Tr::kMTS, Tr::kNTS, kDv / 16, false, false, kDv, Tr::kLdV>(dp, s_do, wr0, s_v, wc0, lane);
    }
    // P = exp2(S sl2 - lse log2e), zero where the row does not see the key; then dS = P (dP - D).
    const bool masked = n0 + kBN > n_full;
    probs_from_lse(
        s, sl2, tig, [&](int mt, int h) { return s_lse[wr0 + mt * 16 + gid + 8 * h] * kLog2e; },
        [&](int mt, int h) {
          const int lr = wr0 + mt * 16 + gid + 8 * h;
          return masked ? visible_keys(rm.query(imin(row0 + lr, row_last)), p.q_offset, p.kv_len) - n0 - wc0 : i64(kBN);
        });
    if constexpr (Tr::kWgmma) warpgroup_wait<0>(dp);
#pragma unroll
    for (int mt = 0; mt < Tr::kMTS; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float d = s_dd[wr0 + mt * 16 + gid + 8 * h];
#pragma unroll
        for (int nt = 0; nt < Tr::kNTS; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) dp[mt][nt][2 * h + e] = s[mt][nt][2 * h + e] * (dp[mt][nt][2 * h + e] - d);
      }
    if constexpr (Tr::kDsInRegs) {
      u32 dsa[Tr::kMTS][kBN / 16][4];
      acc_to_a(dsa, dp);
      if constexpr (Tr::kWgmma)
        warpgroup_mma_rs_tb<Tr::kMTQ, kDqk, kBN / 16, kBN>(acc_dq, dsa, s_k);
      else
        warp_mma_ra<Tr::kMTQ, Tr::kNTQ, kBN / 16, true, kDqk>(acc_dq, dsa, s_k, 0, lane);
    } else {
#pragma unroll
      for (int mt = 0; mt < Tr::kMTS; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int nt = 0; nt < Tr::kNTS; ++nt)
            *reinterpret_cast<u32*>(s_ds + swz<kBN>(wr0 + mt * 16 + gid + 8 * h, wc0 + nt * 8 + 2 * tig)) =
                pack_bf16(dp[mt][nt][2 * h], dp[mt][nt][2 * h + 1]);
      __syncthreads();  // dS is in
      warp_mma<Tr::kMTQ, Tr::kNTQ, kBN / 16, false, true, kBN, kDqk>(acc_dq, s_ds, wmq * Tr::kRowsQ, s_k,
                                                                     wnq * Tr::kColsQ, lane);
    }
  }

  bf16* dq = static_cast<bf16*>(p.dq) + b * p.dq_batch_stride;
  const float scale = float(p.scale);
#pragma unroll
  for (int mt = 0; mt < Tr::kMTQ; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i64 row = row0 + wmq * Tr::kRowsQ + mt * 16 + gid + 8 * h;
      if (row >= rows) continue;
      bf16* out = dq + (g * group + rm.head(row)) * p.dq_head_stride + rm.query(row) * p.dq_token_stride +
                  wnq * Tr::kColsQ;
#pragma unroll
      for (int nt = 0; nt < Tr::kNTQ; ++nt)
        store2<kAligned>(out + nt * 8 + 2 * tig, scale * acc_dq[mt][nt][2 * h], scale * acc_dq[mt][nt][2 * h + 1]);
    }
}

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
