// The fused attention kernels' generic path: flash-style tiles through shared memory, plain fp32 FMA (bf16 and
// f32 inputs are widened on load), online softmax forward, FlashAttention-2 backward that recomputes P from
// the saved log-sum-exp. bf16 at the head dims of the tile table (192/128, 576/512) goes to the tensor-core
// kernels instead (flash_tc.cu); f32 stays here (its 1e-5 tolerance rules out bf16 operands). Every reduction
// has a fixed order (no atomics), so results are bitwise reproducible.
//
// Shared memory holds fp32 tiles whose rows are padded to an odd number of floats, so that threads reading
// one column of consecutive rows hit distinct banks. The static_asserts below check the shared-memory
// budget of each tile configuration at the largest head dims it accepts.
#include "cuda/cuda_attention.cuh"

#include <cmath>

#include "core/causal.hpp"
#include "core/softmax.hpp"
#include "cuda/cuda_ops.cuh"
#include "cuda/flash_tc.cuh"

namespace laga::cuda {
namespace {

constexpr int kThreads = 128;  // every fused kernel: 4 warps
constexpr int kWarps = kThreads / 32;
constexpr std::size_t kSmemBudget = 227 * 1024;  // Hopper's opt-in shared memory per block
constexpr float kNegInf = -INFINITY;

// Row stride (in floats) of a shared tile with `d` columns: odd, for conflict-free column reads.
__host__ __device__ constexpr int padded(int d) { return d % 2 == 0 ? d + 1 : d; }

// Forward: 32 x 32 score tiles (one warp-wide softmax per row) for every head dim up to kFlashMaxHeadDim.
constexpr int kFwdBlockM = 32;
constexpr int kFwdBlockN = 32;

// Backward tiles by the largest head dim a launch may see: the dK/dV kernel holds K, V, dK, dV, Q and dO
// tiles, the dQ kernel Q, dO, dQ, K and V.
template <int kMaxHeadDim_>
struct FlashBwdTiles {
  static constexpr int kMaxHeadDim = kMaxHeadDim_;
  static constexpr int kBlockM = kMaxHeadDim <= 256 ? 32 : 16;  // queries
  static constexpr int kBlockN = kMaxHeadDim <= 256 ? 32 : 16;  // keys
};
using SmallTiles = FlashBwdTiles<256>;
using LargeTiles = FlashBwdTiles<kFlashMaxHeadDim>;

// Shared-memory floats of each kernel for head dims (dqk, dv); the host sizes launches with the same
// functions the static_asserts check.
__host__ __device__ constexpr std::size_t fwd_smem_floats(int dqk, int dv) {
  const int dkv = dqk > dv ? dqk : dv;
  return std::size_t(kFwdBlockM) * padded(dqk)             // Q
         + std::size_t(kFwdBlockN) * padded(dkv)           // K, then V
         + std::size_t(kFwdBlockM) * (kFwdBlockN + 1)      // S / P
         + std::size_t(kFwdBlockM) * padded(dv)            // O accumulator
         + 3 * std::size_t(kFwdBlockM);                    // row max, row sum, correction
}
template <typename Tiles>
__host__ __device__ constexpr std::size_t bwd_dkdv_smem_floats(int dqk, int dv) {
  return std::size_t(Tiles::kBlockN) * (2 * padded(dqk) + 2 * padded(dv))    // K, dK, V, dV
         + std::size_t(Tiles::kBlockM) * (padded(dqk) + padded(dv))        // Q, dO
         + 2 * std::size_t(Tiles::kBlockM) * (Tiles::kBlockN + 1)         // P, dS
         + 2 * std::size_t(Tiles::kBlockM);                                  // lse, D
}
template <typename Tiles>
__host__ __device__ constexpr std::size_t bwd_dq_smem_floats(int dqk, int dv) {
  return std::size_t(Tiles::kBlockM) * (2 * padded(dqk) + padded(dv))       // Q, dQ, dO
         + std::size_t(Tiles::kBlockN) * (padded(dqk) + padded(dv))          // K, V
         + std::size_t(Tiles::kBlockM) * (Tiles::kBlockN + 1)             // dS
         + 2 * std::size_t(Tiles::kBlockM);                                  // lse, D
}

static_assert(kFwdBlockN == 32, "the forward softmax gives one lane per key of the tile");
static_assert(fwd_smem_floats(kFlashMaxHeadDim, kFlashMaxHeadDim) * 4 <= kSmemBudget,
              "forward tiles exceed shared memory at the largest head dims");
static_assert(bwd_dkdv_smem_floats<LargeTiles>(kFlashMaxHeadDim, kFlashMaxHeadDim) * 4 <= kSmemBudget,
              "dK/dV tiles exceed shared memory at the largest head dims");
static_assert(bwd_dq_smem_floats<LargeTiles>(kFlashMaxHeadDim, kFlashMaxHeadDim) * 4 <= kSmemBudget,
              "dQ tiles exceed shared memory at the largest head dims");
static_assert(bwd_dkdv_smem_floats<SmallTiles>(256, 256) * 4 <= kSmemBudget, "dK/dV tiles exceed shared memory");
static_assert(bwd_dq_smem_floats<SmallTiles>(256, 256) * 4 <= kSmemBudget, "dQ tiles exceed shared memory");

// rows x cols of a global [rows, cols] view (row stride ld) into a shared tile (row stride lds) as fp32;
// rows >= valid_rows are zero.
template <typename T>
__device__ __forceinline__ void load_tile(float* dst, int lds, const T* src, i64 ld, int rows, int valid_rows, int cols) {
  for (int e = threadIdx.x; e < rows * cols; e += kThreads) {
    const int r = e / cols, c = e - r * cols;
    dst[r * lds + c] = r < valid_rows ? to_float(src[r * ld + c]) : 0.f;
  }
}

__device__ __forceinline__ float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
#pragma unroll 4
  for (int c = 0; c < n; ++c) acc = fmaf(a[c], b[c], acc);
  return acc;
}

// ================================================================ forward
// Grid (query tiles, q_heads, batch). Block: kFwdBlockM queries of one head against all visible keys.
template <typename T>
__global__ void __launch_bounds__(kThreads) flash_fwd_kernel(AttentionFwdParams p) {
  constexpr int kBM = kFwdBlockM, kBN = kFwdBlockN, kLdS = kBN + 1;
  extern __shared__ float smem[];
  const int dqk = int(p.d_qk), dv = int(p.d_v);
  const int ldq = padded(dqk), ldkv = padded(dqk > dv ? dqk : dv), ldo = padded(dv);
  float* s_q = smem;
  float* s_kv = s_q + kBM * ldq;
  float* s_s = s_kv + kBN * ldkv;
  float* s_o = s_s + kBM * kLdS;
  float* s_max = s_o + kBM * ldo;
  float* s_sum = s_max + kBM;
  float* s_corr = s_sum + kBM;

  const i64 m0 = i64(blockIdx.x) * kBM, h = blockIdx.y, b = blockIdx.z;
  const i64 g = h / (p.q_heads / p.kv_heads);
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + m0 * p.q_token_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + g * p.v_head_stride;
  T* o = static_cast<T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + m0 * p.o_token_stride;
  float* lse = static_cast<float*>(p.lse) + (b * p.q_heads + h) * p.q_len + m0;
  const int bm = int(p.q_len - m0 < kBM ? p.q_len - m0 : kBM);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  load_tile(s_q, ldq, q, p.q_token_stride, kBM, bm, dqk);
  for (int e = tid; e < kBM * dv; e += kThreads) s_o[(e / dv) * ldo + e % dv] = 0.f;
  if (tid < kBM) {
    s_max[tid] = kNegInf;
    s_sum[tid] = 0.f;
  }
  // The tile's last query sees the most keys; key tiles past that are fully masked.
  const i64 n_end = visible_keys(m0 + bm - 1, p.q_offset, p.kv_len);
  __syncthreads();

  for (i64 n0 = 0; n0 < n_end; n0 += kBN) {
    const int bn = int(p.kv_len - n0 < kBN ? p.kv_len - n0 : kBN);
    load_tile(s_kv, ldkv, k + n0 * p.k_token_stride, p.k_token_stride, kBN, bn, dqk);
    __syncthreads();
    // S = scale Q K^T, masked to -inf
    for (int e = tid; e < kBM * kBN; e += kThreads) {
      const int i = e / kBN, j = e % kBN;
      const i64 vis = i < bm ? visible_keys(m0 + i, p.q_offset, p.kv_len) : 0;
      const float s = dot(s_q + i * ldq, s_kv + j * ldkv, dqk) * float(p.scale);
      s_s[i * kLdS + j] = n0 + j < vis ? s : kNegInf;
    }
    __syncthreads();
    load_tile(s_kv, ldkv, v + n0 * p.v_token_stride, p.v_token_stride, kBN, bn, dv);
    // Online softmax: a warp per row, a lane per key.
    for (int r = warp; r < kBM; r += kWarps) {
      const float s = s_s[r * kLdS + lane];
      const float m_old = s_max[r];
      const float m_new = fmaxf(m_old, warp_max(s));
      // Nothing visible yet: the state stays empty. Otherwise exp(-inf) = 0 drops masked keys and, the
      // first time a row sees a key, the empty previous state.
      const bool empty = m_new == kNegInf;
      const float pv = empty ? 0.f : expf(s - m_new);
      const float corr = empty ? 1.f : expf(m_old - m_new);
      const float sum = warp_sum(pv);
      s_s[r * kLdS + lane] = pv;
      __syncwarp();  // every lane has read s_max[r] before lane 0 updates the row's state
      if (lane == 0) {
        s_sum[r] = s_sum[r] * corr + sum;
        s_max[r] = m_new;
        s_corr[r] = corr;
      }
    }
    __syncthreads();
    // O = corr O + P V
    for (int e = tid; e < kBM * dv; e += kThreads) {
      const int i = e / dv, c = e % dv;
      float acc = s_o[i * ldo + c] * s_corr[i];
      const float* pr = s_s + i * kLdS;
#pragma unroll 4
      for (int j = 0; j < kBN; ++j) acc = fmaf(pr[j], s_kv[j * ldkv + c], acc);
      s_o[i * ldo + c] = acc;
    }
    __syncthreads();
  }

  for (int e = tid; e < bm * dv; e += kThreads) {
    const int i = e / dv, c = e % dv;
    o[i * p.o_token_stride + c] = from_float<T>(s_o[i * ldo + c] * softmax_inv(s_sum[i]));
  }
  if (tid < bm) lse[tid] = softmax_lse(s_max[tid], s_sum[tid]);
}

// ================================================================ backward
// D[b, h, i] = sum_c dO[i, c] * O[i, c] (fp32): a warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads) flash_bwd_delta_kernel(AttentionBwdParams p, float* delta) {
  const i64 row = i64(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= p.batch * p.q_heads * p.q_len) return;
  const i64 i = row % p.q_len, bh = row / p.q_len, h = bh % p.q_heads, b = bh / p.q_heads;
  const T* o = static_cast<const T*>(p.o) + b * p.o_batch_stride + h * p.o_head_stride + i * p.o_token_stride;
  const T* d = static_cast<const T*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride + i * p.dout_token_stride;
  float acc = 0.f;
  for (i64 c = lane; c < p.d_v; c += 32) acc = fmaf(to_float(d[c]), to_float(o[c]), acc);
  acc = warp_sum(acc);
  if (lane == 0) delta[row] = acc;
}

// P and dS of one (query tile, key tile) pair into shared memory:
//   P = exp(scale q.k - lse) on visible pairs (0 elsewhere), dS = P (dO.v - D).
// s_p may be null (the dQ kernel needs only dS).
template <int kBM, int kBN>
__device__ __forceinline__ void tile_p_ds(const float* s_q, int ldq, const float* s_do, int ldv, const float* s_k,
                                          const float* s_v, const float* s_lse, const float* s_d, int dqk, int dv,
                                          i64 m0, int bm, i64 n0, int bn, const AttentionBwdParams& p, float* s_p,
                                          float* s_ds) {
  constexpr int kLdS = kBN + 1;
  for (int e = threadIdx.x; e < kBM * kBN; e += kThreads) {
    const int i = e / kBN, j = e % kBN;
    const i64 vis = i < bm ? visible_keys(m0 + i, p.q_offset, p.kv_len) : 0;
    float pv = 0.f, ds = 0.f;
    if (j < bn && n0 + j < vis) {
      pv = expf(dot(s_q + i * ldq, s_k + j * ldq, dqk) * float(p.scale) - s_lse[i]);
      ds = pv * (dot(s_do + i * ldv, s_v + j * ldv, dv) - s_d[i]);
    }
    if (s_p) s_p[i * kLdS + j] = pv;
    s_ds[i * kLdS + j] = ds;
  }
}

// Grid (key tiles, kv_heads, batch). Block: a key tile of one kv head; loops over the query heads sharing it
// and over the query tiles that see it, accumulating dK and dV in shared memory (fp32, fixed order).
template <typename T, typename Tiles>
__global__ void __launch_bounds__(kThreads) flash_bwd_dkdv_kernel(AttentionBwdParams p, const float* delta) {
  constexpr int kBM = Tiles::kBlockM, kBN = Tiles::kBlockN, kLdS = kBN + 1;
  extern __shared__ float smem[];
  const int dqk = int(p.d_qk), dv = int(p.d_v);
  const int ldk = padded(dqk), ldv = padded(dv);
  float* s_k = smem;
  float* s_dk = s_k + kBN * ldk;
  float* s_v = s_dk + kBN * ldk;
  float* s_dv = s_v + kBN * ldv;
  float* s_q = s_dv + kBN * ldv;
  float* s_do = s_q + kBM * ldk;
  float* s_p = s_do + kBM * ldv;
  float* s_ds = s_p + kBM * kLdS;
  float* s_lse = s_ds + kBM * kLdS;
  float* s_d = s_lse + kBM;

  const i64 n0 = i64(blockIdx.x) * kBN, g = blockIdx.y, b = blockIdx.z;
  const i64 group = p.q_heads / p.kv_heads;
  const int bn = int(p.kv_len - n0 < kBN ? p.kv_len - n0 : kBN);
  const int tid = threadIdx.x;
  load_tile(s_k, ldk, static_cast<const T*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride + n0 * p.k_token_stride,
            p.k_token_stride, kBN, bn, dqk);
  load_tile(s_v, ldv, static_cast<const T*>(p.v) + b * p.v_batch_stride + g * p.v_head_stride + n0 * p.v_token_stride,
            p.v_token_stride, kBN, bn, dv);
  for (int e = tid; e < kBN * dqk; e += kThreads) s_dk[(e / dqk) * ldk + e % dqk] = 0.f;
  for (int e = tid; e < kBN * dv; e += kThreads) s_dv[(e / dv) * ldv + e % dv] = 0.f;

  // The first query that sees key n0 is n0 - q_offset.
  const i64 first_query = n0 - p.q_offset > 0 ? n0 - p.q_offset : 0;
  for (i64 h = g * group; h < (g + 1) * group; ++h) {
    const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
    const T* dout = static_cast<const T*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride;
    const float* lse = static_cast<const float*>(p.lse) + (b * p.q_heads + h) * p.q_len;
    const float* d = delta + (b * p.q_heads + h) * p.q_len;
    for (i64 m0 = (first_query / kBM) * kBM; m0 < p.q_len; m0 += kBM) {
      const int bm = int(p.q_len - m0 < kBM ? p.q_len - m0 : kBM);
      __syncthreads();  // the previous tile's Q, dO, P and dS are no longer read
      load_tile(s_q, ldk, q + m0 * p.q_token_stride, p.q_token_stride, kBM, bm, dqk);
      load_tile(s_do, ldv, dout + m0 * p.dout_token_stride, p.dout_token_stride, kBM, bm, dv);
      if (tid < kBM) {
        s_lse[tid] = tid < bm ? lse[m0 + tid] : 0.f;
        s_d[tid] = tid < bm ? d[m0 + tid] : 0.f;
      }
      __syncthreads();
      tile_p_ds<kBM, kBN>(s_q, ldk, s_do, ldv, s_k, s_v, s_lse, s_d, dqk, dv, m0, bm, n0, bn, p, s_p, s_ds);
      __syncthreads();
      // dV += P^T dO,  dK += dS^T Q  (each thread owns its elements: no race, fixed order)
      for (int e = tid; e < kBN * dv; e += kThreads) {
        const int j = e / dv, c = e % dv;
        float acc = s_dv[j * ldv + c];
#pragma unroll 4
        for (int i = 0; i < kBM; ++i) acc = fmaf(s_p[i * kLdS + j], s_do[i * ldv + c], acc);
        s_dv[j * ldv + c] = acc;
      }
      for (int e = tid; e < kBN * dqk; e += kThreads) {
        const int j = e / dqk, c = e % dqk;
        float acc = s_dk[j * ldk + c];
#pragma unroll 4
        for (int i = 0; i < kBM; ++i) acc = fmaf(s_ds[i * kLdS + j], s_q[i * ldk + c], acc);
        s_dk[j * ldk + c] = acc;
      }
    }
  }
  __syncthreads();
  T* dk = static_cast<T*>(p.dk) + b * p.dk_batch_stride + g * p.dk_head_stride + n0 * p.dk_token_stride;
  T* dvp = static_cast<T*>(p.dv) + b * p.dv_batch_stride + g * p.dv_head_stride + n0 * p.dv_token_stride;
  const float scale = float(p.scale);
  for (int e = tid; e < bn * dqk; e += kThreads) {
    const int j = e / dqk, c = e % dqk;
    dk[j * p.dk_token_stride + c] = from_float<T>(scale * s_dk[j * ldk + c]);
  }
  for (int e = tid; e < bn * dv; e += kThreads) {
    const int j = e / dv, c = e % dv;
    dvp[j * p.dv_token_stride + c] = from_float<T>(s_dv[j * ldv + c]);
  }
}

// Grid (query tiles, q_heads, batch). Block: a query tile of one head; loops over the visible key tiles,
// accumulating dQ in shared memory.
template <typename T, typename Tiles>
__global__ void __launch_bounds__(kThreads) flash_bwd_dq_kernel(AttentionBwdParams p, const float* delta) {
  constexpr int kBM = Tiles::kBlockM, kBN = Tiles::kBlockN, kLdS = kBN + 1;
  extern __shared__ float smem[];
  const int dqk = int(p.d_qk), dv = int(p.d_v);
  const int ldk = padded(dqk), ldv = padded(dv);
  float* s_q = smem;
  float* s_dq = s_q + kBM * ldk;
  float* s_do = s_dq + kBM * ldk;
  float* s_k = s_do + kBM * ldv;
  float* s_v = s_k + kBN * ldk;
  float* s_ds = s_v + kBN * ldv;
  float* s_lse = s_ds + kBM * kLdS;
  float* s_d = s_lse + kBM;

  const i64 m0 = i64(blockIdx.x) * kBM, h = blockIdx.y, b = blockIdx.z;
  const i64 g = h / (p.q_heads / p.kv_heads);
  const int bm = int(p.q_len - m0 < kBM ? p.q_len - m0 : kBM);
  const int tid = threadIdx.x;
  load_tile(s_q, ldk, static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride + m0 * p.q_token_stride,
            p.q_token_stride, kBM, bm, dqk);
  load_tile(s_do, ldv,
            static_cast<const T*>(p.dout) + b * p.dout_batch_stride + h * p.dout_head_stride + m0 * p.dout_token_stride,
            p.dout_token_stride, kBM, bm, dv);
  for (int e = tid; e < kBM * dqk; e += kThreads) s_dq[(e / dqk) * ldk + e % dqk] = 0.f;
  if (tid < kBM) {
    const i64 row = (b * p.q_heads + h) * p.q_len + m0 + tid;
    s_lse[tid] = tid < bm ? static_cast<const float*>(p.lse)[row] : 0.f;
    s_d[tid] = tid < bm ? delta[row] : 0.f;
  }
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + g * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + g * p.v_head_stride;
  const i64 n_end = visible_keys(m0 + bm - 1, p.q_offset, p.kv_len);
  for (i64 n0 = 0; n0 < n_end; n0 += kBN) {
    const int bn = int(p.kv_len - n0 < kBN ? p.kv_len - n0 : kBN);
    __syncthreads();  // the previous K, V and dS are no longer read
    load_tile(s_k, ldk, k + n0 * p.k_token_stride, p.k_token_stride, kBN, bn, dqk);
    load_tile(s_v, ldv, v + n0 * p.v_token_stride, p.v_token_stride, kBN, bn, dv);
    __syncthreads();
    tile_p_ds<kBM, kBN>(s_q, ldk, s_do, ldv, s_k, s_v, s_lse, s_d, dqk, dv, m0, bm, n0, bn, p, nullptr, s_ds);
    __syncthreads();
    for (int e = tid; e < kBM * dqk; e += kThreads) {
      const int i = e / dqk, c = e % dqk;
      float acc = s_dq[i * ldk + c];
#pragma unroll 4
      for (int j = 0; j < kBN; ++j) acc = fmaf(s_ds[i * kLdS + j], s_k[j * ldk + c], acc);
      s_dq[i * ldk + c] = acc;
    }
  }
  __syncthreads();
  T* dq = static_cast<T*>(p.dq) + b * p.dq_batch_stride + h * p.dq_head_stride + m0 * p.dq_token_stride;
  const float scale = float(p.scale);
  for (int e = tid; e < bm * dqk; e += kThreads) {
    const int i = e / dqk, c = e % dqk;
    dq[i * p.dq_token_stride + c] = from_float<T>(scale * s_dq[i * ldk + c]);
  }
}

// ================================================================ launches
template <typename Kernel, typename... Args>
void launch(Context& ctx, Kernel kernel, const char* name, dim3 grid, std::size_t smem_bytes, Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  LAGA_REQUIRE(smem_bytes <= std::size_t(ctx.max_smem_per_block), name, " needs ", smem_bytes,
               " bytes of shared memory; the device allows ", ctx.max_smem_per_block);
  LAGA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
  kernel<<<grid, kThreads, smem_bytes, ctx.stream>>>(args...);
  LAGA_CUDA_CHECK_LAUNCH(name);
}

unsigned tiles(i64 n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

template <typename T>
void forward_impl(Context& ctx, const AttentionFwdParams& p) {
  const std::size_t smem = fwd_smem_floats(int(p.d_qk), int(p.d_v)) * sizeof(float);
  launch(ctx, flash_fwd_kernel<T>, "flash_fwd_kernel",
         dim3(tiles(p.q_len, kFwdBlockM), unsigned(p.q_heads), unsigned(p.batch)), smem, p);
}

template <typename T, typename Tiles>
void backward_impl(Context& ctx, const AttentionBwdParams& p) {
  const i64 rows = p.batch * p.q_heads * p.q_len;
  float* delta = static_cast<float*>(ctx.scratch.get(ScratchSlot::delta, sizeof(float) * rows, ctx.stream));
  if (rows > 0) {
    flash_bwd_delta_kernel<T><<<tiles(rows, kWarps), kThreads, 0, ctx.stream>>>(p, delta);
    LAGA_CUDA_CHECK_LAUNCH("flash_bwd_delta_kernel");
  }
  const int dqk = int(p.d_qk), dv = int(p.d_v);
  launch(ctx, flash_bwd_dkdv_kernel<T, Tiles>, "flash_bwd_dkdv_kernel",
         dim3(tiles(p.kv_len, Tiles::kBlockN), unsigned(p.kv_heads), unsigned(p.batch)),
         bwd_dkdv_smem_floats<Tiles>(dqk, dv) * sizeof(float), p, static_cast<const float*>(delta));
  launch(ctx, flash_bwd_dq_kernel<T, Tiles>, "flash_bwd_dq_kernel",
         dim3(tiles(p.q_len, Tiles::kBlockM), unsigned(p.q_heads), unsigned(p.batch)),
         bwd_dq_smem_floats<Tiles>(dqk, dv) * sizeof(float), p, static_cast<const float*>(delta));
}

bool small_dims(const AttentionFwdParams& p) { return p.d_qk <= SmallTiles::kMaxHeadDim && p.d_v <= SmallTiles::kMaxHeadDim; }

}  // namespace

void flash_forward(Context& ctx, const AttentionFwdParams& p) {
  if (flash_tc_supported(p)) return flash_tc_forward(ctx, p);  // bf16 at MLA's head dims: tensor cores
  dispatch_compute(p.dtype, "attention", [&](auto z) {
    using T = decltype(z);
    forward_impl<T>(ctx, p);
  });
}

void flash_backward(Context& ctx, const AttentionBwdParams& p) {
  if (flash_tc_supported(p)) return flash_tc_backward(ctx, p);
  dispatch_compute(p.dtype, "attention", [&](auto z) {
    using T = decltype(z);
    if (small_dims(p))
      backward_impl<T, SmallTiles>(ctx, p);
    else
      backward_impl<T, LargeTiles>(ctx, p);
  });
}

}  // namespace laga::cuda
