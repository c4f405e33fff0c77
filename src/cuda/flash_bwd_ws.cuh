// The warp-specialised 192/128 attention backward (flash_kernels.cuh).
#pragma once

#include "cuda/flash_bwd.cuh"

namespace laga::cuda::flash {

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
  // loading warps carry the walk's state in those 24 too (ptxas spills 512 / 832 B, against 204 / 368 on a block
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
                        bool ordered, const int items, unsigned* taken, const int head_group, const bool convert_dq) {
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

  // With convert_dq (dQ in the fixed order, and no query seeing past the keys: the launcher's rule), the row tiles
  // this key block adds to last are its walk's lowest ones whose last row's causal prefix ends in its keys; their
  // counters count both halves of its adds once every add to them is done. Each computing warpgroup then scales
  // its half (rows 32 wg..) into dq as flash_bwd_dq_convert_kernel would (scale x sum, one rounding): every thread
  // the 12 float4 that its dQ^T accumulators held (dq_accum_offset_ws), each column paired with its neighbour in
  // the lane 4 apart (gid ^ 1), so that a store writes two bf16 of one row. Called after compute_key_block with the
  // key block's KeyTile derived again from an opaque index, so that none of it is kept in registers through the
  // computing loop (kept, ptxas spilled more there).
  auto convert_last_tiles = [&](const Keys& kt) {
    const int wtid = tid & 127, w4 = warp & 3;
    const bool even = (gid & 1) == 0;
    const float scale = float(p.scale);
    bf16* dq = static_cast<bf16*>(p.dq) + kt.b * p.dq_batch_stride + kt.g * p.dq_head_stride;  // MHA: head g
    for (int t = kt.n_tiles - 1; t >= 0; --t) {  // the lowest tiles first
      const i64 row0 = kt.step_row0(t), tile = row0 / kBM, last_row = imin(row0 + kBM, kt.rows) - 1;
      if ((visible_keys(last_row, p.q_offset, p.kv_len) - 1) / kBN != kt.block) break;
      // Unbounded: its writers are this block's dQ warps, whose own waits are bounded.
      wait_counter<false>(dq_count + kt.tile_base + tile, 2u * unsigned(kt.block + 1), true);
      const float* src = dq_accum + (kt.tile_base + tile) * (kBM * kDqk);
      float v[3][4][4];  // every load in flight before the first store
#pragma unroll
      for (int s = 0; s < 3; ++s)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) ld_global_cg_v4(src + (((s * 2 + wg) * 4 + nt) * 128 + wtid) * 4, v[s][nt]);
      // v[s][nt]: rows r0, r0 + 1 (r0 = 32 wg + 8 nt + 2 tig) x columns c, c + 8 (c = 64 s + 16 w4 + gid) as (r0, c),
      // (r0 + 1, c), (r0, c + 8), (r0 + 1, c + 8). An even gid writes row r0 at columns c, c + 1 and c + 8, c + 9
      // (its neighbour's r0 values); an odd one row r0 + 1 at c - 1, c and c + 7, c + 8.
#pragma unroll
      for (int s = 0; s < 3; ++s)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const float* x = v[s][nt];
          const float got0 = shfl_xor(even ? x[1] : x[0], 4), got1 = shfl_xor(even ? x[3] : x[2], 4);
          const i64 row = row0 + 32 * wg + 8 * nt + 2 * tig + (even ? 0 : 1);
          const int c = 64 * s + 16 * w4 + gid - (even ? 0 : 1);
          if (row < kt.rows) {
            bf16* out = dq + row * p.dq_token_stride + c;
            store2<true>(out, scale * (even ? x[0] : got0), scale * (even ? got0 : x[1]));
            store2<true>(out + 8, scale * (even ? x[2] : got1), scale * (even ? got1 : x[3]));
          }
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
    if (convert_dq) convert_last_tiles(Keys(p, opaque(i64(blockIdx.x)), head_group));
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
      if (convert_dq) convert_last_tiles(Keys(p, opaque(i64(x)), head_group));
    }
  }
}

}  // namespace laga::cuda::flash
