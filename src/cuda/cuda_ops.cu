#include "cuda/cuda_ops.cuh"

#include <algorithm>
#include <cmath>
#include <type_traits>

namespace laga::cuda {
namespace {

// ================================================================ copy and fill

// One thread per (row, col) of one batch entry (blockIdx.y), or of every entry in turn with kLoopBatch: each
// thread walks the whole batch in order, the race-free (and deterministic) reduction when every batch entry
// lands on the same destination (dst_batch_stride == 0). I is the index type of the (row, col) walk: 32-bit
// whenever rows * cols allows it, since 64-bit division is emulated on the GPU and made this kernel
// compute-bound at ~0.3 TB/s.
template <typename S, typename D, bool kAccumulate, bool kLoopBatch, typename I>
__global__ void copy_kernel(CopyArgs c, i64 batch_base) {
  using A = typename Accum<D>::type;
  const I cols = I(c.cols), per_batch = I(c.rows) * cols;
  const i64 b = kLoopBatch ? 0 : batch_base + blockIdx.y;
  const S* src = static_cast<const S*>(c.src) + b * c.src_batch_stride;
  D* dst = static_cast<D*>(c.dst) + b * c.dst_batch_stride;
  for (I rc = I(blockIdx.x) * blockDim.x + threadIdx.x; rc < per_batch; rc += I(gridDim.x) * blockDim.x) {
    const I r = rc / cols, col = rc - r * cols;
    const i64 s_off = i64(r) * c.src_ld + col, d_off = i64(r) * c.dst_ld + col;
    D* d = dst + d_off;
    if constexpr (kLoopBatch) {  // kAccumulate: onto dst; otherwise (CopyMode::Sum) from zero
      A acc = kAccumulate ? A(to_acc(*d)) : A(0);
      for (i64 bb = 0; bb < c.batch; ++bb) acc += A(to_acc(src[bb * c.src_batch_stride + s_off]));
      *d = from_acc<D>(acc);
    } else {
      const S v = src[s_off];
      if constexpr (kAccumulate)
        *d = from_acc<D>(to_acc(*d) + A(to_acc(v)));
      else if constexpr (std::is_same_v<S, D>)
        *d = v;
      else
        *d = from_acc<D>(A(to_acc(v)));
    }
  }
}

// Assignment without a change of dtype, in 16-byte vectors: the caller checks that every row of source and
// destination starts on a 16-byte boundary and is a whole number of vectors long. Strides in vectors; one
// batch entry per blockIdx.y.
__global__ void copy_vec16_kernel(const uint4* src, uint4* dst, std::uint32_t rows, std::uint32_t vcols, i64 src_ld,
                                  i64 dst_ld, i64 src_batch_stride, i64 dst_batch_stride, i64 batch_base) {
  const i64 b = batch_base + blockIdx.y;
  src += b * src_batch_stride;
  dst += b * dst_batch_stride;
  const std::uint32_t n = rows * vcols;
  for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const std::uint32_t r = i / vcols, col = i - r * vcols;
    dst[i64(r) * dst_ld + col] = src[i64(r) * src_ld + col];
  }
}

template <typename T>
__global__ void fill_kernel(T* p, i64 n, typename Accum<T>::type value) {
  const T v = from_acc<T>(value);
  for (i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += i64(gridDim.x) * blockDim.x) p[i] = v;
}

bool is_host_pointer(const void* p) {
  cudaPointerAttributes attr{};
  LAGA_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  return attr.type == cudaMemoryTypeUnregistered || attr.type == cudaMemoryTypeHost;
}

// ================================================================ RMSNorm
constexpr int kNormThreads = 256;
constexpr int kNormWarps = kNormThreads / 32;
constexpr int kDgammaThreads = 256;
constexpr i64 kDgammaRowsPerChunk = 64;
constexpr i64 kDgammaMaxChunks = 1024;

// A row's elements in packs of kPack: one element, or 8 in one 16-byte load (32 bytes of float32).
template <int kPack, typename T>
__device__ __forceinline__ void load_pack(const T* p, float (&v)[kPack]) {
  if constexpr (kPack == 1) {
    v[0] = to_float(*p);
  } else if constexpr (sizeof(T) == 2) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = to_float(e[k]);
  } else if constexpr (std::is_same_v<T, float>) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {  // not taken by the host code (bf16 and float32 rows only); kept compilable for every dispatch
#pragma unroll
    for (int k = 0; k < kPack; ++k) v[k] = to_float(p[k]);
  }
}
template <int kPack, typename T>
__device__ __forceinline__ void store_pack(T* p, const float (&v)[kPack]) {
  if constexpr (kPack == 1) {
    *p = from_float<T>(v[0]);
  } else if constexpr (sizeof(T) == 2) {
    uint4 u;
    T* e = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int k = 0; k < 8; ++k) e[k] = from_float<T>(v[k]);
    *reinterpret_cast<uint4*>(p) = u;
  } else if constexpr (std::is_same_v<T, float>) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
  } else {
#pragma unroll
    for (int k = 0; k < kPack; ++k) p[k] = from_float<T>(v[k]);
  }
}

// Who walks a row: a block of kNormThreads (one element a step), or with kWarpRows a warp (kNormRowsPerBlock
// rows a block, 8 elements a step) for rows whose width and strides are multiples of 8 elements on 16-byte
// boundaries (DeepSeek's 1536 and 512), where a block spent most of a short row in its block-wide reduction.
// The same expressions per element either way.
constexpr int kNormRowsPerBlock = 8;
template <bool kWarpRows>
struct NormRow {
  static constexpr int kPack = kWarpRows ? 8 : 1, kThreads = kWarpRows ? 32 : kNormThreads;
  i64 r;
  int t;
  __device__ NormRow()
      : r(kWarpRows ? i64(blockIdx.x) * kNormRowsPerBlock + threadIdx.x / 32 : i64(blockIdx.x)),
        t(kWarpRows ? int(threadIdx.x & 31) : int(threadIdx.x)) {}
  // The sum over the row's threads, which all receive it (`red`: the block's kNormWarps floats).
  __device__ float sum(float v, float* red) const {
    if constexpr (kWarpRows)
      return warp_sum(v);
    else
      return block_reduce<false>(v, red);
  }
};
template <bool kWarpRows>
unsigned norm_blocks(i64 rows) {
  return static_cast<unsigned>(kWarpRows ? (rows + kNormRowsPerBlock - 1) / kNormRowsPerBlock : rows);
}

// rstd = 1/sqrt(mean(x^2) + eps) in fp32, y = x * rstd * gamma.
template <typename T, bool kWarpRows>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_forward_kernel(RmsNormArgs a) {
  using Row = NormRow<kWarpRows>;
  constexpr int P = Row::kPack;
  __shared__ float red[kNormWarps];
  const Row row;
  if (row.r >= a.rows) return;  // a whole warp (kWarpRows) or the whole block
  const T* x = static_cast<const T*>(a.x) + row.r * a.x_ld;
  const T* gamma = static_cast<const T*>(a.gamma);
  T* y = static_cast<T*>(a.y) + row.r * a.y_ld;
  const i64 packs = a.cols / P;
  float ss = 0.f;
  for (i64 q = row.t; q < packs; q += Row::kThreads) {
    float v[P];
    load_pack<P>(x + P * q, v);
#pragma unroll
    for (int k = 0; k < P; ++k) ss = fmaf(v[k], v[k], ss);
  }
  ss = row.sum(ss, red);
  const float rs = 1.0f / sqrtf(ss / float(a.cols) + float(a.eps));
  if (row.t == 0) static_cast<float*>(a.rstd)[row.r] = rs;
  for (i64 q = row.t; q < packs; q += Row::kThreads) {
    float v[P], g[P];
    load_pack<P>(x + P * q, v);
    load_pack<P>(gamma + P * q, g);
#pragma unroll
    for (int k = 0; k < P; ++k) v[k] = v[k] * rs * g[k];
    store_pack<P>(y + P * q, v);
  }
}

// dx = rstd * (dy * g) - x * rstd^3 * mean(dy * g * x). dy is G (float32 for a gradient kept in float32), the
// rest T.
template <typename T, typename G, bool kWarpRows>
__global__ void __launch_bounds__(kNormThreads) rmsnorm_backward_dx_kernel(RmsNormArgs a) {
  using Row = NormRow<kWarpRows>;
  constexpr int P = Row::kPack;
  __shared__ float red[kNormWarps];
  const Row row;
  if (row.r >= a.rows) return;
  const T* x = static_cast<const T*>(a.x) + row.r * a.x_ld;
  const G* dy = static_cast<const G*>(a.dy) + row.r * a.dy_ld;
  const T* gamma = static_cast<const T*>(a.gamma);
  T* dx = static_cast<T*>(a.dx) + row.r * a.dx_ld;
  const float rs = static_cast<const float*>(a.rstd)[row.r];
  const i64 packs = a.cols / P;
  auto load = [&](i64 q, float (&v)[P], float (&d)[P], float (&g)[P]) {
    load_pack<P>(x + P * q, v);
    load_pack<P>(dy + P * q, d);
    load_pack<P>(gamma + P * q, g);
  };
  float dot = 0.f;
  for (i64 q = row.t; q < packs; q += Row::kThreads) {
    float v[P], d[P], g[P];
    load(q, v, d, g);
#pragma unroll
    for (int k = 0; k < P; ++k) dot = fmaf(d[k] * g[k], v[k], dot);
  }
  dot = row.sum(dot, red);
  const float coef = rs * rs * rs * dot / float(a.cols);
  for (i64 q = row.t; q < packs; q += Row::kThreads) {
    float v[P], d[P], g[P];
    load(q, v, d, g);
#pragma unroll
    for (int k = 0; k < P; ++k) v[k] = rs * d[k] * g[k] - v[k] * coef;
    store_pack<P>(dx + P * q, v);
  }
}

// dgamma, pass 1: partial[chunk][col] = sum over the chunk's rows of dy * x * rstd (each thread one column).
template <typename T, typename G>
__global__ void __launch_bounds__(kDgammaThreads) rmsnorm_dgamma_partial_kernel(RmsNormArgs a, i64 rows_per_chunk,
                                                                                 float* partial) {
  const i64 col = i64(blockIdx.x) * kDgammaThreads + threadIdx.x;
  if (col >= a.cols) return;
  const i64 r0 = i64(blockIdx.y) * rows_per_chunk;
  const i64 r1 = min(a.rows, r0 + rows_per_chunk);
  const T* x = static_cast<const T*>(a.x);
  const G* dy = static_cast<const G*>(a.dy);
  const float* rstd = static_cast<const float*>(a.rstd);
  float acc = 0.f;
  for (i64 r = r0; r < r1; ++r) acc = fmaf(to_float(dy[r * a.dy_ld + col]) * to_float(x[r * a.x_ld + col]), rstd[r], acc);
  partial[i64(blockIdx.y) * a.cols + col] = acc;
}

// dgamma, pass 2: dgamma[col] += sum over chunks in order (dgamma is float32: accum_dtype).
__global__ void __launch_bounds__(kDgammaThreads) rmsnorm_dgamma_final_kernel(i64 cols, i64 chunks,
                                                                               const float* partial, float* dgamma) {
  const i64 col = i64(blockIdx.x) * kDgammaThreads + threadIdx.x;
  if (col >= cols) return;
  float acc = 0.f;
  for (i64 ch = 0; ch < chunks; ++ch) acc += partial[ch * cols + col];
  dgamma[col] += acc;
}

// ================================================================ RoPE
// One block per (token, batch) row and kRopeWarps warps over its heads. The block's angles are computed once in
// double (positions reach 1e5 and more: in float the angle alone would be off by 1e-2) into shared memory and
// reused by every head; each warp stages a head's `dim` inputs in shared memory before it writes, so y may be x
// (in place), and reads and writes are whole rows. A head's copy_cols columns ahead of the rotated ones go
// straight from x to y, in 16-byte vectors with kVec (one dtype, every row and stride on 16 bytes).
constexpr int kRopeWarps = 8;

// The rotation of one pair and its transpose, each product rounded on its own (no contraction left to the
// compiler), so that rope_kernel and rope_vec_kernel give the same bits: the block's layouts are bitwise equal
// at P = 1 whichever kernel ran their RoPE.
__device__ __forceinline__ void rope_rotate(float x0, float x1, float c, float s, float& y0, float& y1) {
  y0 = fmaf(x0, c, -__fmul_rn(x1, s));
  y1 = fmaf(x1, c, __fmul_rn(x0, s));
}
__device__ __forceinline__ void rope_rotate_t(float d0, float d1, float c, float s, float& x0, float& x1) {
  x0 = fmaf(d0, c, __fmul_rn(d1, s));
  x1 = fmaf(d1, c, -__fmul_rn(d0, s));
}

// The row's cos and sin (times mscale) of each of the `half` angles into shared memory, computed in double by
// threads tid, tid + threads, ...; the caller synchronises before reading them.
__device__ __forceinline__ void rope_angles(float* cs, float* sn, int half, const RopeArgs& a, i64 t,
                                            const double* inv_freq, int tid, int threads) {
  for (int i = tid; i < half; i += threads) {
    double sd, cd;
    sincos(double(a.pos_offset + t) * inv_freq[i], &sd, &cd);
    cs[i] = float(cd * a.mscale);
    sn[i] = float(sd * a.mscale);
  }
}

// Where head h's row starts in x or y (RopeArgs' head groups; group 0: no groups), in elements.
__device__ __forceinline__ i64 rope_head_offset(int h, int group, i64 head_stride, i64 group_stride) {
  const int g = group > 0 ? h / group : 0, hg = group > 0 ? h - g * group : h;
  return g * group_stride + hg * head_stride;
}

template <typename X, typename T, bool kBackward, bool kVec>
__global__ void __launch_bounds__(32 * kRopeWarps) rope_kernel(RopeArgs a, const double* inv_freq) {
  extern __shared__ float rope_smem[];
  const int half = int(a.dim / 2), dim = int(a.dim), copy_cols = int(a.copy_cols), group = int(a.head_group);
  float* cs = rope_smem;                                // [half]
  float* sn = cs + half;                                // [half]
  float* row = sn + half + threadIdx.y * dim;           // this warp's [dim]
  const i64 t = blockIdx.x / a.batch, b = blockIdx.x - t * a.batch;
  rope_angles(cs, sn, half, a, t, inv_freq, int(threadIdx.y * 32 + threadIdx.x), 32 * kRopeWarps);
  __syncthreads();
  const X* x = static_cast<const X*>(a.x) + t * a.x_token_stride + b * a.x_batch_stride;
  T* y = static_cast<T*>(a.y) + t * a.y_token_stride + b * a.y_batch_stride;
  for (int h = threadIdx.y; h < int(a.heads); h += kRopeWarps) {
    const X* xs = x + rope_head_offset(h, group, a.x_head_stride, a.x_group_stride);
    T* ys = y + rope_head_offset(h, group, a.y_head_stride, a.y_group_stride);
    if constexpr (kVec) {
      constexpr int kPer = 16 / sizeof(T);
      for (int j = threadIdx.x; j < copy_cols / kPer; j += 32)
        reinterpret_cast<uint4*>(ys)[j] = reinterpret_cast<const uint4*>(xs)[j];
    } else {
      for (int j = threadIdx.x; j < copy_cols; j += 32) ys[j] = from_float<T>(to_float(xs[j]));
    }
    xs += copy_cols;
    ys += copy_cols;
    for (int j = threadIdx.x; j < dim; j += 32) row[j] = to_float(xs[j]);
    __syncwarp();
    for (int i = threadIdx.x; i < half; i += 32) {
      const float c = cs[i], s = sn[i];
      float r0, r1;
      if constexpr (!kBackward) {
        rope_rotate(row[2 * i], row[2 * i + 1], c, s, r0, r1);
        ys[i] = from_float<T>(r0);
        ys[i + half] = from_float<T>(r1);
      } else {
        rope_rotate_t(row[i], row[i + half], c, s, r0, r1);
        ys[2 * i] = from_float<T>(r0);
        ys[2 * i + 1] = from_float<T>(r1);
      }
    }
    __syncwarp();
  }
}

// RoPE in 16-byte vectors (bfloat16 rows, dim = kDim, every row and stride on 16 bytes, many heads): the query
// path's RoPE, in place or into the all-to-all's buffer with the nope columns copied. rope_kernel stages each
// head in shared memory one element a lane; here a thread moves whole vectors, several in flight: first the
// copied columns (one vector a thread, kRopeVecUnroll at a time), then the rotated ones (a head's segment over
// kDim / 8 lanes, read whole before any of it is written, so y may be x). One block per (token, batch) row, its
// angles in shared memory as in rope_kernel (four rows a block ran slower: fewer blocks in flight).
constexpr int kRopeVecThreads = 256;
constexpr int kRopeVecUnroll = 4;
constexpr int kRopeVecDim = 64;       // DeepSeek's rope head dim; other dims take rope_kernel
constexpr i64 kRopeVecMinHeads = 32;  // fewer heads (the latent's one) take rope_kernel, cheaper a row

template <typename T, bool kBackward, int kDim>
__global__ void __launch_bounds__(kRopeVecThreads) rope_vec_kernel(RopeArgs a, const double* inv_freq) {
  constexpr int E = 16 / sizeof(T), kVecs = kDim / E, kHalf = kDim / 2;
  __shared__ float cs[kHalf], sn[kHalf];
  const int group = int(a.head_group), heads = int(a.heads);
  const int copy_v = int(a.copy_cols) / E, copy_units = heads * copy_v;
  const i64 t = blockIdx.x / a.batch, b = blockIdx.x - t * a.batch;
  const T* x = static_cast<const T*>(a.x) + t * a.x_token_stride + b * a.x_batch_stride;
  T* y = static_cast<T*>(a.y) + t * a.y_token_stride + b * a.y_batch_stride;
  auto head_x = [&](int h) { return x + rope_head_offset(h, group, a.x_head_stride, a.x_group_stride); };
  auto head_y = [&](int h) { return y + rope_head_offset(h, group, a.y_head_stride, a.y_group_stride); };
  // The angles (the copies below need none: the barrier waits after them).
  rope_angles(cs, sn, kHalf, a, t, inv_freq, int(threadIdx.x), kRopeVecThreads);
  if (a.x != a.y) {
    for (int u0 = threadIdx.x; u0 < copy_units; u0 += kRopeVecThreads * kRopeVecUnroll) {
      uint4 v[kRopeVecUnroll];
      int h[kRopeVecUnroll], k[kRopeVecUnroll];
#pragma unroll
      for (int j = 0; j < kRopeVecUnroll; ++j) {
        const int u = u0 + j * kRopeVecThreads;
        h[j] = u / copy_v;
        k[j] = u - h[j] * copy_v;
        if (u < copy_units) v[j] = reinterpret_cast<const uint4*>(head_x(h[j]))[k[j]];
      }
#pragma unroll
      for (int j = 0; j < kRopeVecUnroll; ++j)
        if (u0 + j * kRopeVecThreads < copy_units) reinterpret_cast<uint4*>(head_y(h[j]))[k[j]] = v[j];
    }
  }
  __syncthreads();
  // The rotated columns: kVecs lanes a head, lane j loading the head's vector j (the segment read whole and
  // coalesced) and writing its output vector j from the two input vectors it needs, taken from the head's lanes
  // by shuffles (so every read of the segment comes before any write: in place works). Forward: output vectors
  // j and j + kVecs/2 hold the first and second elements of the pairs in input vectors 2j' and 2j'+1 (j' = j mod
  // kVecs/2); backward: output vector j (pairs E/2 j ..) reads dy's vectors j/2 and j/2 + kVecs/2.
  static_assert(kVecs <= 32 && 32 % kVecs == 0 && kVecs % 2 == 0, "a head's vectors in one warp");
  const int lanes = (heads * kVecs + 31) / 32 * 32;  // whole warps take part in the shuffles
  for (int u = threadIdx.x; u < lanes; u += kRopeVecThreads) {
    const int h = u / kVecs, j = u - h * kVecs;
    const bool valid = h < heads;
    uint4 mine = make_uint4(0, 0, 0, 0);
    T* yr = nullptr;
    if (valid) {
      mine = reinterpret_cast<const uint4*>(head_x(h) + a.copy_cols)[j];
      yr = head_y(h) + a.copy_cols;
    }
    const int src0 = kBackward ? j / 2 : 2 * (j % (kVecs / 2)), src1 = kBackward ? src0 + kVecs / 2 : src0 + 1;
    uint4 in[2];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
      const int src = w == 0 ? src0 : src1;
      in[w].x = __shfl_sync(0xffffffffu, mine.x, src, kVecs);
      in[w].y = __shfl_sync(0xffffffffu, mine.y, src, kVecs);
      in[w].z = __shfl_sync(0xffffffffu, mine.z, src, kVecs);
      in[w].w = __shfl_sync(0xffffffffu, mine.w, src, kVecs);
    }
    if (!valid) continue;
    const T* e0 = reinterpret_cast<const T*>(&in[0]);
    const T* e1 = reinterpret_cast<const T*>(&in[1]);
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
    if constexpr (!kBackward) {  // pairs i = E j' + q (j' = j mod kVecs/2): (x[2i], x[2i+1]) -> y[i], y[i + half]
      const bool second = j >= kVecs / 2;
      const int i0 = E * (j % (kVecs / 2));
#pragma unroll
      for (int q = 0; q < E; ++q) {
        const T* e = q < E / 2 ? e0 : e1;
        const int qq = q < E / 2 ? q : q - E / 2;
        float r0, r1;
        rope_rotate(to_float(e[2 * qq]), to_float(e[2 * qq + 1]), cs[i0 + q], sn[i0 + q], r0, r1);
        o[q] = from_float<T>(second ? r1 : r0);
      }
    } else {  // pairs i = E/2 j + q: (dy[i], dy[i + half]) -> dx[2i], dx[2i+1]
      const int i0 = (E / 2) * j, off = (E / 2) * (j % 2);
#pragma unroll
      for (int q = 0; q < E / 2; ++q) {
        float r0, r1;
        rope_rotate_t(to_float(e0[off + q]), to_float(e1[off + q]), cs[i0 + q], sn[i0 + q], r0, r1);
        o[2 * q] = from_float<T>(r0);
        o[2 * q + 1] = from_float<T>(r1);
      }
    }
    reinterpret_cast<uint4*>(yr)[j] = out;
  }
}

// ================================================================ attention merge

// One warp per (query, batch, head) row: every lane reads the old log-sum-exp, scales its columns, then lane 0
// writes the new one. P is o_part's element type, O the running output's; lse is float.
template <typename P, typename O>
__global__ void attention_merge_kernel(AttentionMergeArgs a, i64 rows) {
  const i64 row = (i64(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const i64 h = row % a.heads, bi = (row / a.heads) % a.batch, i = row / (a.heads * a.batch);
  const i64 l = (bi * a.heads + h) * a.q_len + i;
  float* lse = static_cast<float*>(a.lse);
  const float lp = static_cast<const float*>(a.lse_part)[l], lo = lse[l];
  if (lp == -INFINITY) return;
  const float m = fmaxf(lo, lp);
  const float eo = expf(lo - m), ep = expf(lp - m);  // exp(-inf) = 0 for an empty running row
  const float sum = eo + ep, wo = eo / sum, wp = ep / sum;
  O* o = static_cast<O*>(a.o) + i * a.o_token_stride + bi * a.o_batch_stride + h * a.o_head_stride;
  const P* op = static_cast<const P*>(a.o_part) + i * a.part_token_stride + bi * a.part_batch_stride +
                h * a.part_head_stride;
  for (i64 c = lane; c < a.d_v; c += 32) o[c] = from_float<O>(to_float(o[c]) * wo + to_float(op[c]) * wp);
  __syncwarp();
  if (lane == 0) lse[l] = m + logf(sum);
}

}  // namespace

// ================================================================ host entry points

void copy_op(Context& ctx, const CopyArgs& c) {
  LAGA_REQUIRE(c.batch >= 0 && c.rows >= 0 && c.cols >= 0, "copy: negative size (batch ", c.batch, ", rows ",
               c.rows, ", cols ", c.cols, ")");
  if (c.src == nullptr || c.dst == nullptr || c.batch == 0 || c.rows == 0 || c.cols == 0) return;
  const std::size_t es = dtype_size(c.dtype);
  const DType dst_dtype = c.dst_dtype.value_or(c.dtype);
  if (is_host_pointer(c.src) || is_host_pointer(c.dst)) {
    LAGA_REQUIRE(dst_dtype == c.dtype, "copy: host transfers keep the dtype (", dtype_name(c.dtype), " to ",
                 dtype_name(dst_dtype), " asked)");
    LAGA_REQUIRE(c.mode == CopyMode::Assign, "copy: accumulate and sum need device buffers (got a host pointer)");
    for (i64 b = 0; b < c.batch; ++b) {
      const char* s = static_cast<const char*>(c.src) + b * c.src_batch_stride * i64(es);
      char* d = static_cast<char*>(c.dst) + b * c.dst_batch_stride * i64(es);
      if (s == d) continue;
      LAGA_CUDA_CHECK(cudaMemcpy2DAsync(d, c.dst_ld * es, s, c.src_ld * es, c.cols * es, c.rows, cudaMemcpyDefault,
                                        ctx.stream));
    }
    LAGA_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    return;
  }
  if (c.mode == CopyMode::Assign && c.src == c.dst && c.src_ld == c.dst_ld &&
      c.src_batch_stride == c.dst_batch_stride && dst_dtype == c.dtype)
    return;  // onto itself
  LAGA_REQUIRE(c.mode != CopyMode::Sum || c.dst_batch_stride == 0, "copy: sum over the batch needs a dst batch "
               "stride of 0 (got ", c.dst_batch_stride, ")");
  const bool sum = c.mode == CopyMode::Sum && c.batch > 1;  // a batch of one is an assignment
  const bool reduce = (c.mode == CopyMode::Accumulate && c.dst_batch_stride == 0 && c.batch > 1) || sum;
  // Batch entries go on blockIdx.y (at most 65535 a launch); the (row, col) walk on blockIdx.x, grid-strided.
  constexpr i64 kMaxGridY = 65535;
  const i64 per_batch = c.rows * c.cols;
  constexpr i64 kIndex32 = i64(1) << 31;  // the walk's index plus one grid stride stays below 2^32
  const auto launches = [&](auto&& launch) {
    for (i64 b0 = 0; b0 < (reduce ? 1 : c.batch); b0 += kMaxGridY) launch(b0, unsigned(std::min(c.batch - b0, kMaxGridY)));
  };
  const i64 vec = i64(16 / es);
  const auto aligned = [&](const void* p, i64 ld, i64 batch_stride) {
    return reinterpret_cast<std::uintptr_t>(p) % 16 == 0 && ld % vec == 0 && batch_stride % vec == 0;
  };
  if (c.mode == CopyMode::Assign && dst_dtype == c.dtype && c.cols % vec == 0 && per_batch / vec < kIndex32 &&
      aligned(c.src, c.src_ld, c.src_batch_stride) && aligned(c.dst, c.dst_ld, c.dst_batch_stride)) {
    const unsigned blocks = std::min(blocks_for(per_batch / vec, kElementwiseThreads), 1u << 20);
    launches([&](i64 b0, unsigned nb) {
      copy_vec16_kernel<<<dim3(blocks, nb), kElementwiseThreads, 0, ctx.stream>>>(
          static_cast<const uint4*>(c.src), static_cast<uint4*>(c.dst), std::uint32_t(c.rows),
          std::uint32_t(c.cols / vec), c.src_ld / vec, c.dst_ld / vec, c.src_batch_stride / vec,
          c.dst_batch_stride / vec, b0);
    });
    LAGA_CUDA_CHECK_LAUNCH("copy_vec16_kernel");
    return;
  }
  const unsigned blocks = std::min(blocks_for(per_batch, kElementwiseThreads), 1u << 20);
  dispatch_pair(c.dtype, dst_dtype, "copy", [&](auto zs, auto zd) {
    using S = decltype(zs);
    using D = decltype(zd);
    const auto run = [&](auto index) {
      using I = decltype(index);
      launches([&](i64 b0, unsigned nb) {
        const dim3 grid(blocks, reduce ? 1u : nb);
        if (sum)
          copy_kernel<S, D, false, true, I><<<grid, kElementwiseThreads, 0, ctx.stream>>>(c, b0);
        else if (reduce)
          copy_kernel<S, D, true, true, I><<<grid, kElementwiseThreads, 0, ctx.stream>>>(c, b0);
        else if (c.mode == CopyMode::Accumulate)
          copy_kernel<S, D, true, false, I><<<grid, kElementwiseThreads, 0, ctx.stream>>>(c, b0);
        else
          copy_kernel<S, D, false, false, I><<<grid, kElementwiseThreads, 0, ctx.stream>>>(c, b0);
      });
    };
    if (per_batch < kIndex32)
      run(std::uint32_t{});
    else
      run(i64{});
  });
  LAGA_CUDA_CHECK_LAUNCH("copy_kernel");
}

void fill_op(Context& ctx, void* ptr, i64 n, DType dtype, double value) {
  if (ptr == nullptr || n <= 0) return;
  // Zero (+0.0 in every dtype, all bits clear) by the driver's memset: a gradient's start, the common case, at
  // the copy engine's rate where fill_kernel's element-wise stores reach a fraction of it.
  if (value == 0.0 && !std::signbit(value)) {
    LAGA_CUDA_CHECK(cudaMemsetAsync(ptr, 0, std::size_t(n) * dtype_size(dtype), ctx.stream));
    return;
  }
  dispatch_any(dtype, [&](auto z) {
    using T = decltype(z);
    fill_kernel<T><<<blocks_for(n, kElementwiseThreads), kElementwiseThreads, 0, ctx.stream>>>(
        static_cast<T*>(ptr), n, static_cast<typename Accum<T>::type>(value));
  });
  LAGA_CUDA_CHECK_LAUNCH("fill_kernel");
}

namespace {
void check_norm(const RmsNormArgs& a, bool backward) {
  LAGA_REQUIRE(a.rows >= 0 && a.cols >= 1, "rmsnorm: rows ", a.rows, " and cols ", a.cols, " must be >= 0 and >= 1");
  LAGA_REQUIRE(a.rows <= INT32_MAX, "rmsnorm: rows = ", a.rows, " exceeds the grid limit");
  LAGA_REQUIRE(a.x && a.gamma && a.rstd, "rmsnorm: x, gamma and rstd must be set");
  if (backward)
    LAGA_REQUIRE(a.dy && a.dx && a.dgamma, "rmsnorm backward: dy, dx and dgamma must be set");
  else
    LAGA_REQUIRE(a.y, "rmsnorm forward: y must be set");
}
// Rows that the warp-per-row kernels take: 8 elements a load on 16-byte boundaries (gamma too), 32-bit packs.
bool norm_rows_vectorisable(const RmsNormArgs& a, const void* rows, i64 ld, std::size_t es) {
  auto on16 = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return a.cols % 8 == 0 && a.cols / 8 <= INT32_MAX && ld % 8 == 0 && (ld * i64(es)) % 16 == 0 && on16(rows) &&
         on16(a.gamma) && a.rows <= i64(UINT32_MAX) * kNormRowsPerBlock;
}
}  // namespace

void rmsnorm_forward_op(Context& ctx, const RmsNormArgs& a) {
  check_norm(a, false);
  if (a.rows == 0) return;
  const bool warp_rows = norm_rows_vectorisable(a, a.x, a.x_ld, dtype_size(a.dtype)) &&
                        norm_rows_vectorisable(a, a.y, a.y_ld, dtype_size(a.dtype));
  dispatch_compute(a.dtype, "rmsnorm", [&](auto z) {
    using T = decltype(z);
    if (warp_rows)
      rmsnorm_forward_kernel<T, true><<<norm_blocks<true>(a.rows), kNormThreads, 0, ctx.stream>>>(a);
    else
      rmsnorm_forward_kernel<T, false><<<norm_blocks<false>(a.rows), kNormThreads, 0, ctx.stream>>>(a);
  });
  LAGA_CUDA_CHECK_LAUNCH("rmsnorm_forward_kernel");
}

void rmsnorm_backward_op(Context& ctx, const RmsNormArgs& a) {
  check_norm(a, true);
  if (a.rows == 0) return;
  const i64 rows_per_chunk =
      std::max<i64>(kDgammaRowsPerChunk, (a.rows + kDgammaMaxChunks - 1) / kDgammaMaxChunks);
  const i64 chunks = (a.rows + rows_per_chunk - 1) / rows_per_chunk;
  float* partial = static_cast<float*>(
      ctx.scratch.get(ScratchSlot::norm_partial, sizeof(float) * std::size_t(chunks * a.cols), ctx.stream));
  const unsigned col_blocks = blocks_for(a.cols, kDgammaThreads);
  const bool warp_rows = norm_rows_vectorisable(a, a.x, a.x_ld, dtype_size(a.dtype)) &&
                        norm_rows_vectorisable(a, a.dx, a.dx_ld, dtype_size(a.dtype)) &&
                        norm_rows_vectorisable(a, a.dy, a.dy_ld, dtype_size(a.dy_dtype.value_or(a.dtype)));
  dispatch_compute(a.dtype, "rmsnorm", [](auto) {});
  dispatch_pair(a.dtype, a.dy_dtype.value_or(a.dtype), "rmsnorm backward", [&](auto z, auto zg) {
    using T = decltype(z);
    using G = decltype(zg);
    if (warp_rows)
      rmsnorm_backward_dx_kernel<T, G, true><<<norm_blocks<true>(a.rows), kNormThreads, 0, ctx.stream>>>(a);
    else
      rmsnorm_backward_dx_kernel<T, G, false><<<norm_blocks<false>(a.rows), kNormThreads, 0, ctx.stream>>>(a);
    LAGA_CUDA_CHECK_LAUNCH("rmsnorm_backward_dx_kernel");
    rmsnorm_dgamma_partial_kernel<T, G>
        <<<dim3(col_blocks, static_cast<unsigned>(chunks)), kDgammaThreads, 0, ctx.stream>>>(a, rows_per_chunk, partial);
    LAGA_CUDA_CHECK_LAUNCH("rmsnorm_dgamma_partial_kernel");
    rmsnorm_dgamma_final_kernel<<<col_blocks, kDgammaThreads, 0, ctx.stream>>>(a.cols, chunks, partial,
                                                                              static_cast<float*>(a.dgamma));
    LAGA_CUDA_CHECK_LAUNCH("rmsnorm_dgamma_final_kernel");
  });
}

void rope_op(Context& ctx, const RopeArgs& a, const double* inv_freq_device, bool backward) {
  LAGA_REQUIRE(a.dim >= 0 && a.dim % 2 == 0, "rope: dim = ", a.dim, " must be even");
  LAGA_REQUIRE(a.tokens >= 0 && a.batch >= 0 && a.heads >= 0, "rope: negative size");
  const i64 total = a.tokens * a.batch * a.heads * (a.dim / 2);
  if (total == 0 || a.x == nullptr || a.y == nullptr) return;
  const i64 rows = a.tokens * a.batch;
  LAGA_REQUIRE(rows <= INT32_MAX, "rope: tokens x batch = ", rows, " exceeds the grid limit");
  const std::size_t smem = sizeof(float) * std::size_t(a.dim + kRopeWarps * a.dim);
  LAGA_REQUIRE(smem <= 48 * 1024, "rope: dim = ", a.dim, " needs more shared memory than a block has");
  LAGA_REQUIRE(a.copy_cols >= 0 && a.head_group >= 0, "rope: copy_cols = ", a.copy_cols, " and head_group = ",
               a.head_group, " must be >= 0");
  LAGA_REQUIRE(a.heads <= INT32_MAX && a.copy_cols <= INT32_MAX, "rope: heads = ", a.heads, " or copy_cols = ",
               a.copy_cols, " exceeds 32 bits");
  // The copied columns in 16-byte vectors where nothing is converted and every head row starts on 16 bytes.
  const DType xd = a.x_dtype.value_or(a.dtype);
  const i64 es = i64(dtype_size(a.dtype));
  auto on16 = [&](i64 elements) { return (elements * es) % 16 == 0; };
  auto ptr16 = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  const bool aligned = ptr16(a.x) && ptr16(a.y) && on16(a.x_token_stride) && on16(a.x_batch_stride) &&
                       on16(a.x_head_stride) && on16(a.x_group_stride) && on16(a.y_token_stride) &&
                       on16(a.y_batch_stride) && on16(a.y_head_stride) && on16(a.y_group_stride) && on16(a.copy_cols);
  const bool vec = a.copy_cols > 0 && xd == a.dtype && aligned;
  // bfloat16 with DeepSeek's rope dim, every vector on 16 bytes: rope_vec_kernel.
  const bool fast = xd == a.dtype && a.dtype == DType::BF16 && a.dim == kRopeVecDim && a.heads >= kRopeVecMinHeads &&
                    aligned;
  const dim3 grid{unsigned(rows)}, block{32, kRopeWarps};
  dispatch_compute(a.dtype, "rope", [](auto) {});
  dispatch_pair(xd, a.dtype, "rope", [&](auto zx, auto z) {
    using X = decltype(zx);
    using T = decltype(z);
    if constexpr (std::is_same_v<X, double> || std::is_same_v<T, double>) {
      LAGA_REQUIRE(false, "rope: float64 is not supported by the cuda backend: use float32 or bfloat16");
    } else {
      auto launch = [&](auto kernel) { kernel<<<grid, block, smem, ctx.stream>>>(a, inv_freq_device); };
      if constexpr (std::is_same_v<X, bf16> && std::is_same_v<T, bf16>) {
        if (fast) {
          if (backward)
            rope_vec_kernel<T, true, kRopeVecDim><<<grid.x, kRopeVecThreads, 0, ctx.stream>>>(a, inv_freq_device);
          else
            rope_vec_kernel<T, false, kRopeVecDim><<<grid.x, kRopeVecThreads, 0, ctx.stream>>>(a, inv_freq_device);
          return;
        }
      }
      if (backward)
        vec ? launch(rope_kernel<X, T, true, true>) : launch(rope_kernel<X, T, true, false>);
      else
        vec ? launch(rope_kernel<X, T, false, true>) : launch(rope_kernel<X, T, false, false>);
    }
  });
  LAGA_CUDA_CHECK_LAUNCH("rope_kernel");
}

void attention_merge_op(Context& ctx, const AttentionMergeArgs& a) {
  LAGA_REQUIRE(a.batch >= 0 && a.q_len >= 0 && a.heads >= 0 && a.d_v >= 0, "attention merge: negative size");
  const i64 rows = a.q_len * a.batch * a.heads;
  if (rows == 0 || a.d_v == 0 || a.o == nullptr) return;
  dispatch_compute(a.dtype, "attention merge", [](auto) {});
  constexpr int kRowsPerBlock = kElementwiseThreads / 32;
  dispatch_pair(a.dtype, a.o_dtype.value_or(a.dtype), "attention merge", [&](auto zp, auto zo) {
    using P = decltype(zp);
    using O = decltype(zo);
    attention_merge_kernel<P, O><<<blocks_for(rows, kRowsPerBlock), kElementwiseThreads, 0, ctx.stream>>>(a, rows);
  });
  LAGA_CUDA_CHECK_LAUNCH("attention_merge_kernel");
}

}  // namespace laga::cuda
