// CPU attention (eager and fused, f32 and f64) against a naive float64 reference written with plain loops.
// Every operand is a strided view; the columns around a view are NaN, so a kernel that reads outside its
// inputs produces NaN, and one that writes outside its outputs leaves a non-NaN behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/attention_views.hpp"
#include "cpu/cpu_attention.hpp"
#include "laga/errors.hpp"

namespace laga {
namespace {

using i64 = std::int64_t;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

using Layout = test::ViewLayout;
using Case = test::AttentionCase;

// q_len values are deliberately not multiples of the 64-row tile.
const Case kCases[] = {
    {"tiny_mha", 1, 5, 5, 2, 2, 8, 8, 0, Layout::dense, false},
    {"mha_multi_tile", 2, 130, 130, 3, 3, 40, 24, 0, Layout::dense, false},
    {"mha_offset_wide", 2, 70, 200, 2, 2, 24, 16, 130, Layout::wide, false},
    {"mha_offset_unseen_keys_batch_major", 2, 33, 150, 2, 2, 20, 12, 100, Layout::batch_major, false},
    {"mqa_absorbed_wide", 2, 100, 100, 4, 1, 24, 16, 0, Layout::wide, true},
    {"mqa_absorbed_offset_batch_major", 2, 65, 190, 3, 1, 24, 16, 125, Layout::batch_major, true},
    {"mqa_separate_v_offset", 1, 64, 128, 4, 1, 32, 20, 64, Layout::wide, false},
    {"mla_head_dims_wide", 1, 96, 96, 2, 2, 192, 128, 0, Layout::wide, false},
    {"single_query_mqa_absorbed", 2, 1, 70, 2, 1, 16, 8, 69, Layout::wide, true},
    {"guard_negative_offset", 1, 20, 20, 2, 2, 8, 8, -3, Layout::dense, false},
};

// A [tokens, batch, heads, dim] view into a shared buffer.
template <typename T>
struct View {
  i64 tokens = 0, batch = 0, heads = 0, dim = 0;
  i64 token_stride = 0, batch_stride = 0, head_stride = 0, col0 = 0;
  std::shared_ptr<std::vector<T>> buf;

  i64 index(i64 t, i64 b, i64 h, i64 c) const {
    return col0 + t * token_stride + b * batch_stride + h * head_stride + c;
  }
  T& at(i64 t, i64 b, i64 h, i64 c) const { return (*buf)[index(t, b, h, c)]; }
  T* data() const { return buf->data() + col0; }
  // Logical (dense) position, the layout of the reference arrays.
  i64 logical(i64 t, i64 b, i64 h, i64 c) const { return ((t * batch + b) * heads + h) * dim + c; }
  template <typename F>
  void for_each(F&& f) const {
    for (i64 t = 0; t < tokens; ++t)
      for (i64 b = 0; b < batch; ++b)
        for (i64 h = 0; h < heads; ++h)
          for (i64 c = 0; c < dim; ++c) f(t, b, h, c);
  }
};

template <typename T>
View<T> make_view(Layout layout, i64 tokens, i64 batch, i64 heads, i64 dim) {
  const test::ViewStrides st = test::view_strides(layout, tokens, batch, heads, dim);
  View<T> v;
  v.tokens = tokens, v.batch = batch, v.heads = heads, v.dim = dim;
  v.token_stride = st.token, v.batch_stride = st.batch, v.head_stride = st.head, v.col0 = st.col0;
  v.buf = std::make_shared<std::vector<T>>(st.size, T(kNaN));
  return v;
}

template <typename T>
View<T> prefix_of(const View<T>& k, i64 dim) {
  View<T> v = k;
  v.dim = dim;
  return v;
}

// Buffer elements outside the view that are no longer NaN (i.e. were written).
template <typename T>
i64 written_outside(const View<T>& v) {
  std::vector<char> inside(v.buf->size(), 0);
  v.for_each([&](i64 t, i64 b, i64 h, i64 c) { inside[v.index(t, b, h, c)] = 1; });
  i64 n = 0;
  for (std::size_t i = 0; i < inside.size(); ++i) n += !inside[i] && !std::isnan((*v.buf)[i]);
  return n;
}

// One attention call's operands; the same Case and seed give the same bytes.
template <typename T>
struct Problem {
  Case c;
  AttentionKernel kernel;
  double scale;
  View<T> q, k, v, dout, o, dq, dk, dv;
  std::vector<T> lse, probs;  // NaN-poisoned; empty means "pass null"

  Problem(const Case& cs, AttentionKernel kern, bool with_lse = true) : c(cs), kernel(kern) {
    scale = 1.5 / std::sqrt(double(c.d_qk));
    q = make_view<T>(c.layout, c.q_len, c.batch, c.q_heads, c.d_qk);
    k = make_view<T>(c.layout, c.kv_len, c.batch, c.kv_heads, c.d_qk);
    v = c.v_aliases_k ? prefix_of(k, c.d_v) : make_view<T>(c.layout, c.kv_len, c.batch, c.kv_heads, c.d_v);
    dout = make_view<T>(c.layout, c.q_len, c.batch, c.q_heads, c.d_v);
    o = make_view<T>(c.layout, c.q_len, c.batch, c.q_heads, c.d_v);
    dq = make_view<T>(c.layout, c.q_len, c.batch, c.q_heads, c.d_qk);
    dk = make_view<T>(c.layout, c.kv_len, c.batch, c.kv_heads, c.d_qk);
    dv = make_view<T>(c.layout, c.kv_len, c.batch, c.kv_heads, c.d_v);

    // Magnitudes in [0.1, 1] with random signs: no zeros that would hide a missing term.
    std::mt19937_64 rng(20240613);
    std::uniform_real_distribution<double> mag(0.1, 1.0);
    std::bernoulli_distribution sign(0.5);
    auto fill = [&](const View<T>& x) {
      x.for_each([&](i64 t, i64 b, i64 h, i64 cc) { x.at(t, b, h, cc) = T(sign(rng) ? mag(rng) : -mag(rng)); });
    };
    fill(q);
    fill(k);
    if (!c.v_aliases_k) fill(v);
    fill(dout);

    if (kernel == AttentionKernel::Fused || with_lse) lse.assign(c.batch * c.q_heads * c.q_len, T(kNaN));
    if (kernel == AttentionKernel::Eager) probs.assign(c.batch * c.q_heads * c.q_len * c.kv_len, T(kNaN));
  }

  AttentionBwdParams params() const {
    AttentionBwdParams p;
    p.dtype = std::is_same_v<T, float> ? DType::F32 : DType::F64;
    p.kernel = kernel;
    p.batch = c.batch;
    p.q_len = c.q_len;
    p.kv_len = c.kv_len;
    p.q_heads = c.q_heads;
    p.kv_heads = c.kv_heads;
    p.d_qk = c.d_qk;
    p.d_v = c.d_v;
    p.q_offset = c.q_offset;
    p.scale = scale;
    p.q = q.data(), p.q_token_stride = q.token_stride, p.q_batch_stride = q.batch_stride;
    p.q_head_stride = q.head_stride;
    p.k = k.data(), p.k_token_stride = k.token_stride, p.k_batch_stride = k.batch_stride;
    p.k_head_stride = k.head_stride;
    p.v = v.data(), p.v_token_stride = v.token_stride, p.v_batch_stride = v.batch_stride;
    p.v_head_stride = v.head_stride;
    p.o = o.data(), p.o_token_stride = o.token_stride, p.o_batch_stride = o.batch_stride;
    p.o_head_stride = o.head_stride;
    p.lse = lse.empty() ? nullptr : const_cast<T*>(lse.data());
    p.probs = probs.empty() ? nullptr : const_cast<T*>(probs.data());
    p.dout = dout.data(), p.dout_token_stride = dout.token_stride, p.dout_batch_stride = dout.batch_stride;
    p.dout_head_stride = dout.head_stride;
    p.dq = dq.data(), p.dq_token_stride = dq.token_stride, p.dq_batch_stride = dq.batch_stride;
    p.dq_head_stride = dq.head_stride;
    p.dk = dk.data(), p.dk_token_stride = dk.token_stride, p.dk_batch_stride = dk.batch_stride;
    p.dk_head_stride = dk.head_stride;
    p.dv = dv.data(), p.dv_token_stride = dv.token_stride, p.dv_batch_stride = dv.batch_stride;
    p.dv_head_stride = dv.head_stride;
    return p;
  }

  void forward() { cpu::attention_forward(params()); }
  void backward() { cpu::attention_backward(params()); }
};

struct Expected {
  std::vector<double> o, lse, probs, dq, dk, dv;  // logical layouts; lse/probs [batch, heads, q_len(, kv_len)]
};

// The textbook definition, one (b, h, i, j) at a time, in float64.
template <typename T>
Expected reference(const Problem<T>& pr) {
  const Case& c = pr.c;
  Expected e;
  e.o.assign(c.q_len * c.batch * c.q_heads * c.d_v, 0.0);
  e.lse.assign(c.batch * c.q_heads * c.q_len, -kInf);
  e.probs.assign(c.batch * c.q_heads * c.q_len * c.kv_len, 0.0);
  e.dq.assign(c.q_len * c.batch * c.q_heads * c.d_qk, 0.0);
  e.dk.assign(c.kv_len * c.batch * c.kv_heads * c.d_qk, 0.0);
  e.dv.assign(c.kv_len * c.batch * c.kv_heads * c.d_v, 0.0);
  std::vector<double> p(c.kv_len), dp(c.kv_len);
  for (i64 b = 0; b < c.batch; ++b) {
    for (i64 h = 0; h < c.q_heads; ++h) {
      const i64 g = h / (c.q_heads / c.kv_heads);
      for (i64 i = 0; i < c.q_len; ++i) {
        const i64 visible = std::clamp<i64>(i + c.q_offset + 1, 0, c.kv_len);
        if (visible == 0) continue;
        double m = -kInf;
        for (i64 j = 0; j < visible; ++j) {
          double s = 0;
          for (i64 d = 0; d < c.d_qk; ++d) s += double(pr.q.at(i, b, h, d)) * double(pr.k.at(j, b, g, d));
          p[j] = pr.scale * s;
          m = std::max(m, p[j]);
        }
        double sum = 0;
        for (i64 j = 0; j < visible; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (i64 j = 0; j < visible; ++j) p[j] /= sum;
        const i64 row = (b * c.q_heads + h) * c.q_len + i;
        e.lse[row] = m + std::log(sum);
        for (i64 j = 0; j < visible; ++j) e.probs[row * c.kv_len + j] = p[j];
        for (i64 d = 0; d < c.d_v; ++d) {
          double acc = 0;
          for (i64 j = 0; j < visible; ++j) acc += p[j] * double(pr.v.at(j, b, g, d));
          e.o[pr.o.logical(i, b, h, d)] = acc;
        }
        // Backward: dP = dO V^T, dS = P (dP - rowsum(P dP)).
        double delta = 0;
        for (i64 j = 0; j < visible; ++j) {
          double s = 0;
          for (i64 d = 0; d < c.d_v; ++d) s += double(pr.dout.at(i, b, h, d)) * double(pr.v.at(j, b, g, d));
          dp[j] = s;
          delta += p[j] * s;
        }
        for (i64 j = 0; j < visible; ++j) {
          const double ds = p[j] * (dp[j] - delta);
          for (i64 d = 0; d < c.d_qk; ++d) {
            e.dq[pr.dq.logical(i, b, h, d)] += pr.scale * ds * double(pr.k.at(j, b, g, d));
            e.dk[pr.dk.logical(j, b, g, d)] += pr.scale * ds * double(pr.q.at(i, b, h, d));
          }
          for (i64 d = 0; d < c.d_v; ++d) e.dv[pr.dv.logical(j, b, g, d)] += p[j] * double(pr.dout.at(i, b, h, d));
        }
      }
    }
  }
  return e;
}

// Relative Frobenius error ||got - want|| / ||want||.
template <typename T>
double rel_error(const View<T>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  got.for_each([&](i64 t, i64 b, i64 h, i64 c) {
    const double d = double(got.at(t, b, h, c)) - want[got.logical(t, b, h, c)];
    num += d * d;
    den += want[got.logical(t, b, h, c)] * want[got.logical(t, b, h, c)];
  });
  return std::sqrt(num) / std::sqrt(den);
}

// Same for flat arrays; -inf entries (rows with no visible key) must match exactly and are left out.
template <typename T>
double rel_error(const std::vector<T>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      if (double(got[i]) != want[i]) return kInf;
      continue;
    }
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::sqrt(den);
}

template <typename T>
double tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  // memcmp must not see the null data() of an empty vector (the fused kernel keeps no probabilities).
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

const char* kernel_name(AttentionKernel k) { return k == AttentionKernel::Eager ? "eager" : "fused"; }

// ---------------------------------------------------------------------------------------------------
// Each kernel and dtype against the reference.

struct KernelParam {
  Case c;
  DType dtype;
  AttentionKernel kernel;
};

std::string param_name(const KernelParam& p) {
  return std::string(p.c.name) + "_" + (p.dtype == DType::F64 ? "f64" : "f32") + "_" + kernel_name(p.kernel);
}
void PrintTo(const KernelParam& p, std::ostream* os) { *os << param_name(p); }

std::vector<KernelParam> kernel_params() {
  std::vector<KernelParam> out;
  for (const Case& c : kCases)
    for (DType d : {DType::F32, DType::F64})
      for (AttentionKernel k : {AttentionKernel::Eager, AttentionKernel::Fused}) out.push_back({c, d, k});
  return out;
}

class AttentionVsReference : public ::testing::TestWithParam<KernelParam> {
 protected:
  const Case& cs() const { return GetParam().c; }
  bool f64() const { return GetParam().dtype == DType::F64; }
  AttentionKernel kernel() const { return GetParam().kernel; }

  template <typename T>
  void check_forward() {
    Problem<T> pr(cs(), kernel());
    pr.forward();
    const Expected e = reference(pr);
    EXPECT_LE(rel_error(pr.o, e.o), tolerance<T>()) << "o";
    EXPECT_LE(rel_error(pr.lse, e.lse), tolerance<T>()) << "lse";
    if (kernel() == AttentionKernel::Eager) {
      EXPECT_LE(rel_error(pr.probs, e.probs), tolerance<T>()) << "probs";
    }
    EXPECT_EQ(written_outside(pr.o), 0) << "o written outside its view";
  }

  template <typename T>
  void check_backward() {
    Problem<T> pr(cs(), kernel());
    pr.forward();
    pr.backward();
    const Expected e = reference(pr);
    EXPECT_LE(rel_error(pr.dq, e.dq), tolerance<T>()) << "dq";
    EXPECT_LE(rel_error(pr.dk, e.dk), tolerance<T>()) << "dk";
    EXPECT_LE(rel_error(pr.dv, e.dv), tolerance<T>()) << "dv";
    EXPECT_EQ(written_outside(pr.dq), 0) << "dq written outside its view";
    EXPECT_EQ(written_outside(pr.dk), 0) << "dk written outside its view";
    EXPECT_EQ(written_outside(pr.dv), 0) << "dv written outside its view";
  }

  template <typename T>
  void check_deterministic() {
    Problem<T> a(cs(), kernel()), b(cs(), kernel());
    a.forward();
    a.backward();
    b.forward();
    b.backward();
    EXPECT_TRUE(same_bytes(*a.o.buf, *b.o.buf)) << "o";
    EXPECT_TRUE(same_bytes(a.lse, b.lse)) << "lse";
    EXPECT_TRUE(same_bytes(a.probs, b.probs)) << "probs";
    EXPECT_TRUE(same_bytes(*a.dq.buf, *b.dq.buf)) << "dq";
    EXPECT_TRUE(same_bytes(*a.dk.buf, *b.dk.buf)) << "dk";
    EXPECT_TRUE(same_bytes(*a.dv.buf, *b.dv.buf)) << "dv";
  }
};

TEST_P(AttentionVsReference, Forward) { f64() ? check_forward<double>() : check_forward<float>(); }
TEST_P(AttentionVsReference, Backward) { f64() ? check_backward<double>() : check_backward<float>(); }
TEST_P(AttentionVsReference, BitwiseDeterministicOnRerun) {
  f64() ? check_deterministic<double>() : check_deterministic<float>();
}

INSTANTIATE_TEST_SUITE_P(Cpu, AttentionVsReference, ::testing::ValuesIn(kernel_params()),
                         [](const ::testing::TestParamInfo<KernelParam>& info) { return param_name(info.param); });

// ---------------------------------------------------------------------------------------------------
// Properties across kernels.

class AttentionKernels : public ::testing::TestWithParam<Case> {};

TEST_P(AttentionKernels, EagerMatchesFusedF64) {
  Problem<double> eager(GetParam(), AttentionKernel::Eager), fused(GetParam(), AttentionKernel::Fused);
  for (auto* pr : {&eager, &fused}) {
    pr->forward();
    pr->backward();
  }
  auto dense = [](const View<double>& x) {
    std::vector<double> out(x.tokens * x.batch * x.heads * x.dim);
    x.for_each([&](i64 t, i64 b, i64 h, i64 c) { out[x.logical(t, b, h, c)] = x.at(t, b, h, c); });
    return out;
  };
  const std::vector<double> fused_lse(fused.lse.begin(), fused.lse.end());
  EXPECT_LE(rel_error(eager.o, dense(fused.o)), 1e-10) << "o";
  EXPECT_LE(rel_error(eager.lse, fused_lse), 1e-10) << "lse";
  EXPECT_LE(rel_error(eager.dq, dense(fused.dq)), 1e-10) << "dq";
  EXPECT_LE(rel_error(eager.dk, dense(fused.dk)), 1e-10) << "dk";
  EXPECT_LE(rel_error(eager.dv, dense(fused.dv)), 1e-10) << "dv";
}

template <typename T>
void check_probs(const Case& c) {
  Problem<T> pr(c, AttentionKernel::Eager, /*with_lse=*/false);  // eager may run without lse
  pr.forward();
  i64 masked_nonzero = 0, visible_nonpositive = 0;
  double worst_row = 0;
  for (i64 row = 0; row < c.batch * c.q_heads * c.q_len; ++row) {
    const i64 i = row % c.q_len;
    const i64 visible = std::clamp<i64>(i + c.q_offset + 1, 0, c.kv_len);
    const T* p = pr.probs.data() + row * c.kv_len;
    double sum = 0;
    for (i64 j = 0; j < c.kv_len; ++j) {
      if (j < visible) {
        visible_nonpositive += !(p[j] > T(0));
        sum += p[j];
      } else {
        masked_nonzero += p[j] != T(0);  // NaN poison counts too
      }
    }
    if (visible > 0) worst_row = std::max(worst_row, std::abs(sum - 1.0));
  }
  EXPECT_EQ(masked_nonzero, 0);
  EXPECT_EQ(visible_nonpositive, 0);
  EXPECT_LE(worst_row, (std::is_same_v<T, double> ? 1e-13 : 1e-6));
}

TEST_P(AttentionKernels, EagerProbsMaskedZeroAndRowsSumToOne) {
  check_probs<float>(GetParam());
  check_probs<double>(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Cpu, AttentionKernels, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// V inside K with dv_in_dk: dk = dK + [dV, 0] (the sum of the separate run's, the same bits), dv untouched, dq
// as without the flag; dv_in_dk without V inside K is refused.
TEST_P(AttentionKernels, DvInDkSumsDvIntoDk) {
  const Case& c = GetParam();
  for (AttentionKernel kernel : {AttentionKernel::Eager, AttentionKernel::Fused}) {
    Problem<double> apart(c, kernel), sum(c, kernel);
    apart.forward();
    apart.backward();
    sum.forward();
    AttentionBwdParams p = sum.params();
    p.dv_in_dk = true;
    p.dv = nullptr;
    if (!c.v_aliases_k) {
      EXPECT_THROW(cpu::attention_backward(p), RuntimeError);
      continue;
    }
    cpu::attention_backward(p);
    EXPECT_TRUE(same_bytes(*sum.dq.buf, *apart.dq.buf)) << "dq";
    i64 differ = 0;
    apart.dk.for_each([&](i64 t, i64 b, i64 h, i64 d) {
      const double want = apart.dk.at(t, b, h, d) + (d < c.d_v ? apart.dv.at(t, b, h, d) : 0.0);
      differ += sum.dk.at(t, b, h, d) != want;
    });
    EXPECT_EQ(differ, 0) << "dk != dK + [dV, 0]";
    EXPECT_EQ(written_outside(sum.dk), 0) << "dk written outside its view";
    EXPECT_TRUE(std::all_of(sum.dv.buf->begin(), sum.dv.buf->end(), [](double x) { return std::isnan(x); }))
        << "dv written with dv_in_dk";
  }
}

// ---------------------------------------------------------------------------------------------------
// Input checks.

TEST(AttentionChecks, RejectsUnsupportedDtype) {
  Problem<float> pr(kCases[0], AttentionKernel::Fused);
  AttentionBwdParams p = pr.params();
  p.dtype = DType::BF16;
  EXPECT_THROW(cpu::attention_forward(p), RuntimeError);
  EXPECT_THROW(cpu::attention_backward(p), RuntimeError);
}

TEST(AttentionChecks, RejectsKvHeadsNotDividingQHeads) {
  Case c = kCases[1];  // 3 query heads
  Problem<double> pr(c, AttentionKernel::Fused);
  AttentionBwdParams p = pr.params();
  p.kv_heads = 2;
  EXPECT_THROW(cpu::attention_forward(p), RuntimeError);
}

TEST(AttentionChecks, RejectsMissingSavedTensors) {
  Problem<double> eager(kCases[0], AttentionKernel::Eager), fused(kCases[0], AttentionKernel::Fused);
  AttentionBwdParams pe = eager.params(), pf = fused.params();
  pe.probs = nullptr;
  pf.lse = nullptr;
  EXPECT_THROW(cpu::attention_forward(pe), RuntimeError);
  EXPECT_THROW(cpu::attention_backward(pf), RuntimeError);
}

}  // namespace
}  // namespace laga
