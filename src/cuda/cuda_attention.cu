// Attention: validation, dispatch, and the eager kernel (cuBLASLt GEMMs around a masked softmax).
#include "cuda/cuda_attention.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/causal.hpp"
#include "core/softmax.hpp"
#include "cuda/cuda_gemm.cuh"
#include "cuda/cuda_ops.cuh"
#include "cuda/flash_tc.cuh"

namespace laga::cuda {
namespace {

constexpr int kRowThreads = 128;  // one block per score row
constexpr int kRowWarps = kRowThreads / 32;
constexpr float kNegInf = -INFINITY;

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
  const float inv = softmax_inv(sum);  // sum = 0 where n = 0
  for (i64 j = threadIdx.x; j < kv_len; j += kRowThreads)
    pr[j] = from_float<T>(j < n ? expf(s[j] - m) * inv : 0.f);
  if (lse != nullptr && threadIdx.x == 0) lse[row] = softmax_lse(m, sum);
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

// For the query heads h of [h0, h1), kv head g = h / group: C_h = alpha op(A_h) op(B_g) with
// A_h = a + (h - h0) a_hs, B_g = b + g b_gs, C_h = c + (h - h0) c_hs (a and c point at head h0's matrices, b at
// kv head 0's). One batched call for MHA (group 1), one per kv head otherwise (stride-0 B); [0, H) makes the
// same calls as before chunking existed.
void per_head_gemm(Context& ctx, MatmulArgs g, i64 h0, i64 h1, i64 group, i64 a_hs, i64 b_gs, i64 c_hs) {
  const std::size_t es_ab = g.ab_type == CUDA_R_32F ? 4 : 2, es_c = g.c_type == CUDA_R_32F ? 4 : 2;
  if (group == 1) {
    g.batch = h1 - h0;
    g.b = byte_ptr(g.b, h0 * b_gs, es_ab);
    g.stride_a = a_hs;
    g.stride_b = b_gs;
    g.stride_c = c_hs;
    ctx.gemm->run(g);
    return;
  }
  for (i64 kv = h0 / group; kv * group < h1; ++kv) {
    const i64 s = std::max(h0, kv * group), e = std::min(h1, (kv + 1) * group);
    MatmulArgs x = g;
    x.batch = e - s;
    x.stride_a = a_hs;
    x.stride_b = 0;
    x.stride_c = c_hs;
    x.a = byte_ptr(g.a, (s - h0) * a_hs, es_ab);
    x.b = byte_ptr(g.b, kv * b_gs, es_ab);
    x.c = byte_ptr(g.c, (s - h0) * c_hs, es_c);
    ctx.gemm->run(x);
  }
}

// ---------------------------------------------------------------- chunks of the score scratch
// Eager attention materialises [heads, q_len, kv_len] scores per batch entry (fp32; in the backward fp32 dP
// and dS in the storage dtype). At DeepSeek-V3 scale that is tens of GiB outside the allocator, so the heads
// are processed in chunks whose scratch (the scores slot) stays at or under ctx.eager_scratch_cap:
//  - `heads` heads with all their query rows: a multiple of the group when it is at least one group (chunks
//    are then whole kv groups), otherwise chunks of one kv group's heads;
//  - when one head's rows do not fit, one head at a time, `rows` query rows per chunk (at least one).
// Every head and query row is computed on its own (softmax rows, dQ rows, P V rows), so chunking changes no
// arithmetic except in the sums over heads and rows: dK of a kv group split over chunks is summed in an fp32
// buffer (dk_accum, one GEMM per chunk with beta = 1) and rounded once. dV never is: it reads the saved
// probabilities, which are whole. Results are still not bitwise those of an unchunked run in general: cuBLASLt's
// heuristic picks an algorithm per problem (batch count and operand alignment included), and a different
// algorithm (split-K, tile order) sums in a different order. A given cap always gives the same bits.
struct Chunking {
  i64 heads = 0;  // per chunk, all rows (rows == q_len), or 1
  i64 rows = 0;   // per chunk: q_len, or fewer with heads == 1
  i64 elements(i64 kv_len) const { return heads * rows * kv_len; }
};

struct Chunk {
  i64 h0, h1, r0, r1;
};

i64 round_up_256(i64 bytes) { return (bytes + 255) / 256 * 256; }

// Scores slot bytes for `e` score elements: fp32 scores (forward); fp32 dP then dS at a 256-byte boundary
// (backward, `ds_size` = sizeof the storage dtype).
i64 score_bytes(i64 e, std::size_t ds_size) {
  return ds_size == 0 ? 4 * e : round_up_256(4 * e) + i64(ds_size) * e;
}

// Largest n in [1, hi] with fits(n) (fits is monotone, decreasing); 1 when none fits.
template <typename F>
i64 largest_fitting(i64 hi, F&& fits) {
  i64 lo = 1;
  if (fits(hi)) return hi;
  while (hi - lo > 1) {
    const i64 mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

Chunking plan_chunks(std::size_t cap, i64 heads, i64 group, i64 sq, i64 sk, std::size_t ds_size) {
  const i64 per_head = sq * sk;
  const i64 limit = cap > std::size_t(INT64_MAX) ? INT64_MAX : i64(cap);
  if (per_head == 0) return {heads, sq};
  if (score_bytes(per_head, ds_size) <= limit) {
    i64 c = largest_fitting(heads, [&](i64 n) { return score_bytes(n * per_head, ds_size) <= limit; });
    if (c >= group) c -= c % group;
    return {c, sq};
  }
  return {1, largest_fitting(sq, [&](i64 n) { return score_bytes(n * sk, ds_size) <= limit; })};
}

// f(chunk) for every chunk of the plan: heads in order; a kv group's chunks consecutive, rows in order.
template <typename F>
void for_each_chunk(const Chunking& ch, i64 heads, i64 group, i64 sq, F&& f) {
  if (ch.rows < sq) {
    for (i64 h = 0; h < heads; ++h)
      for (i64 r = 0; r < sq; r += ch.rows) f(Chunk{h, h + 1, r, std::min(sq, r + ch.rows)});
  } else if (ch.heads >= group) {
    for (i64 h = 0; h < heads; h += ch.heads) f(Chunk{h, std::min(heads, h + ch.heads), 0, sq});
  } else {
    for (i64 g = 0; g < heads; g += group)
      for (i64 h = g; h < g + group; h += ch.heads) f(Chunk{h, std::min(g + group, h + ch.heads), 0, sq});
  }
}

template <typename T>
void eager_forward(Context& ctx, const AttentionFwdParams& p) {
  const i64 H = p.q_heads, group = p.q_heads / p.kv_heads, sq = p.q_len, sk = p.kv_len;
  const std::size_t es = sizeof(T);
  const cudaDataType_t dt = cuda_data_type(p.dtype);
  const i64 per_batch = H * sq * sk;
  const Chunking ch = plan_chunks(ctx.eager_scratch_cap, H, group, sq, sk, 0);
  float* scores = static_cast<float*>(
      ctx.scratch.get(ScratchSlot::scores, std::size_t(score_bytes(ch.elements(sk), 0)), ctx.stream));
  for (i64 b = 0; b < p.batch; ++b) {
    const void* q = byte_ptr(p.q, b * p.q_batch_stride, es);
    const void* k = byte_ptr(p.k, b * p.k_batch_stride, es);
    const void* v = byte_ptr(p.v, b * p.v_batch_stride, es);
    void* o = byte_ptr(p.o, b * p.o_batch_stride, es);
    T* probs = static_cast<T*>(p.probs) + b * per_batch;
    float* lse = p.lse ? static_cast<float*>(p.lse) + b * H * sq : nullptr;
    for_each_chunk(ch, H, group, sq, [&](const Chunk& c) {
      const i64 n = c.r1 - c.r0, rows = (c.h1 - c.h0) * n;
      T* pc = probs + c.h0 * sq * sk + c.r0 * sk;  // the chunk's rows are contiguous in probs
      // scores_h = scale Q_h K_g^T  (fp32)
      per_head_gemm(ctx,
                    MatmulArgs{.ab_type = dt, .c_type = CUDA_R_32F, .trans_b = Trans::Yes, .m = n, .n = sk,
                               .k = p.d_qk, .a = byte_ptr(q, c.h0 * p.q_head_stride + c.r0 * p.q_token_stride, es),
                               .lda = p.q_token_stride, .b = k, .ldb = p.k_token_stride, .c = scores, .ldc = sk,
                               .alpha = float(p.scale)},
                    c.h0, c.h1, group, p.q_head_stride, p.k_head_stride, n * sk);
      if (rows > 0) {
        eager_softmax_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, ctx.stream>>>(
            scores, pc, lse ? lse + c.h0 * sq + c.r0 : nullptr, n, sk, p.q_offset + c.r0);
        LAGA_CUDA_CHECK_LAUNCH("eager_softmax_kernel");
      }
      // O_h = P_h V_g
      per_head_gemm(ctx,
                    MatmulArgs{.ab_type = dt, .c_type = dt, .m = n, .n = p.d_v, .k = sk, .a = pc, .lda = sk, .b = v,
                               .ldb = p.v_token_stride,
                               .c = byte_ptr(o, c.h0 * p.o_head_stride + c.r0 * p.o_token_stride, es),
                               .ldc = p.o_token_stride},
                    c.h0, c.h1, group, sq * sk, p.v_head_stride, p.o_head_stride);
    });
  }
}

template <typename T>
void eager_backward(Context& ctx, const AttentionBwdParams& p) {
  const i64 H = p.q_heads, group = p.q_heads / p.kv_heads, sq = p.q_len, sk = p.kv_len;
  const std::size_t es = sizeof(T);
  const cudaDataType_t dt = cuda_data_type(p.dtype);
  const float scale = float(p.scale);
  const i64 per_batch = H * sq * sk;
  const Chunking ch = plan_chunks(ctx.eager_scratch_cap, H, group, sq, sk, es);
  const i64 chunk_elements = ch.elements(sk);
  // dP (fp32) and dS (storage dtype) of one chunk share the scores slot.
  char* slot = static_cast<char*>(
      ctx.scratch.get(ScratchSlot::scores, std::size_t(score_bytes(chunk_elements, es)), ctx.stream));
  float* dp = reinterpret_cast<float*>(slot);
  T* ds = reinterpret_cast<T*>(slot + round_up_256(4 * chunk_elements));
  const bool whole_groups = ch.rows == sq && ch.heads >= group;  // no kv group's dK sum is split
  T* gq = nullptr;
  T* gdo = nullptr;
  float* dk_acc = nullptr;
  if (group > 1) {  // a kv head's query heads gathered into one [heads * q_len, d] operand
    if (ch.rows == sq)
      gq = static_cast<T*>(
          ctx.scratch.get(ScratchSlot::gather_q, es * std::min(group, ch.heads) * sq * p.d_qk, ctx.stream));
    gdo = static_cast<T*>(ctx.scratch.get(ScratchSlot::gather_do, es * group * sq * p.d_v, ctx.stream));
  }
  if (!whole_groups)
    dk_acc = static_cast<float*>(ctx.scratch.get(ScratchSlot::dk_accum, sizeof(float) * sk * p.d_qk, ctx.stream));
  // A kv head's query heads [h0, h1) of Q (or dO) -> rows [0, (h1 - h0) q_len) of dst.
  auto gather = [&](T* dst, const void* src, i64 h0, i64 h1, i64 d, i64 head_stride, i64 token_stride) {
    copy_op(ctx, CopyArgs{.dtype = p.dtype, .batch = h1 - h0, .rows = sq, .cols = d,
                          .src = byte_ptr(src, h0 * head_stride, es), .src_ld = token_stride,
                          .src_batch_stride = head_stride, .dst = dst, .dst_ld = d, .dst_batch_stride = sq * d});
  };
  for (i64 b = 0; b < p.batch; ++b) {
    const void* q = byte_ptr(p.q, b * p.q_batch_stride, es);
    const void* k = byte_ptr(p.k, b * p.k_batch_stride, es);
    const void* v = byte_ptr(p.v, b * p.v_batch_stride, es);
    const void* dout = byte_ptr(p.dout, b * p.dout_batch_stride, es);
    void* dq = byte_ptr(p.dq, b * p.dq_batch_stride, es);
    void* dk = byte_ptr(p.dk, b * p.dk_batch_stride, es);
    void* dv = byte_ptr(p.dv, b * p.dv_batch_stride, es);
    const T* probs = static_cast<const T*>(p.probs) + b * per_batch;
    // dV_g = sum over the group of P_h^T dO_h: from the saved probabilities, not chunked.
    if (group == 1) {
      ctx.gemm->run(MatmulArgs{.ab_type = dt, .c_type = dt, .trans_a = Trans::Yes, .m = sk, .n = p.d_v, .k = sq,
                               .batch = H, .a = probs, .lda = sk, .stride_a = sq * sk, .b = dout,
                               .ldb = p.dout_token_stride, .stride_b = p.dout_head_stride, .c = dv,
                               .ldc = p.dv_token_stride, .stride_c = p.dv_head_stride});
    } else {  // the sum over the group is one GEMM with the group's rows stacked (k = group * q_len)
      for (i64 kv = 0; kv < p.kv_heads; ++kv) {
        gather(gdo, dout, kv * group, (kv + 1) * group, p.d_v, p.dout_head_stride, p.dout_token_stride);
        ctx.gemm->run(MatmulArgs{.ab_type = dt, .c_type = dt, .trans_a = Trans::Yes, .m = sk, .n = p.d_v,
                                 .k = group * sq, .a = probs + kv * group * sq * sk, .lda = sk, .b = gdo,
                                 .ldb = p.d_v, .c = byte_ptr(dv, kv * p.dv_head_stride, es),
                                 .ldc = p.dv_token_stride});
      }
    }
    for_each_chunk(ch, H, group, sq, [&](const Chunk& c) {
      const i64 n = c.r1 - c.r0, rows = (c.h1 - c.h0) * n;
      // dP_h = dO_h V_g^T  (fp32), then dS = P (dP - rowsum(P dP))  (storage dtype)
      per_head_gemm(ctx,
                    MatmulArgs{.ab_type = dt, .c_type = CUDA_R_32F, .trans_b = Trans::Yes, .m = n, .n = sk,
                               .k = p.d_v,
                               .a = byte_ptr(dout, c.h0 * p.dout_head_stride + c.r0 * p.dout_token_stride, es),
                               .lda = p.dout_token_stride, .b = v, .ldb = p.v_token_stride, .c = dp, .ldc = sk},
                    c.h0, c.h1, group, p.dout_head_stride, p.v_head_stride, n * sk);
      if (rows > 0) {
        eager_dscores_kernel<T><<<static_cast<unsigned>(rows), kRowThreads, 0, ctx.stream>>>(
            probs + c.h0 * sq * sk + c.r0 * sk, dp, ds, sk);
        LAGA_CUDA_CHECK_LAUNCH("eager_dscores_kernel");
      }
      // dQ_h = scale dS_h K_g
      per_head_gemm(ctx,
                    MatmulArgs{.ab_type = dt, .c_type = dt, .m = n, .n = p.d_qk, .k = sk, .a = ds, .lda = sk, .b = k,
                               .ldb = p.k_token_stride,
                               .c = byte_ptr(dq, c.h0 * p.dq_head_stride + c.r0 * p.dq_token_stride, es),
                               .ldc = p.dq_token_stride, .alpha = scale},
                    c.h0, c.h1, group, n * sk, p.k_head_stride, p.dq_head_stride);
      // dK_g = scale sum over the group of dS_h^T Q_h
      if (n == sq && c.h0 % group == 0 && c.h1 % group == 0) {  // whole kv groups, all rows: written directly
        if (group == 1) {
          ctx.gemm->run(MatmulArgs{.ab_type = dt, .c_type = dt, .trans_a = Trans::Yes, .m = sk, .n = p.d_qk,
                                   .k = sq, .batch = c.h1 - c.h0, .a = ds, .lda = sk, .stride_a = sq * sk,
                                   .b = byte_ptr(q, c.h0 * p.q_head_stride, es), .ldb = p.q_token_stride,
                                   .stride_b = p.q_head_stride, .c = byte_ptr(dk, c.h0 * p.dk_head_stride, es),
                                   .ldc = p.dk_token_stride, .stride_c = p.dk_head_stride, .alpha = scale});
          return;
        }
        for (i64 kv = c.h0 / group; kv < c.h1 / group; ++kv) {
          gather(gq, q, kv * group, (kv + 1) * group, p.d_qk, p.q_head_stride, p.q_token_stride);
          ctx.gemm->run(MatmulArgs{.ab_type = dt, .c_type = dt, .trans_a = Trans::Yes, .m = sk, .n = p.d_qk,
                                   .k = group * sq, .a = ds + (kv * group - c.h0) * sq * sk, .lda = sk, .b = gq,
                                   .ldb = p.d_qk, .c = byte_ptr(dk, kv * p.dk_head_stride, es),
                                   .ldc = p.dk_token_stride, .alpha = scale});
        }
        return;
      }
      // Part of one kv group's sum (heads of one group, or rows of one head): accumulated in fp32.
      const i64 kv = c.h0 / group;
      const bool first = c.h0 == kv * group && c.r0 == 0, last = c.h1 == (kv + 1) * group && c.r1 == sq;
      MatmulArgs acc{.ab_type = dt, .c_type = CUDA_R_32F, .trans_a = Trans::Yes, .m = sk, .n = p.d_qk, .k = rows,
                     .a = ds, .lda = sk, .c = dk_acc, .ldc = p.d_qk, .alpha = scale, .beta = first ? 0.f : 1.f};
      if (n == sq) {  // heads [h0, h1) of the group, stacked
        gather(gq, q, c.h0, c.h1, p.d_qk, p.q_head_stride, p.q_token_stride);
        acc.b = gq;
        acc.ldb = p.d_qk;
      } else {  // rows [r0, r1) of one head
        acc.b = byte_ptr(q, c.h0 * p.q_head_stride + c.r0 * p.q_token_stride, es);
        acc.ldb = p.q_token_stride;
      }
      ctx.gemm->run(acc);
      if (last)
        copy_op(ctx, CopyArgs{.dtype = DType::F32, .rows = sk, .cols = p.d_qk, .src = dk_acc, .src_ld = p.d_qk,
                              .dst = byte_ptr(dk, kv * p.dk_head_stride, es), .dst_ld = p.dk_token_stride,
                              .dst_dtype = p.dtype});
    });
  }
}

void check_common(const AttentionFwdParams& p, const char* op) {
  LAGA_REQUIRE(p.dtype == DType::F32 || p.dtype == DType::BF16, "cuda ", op, " supports float32 and bfloat16, got ",
               dtype_name(p.dtype));
  LAGA_REQUIRE(p.batch >= 0 && p.q_len >= 0 && p.kv_len >= 0, op, ": negative size (batch ", p.batch, ", q_len ",
               p.q_len, ", kv_len ", p.kv_len, ")");
  LAGA_REQUIRE(p.d_qk > 0 && p.d_v > 0, op, ": d_qk ", p.d_qk, " and d_v ", p.d_v, " must be positive");
  LAGA_REQUIRE(p.q_heads > 0 && p.kv_heads > 0 && p.q_heads % p.kv_heads == 0, op, ": q_heads ", p.q_heads,
               " must be a positive multiple of kv_heads ", p.kv_heads);
  LAGA_REQUIRE(p.q && p.k && p.v, op, ": q, k and v must be set");
  LAGA_REQUIRE(p.q_heads <= 65535 && p.batch <= 65535, op, ": q_heads ", p.q_heads, " and batch ", p.batch,
               " must be <= 65535 (grid limit)");
  if (p.kernel == AttentionKernel::Eager) {
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
  if (p.kernel == AttentionKernel::Fused) return flash_forward(ctx, p);
  dispatch_compute(p.dtype, "attention", [&](auto z) { eager_forward<decltype(z)>(ctx, p); });
}

void attention_backward(Context& ctx, const AttentionBwdParams& p) {
  check_common(p, "attention_backward");
  LAGA_REQUIRE(p.dout && p.dq && p.dk && (p.dv || p.dv_in_dk), "attention_backward: dout, dq, dk and dv must be set");
  LAGA_REQUIRE(p.dk != p.dv, "attention_backward: dk and dv must not alias");
  LAGA_REQUIRE(!p.dv_in_dk || attention_v_in_k(p), "attention_backward: dv_in_dk needs v inside k (same pointer and ",
               "strides, d_v <= d_qk)");
  if (p.kernel == AttentionKernel::Fused) LAGA_REQUIRE(p.o, "attention_backward: the fused kernel needs o");
  if (p.batch == 0) return;
  if (p.dv_in_dk && !(p.kernel == AttentionKernel::Fused && flash_tc_takes_dv_in_dk(ctx, p))) {
    // A path that writes dV apart: into scratch, then added into dk's first d_v columns.
    AttentionBwdParams q = p;
    q.dv_in_dk = false;
    const std::int64_t pairs = p.batch * p.kv_heads;
    q.dv = ctx.scratch.get(ScratchSlot::dv_sum, std::size_t(p.kv_len * pairs * p.d_v) * dtype_size(p.dtype), ctx.stream);
    q.dv_head_stride = p.d_v, q.dv_batch_stride = p.kv_heads * p.d_v, q.dv_token_stride = pairs * p.d_v;
    attention_backward(ctx, q);
    const std::size_t es = dtype_size(p.dtype);
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t g = 0; g < p.kv_heads; ++g)
        copy_op(ctx, CopyArgs{.dtype = p.dtype, .rows = p.kv_len, .cols = p.d_v,
                              .src = static_cast<const char*>(q.dv) + std::size_t(b * q.dv_batch_stride + g * p.d_v) * es,
                              .src_ld = q.dv_token_stride,
                              .dst = static_cast<char*>(p.dk) + std::size_t(b * p.dk_batch_stride + g * p.dk_head_stride) * es,
                              .dst_ld = p.dk_token_stride, .mode = CopyMode::Accumulate});
    return;
  }
  if (p.kernel == AttentionKernel::Fused) return flash_backward(ctx, p);
  dispatch_compute(p.dtype, "attention", [&](auto z) { eager_backward<decltype(z)>(ctx, p); });
}

}  // namespace laga::cuda
