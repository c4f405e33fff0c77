// The attention backward's other kernels (flash_kernels.cuh): dK and dV through shared memory with the rows
// split over blocks and their reduction, and the separate dQ kernel.
#pragma once

#include "cuda/flash_bwd.cuh"

namespace laga::cuda::flash {

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

}  // namespace laga::cuda::flash
