// CPU backend: float32 and float64, GEMMs through OpenBLAS, the rest as plain loops.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>

#include "cpu/cpu_attention.hpp"
#include "laga/backend.hpp"
#include "laga/errors.hpp"
#include "laga/hosted.hpp"

namespace laga {
namespace {

CBLAS_TRANSPOSE to_cblas(Trans t) { return t == Trans::Yes ? CblasTrans : CblasNoTrans; }

template <typename T>
void gemm_impl(const GemmArgs& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  for (std::int64_t i = 0; i < g.batch; ++i) {
    const T* ai = a + i * g.stride_a;
    const T* bi = b + i * g.stride_b;
    T* ci = c + i * g.stride_c;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, to_cblas(g.trans_a), to_cblas(g.trans_b), g.m, g.n, g.k, float(g.alpha), ai,
                  g.lda, bi, g.ldb, float(g.beta), ci, g.ldc);
    else
      cblas_dgemm(CblasRowMajor, to_cblas(g.trans_a), to_cblas(g.trans_b), g.m, g.n, g.k, g.alpha, ai, g.lda,
                  bi, g.ldb, g.beta, ci, g.ldc);
  }
}

template <typename T>
void copy_impl(const CopyArgs& c) {
  const T* src = static_cast<const T*>(c.src);
  T* dst = static_cast<T*>(c.dst);
  for (std::int64_t b = 0; b < c.batch; ++b)
    for (std::int64_t r = 0; r < c.rows; ++r) {
      const T* s = src + b * c.src_batch_stride + r * c.src_ld;
      T* d = dst + b * c.dst_batch_stride + r * c.dst_ld;
      if (c.mode == CopyMode::Assign || (c.mode == CopyMode::Sum && b == 0)) {
        if (s != d) std::memmove(d, s, sizeof(T) * c.cols);
      } else {
        for (std::int64_t j = 0; j < c.cols; ++j) d[j] += s[j];
      }
    }
}

// Statistics in double for both dtypes: cheap here and keeps float32 close to the float64 reference.
template <typename T>
void rmsnorm_forward_impl(const RmsNormArgs& a) {
  using Acc = T;  // rstd is stored in accum_dtype: float for f32, double for f64
  const T* x = static_cast<const T*>(a.x);
  const T* gamma = static_cast<const T*>(a.gamma);
  T* y = static_cast<T*>(a.y);
  Acc* rstd = static_cast<Acc*>(a.rstd);
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const T* xr = x + r * a.x_ld;
    double ss = 0;
    for (std::int64_t j = 0; j < a.cols; ++j) ss += double(xr[j]) * double(xr[j]);
    const Acc rs = Acc(1.0 / std::sqrt(ss / double(a.cols) + a.eps));
    rstd[r] = rs;
    T* yr = y + r * a.y_ld;
    for (std::int64_t j = 0; j < a.cols; ++j) yr[j] = T(xr[j] * rs * gamma[j]);
  }
}

// y = x * rstd * g:  dx = rstd * (dy*g) - x * rstd^3 * mean(dy*g*x);  dgamma += sum_rows dy * x * rstd.
template <typename T>
void rmsnorm_backward_impl(const RmsNormArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  const T* gamma = static_cast<const T*>(a.gamma);
  const T* rstd = static_cast<const T*>(a.rstd);
  const T* dy = static_cast<const T*>(a.dy);
  T* dx = static_cast<T*>(a.dx);
  T* dgamma = static_cast<T*>(a.dgamma);
  for (std::int64_t r = 0; r < a.rows; ++r) {
    const T* xr = x + r * a.x_ld;
    const T* dyr = dy + r * a.dy_ld;
    T* dxr = dx + r * a.dx_ld;
    const double rs = rstd[r];
    double dot = 0;
    for (std::int64_t j = 0; j < a.cols; ++j) dot += double(dyr[j]) * double(gamma[j]) * double(xr[j]);
    const double coef = rs * rs * rs * dot / double(a.cols);
    for (std::int64_t j = 0; j < a.cols; ++j) {
      dxr[j] = T(rs * double(dyr[j]) * double(gamma[j]) - double(xr[j]) * coef);
      dgamma[j] += T(double(dyr[j]) * double(xr[j]) * rs);
    }
  }
}

// Forward: (x[2i], x[2i+1]) -> y[i] = x[2i] c - x[2i+1] s,  y[i+h] = x[2i+1] c + x[2i] s  (h = dim/2).
// Backward is the transpose: dx[2i] = dy[i] c + dy[i+h] s,  dx[2i+1] = -dy[i] s + dy[i+h] c.
template <typename T, bool kBackward>
void rope_impl(const RopeArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const std::int64_t half = a.dim / 2;
  std::vector<double> cs(half), sn(half), row(a.dim);  // the row is read whole before it is written: y may be x
  for (std::int64_t t = 0; t < a.tokens; ++t) {
    const double pos = double(a.pos_offset + t);
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = pos * a.inv_freq[i];
      cs[i] = std::cos(angle) * a.mscale;
      sn[i] = std::sin(angle) * a.mscale;
    }
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t h = 0; h < a.heads; ++h) {
        const T* xh = x + t * a.x_token_stride + b * a.x_batch_stride + a.x_head_offset(h);
        T* yh = y + t * a.y_token_stride + b * a.y_batch_stride + a.y_head_offset(h);
        if (xh != yh) std::copy(xh, xh + a.copy_cols, yh);
        const T* xs = xh + a.copy_cols;
        T* ys = yh + a.copy_cols;
        std::copy(xs, xs + a.dim, row.begin());
        for (std::int64_t i = 0; i < half; ++i) {
          if constexpr (!kBackward) {
            const double x0 = row[2 * i], x1 = row[2 * i + 1];
            ys[i] = T(x0 * cs[i] - x1 * sn[i]);
            ys[i + half] = T(x1 * cs[i] + x0 * sn[i]);
          } else {
            const double d0 = row[i], d1 = row[i + half];
            ys[2 * i] = T(d0 * cs[i] + d1 * sn[i]);
            ys[2 * i + 1] = T(-d0 * sn[i] + d1 * cs[i]);
          }
        }
      }
  }
}

template <typename F>
void dispatch(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::F64: f(double{}); return;
    default: LAGA_REQUIRE(false, "dtype ", dtype_name(t), " is not supported by the cpu backend (", op, "): use float32 or float64");
  }
}

// The cpu backend computes in one dtype per op (float32 accumulates in float32): a second dtype must match.
void require_one_dtype(const char* op, DType dtype, const std::optional<DType>& other, const char* field) {
  LAGA_CHECK(!other || *other == dtype, "cpu ", op, ": ", field, " is ", dtype_name(*other), " but the op's dtype is ",
             dtype_name(dtype), " (the cpu backend needs one dtype)");
}

template <typename T>
void attention_merge_impl(const AttentionMergeArgs& a) {
  T* lse = static_cast<T*>(a.lse);
  const T* lse_part = static_cast<const T*>(a.lse_part);
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.heads; ++h)
      for (std::int64_t i = 0; i < a.q_len; ++i) {
        const std::int64_t l = (b * a.heads + h) * a.q_len + i;
        const T lp = lse_part[l], lo = lse[l];
        if (lp == -std::numeric_limits<T>::infinity()) continue;
        T* o = static_cast<T*>(a.o) + i * a.o_token_stride + b * a.o_batch_stride + h * a.o_head_stride;
        const T* op = static_cast<const T*>(a.o_part) + i * a.part_token_stride + b * a.part_batch_stride +
                      h * a.part_head_stride;
        const T m = std::max(lo, lp);
        const T eo = std::exp(lo - m), ep = std::exp(lp - m);  // exp(-inf) = 0 for an empty running row
        const T sum = eo + ep;
        const T wo = eo / sum, wp = ep / sum;
        for (std::int64_t c = 0; c < a.d_v; ++c) o[c] = o[c] * wo + op[c] * wp;
        lse[l] = m + std::log(sum);
      }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() = default;
  explicit CpuBackend(Allocator& hosted) : alloc_(&hosted) {
    LAGA_REQUIRE(hosted.device() == Device::Cpu, "a cpu backend needs a cpu allocator, not one of device ",
                 device_name(hosted.device()));
  }
  Device device() const override { return Device::Cpu; }
  const char* name() const override { return "cpu"; }
  Allocator& allocator() override { return *alloc_; }

  void gemm(const GemmArgs& g) override {
    require_one_dtype("gemm", g.dtype, g.c_dtype, "C");
    dispatch(g.dtype, "gemm", [&](auto t) { gemm_impl<decltype(t)>(g); });
  }
  void copy(const CopyArgs& c) override {
    if (c.src == nullptr || c.dst == nullptr) return;
    require_one_dtype("copy", c.dtype, c.dst_dtype, "dst");
    LAGA_REQUIRE(c.mode != CopyMode::Sum || c.dst_batch_stride == 0,
                 "copy: sum over the batch needs a dst batch stride of 0 (got ", c.dst_batch_stride, ")");
    dispatch(c.dtype, "copy", [&](auto t) { copy_impl<decltype(t)>(c); });
  }
  void fill(const Tensor& t, double value) override {
    dispatch(t.dtype(), "fill", [&](auto z) {
      using T = decltype(z);
      T* p = t.data_as<T>();
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = T(value);
    });
  }
  void rmsnorm_forward(const RmsNormArgs& a) override {
    dispatch(a.dtype, "rmsnorm", [&](auto t) { rmsnorm_forward_impl<decltype(t)>(a); });
  }
  void rmsnorm_backward(const RmsNormArgs& a) override {
    require_one_dtype("rmsnorm backward", a.dtype, a.dy_dtype, "dy");
    dispatch(a.dtype, "rmsnorm", [&](auto t) { rmsnorm_backward_impl<decltype(t)>(a); });
  }
  void rope_forward(const RopeArgs& a) override {
    require_one_dtype("rope", a.dtype, a.x_dtype, "x");
    dispatch(a.dtype, "rope", [&](auto t) { rope_impl<decltype(t), false>(a); });
  }
  void rope_backward(const RopeArgs& a) override {
    require_one_dtype("rope backward", a.dtype, a.x_dtype, "dy");
    dispatch(a.dtype, "rope", [&](auto t) { rope_impl<decltype(t), true>(a); });
  }
  void attention_forward(const AttentionFwdParams& p) override { cpu::attention_forward(p); }
  void attention_backward(const AttentionBwdParams& p) override { cpu::attention_backward(p); }
  void attention_merge(const AttentionMergeArgs& a) override {
    require_one_dtype("attention merge", a.dtype, a.o_dtype, "o");
    dispatch(a.dtype, "attention merge", [&](auto t) { attention_merge_impl<decltype(t)>(a); });
  }

 private:
  CpuAllocator own_;
  Allocator* alloc_ = &own_;  // own_, or the allocator of the framework hosting the backend
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }
std::unique_ptr<Backend> make_cpu_backend(Allocator& allocator) { return std::make_unique<CpuBackend>(allocator); }

int set_cpu_blas_threads(int threads) {
  const int previous = openblas_get_num_threads();
  openblas_set_num_threads(threads);
  return previous;
}

}  // namespace laga
