// The tensor-core attention forwards (flash_kernels.cuh): mma.sync / wgmma with one warpgroup, O split over two
// warpgroups (576/512), and the warp-specialised 192/128 forward on a persistent grid.
#pragma once

#include "cuda/flash_common.cuh"

namespace laga::cuda::flash {

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

}  // namespace laga::cuda::flash
