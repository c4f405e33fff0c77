// The launch sequence of the tensor-core attention kernels (flash_kernels.cuh), written once for the two
// places they run: a CUDA stream (flash_tc.cu) and the host emulation of tests/emu, which so checks the
// launches themselves (grids, scratch sizes, the order of the backward's kernels, the switches from runtime
// head dims, V inside K and alignment to template arguments) and not only the kernels.
//
// A launcher is what the sequence runs on:
//   template <class Kernel, class... Args>
//   void launch(Kernel kernel, const char* name, i64 blocks, int threads, std::size_t smem, Args... args);
//                                               a 1-D grid of `blocks` (> 0) blocks
//   void* scratch(LaunchScratch slot, std::size_t bytes)   at least `bytes` bytes, contents undefined
//   void zero(void* ptr, std::size_t bytes)                 zero-fills, in order with the launches
//   int multiprocessors()                                   the device's SM count
//   bool fused_dq()                                         192/128: dQ added up inside the dK/dV kernel;
//                                                           576/512 with V inside K and dv_in_dk: flash_bwd_vk_kernel
//   int row_splits()                                        576/512 dK/dV row splits: 0 chooses (dkdv_row_splits)
//   bool warp_specialized_forward()                         192/128: flash_fwd_ws_kernel, else flash_fwd_kernel
//   int forward_blocks()                                    flash_fwd_ws_kernel's persistent grid: 0 chooses
//                                                           (forward_grid_blocks: one block per SM, or fewer that
//                                                           whole head groups fill), n > 0 at most n (never more
//                                                           than its row tiles)
//   int forward_head_group()                                flash_fwd_ws_kernel's work order: the row tiles of n
//                                                           (kv head, batch) pairs at a time, 0 kForwardHeadGroup
//   bool warp_specialized_backward()                        192/128 with fused dQ, MHA, aligned views:
//                                                           flash_bwd_ws_kernel, else flash_bwd_dkdv_regs_kernel
//   int backward_blocks()                                   flash_bwd_ws_kernel's grid: persistent, 0 one block per
//                                                           SM, n > 0 at most n; a block per key block (the grid
//                                                           that is not persistent) where that is no fewer
//   int backward_head_group()                               flash_bwd_ws_kernel's work order: the key blocks of n
//                                                           (kv head, batch) pairs at a time, 0 chooses
//                                                           (backward_head_group: kBackwardHeadGroup or more)
//   bool rows_resident_vk()                                 576/512 with V inside K and dv_in_dk (fused dQ):
//                                                           flash_bwd_vkq_kernel, else flash_bwd_vk_kernel
//   bool ordered_dq()                                       flash_bwd_ws_kernel's dQ and flash_bwd_vkq_kernel's
//                                                           dK + [dV, 0] added in a fixed order (deterministic),
//                                                           else in any order
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>

#include "cuda/flash_kernels.cuh"
#include "laga/errors.hpp"

namespace laga::cuda::flash {

// The backward's scratch buffers.
enum class LaunchScratch {
  delta,          // D = rowsum(dO * O), fp32 [batch, q_heads, q_len]
  dq_accum,       // 192/128 with fused dQ: fp32 dQ tiles of kDqTileRows rows
  dq_count,       // their counters (how many key blocks have added theirs)
  split_partial,  // 576/512: the dK/dV partial sums of the row splits
  taken,          // 192/128 warp-specialised kernels: how many work items their persistent blocks have taken
};

inline bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }
inline bool strides8(i64 a, i64 b, i64 c) { return a % 8 == 0 && b % 8 == 0 && c % 8 == 0; }

// V is the first d_v columns of K (absorbed MLA): same pointer and strides.
inline bool v_in_k(const AttentionFwdParams& p) {
  return p.v == p.k && p.v_token_stride == p.k_token_stride && p.v_batch_stride == p.k_batch_stride &&
         p.v_head_stride == p.k_head_stride;
}

// 16-byte aligned views (cp.async) or not (2-byte loads).
inline bool fwd_aligned(const AttentionFwdParams& p) {
  return aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.o) &&
         strides8(p.q_token_stride, p.q_batch_stride, p.q_head_stride) &&
         strides8(p.k_token_stride, p.k_batch_stride, p.k_head_stride) &&
         strides8(p.v_token_stride, p.v_batch_stride, p.v_head_stride) &&
         strides8(p.o_token_stride, p.o_batch_stride, p.o_head_stride);
}

inline bool bwd_aligned(const AttentionBwdParams& p) {
  return fwd_aligned(p) && aligned16(p.dout) && aligned16(p.dq) && aligned16(p.dk) && aligned16(p.dv) &&
         strides8(p.dout_token_stride, p.dout_batch_stride, p.dout_head_stride) &&
         strides8(p.dq_token_stride, p.dq_batch_stride, p.dq_head_stride) &&
         strides8(p.dk_token_stride, p.dk_batch_stride, p.dk_head_stride) &&
         strides8(p.dv_token_stride, p.dv_batch_stride, p.dv_head_stride);
}

// Whether the tensor-core kernels take this problem (bf16, head dims in kHeadDims).
inline bool tc_supported(const AttentionFwdParams& p) { return p.dtype == DType::BF16 && has_head_dims(p.d_qk, p.d_v); }

// One block per (tile, kv head, batch entry), tile slowest (tile_work). The kernels map rows to (query, head)
// in 32 bits (RowMap).
inline i64 flash_grid(i64 tiles, const AttentionFwdParams& p) {
  const i64 rows = p.q_len * (p.q_heads / p.kv_heads);
  LAGA_REQUIRE(rows <= INT32_MAX, "attention: q_len ", p.q_len, " x ", p.q_heads / p.kv_heads,
               " query heads per kv head = ", rows, " rows; the kernels take at most 2^31 - 1");
  const i64 n = grid_blocks(tiles, p.kv_heads, p.batch);
  LAGA_REQUIRE(n <= INT32_MAX, "attention: ", n, " blocks exceed the grid limit (", tiles, " tiles x ", p.kv_heads,
               " kv heads x batch ", p.batch, ")");
  return n;
}

// Launches unless the grid is empty.
template <class L, class Kernel, class... Args>
void launch_nonempty(L& launcher, Kernel kernel, const char* name, i64 blocks, int threads, std::size_t smem, Args... args) {
  if (blocks > 0) launcher.launch(kernel, name, blocks, threads, smem, args...);
}

// 576/512 dK/dV: the rows of each key block split over about enough blocks to fill the GPU twice (causal work
// is heaviest for the first key blocks, which launch first), rounded down to a power of two; each split keeps at
// least 4 row tiles. Measured on the H200 (16 heads, one kv head, summed dK/dV kernel): at S = 8k 2 splits ran
// 240 TFLOP/s where 3 ran 199 and 4 219; at 16k 2 and 1 the same; at 32k 1 the best.
inline int dkdv_row_splits(i64 rows, i64 key_blocks, const AttentionFwdParams& p, int block_m, int multiprocessors) {
  const i64 per_split = key_blocks * p.kv_heads * p.batch;
  const i64 want = std::clamp<i64>(std::min<i64>((2 * i64(multiprocessors) + per_split - 1) / per_split,
                                                 rows / (4 * block_m)), 1, 16);
  int splits = 1;
  while (2 * splits <= want) splits *= 2;
  return splits;
}

// flash_bwd_vkq_kernel's splits: each key block's adds are a chain of the row tiles that see it, one after
// another, which holds the kernel back where a chain is long against a block's share of the work (short
// sequences: every row tile adds to the first key block). A split is its own chain and its own copy of the fp32
// key tiles: 2 x multiprocessors / (batch x kv heads x the mean key blocks a row tile walks) of them, rounded
// down to a power of two, at most 16 and at most the row tiles. Measured on the H200 (one kv head, causal):
// the best of 1, 2, 4, 8, 16 splits was 8 at S = 4k, 4 at 8k, 2 at 16k and 1 at 32k, with 16 or 128 heads.
inline int vkq_splits(const AttentionFwdParams& p, int block_m, int block_n, int multiprocessors) {
  constexpr double kChainShare = 2.0;
  const double keys_first = double(visible_keys(0, p.q_offset, p.kv_len));
  const double keys_last = double(visible_keys(p.q_len - 1, p.q_offset, p.kv_len));
  const double mean_blocks = std::max(1.0, (keys_first + keys_last) / (2.0 * block_n));
  const double want = kChainShare * multiprocessors / (double(p.batch * p.kv_heads) * mean_blocks);
  const i64 row_tiles = ceil_div(p.q_len * (p.q_heads / p.kv_heads), i64(block_m));
  int splits = 1;
  while (splits < 16 && 2 * splits <= want && 2 * splits <= row_tiles) splits *= 2;
  return splits;
}

// The warp-specialised kernels' work order: the heads a group the launcher asks for, else the kernel's default.
inline int head_group(int asked, i64 by_default) { return asked > 0 ? asked : int(by_default); }

// flash_bwd_ws_kernel's work order: the heads a group the launcher asks for, else kBackwardHeadGroup, doubled in the
// fixed order while a head's items are short. Its blocks take a group's key blocks block-major (key block j of every
// head of the group, then j + 1), so about resident / group key blocks of a head are at work together, and in the
// fixed order each adds its dQ to a row tile only after the key block before it has: started a step or so apart,
// they trail one another by about an add each, which a walk of row_tiles steps hides only while resident / group
// <= row_tiles (src/cuda/NOTES.md version 40). A power of two times kBackwardHeadGroup, so that the groups divide
// the heads (a last, smaller group would run its tail with the chain exposed). DeepSeek-V3, P = 8, 132 SMs: the
// all_gather rank's 128 heads 32 at a time at S = 4k, 16 at 8k, 8 from 16k; the a2a ranks' 16 heads (>= 64 tiles) 8.
inline int backward_head_group(int asked, bool ordered, i64 resident, i64 row_tiles) {
  if (asked > 0) return asked;
  i64 group = kBackwardHeadGroup;
  if (ordered && row_tiles >= 1)
    while (group * row_tiles < resident) group *= 2;
  return int(group);
}

// flash_fwd_ws_kernel's persistent grid: at most `asked` blocks where the launcher asks, else one per SM, or fewer
// where every row tile sees about as many keys as the others (the lightest at least 3/4 of the heaviest: a short
// query range far into the keys, as the all_gather rank's S / P queries over S keys). There the blocks take a
// group's row tiles at about the same time and walk its heads' K and V together, a few key tiles apart, while L2
// holds them; on one block per SM a wave holds a group and part of the next (132 blocks, 128 row tiles a group at
// DeepSeek-V3's all_gather rank of 32k), and that part's row tiles start a whole walk apart, a wave later, so
// L2 must hold its heads' K and V from first key to last. So the grid is the most blocks <= the SMs that whole
// groups fill (a multiple of a group's row tiles, or a divisor of them where a group has more row tiles than
// SMs), if that keeps at least 7/8 of the SMs (src/cuda/NOTES.md version 41).
inline i64 forward_grid_blocks(int asked, int multiprocessors, i64 items, i64 group_items, i64 lightest_keys,
                               i64 heaviest_keys) {
  const i64 sms = multiprocessors;
  if (asked > 0) return std::min<i64>(items, asked);
  i64 blocks = sms;
  if (group_items >= 1 && 4 * lightest_keys >= 3 * heaviest_keys) {
    i64 whole = 0;
    if (group_items <= sms) {
      whole = sms / group_items * group_items;
    } else {
      const i64 waves = ceil_div(group_items, sms);
      if (group_items % waves == 0) whole = group_items / waves;
    }
    if (8 * whole >= 7 * sms) blocks = whole;
  }
  return std::min<i64>(items, blocks);
}

// A persistent grid's ticket counter (ItemSlots), zeroed before its launch.
template <class L>
unsigned* zeroed_tickets(L& launcher) {
  auto* taken = static_cast<unsigned*>(launcher.scratch(LaunchScratch::taken, sizeof(unsigned)));
  launcher.zero(taken, sizeof(unsigned));
  return taken;
}

template <class K, bool kAligned, class L>
void forward_impl(L& launcher, const AttentionFwdParams& p) {
  const i64 rows = p.q_len * (p.q_heads / p.kv_heads);
  if constexpr (K::c.fwd_o_split) {
    using Tr = typename K::FwdSplit;
    launch_nonempty(launcher, flash_fwd_split_kernel<Tr, kAligned>, "flash_fwd_split_kernel",
        flash_grid(ceil_div(rows, Tr::kBlockM), p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p);
  } else {
    if constexpr (K::c.fwd_ws) {
      if (launcher.warp_specialized_forward()) {
        using Tr = typename K::FwdWs;
        const i64 items = flash_grid(ceil_div(rows, Tr::kBlockM), p);
        if (items == 0) return;
        const int heads = head_group(launcher.forward_head_group(), kForwardHeadGroup);
        const i64 row_tiles = ceil_div(rows, Tr::kBlockM), group = p.q_heads / p.kv_heads;
        const i64 blocks = forward_grid_blocks(launcher.forward_blocks(), launcher.multiprocessors(), items,
            row_tiles * std::min<i64>(heads, p.kv_heads * p.batch),
            visible_keys((std::min<i64>(Tr::kBlockM, rows) - 1) / group, p.q_offset, p.kv_len),
            visible_keys(p.q_len - 1, p.q_offset, p.kv_len));
        launch_nonempty(launcher, flash_fwd_ws_kernel<Tr, kAligned>, "flash_fwd_ws_kernel", blocks, Tr::kThreads,
            std::size_t(Tr::kSmemBytes), p, int(items), zeroed_tickets(launcher), heads);
        return;
      }
    }
    using Tr = typename K::Fwd;
    launch_nonempty(launcher, flash_fwd_kernel<Tr, kAligned>, "flash_fwd_kernel", flash_grid(ceil_div(rows, Tr::kBlockM), p),
        Tr::kThreads, std::size_t(Tr::kSmemBytes), p);
  }
}

// The fused dQ's fp32 row tiles (kDqTileRows rows of d_qk) and their counters, zeroed: the dK/dV kernel adds
// into them in key-block order, flash_bwd_dq_convert_kernel writes dq from them.
struct DqTiles {
  float* accum;
  unsigned* count;
  i64 tiles;
};
template <int kDqk, class L>
DqTiles dq_tiles(L& launcher, const AttentionFwdParams& p, i64 rows, int copies = 1) {
  const i64 tiles = p.batch * p.kv_heads * copies * dq_row_tiles(rows);
  LAGA_REQUIRE(tiles <= INT32_MAX, "attention: ", tiles, " dQ tiles exceed the grid limit");
  constexpr std::size_t kTileFloats = std::size_t(kDqTileRows) * kDqk;
  DqTiles t{static_cast<float*>(launcher.scratch(LaunchScratch::dq_accum, sizeof(float) * kTileFloats * std::size_t(tiles))),
            static_cast<unsigned*>(launcher.scratch(LaunchScratch::dq_count, sizeof(unsigned) * std::size_t(tiles))), tiles};
  if (tiles > 0) launcher.zero(t.count, sizeof(unsigned) * std::size_t(tiles));
  return t;
}
// kLayout: which kernel's tiles (see flash_bwd_dq_convert_kernel).
template <int kDqk, bool kAligned, DqLayout kLayout, class L>
void dq_from_tiles(L& launcher, const AttentionBwdParams& p, const DqTiles& t) {
  launch_nonempty(launcher, flash_bwd_dq_convert_kernel<kDqk, kAligned, kLayout>, "flash_bwd_dq_convert_kernel", t.tiles,
                  256, sizeof(float) * std::size_t(kDqTileRows) * kDqk, p, static_cast<const float*>(t.accum),
                  static_cast<const unsigned*>(t.count), 1);
}

// Row splits of the 576/512 dK/dV kernels: how many, and the fp32 partials (width columns a key) they write
// when more than one; reduce_splits sums them in split order into dk (and dv).
struct RowSplits {
  int splits;
  float* partial;
};
template <class L>
RowSplits row_splits(L& launcher, const AttentionFwdParams& p, i64 rows, i64 key_blocks, int block_m, int width) {
  const int fixed = launcher.row_splits();
  RowSplits r{fixed > 0 ? fixed : dkdv_row_splits(rows, key_blocks, p, block_m, launcher.multiprocessors()), nullptr};
  if (r.splits > 1)
    r.partial = static_cast<float*>(launcher.scratch(
        LaunchScratch::split_partial, sizeof(float) * std::size_t(r.splits * p.batch * p.kv_heads * p.kv_len * width)));
  return r;
}
template <int kDqk, int kDv, bool kAligned, class L>
void reduce_splits(L& launcher, const AttentionBwdParams& p, const RowSplits& r) {
  if (r.splits < 2) return;
  const i64 pairs = p.batch * p.kv_heads * p.kv_len * (kDqk + kDv) / 2;
  launch_nonempty(launcher, flash_bwd_dkdv_reduce_kernel<kDqk, kDv, kAligned>, "flash_bwd_dkdv_reduce_kernel",
                  ceil_div(pairs, 256), 256, 0, p, r.splits, static_cast<const float*>(r.partial));
}

template <class K, bool kAligned, class L>
void backward_impl(L& launcher, const AttentionBwdParams& p) {
  constexpr TileConfig c = K::c;
  const i64 group = p.q_heads / p.kv_heads, rows = p.q_len * group;
  const i64 bh_rows = p.batch * p.q_heads * p.q_len;
  float* delta = static_cast<float*>(launcher.scratch(LaunchScratch::delta, sizeof(float) * std::size_t(bh_rows)));
  launch_nonempty(launcher, flash_bwd_delta_kernel<kAligned>, "flash_bwd_delta_kernel", ceil_div(bh_rows, 8), 256, 0, p, delta);
  const float* cdelta = delta;
  if constexpr (c.dkv_sum) {
    if (p.dv_in_dk && launcher.rows_resident_vk()) {
      // dQ in registers, a block per row tile walking the key blocks; dK + [dV, 0] added up into fp32 key tiles
      // (dq_tiles' tiles, a key for a row), then copied into dk.
      using Tr = typename K::Vkq;
      const int fixed = launcher.row_splits();
      const int splits = fixed > 0 ? fixed : vkq_splits(p, Tr::kBlockM, Tr::kBlockN, launcher.multiprocessors());
      const DqTiles dkv = dq_tiles<Tr::kDqk>(launcher, p, p.kv_len, splits);
      launch_nonempty(launcher, flash_bwd_vkq_kernel<Tr, kAligned>, "flash_bwd_vkq_kernel",
          flash_grid(ceil_div(rows, Tr::kBlockM), p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cdelta, dkv.accum,
          dkv.count, splits, launcher.ordered_dq());
      launch_nonempty(launcher, flash_bwd_dq_convert_kernel<Tr::kDqk, kAligned, DqLayout::rows, true>,
          "flash_bwd_dq_convert_kernel (dK + [dV, 0])", dkv.tiles / splits, 256,
          sizeof(float) * std::size_t(kDqTileRows) * Tr::kDqk, p, static_cast<const float*>(dkv.accum),
          static_cast<const unsigned*>(dkv.count), splits);
      return;
    }
    if (p.dv_in_dk) {
      // dK + [dV, 0] in one accumulator, dQ added up into fp32 row tiles, then copied into dq
      // (flash_bwd_vk_kernel folds the scale into dS). Each key block's row tiles split over blocks as the
      // row-split dK/dV kernel's (the first key blocks carry the most causal work).
      using Tr = typename K::Vk;
      const DqTiles dq = dq_tiles<Tr::kDqk>(launcher, p, rows);
      const i64 key_blocks = ceil_div(p.kv_len, Tr::kBlockN);
      const RowSplits r = row_splits(launcher, p, rows, key_blocks, Tr::kBlockM, Tr::kDqk);
      launch_nonempty(launcher, flash_bwd_vk_kernel<Tr, kAligned>, "flash_bwd_vk_kernel",
          flash_grid(key_blocks * r.splits, p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cdelta, dq.accum, dq.count,
          r.splits, r.partial);
      reduce_splits<Tr::kDqk, 0, kAligned>(launcher, p, r);
      dq_from_tiles<Tr::kDqk, kAligned, DqLayout::rows>(launcher, p, dq);
      return;
    }
  }
  LAGA_REQUIRE(!p.dv_in_dk, "attention: dv_in_dk reached a tensor-core backward without the summed dK/dV kernel");
  if constexpr (c.dq_fused) {
    if constexpr (c.dkdv_ws && kAligned) {
      if (launcher.fused_dq() && launcher.warp_specialized_backward() && group == 1) {
        using Tr = typename K::DkdvWs;
        const DqTiles dq = dq_tiles<Tr::kDqk>(launcher, p, rows);
        const i64 items = flash_grid(ceil_div(p.kv_len, Tr::kBlockN), p);  // key blocks
        const int want = launcher.backward_blocks();
        const i64 blocks = std::min<i64>(items, want > 0 ? want : launcher.multiprocessors());
        // In the fixed order, where every query sees keys and none past them, the key block that adds to a row
        // tile last writes it into dq itself; otherwise the conversion kernel does, after the kernel.
        const bool ordered = launcher.ordered_dq();
        const int heads = backward_head_group(launcher.backward_head_group(), ordered,
            std::min<i64>(blocks, launcher.multiprocessors()), ceil_div(rows, i64(Tr::kBlockM)));
        const bool convert = ordered && p.q_offset >= 0 && p.q_offset + p.q_len <= p.kv_len;
        if (blocks < items) {  // a persistent grid
          launch_nonempty(launcher, flash_bwd_ws_kernel<Tr, true>, "flash_bwd_ws_kernel", blocks, Tr::kThreads,
              std::size_t(Tr::kSmemBytes), p, cdelta, dq.accum, dq.count, ordered, int(items),
              zeroed_tickets(launcher), heads, convert);
        } else {  // a block per key block
          launch_nonempty(launcher, flash_bwd_ws_kernel<Tr, false>, "flash_bwd_ws_kernel", items, Tr::kThreads,
              std::size_t(Tr::kSmemBytes), p, cdelta, dq.accum, dq.count, ordered, int(items),
              static_cast<unsigned*>(nullptr), heads, convert);
        }
        if (!convert) dq_from_tiles<Tr::kDqk, kAligned, DqLayout::ws>(launcher, p, dq);
        return;
      }
    }
    if (launcher.fused_dq()) {
      // dQ added up by the dK/dV kernel into fp32 tiles, then scaled into dq.
      using Tr = typename K::DkdvRegsFusedDq;
      const DqTiles dq = dq_tiles<Tr::kDqk>(launcher, p, rows);
      launch_nonempty(launcher, flash_bwd_dkdv_regs_kernel<Tr, kAligned>, "flash_bwd_dkdv_regs_kernel (fused dQ)",
          flash_grid(ceil_div(p.kv_len, Tr::kBlockN), p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cdelta,
          dq.accum, dq.count);
      dq_from_tiles<Tr::kDqk, kAligned, DqLayout::fused>(launcher, p, dq);
      return;
    }
  }
  if constexpr (c.dkdv_regs) {
    using Tr = typename K::DkdvRegs;
    launch_nonempty(launcher, flash_bwd_dkdv_regs_kernel<Tr, kAligned>, "flash_bwd_dkdv_regs_kernel",
        flash_grid(ceil_div(p.kv_len, Tr::kBlockN), p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cdelta,
        static_cast<float*>(nullptr), static_cast<unsigned*>(nullptr));
  } else {
    using Tr = typename K::DkdvSmem;
    const i64 key_blocks = ceil_div(p.kv_len, Tr::kBlockN);
    const RowSplits r = row_splits(launcher, p, rows, key_blocks, Tr::kBlockM, Tr::kDqk + Tr::kDv);
    launch_nonempty(launcher, flash_bwd_dkdv_smem_kernel<Tr, kAligned>, "flash_bwd_dkdv_smem_kernel",
        flash_grid(key_blocks * r.splits, p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cdelta, r.splits, r.partial);
    reduce_splits<Tr::kDqk, Tr::kDv, kAligned>(launcher, p, r);
  }
  using Tq = typename K::Dq;
  launch_nonempty(launcher, flash_bwd_dq_kernel<Tq, kAligned>, "flash_bwd_dq_kernel", flash_grid(ceil_div(rows, Tq::kBlockM), p),
      Tq::kThreads, std::size_t(Tq::kSmemBytes), p, cdelta);
}

// Runtime (d_qk, d_v) (a pair of kHeadDims), V inside K and alignment to template arguments;
// f(Kernels<...>{}, bool_constant).
template <std::size_t kPair = 0, typename F>
void dispatch(const AttentionFwdParams& p, bool aligned, F&& f) {
  if constexpr (kPair < std::size(kHeadDims)) {
    constexpr HeadDims d = kHeadDims[kPair];
    if (p.d_qk != d.qk || p.d_v != d.v) return dispatch<kPair + 1>(p, aligned, f);
    auto with_alignment = [&](auto kernels) {
      if (aligned)
        f(kernels, std::true_type{});
      else
        f(kernels, std::false_type{});
    };
    if constexpr (d.v_in_k_variant) {
      if (v_in_k(p)) return with_alignment(Kernels<d.qk, d.v, true>{});
    }
    with_alignment(Kernels<d.qk, d.v, false>{});
  } else {
    LAGA_REQUIRE(false, "no tensor-core attention kernel for d_qk ", p.d_qk, " and d_v ", p.d_v);
  }
}

// The forward and the backward of one problem, through `launcher`. Called after validation, only when
// tc_supported(p).
template <class L>
void forward(L& launcher, const AttentionFwdParams& p) {
  dispatch(p, fwd_aligned(p), [&](auto kernels, auto aligned) {
    forward_impl<decltype(kernels), decltype(aligned)::value>(launcher, p);
  });
}

// Whether backward() writes dK + [dV, 0] itself when p.dv_in_dk (576/512 with V inside K, fused_dq on);
// otherwise the caller runs it with a dv of its own and adds that into dk.
template <class L>
bool takes_dv_in_dk(L& launcher, const AttentionFwdParams& p) {
  return tc_supported(p) && v_in_k(p) && tile_config(int(p.d_qk), int(p.d_v), true).dkv_sum && launcher.fused_dq();
}

template <class L>
void backward(L& launcher, const AttentionBwdParams& p) {
  dispatch(p, bwd_aligned(p), [&](auto kernels, auto aligned) {
    backward_impl<decltype(kernels), decltype(aligned)::value>(launcher, p);
  });
}

}  // namespace laga::cuda::flash
