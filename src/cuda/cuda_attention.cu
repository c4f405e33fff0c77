// Attention: validation, dispatch, and the eager kernel (cuBLASLt GEMMs around a masked softmax).
#include "cuda/cuda_attention.cuh"

#include <cmath>

#include "cuda/cuda_gemm.cuh"
#include "cuda/cuda_ops.cuh"

namespace laga::cuda {
namespace {

constexpr int kRowThreads = 128;  // one block per score row
constexpr int kRowWarps = kRowThreads / 32;
constexpr float kNegInf = -INFINITY;

// Keys visible to query i: 0 .. i + q_offset, clamped (a negative offset gives empty rows).
__device__ __forceinline__ i64 visible_keys(i64 i, i64 q_offset, i64 kv_len) {
  const i64 n = i + q_offset + 1;
  return n < 0 ? 0 : (n > kv_len ? kv_len : n);
}

// probs[row] = softmax of the visible prefix of scores[row] (rows are (head, query) of one batch entry),
// zero past it; lse (may be null) = max + log(sum), -inf for a row with no visible key.
template <typename T>
__global__ void __launch_bounds__(kRowThreads)
    eager_softmax_kernel(const float* scores, T* probs, float* lse, i64 q_len, i64 kv_len, i64 q_offset) {
  __shared__ float red[kRowWarps];
  const i64 row = blockIdx.x;
  const i64 i = row % q_len;
  const float* s = scores + row * kv_len;
  T* pr = probs + row * kv_len;
  const i64 n = visible_keys(i, q_offset, kv_len);
  float m = kNegInf;
  for (i64 j = threadIdx.x; j < n; j += kRowThreads) m = fmaxf(m, s[j]);
  m = block_reduce<true>(m, red);
  float sum = 0.f;
  for (i64 j = threadIdx.x; j < n; j += kRowThreads) sum += expf(s[j] - m);
  sum = block_reduce<false>(sum, red);
  const float inv = n > 0 ? 1.0f / sum : 0.f;
  for (i64 j = threadIdx.x; j < kv_len; j += kRowThreads)
    pr[j] = from_float<T>(j < n ? expf(s[j] - m) * inv : 0.f);
  if (lse != nullptr && threadIdx.x == 0) lse[row] = n > 0 ? m + logf(sum) : kNegInf;
}

// dS = P * (dP - rowsum(P * dP)), one block per (head, query) row.
template <typename T>
__global__ void __launch_bounds__(kRowThreads) eager_dscores_kernel(const T* probs, const float* dp, T* ds, i64 kv_len) {
  __shared__ float red[kRowWarps];
  const i64 row = blockIdx.x;
  const T* pr = probs + row * kv_len;
  const float* dr = dp + row * kv_len;
  T* out = ds + row * kv_len;
  float dot = 0.f;
  for (i64 j = threadIdx.x; j < kv_len; j += kRowThreads) dot = fmaf(to_float(pr[j]), dr[j], dot);
  dot = block_reduce<false>(dot, red);
  for (i64 j = threadIdx.x; j < kv_len; j += kRowThreads) out[j] = from_float<T>(to_float(pr[j]) * (dr[j] - dot));
}

const char* byte_ptr(const void* p, i64 elements, std::size_t es) {
  return static_cast<const char*>(p) + elements * static_cast<i64>(es);
}
char* byte_ptr(void* p, i64 elements, std::size_t es) { return static_cast<char*>(p) + elements * static_cast<i64>(es); }

// For every query head h of kv head g = h / group: C_h = alpha op(A_h) op(B_g) with A_h = a + h * a_hs,
// B_g = b + g * b_gs, C_h = c + h * c_hs. One batched call for MHA (group 1) and MQA (one kv head), one per
// kv head otherwise.
void per_head_gemm(Context& ctx, MatmulArgs g, i64 heads, i64 group, i64 a_hs, i64 b_gs, i64 c_hs) {
  const std::size_t es_ab = g.ab_type == CUDA_R_32F ? 4 : 2, es_c = g.c_type == CUDA_R_32F ? 4 : 2;
  if (group == 1) {
    g.batch = heads;
    g.stride_a = a_hs;
    g.stride_b = b_gs;
    g.stride_c = c_hs;
    ctx.gemm->run(g);
    return;
  }
  for (i64 kv = 0; kv < heads / group; ++kv) {
    MatmulArgs x = g;
    x.batch = group;
    x.stride_a = a_hs;
    x.stride_b = 0;
    x.stride_c = c_hs;
    x.a = byte_ptr(g.a, kv * group * a_hs, es_ab);
    x.b = byte_ptr(g.b, kv * b_gs, es_ab);
    x.c = byte_ptr(g.c, kv * group * c_hs, es_c);
    ctx.gemm->run(x);
  }
}

template <typename T>
void eager_forward(Context& ctx, const AttentionFwdParams& p) {
  const i64 H = p.q_heads, group = p.q_heads / p.kv_heads, sq = p.q_len, sk = p.kv_len;
  const std::size_t es = sizeof(T);
  const cudaDataType_t dt = cuda_data_type(p.dtype);
  const i64 per_batch = H * sq * sk;
  float* scores = static_cast<float*>(ctx.scratch.get(ScratchSlot::scores, sizeof(float) * per_batch, ctx.stream));
  for (i64 b = 0; b < p.batch; ++b) {
    const void* q = byte_ptr(p.q, b * p.q_batch_stride, es);
    const void* k = byte_ptr(p.k, b * p.k_batch_stride, es);
    const void* v = byte_ptr(p.v, b * p.v_batch_stride, es);
    void* o = byte_ptr(p.o, b * p.o_batch_stride, es);
    T* probs = static_cast<T*>(p.probs) + b * per_batch;
    // scores_h = scale Q_h K_g^T  (fp32)
    per_head_gemm(ctx,
                  MatmulArgs{.ab_type = dt, .c_type = CUDA_R_32F, .trans_b = Trans::yes, .m = sq, .n = sk, .k = p.d_qk,
                             .a = q, .lda = p.q_token_stride, .b = k, .ldb = p.k_token_stride, .c = scores, .ldc = sk,
                             .alpha = float(p.scale)},
                  H, group, p.q_head_stride, p.k_head_stride, sq * sk);
    eager_softmax_kernel<T><<<static_cast<unsigned>(H * sq), kRowThreads, 0, ctx.stream>>>(
        scores, probs, p.lse ? static_cast<float*>(p.lse) + b * H * sq : nullptr, sq, sk, p.q_offset);
    LAGA_CUDA_CHECK_LAUNCH("eager_softmax_kernel");
    // O_h = P_h V_g
    per_head_gemm(ctx,
                  MatmulArgs{.ab_type = dt, .c_type = dt, .m = sq, .n = p.d_v, .k = sk, .a = probs, .lda = sk, .b = v,
                             .ldb = p.v_token_stride, .c = o, .ldc = p.o_token_stride},
                  H, group, sq * sk, p.v_head_stride, p.o_head_stride);
  }
}

template <typename T>
void eager_backward(Context& ctx, const AttentionBwdParams& p) {
  const i64 H = p.q_heads, group = p.q_heads / p.kv_heads, sq = p.q_len, sk = p.kv_len;
  const std::size_t es = sizeof(T);
  const cudaDataType_t dt = cuda_data_type(p.dtype);
  const float scale = float(p.scale);
  const i64 per_batch = H * sq * sk;
  float* dp = static_cast<float*>(ctx.scratch.get(ScratchSlot::scores, sizeof(float) * per_batch, ctx.stream));
  T* ds = static_cast<T*>(ctx.scratch.get(ScratchSlot::dscores, es * per_batch, ctx.stream));
  T* gq = nullptr;
  T* gdo = nullptr;
  if (group > 1) {  // a kv head's query heads gathered into one [group * q_len, d] operand
    gq = static_cast<T*>(ctx.scratch.get(ScratchSlot::gather_q, es * group * sq * p.d_qk, ctx.stream));
    gdo = static_cast<T*>(ctx.scratch.get(ScratchSlot::gather_do, es * group * sq * p.d_v, ctx.stream));
  }
  for (i64 b = 0; b < p.batch; ++b) {
    const void* q = byte_ptr(p.q, b * p.q_batch_stride, es);
    const void* k = byte_ptr(p.k, b * p.k_batch_stride, es);
    const void* v = byte_ptr(p.v, b * p.v_batch_stride, es);
    const void* dout = byte_ptr(p.dout, b * p.dout_batch_stride, es);
    void* dq = byte_ptr(p.dq, b * p.dq_batch_stride, es);
    void* dk = byte_ptr(p.dk, b * p.dk_batch_stride, es);
    void* dv = byte_ptr(p.dv, b * p.dv_batch_stride, es);
    const T* probs = static_cast<const T*>(p.probs) + b * per_batch;
    // dP_h = dO_h V_g^T  (fp32), then dS = P (dP - rowsum(P dP))  (storage dtype)
    per_head_gemm(ctx,
                  MatmulArgs{.ab_type = dt, .c_type = CUDA_R_32F, .trans_b = Trans::yes, .m = sq, .n = sk, .k = p.d_v,
                             .a = dout, .lda = p.dout_token_stride, .b = v, .ldb = p.v_token_stride, .c = dp, .ldc = sk},
                  H, group, p.dout_head_stride, p.v_head_stride, sq * sk);
    if (H * sq > 0) {
      eager_dscores_kernel<T><<<static_cast<unsigned>(H * sq), kRowThreads, 0, ctx.stream>>>(probs, dp, ds, sk);
      LAGA_CUDA_CHECK_LAUNCH("eager_dscores_kernel");
    }
    // dQ_h = scale dS_h K_g
    per_head_gemm(ctx,
                  MatmulArgs{.ab_type = dt, .c_type = dt, .m = sq, .n = p.d_qk, .k = sk, .a = ds, .lda = sk, .b = k,
                             .ldb = p.k_token_stride, .c = dq, .ldc = p.dq_token_stride, .alpha = scale},
                  H, group, sq * sk, p.k_head_stride, p.dq_head_stride);
    if (group == 1) {
      // dK_h = scale dS_h^T Q_h,  dV_h = P_h^T dO_h
      ctx.gemm->run(MatmulArgs{.ab_type = dt, .c_type = dt, .trans_a = Trans::yes, .m = sk, .n = p.d_qk, .k = sq,
                               .batch = H, .a = ds, .lda = sk, .stride_a = sq * sk, .b = q, .ldb = p.q_token_stride,
                               .stride_b = p.q_head_stride, .c = dk, .ldc = p.dk_token_stride,
                               .stride_c = p.dk_head_stride, .alpha = scale});
      ctx.gemm->run(MatmulArgs{.ab_type = dt, .c_type = dt, .trans_a = Trans::yes, .m = sk, .n = p.d_v, .k = sq,
                               .batch = H, .a = probs, .lda = sk, .stride_a = sq * sk, .b = dout,
                               .ldb = p.dout_token_stride, .stride_b = p.dout_head_stride, .c = dv,
                               .ldc = p.dv_token_stride, .stride_c = p.dv_head_stride});
      continue;
    }
    // Shared kv heads: the sum over the group is one GEMM with the group's rows stacked (k = group * q_len).
    for (i64 kv = 0; kv < p.kv_heads; ++kv) {
      const i64 h0 = kv * group;
      copy_op(ctx, CopyArgs{.dtype = p.dtype, .batch = group, .rows = sq, .cols = p.d_qk,
                            .src = byte_ptr(q, h0 * p.q_head_stride, es), .src_ld = p.q_token_stride,
                            .src_batch_stride = p.q_head_stride, .dst = gq, .dst_ld = p.d_qk,
                            .dst_batch_stride = sq * p.d_qk});
      copy_op(ctx, CopyArgs{.dtype = p.dtype, .batch = group, .rows = sq, .cols = p.d_v,
                            .src = byte_ptr(dout, h0 * p.dout_head_stride, es), .src_ld = p.dout_token_stride,
                            .src_batch_stride = p.dout_head_stride, .dst = gdo, .dst_ld = p.d_v,
                            .dst_batch_stride = sq * p.d_v});
      ctx.gemm->run(MatmulArgs{.ab_type = dt, .c_type = dt, .trans_a = Trans::yes, .m = sk, .n = p.d_qk,
                               .k = group * sq, .a = ds + h0 * sq * sk, .lda = sk, .b = gq, .ldb = p.d_qk,
                               .c = byte_ptr(dk, kv * p.dk_head_stride, es), .ldc = p.dk_token_stride,
                               .alpha = scale});
      ctx.gemm->run(MatmulArgs{.ab_type = dt, .c_type = dt, .trans_a = Trans::yes, .m = sk, .n = p.d_v,
                               .k = group * sq, .a = probs + h0 * sq * sk, .lda = sk, .b = gdo, .ldb = p.d_v,
                               .c = byte_ptr(dv, kv * p.dv_head_stride, es), .ldc = p.dv_token_stride});
    }
  }
}

void check_common(const AttentionFwdParams& p, const char* op) {
  LAGA_REQUIRE(p.dtype == DType::f32 || p.dtype == DType::bf16, "cuda ", op, " supports float32 and bfloat16, got ",
               dtype_name(p.dtype));
  LAGA_REQUIRE(p.batch >= 0 && p.q_len >= 0 && p.kv_len >= 0, op, ": negative size (batch ", p.batch, ", q_len ",
               p.q_len, ", kv_len ", p.kv_len, ")");
  LAGA_REQUIRE(p.d_qk > 0 && p.d_v > 0, op, ": d_qk ", p.d_qk, " and d_v ", p.d_v, " must be positive");
  LAGA_REQUIRE(p.q_heads > 0 && p.kv_heads > 0 && p.q_heads % p.kv_heads == 0, op, ": q_heads ", p.q_heads,
               " must be a positive multiple of kv_heads ", p.kv_heads);
  LAGA_REQUIRE(p.q && p.k && p.v, op, ": q, k and v must be set");
  LAGA_REQUIRE(p.q_heads <= 65535 && p.batch <= 65535, op, ": q_heads ", p.q_heads, " and batch ", p.batch,
               " must be <= 65535 (grid limit)");
  if (p.kernel == AttentionKernel::eager) {
    LAGA_REQUIRE(p.probs, op, ": the eager kernel needs probs");
    LAGA_REQUIRE(p.q_heads * p.q_len <= INT32_MAX, op, ": q_heads * q_len = ", p.q_heads * p.q_len,
                 " exceeds the grid limit");
  } else {
    LAGA_REQUIRE(p.lse, op, ": the fused kernel needs lse");
    LAGA_REQUIRE(p.d_qk <= kFlashMaxHeadDim && p.d_v <= kFlashMaxHeadDim, op, ": the fused kernel supports head dims up to ",
                 kFlashMaxHeadDim, ", got d_qk ", p.d_qk, " and d_v ", p.d_v);
  }
}

}  // namespace

void attention_forward(Context& ctx, const AttentionFwdParams& p) {
  check_common(p, "attention_forward");
  LAGA_REQUIRE(p.o, "attention_forward: o must be set");
  if (p.batch == 0 || p.q_len == 0) return;
  if (p.kernel == AttentionKernel::fused) return flash_forward(ctx, p);
  dispatch_compute(p.dtype, "attention", [&](auto z) { eager_forward<decltype(z)>(ctx, p); });
}

void attention_backward(Context& ctx, const AttentionBwdParams& p) {
  check_common(p, "attention_backward");
  LAGA_REQUIRE(p.dout && p.dq && p.dk && p.dv, "attention_backward: dout, dq, dk and dv must be set");
  LAGA_REQUIRE(p.dk != p.dv, "attention_backward: dk and dv must not alias");
  if (p.kernel == AttentionKernel::fused) LAGA_REQUIRE(p.o, "attention_backward: the fused kernel needs o");
  if (p.batch == 0) return;
  if (p.kernel == AttentionKernel::fused) return flash_backward(ctx, p);
  dispatch_compute(p.dtype, "attention", [&](auto z) { eager_backward<decltype(z)>(ctx, p); });
}

}  // namespace laga::cuda
