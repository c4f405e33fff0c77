#include "cpu/cpu_attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/causal.hpp"
#include "core/softmax.hpp"
#include "laga/errors.hpp"

namespace laga::cpu {
namespace {

using i64 = std::int64_t;

// Fused tile sizes: a 64 x 64 score tile plus its Q/K/V rows stays in L2 for d_qk up to 576.
constexpr i64 kBlockM = 64;  // queries per tile
constexpr i64 kBlockN = 64;  // keys per tile

const char* dtype_label(DType d) {
  switch (d) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
  }
  return "unknown";
}

// Row-major C = alpha * op(A) * op(B) + beta * C. BLAS is not asked to handle k == 0 (its behaviour on
// beta there is not something to rely on), so that case is done here.
template <typename T>
void gemm(bool trans_a, bool trans_b, i64 m, i64 n, i64 k, T alpha, const T* a, i64 lda, const T* b,
          i64 ldb, T beta, T* c, i64 ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (i64 i = 0; i < m; ++i)
      for (i64 j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    return;
  }
  const auto ta = trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = trans_b ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// rows x cols block with row stride `stride` <-> dense rows x cols.
template <typename T>
void gather(const T* src, i64 stride, i64 rows, i64 cols, T* dst) {
  for (i64 r = 0; r < rows; ++r) std::copy_n(src + r * stride, cols, dst + r * cols);
}
template <typename T>
void scatter(const T* src, i64 rows, i64 cols, T* dst, i64 stride) {
  for (i64 r = 0; r < rows; ++r) std::copy_n(src + r * cols, cols, dst + r * stride);
}

// Typed access to one (batch, head) slice of the token-major operands.
template <typename T>
struct Operands {
  const AttentionFwdParams& p;
  i64 group;  // query heads per kv head

  explicit Operands(const AttentionFwdParams& params)
      : p(params), group(params.q_heads / params.kv_heads) {}

  static const T* at(const void* base, i64 batch_stride, i64 head_stride, i64 b, i64 h) {
    return static_cast<const T*>(base) + b * batch_stride + h * head_stride;
  }
  static T* at(void* base, i64 batch_stride, i64 head_stride, i64 b, i64 h) {
    return static_cast<T*>(base) + b * batch_stride + h * head_stride;
  }
  const T* q(i64 b, i64 h) const { return at(p.q, p.q_batch_stride, p.q_head_stride, b, h); }
  const T* k(i64 b, i64 g) const { return at(p.k, p.k_batch_stride, p.k_head_stride, b, g); }
  const T* v(i64 b, i64 g) const { return at(p.v, p.v_batch_stride, p.v_head_stride, b, g); }
  T* o(i64 b, i64 h) const { return at(p.o, p.o_batch_stride, p.o_head_stride, b, h); }
  T* lse(i64 b, i64 h) const { return static_cast<T*>(p.lse) + (b * p.q_heads + h) * p.q_len; }
  T* probs(i64 b, i64 h) const {
    return static_cast<T*>(p.probs) + (b * p.q_heads + h) * p.q_len * p.kv_len;
  }

  i64 visible(i64 i) const { return visible_keys(i, p.q_offset, p.kv_len); }  // core/causal.hpp

  void load_kv(i64 b, i64 g, T* kc, T* vc) const {
    gather(k(b, g), p.k_token_stride, p.kv_len, p.d_qk, kc);
    gather(v(b, g), p.v_token_stride, p.kv_len, p.d_v, vc);
  }
};

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// ---------------------------------------------------------------------------------------------------
// Eager

template <typename T>
void eager_forward(const AttentionFwdParams& p) {
  const Operands<T> x(p);
  const i64 sq = p.q_len, sk = p.kv_len;
  std::vector<T> qc(sq * p.d_qk), kc(sk * p.d_qk), vc(sk * p.d_v), oc(sq * p.d_v);
  for (i64 b = 0; b < p.batch; ++b) {
    for (i64 g = 0; g < p.kv_heads; ++g) {
      x.load_kv(b, g, kc.data(), vc.data());
      for (i64 h = g * x.group; h < (g + 1) * x.group; ++h) {
        gather(x.q(b, h), p.q_token_stride, sq, p.d_qk, qc.data());
        T* P = x.probs(b, h);
        gemm<T>(false, true, sq, sk, p.d_qk, T(p.scale), qc.data(), p.d_qk, kc.data(), p.d_qk, T(0), P, sk);
        for (i64 i = 0; i < sq; ++i) {
          T* row = P + i * sk;
          const i64 n = x.visible(i);
          T lse = T(kNegInf);
          if (n > 0) {
            const T m = *std::max_element(row, row + n);
            T sum = 0;
            for (i64 j = 0; j < n; ++j) sum += (row[j] = std::exp(row[j] - m));
            const T inv = softmax_inv(sum);
            for (i64 j = 0; j < n; ++j) row[j] *= inv;
            lse = softmax_lse(m, sum);
          }
          std::fill(row + n, row + sk, T(0));
          if (p.lse) x.lse(b, h)[i] = lse;
        }
        gemm<T>(false, false, sq, p.d_v, sk, T(1), P, sk, vc.data(), p.d_v, T(0), oc.data(), p.d_v);
        scatter(oc.data(), sq, p.d_v, x.o(b, h), p.o_token_stride);
      }
    }
  }
}

template <typename T>
void eager_backward(const AttentionBwdParams& p) {
  const Operands<T> x(p);
  const i64 sq = p.q_len, sk = p.kv_len;
  std::vector<T> qc(sq * p.d_qk), kc(sk * p.d_qk), vc(sk * p.d_v), doc(sq * p.d_v);
  std::vector<T> ds(sq * sk), dqc(sq * p.d_qk), dkc(sk * p.d_qk), dvc(sk * p.d_v);
  for (i64 b = 0; b < p.batch; ++b) {
    for (i64 g = 0; g < p.kv_heads; ++g) {
      x.load_kv(b, g, kc.data(), vc.data());
      // Summed over the query heads of this kv head (MQA), in head order.
      std::fill(dkc.begin(), dkc.end(), T(0));
      std::fill(dvc.begin(), dvc.end(), T(0));
      for (i64 h = g * x.group; h < (g + 1) * x.group; ++h) {
        gather(x.q(b, h), p.q_token_stride, sq, p.d_qk, qc.data());
        gather(Operands<T>::at(p.dout, p.dout_batch_stride, p.dout_head_stride, b, h), p.dout_token_stride,
               sq, p.d_v, doc.data());
        const T* P = x.probs(b, h);
        gemm<T>(false, true, sq, sk, p.d_v, T(1), doc.data(), p.d_v, vc.data(), p.d_v, T(0), ds.data(), sk);
        for (i64 i = 0; i < sq; ++i) {
          const T* pr = P + i * sk;
          T* dr = ds.data() + i * sk;
          T dot = 0;
          for (i64 j = 0; j < sk; ++j) dot += pr[j] * dr[j];
          for (i64 j = 0; j < sk; ++j) dr[j] = pr[j] * (dr[j] - dot);
        }
        const T scale = T(p.scale);
        gemm<T>(false, false, sq, p.d_qk, sk, scale, ds.data(), sk, kc.data(), p.d_qk, T(0), dqc.data(), p.d_qk);
        gemm<T>(true, false, sk, p.d_qk, sq, scale, ds.data(), sk, qc.data(), p.d_qk, T(1), dkc.data(), p.d_qk);
        gemm<T>(true, false, sk, p.d_v, sq, T(1), P, sk, doc.data(), p.d_v, T(1), dvc.data(), p.d_v);
        scatter(dqc.data(), sq, p.d_qk, Operands<T>::at(p.dq, p.dq_batch_stride, p.dq_head_stride, b, h),
                p.dq_token_stride);
      }
      scatter(dkc.data(), sk, p.d_qk, Operands<T>::at(p.dk, p.dk_batch_stride, p.dk_head_stride, b, g),
              p.dk_token_stride);
      scatter(dvc.data(), sk, p.d_v, Operands<T>::at(p.dv, p.dv_batch_stride, p.dv_head_stride, b, g),
              p.dv_token_stride);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Fused

template <typename T>
void fused_forward(const AttentionFwdParams& p) {
  const Operands<T> x(p);
  const i64 sq = p.q_len, sk = p.kv_len;
  std::vector<T> qc(sq * p.d_qk), kc(sk * p.d_qk), vc(sk * p.d_v);
  std::vector<T> s(kBlockM * kBlockN), acc(kBlockM * p.d_v), row_max(kBlockM), row_sum(kBlockM);
  for (i64 b = 0; b < p.batch; ++b) {
    for (i64 g = 0; g < p.kv_heads; ++g) {
      x.load_kv(b, g, kc.data(), vc.data());
      for (i64 h = g * x.group; h < (g + 1) * x.group; ++h) {
        gather(x.q(b, h), p.q_token_stride, sq, p.d_qk, qc.data());
        T* o = x.o(b, h);
        T* lse = x.lse(b, h);
        for (i64 m0 = 0; m0 < sq; m0 += kBlockM) {
          const i64 bm = std::min(kBlockM, sq - m0);
          std::fill(acc.begin(), acc.end(), T(0));
          std::fill(row_max.begin(), row_max.end(), T(kNegInf));
          std::fill(row_sum.begin(), row_sum.end(), T(0));
          // The tile's last query sees the most keys; tiles past that are fully masked.
          const i64 n_end = x.visible(m0 + bm - 1);
          for (i64 n0 = 0; n0 < n_end; n0 += kBlockN) {
            const i64 bn = std::min(kBlockN, n_end - n0);
            gemm<T>(false, true, bm, bn, p.d_qk, T(p.scale), qc.data() + m0 * p.d_qk, p.d_qk,
                    kc.data() + n0 * p.d_qk, p.d_qk, T(0), s.data(), kBlockN);
            for (i64 r = 0; r < bm; ++r) {
              T* sr = s.data() + r * kBlockN;
              const i64 nv = std::clamp<i64>(x.visible(m0 + r) - n0, 0, bn);
              if (nv == 0) {  // nothing visible in this tile: contributes nothing, state unchanged
                std::fill(sr, sr + bn, T(0));
                continue;
              }
              const T m_new = std::max(row_max[r], *std::max_element(sr, sr + nv));
              // exp(-inf) = 0 drops the (empty) previous state the first time a row sees a key.
              const T correction = std::exp(row_max[r] - m_new);
              T sum = 0;
              for (i64 j = 0; j < nv; ++j) sum += (sr[j] = std::exp(sr[j] - m_new));
              std::fill(sr + nv, sr + bn, T(0));
              row_sum[r] = row_sum[r] * correction + sum;
              row_max[r] = m_new;
              if (correction != T(1)) {
                T* ar = acc.data() + r * p.d_v;
                for (i64 c = 0; c < p.d_v; ++c) ar[c] *= correction;
              }
            }
            gemm<T>(false, false, bm, p.d_v, bn, T(1), s.data(), kBlockN, vc.data() + n0 * p.d_v, p.d_v, T(1),
                    acc.data(), p.d_v);
          }
          for (i64 r = 0; r < bm; ++r) {
            T* orow = o + (m0 + r) * p.o_token_stride;
            const T* ar = acc.data() + r * p.d_v;
            if (row_sum[r] == T(0)) {  // no visible key
              std::fill(orow, orow + p.d_v, T(0));
              lse[m0 + r] = T(kNegInf);
              continue;
            }
            const T inv = softmax_inv(row_sum[r]);
            for (i64 c = 0; c < p.d_v; ++c) orow[c] = ar[c] * inv;
            lse[m0 + r] = softmax_lse(row_max[r], row_sum[r]);
          }
        }
      }
    }
  }
}

template <typename T>
void fused_backward(const AttentionBwdParams& p) {
  const Operands<T> x(p);
  const i64 sq = p.q_len, sk = p.kv_len;
  std::vector<T> qc(sq * p.d_qk), kc(sk * p.d_qk), vc(sk * p.d_v), doc(sq * p.d_v), delta(sq);
  std::vector<T> dqc(sq * p.d_qk), dkc(sk * p.d_qk), dvc(sk * p.d_v);
  std::vector<T> pt(kBlockM * kBlockN), dst(kBlockM * kBlockN);
  const T scale = T(p.scale);
  for (i64 b = 0; b < p.batch; ++b) {
    for (i64 g = 0; g < p.kv_heads; ++g) {
      x.load_kv(b, g, kc.data(), vc.data());
      std::fill(dkc.begin(), dkc.end(), T(0));
      std::fill(dvc.begin(), dvc.end(), T(0));
      for (i64 h = g * x.group; h < (g + 1) * x.group; ++h) {
        gather(x.q(b, h), p.q_token_stride, sq, p.d_qk, qc.data());
        gather(Operands<T>::at(p.dout, p.dout_batch_stride, p.dout_head_stride, b, h), p.dout_token_stride,
               sq, p.d_v, doc.data());
        const T* lse = x.lse(b, h);
        // D = rowsum(dO * O) equals rowsum(dP * P), so the softmax backward needs no q_len x kv_len row.
        const T* o = x.o(b, h);
        for (i64 i = 0; i < sq; ++i) {
          const T* orow = o + i * p.o_token_stride;
          const T* drow = doc.data() + i * p.d_v;
          T dot = 0;
          for (i64 c = 0; c < p.d_v; ++c) dot += drow[c] * orow[c];
          delta[i] = dot;
        }
        std::fill(dqc.begin(), dqc.end(), T(0));
        for (i64 n0 = 0; n0 < sk; n0 += kBlockN) {
          const i64 bn = std::min(kBlockN, sk - n0);
          const T* kt = kc.data() + n0 * p.d_qk;
          const T* vt = vc.data() + n0 * p.d_v;
          for (i64 m0 = 0; m0 < sq; m0 += kBlockM) {
            const i64 bm = std::min(kBlockM, sq - m0);
            if (x.visible(m0 + bm - 1) <= n0) continue;  // whole tile masked
            const T* qt = qc.data() + m0 * p.d_qk;
            const T* dot = doc.data() + m0 * p.d_v;
            // P recomputed from the saved log-sum-exp.
            gemm<T>(false, true, bm, bn, p.d_qk, scale, qt, p.d_qk, kt, p.d_qk, T(0), pt.data(), kBlockN);
            for (i64 r = 0; r < bm; ++r) {
              T* pr = pt.data() + r * kBlockN;
              const i64 nv = std::clamp<i64>(x.visible(m0 + r) - n0, 0, bn);
              const T l = lse[m0 + r];
              for (i64 j = 0; j < nv; ++j) pr[j] = std::exp(pr[j] - l);
              std::fill(pr + nv, pr + bn, T(0));
            }
            gemm<T>(true, false, bn, p.d_v, bm, T(1), pt.data(), kBlockN, dot, p.d_v, T(1),
                    dvc.data() + n0 * p.d_v, p.d_v);
            gemm<T>(false, true, bm, bn, p.d_v, T(1), dot, p.d_v, vt, p.d_v, T(0), dst.data(), kBlockN);
            for (i64 r = 0; r < bm; ++r) {
              const T* pr = pt.data() + r * kBlockN;
              T* dr = dst.data() + r * kBlockN;
              for (i64 j = 0; j < bn; ++j) dr[j] = pr[j] * (dr[j] - delta[m0 + r]);
            }
            gemm<T>(true, false, bn, p.d_qk, bm, scale, dst.data(), kBlockN, qt, p.d_qk, T(1),
                    dkc.data() + n0 * p.d_qk, p.d_qk);
            gemm<T>(false, false, bm, p.d_qk, bn, scale, dst.data(), kBlockN, kt, p.d_qk, T(1),
                    dqc.data() + m0 * p.d_qk, p.d_qk);
          }
        }
        scatter(dqc.data(), sq, p.d_qk, Operands<T>::at(p.dq, p.dq_batch_stride, p.dq_head_stride, b, h),
                p.dq_token_stride);
      }
      scatter(dkc.data(), sk, p.d_qk, Operands<T>::at(p.dk, p.dk_batch_stride, p.dk_head_stride, b, g),
              p.dk_token_stride);
      scatter(dvc.data(), sk, p.d_v, Operands<T>::at(p.dv, p.dv_batch_stride, p.dv_head_stride, b, g),
              p.dv_token_stride);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Validation and dispatch

void check_common(const AttentionFwdParams& p, const char* op) {
  LAGA_CHECK(p.dtype == DType::F32 || p.dtype == DType::F64, "cpu ", op, " supports f32 and f64 only, got ",
             dtype_label(p.dtype));
  LAGA_CHECK(p.batch >= 0 && p.q_len >= 0 && p.kv_len >= 0, op, ": negative size (batch ", p.batch,
             ", q_len ", p.q_len, ", kv_len ", p.kv_len, ")");
  LAGA_CHECK(p.d_qk > 0 && p.d_v > 0, op, ": d_qk ", p.d_qk, " and d_v ", p.d_v, " must be positive");
  LAGA_CHECK(p.q_heads > 0 && p.kv_heads > 0 && p.q_heads % p.kv_heads == 0, op, ": q_heads ", p.q_heads,
             " must be a positive multiple of kv_heads ", p.kv_heads);
  LAGA_CHECK(p.q && p.k && p.v, op, ": q, k and v must be set");
  if (p.kernel == AttentionKernel::Eager)
    LAGA_CHECK(p.probs, op, ": the eager kernel needs probs");
  else
    LAGA_CHECK(p.lse, op, ": the fused kernel needs lse");
}

bool no_queries(const AttentionFwdParams& p) { return p.batch == 0 || p.q_len == 0; }

}  // namespace

void attention_forward(const AttentionFwdParams& p) {
  check_common(p, "attention_forward");
  LAGA_CHECK(p.o, "attention_forward: o must be set");
  if (no_queries(p)) return;
  const bool f32 = p.dtype == DType::F32;
  if (p.kernel == AttentionKernel::Eager)
    f32 ? eager_forward<float>(p) : eager_forward<double>(p);
  else
    f32 ? fused_forward<float>(p) : fused_forward<double>(p);
}

// dv_in_dk: dV into a buffer of its own, then added into dk's first d_v columns.
template <typename T>
void backward_dv_in_dk(const AttentionBwdParams& p) {
  AttentionBwdParams q = p;
  q.dv_in_dk = false;
  const i64 pairs = p.batch * p.kv_heads;
  std::vector<T> dv(static_cast<std::size_t>(p.kv_len * pairs * p.d_v));
  q.dv = dv.data();
  q.dv_head_stride = p.d_v, q.dv_batch_stride = p.kv_heads * p.d_v, q.dv_token_stride = pairs * p.d_v;
  attention_backward(q);
  T* dk = static_cast<T*>(p.dk);
  for (i64 j = 0; j < p.kv_len; ++j)
    for (i64 b = 0; b < p.batch; ++b)
      for (i64 g = 0; g < p.kv_heads; ++g)
        for (i64 c = 0; c < p.d_v; ++c)
          dk[j * p.dk_token_stride + b * p.dk_batch_stride + g * p.dk_head_stride + c] +=
              dv[static_cast<std::size_t>(j * q.dv_token_stride + b * q.dv_batch_stride + g * q.dv_head_stride + c)];
}

void attention_backward(const AttentionBwdParams& p) {
  check_common(p, "attention_backward");
  LAGA_CHECK(p.dout && p.dq && p.dk && (p.dv || p.dv_in_dk), "attention_backward: dout, dq, dk and dv must be set");
  LAGA_CHECK(p.dk != p.dv, "attention_backward: dk and dv must not alias");
  LAGA_CHECK(!p.dv_in_dk || attention_v_in_k(p), "attention_backward: dv_in_dk needs v inside k");
  if (p.kernel == AttentionKernel::Fused) LAGA_CHECK(p.o, "attention_backward: the fused kernel needs o");
  if (p.batch == 0) return;
  const bool f32 = p.dtype == DType::F32;
  if (p.dv_in_dk) return f32 ? backward_dv_in_dk<float>(p) : backward_dv_in_dk<double>(p);
  if (p.kernel == AttentionKernel::Eager)
    f32 ? eager_backward<float>(p) : eager_backward<double>(p);
  else
    f32 ? fused_backward<float>(p) : fused_backward<double>(p);
}

}  // namespace laga::cpu
