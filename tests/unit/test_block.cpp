// The MLA block on one rank (P = 1): finite-difference gradients in float64 for every form and kernel,
// absorbed == explicit and eager == fused in float64, inputs left untouched and gradients overwritten, edge
// shapes, the saved-tensor accounting of the allocator, and the validation of (config, options, shape).
// The matrix of forms x layouts x kernels x P against the float64 reference (LAGA bit-identical to explicit
// at P = 1 among it) is the conformance suite's (tests/conformance).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "block_test_util.hpp"
#include "laga/errors.hpp"

namespace {

using namespace laga;
using namespace laga::block_test;

// Small enough that every case runs in milliseconds, big enough for several tokens per head, a full
// causal mask and batch > 1 (token-major rows interleave the batch).
constexpr std::int64_t kBatch = 2;
constexpr std::int64_t kSeq = 16;

std::string layout_tag(Layout l) { return layout_name(l); }

// ================================================================ finite differences (float64)

struct FdParam {
  std::string config;  // "tiny", "tiny_no_q_lora" or "tiny_mscale"
  Variant variant;
  Layout layout;
  AttentionKernel kernel;
};
std::string fd_name(const FdParam& p) {
  return p.config + "_" + p.variant.name() + "_" + layout_tag(p.layout) + "_" + kernel_name(p.kernel) + "_f64";
}
void PrintTo(const FdParam& p, std::ostream* os) { *os << fd_name(p); }

std::vector<FdParam> fd_params() {
  std::vector<FdParam> out;
  for (const char* cfg : {"tiny", "tiny_no_q_lora", "tiny_mscale"})
    for (const Variant& v : all_variants())
      for (Layout l : kAllLayouts)
        for (AttentionKernel k : kAllKernels) out.push_back({cfg, v, l, k});
  return out;
}

class BlockGradFd : public ::testing::TestWithParam<FdParam> {};

// loss = sum(y * dy), so backward with dy gives dloss/d(everything). For x and every weight W, along a
// random direction u (unit rms): central difference (L(W + h u) - L(W - h u)) / 2h against <grad W, u>,
// with h = 1e-5 * rms(W).
//   Tolerance 1e-6 (relative to |<grad, u>|): the truncation error of the central difference is
//   O(h^2 L''') ~ 1e-10 relative for a smooth function at a 1e-5 relative step, and the rounding error
//   is ~ 1e-16 * sum|y dy| / h ~ 1e-9 relative here; a wrong gradient term is off by O(1).
TEST_P(BlockGradFd, DirectionalDerivativesMatchCentralDifferences) {
  const FdParam& p = GetParam();
  const MlaConfig cfg = config_by_name(p.config);
  SingleRank rank(cfg, p.variant.options(p.layout, p.kernel, DType::F64), kBatch, kSeq);
  const SingleResult base = rank.run();
  // At P = 1 no byte crosses between ranks.
  EXPECT_EQ(rank.comm().total_sent(Phase::Forward) + rank.comm().total_sent(Phase::Backward), 0u);

  const std::vector<std::string> names = rank.input_names();
  // The weights of this configuration, and nothing else: q_lora_rank null has q_proj for q_a_proj,
  // q_a_layernorm and q_b_proj.
  std::vector<std::string> expected{"x"};
  if (cfg.q_lora_rank)
    expected.insert(expected.end(), {"q_a_proj", "q_a_layernorm", "q_b_proj"});
  else
    expected.push_back("q_proj");
  expected.insert(expected.end(), {"kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"});
  ASSERT_EQ(names, expected);

  Backend& be = rank.backend();
  std::uint64_t stream = 1000;
  for (const std::string& name : names) {
    Tensor& t = rank.tensor(name);
    const std::vector<double> t0 = to_host(be, t);
    std::vector<double> grad;
    if (name == "x") {
      grad = base.values.dx;
    } else {
      for (const auto& [n, g] : base.values.grads)
        if (n == name) grad = g;
    }
    ASSERT_EQ(grad.size(), t0.size()) << name;

    std::vector<double> u(t0.size());
    double u_ss = 0, t_ss = 0;
    for (std::size_t i = 0; i < u.size(); ++i) {
      u[i] = deterministic_value(4242, stream, i);
      u_ss += u[i] * u[i];
      t_ss += t0[i] * t0[i];
    }
    ++stream;
    const double u_rms = std::sqrt(u_ss / double(u.size())), t_rms = std::sqrt(t_ss / double(u.size()));
    for (double& e : u) e /= u_rms;
    const double h = 1e-5 * t_rms;
    ASSERT_GT(h, 0) << name;

    auto loss_at = [&](double step) {
      std::vector<double> tv(t0);
      for (std::size_t i = 0; i < tv.size(); ++i) tv[i] += step * u[i];
      from_host(be, t, tv);
      return rank.loss();
    };
    const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
    from_host(be, t, t0);
    double an = 0;
    for (std::size_t i = 0; i < u.size(); ++i) an += grad[i] * u[i];
    ASSERT_GT(std::abs(an), 0) << name << ": the directional derivative is exactly zero";
    const double rel = std::abs(fd - an) / std::abs(an);
    EXPECT_LE(rel, 1e-6) << fd_name(p) << ": d loss / d " << name << " along u: finite difference " << fd
                         << ", backward " << an;
  }
  // The perturbations were undone: the loss is the one of the unperturbed inputs.
  SingleRank fresh(cfg, p.variant.options(p.layout, p.kernel, DType::F64), kBatch, kSeq);
  EXPECT_EQ(rank.loss(), fresh.loss());
}

INSTANTIATE_TEST_SUITE_P(P1, BlockGradFd, ::testing::ValuesIn(fd_params()),
                         [](const ::testing::TestParamInfo<FdParam>& info) { return fd_name(info.param); });

// ================================================================ absorbed == explicit, eager == fused (float64)

struct FormParam {
  Variant variant;
  Layout layout;
  AttentionKernel kernel;
};
std::string form_param_name(const FormParam& p) {
  return p.variant.name() + "_" + layout_tag(p.layout) + "_" + kernel_name(p.kernel) + "_f64";
}
void PrintTo(const FormParam& p, std::ostream* os) { *os << form_param_name(p); }

std::vector<FormParam> form_params(bool absorbed_only, bool one_kernel) {
  std::vector<FormParam> out;
  for (const Variant& v : all_variants()) {
    if (absorbed_only && v.form != Form::Absorbed) continue;
    for (Layout l : kAllLayouts)
      for (AttentionKernel k : kAllKernels) {
        if (one_kernel && k != kAllKernels[0]) continue;
        out.push_back({v, l, k});
      }
  }
  return out;
}

// The absorbed rewrite is the same function as the explicit form, computed in another order (W_UK folded
// into the query, W_UV after attention).
//   Tolerance 1e-10 in float64: reassociated sums of <= a few hundred terms of O(1) values differ by
//   ~1e-15 relative per element; 1e-10 leaves 5 orders of margin and still catches any wrong term
//   (a missing head, mask or scale is O(1)).
class AbsorbedVsExplicit : public ::testing::TestWithParam<FormParam> {};

TEST_P(AbsorbedVsExplicit, OutputAndAllGradientsMatchInFloat64) {
  const FormParam& p = GetParam();
  for (const char* cfg_name : {"tiny", "tiny_no_q_lora"}) {
    const MlaConfig cfg = config_by_name(cfg_name);
    SingleRank absorbed(cfg, p.variant.options(p.layout, p.kernel, DType::F64), kBatch, kSeq);
    SingleRank expl(cfg, Variant{}.options(p.layout, p.kernel, DType::F64), kBatch, kSeq);
    const SingleResult a = absorbed.run(), e = expl.run();
    expect_close(a.values, e.values, 1e-10, form_param_name(p) + " (" + cfg_name + ") vs explicit");
    // Not trivially equal: the absorbed form really ran another computation.
    EXPECT_FALSE(same_records(a.saved, e.saved)) << "absorbed and explicit saved the same tensors";
  }
}

INSTANTIATE_TEST_SUITE_P(P1, AbsorbedVsExplicit, ::testing::ValuesIn(form_params(true, false)),
                         [](const ::testing::TestParamInfo<FormParam>& info) { return form_param_name(info.param); });

// The flash-style kernel (online softmax, recomputed probabilities) against the one that materialises them,
// within one 64-row tile (S = 16) and over several, the last one partial (S = 130).
//   Tolerance 1e-10 in float64: as above; online-softmax rescaling reorders sums, nothing more.
class EagerVsFused : public ::testing::TestWithParam<FormParam> {};

TEST_P(EagerVsFused, OutputAndAllGradientsMatchInFloat64) {
  const FormParam& p = GetParam();
  for (const char* cfg_name : {"tiny", "tiny_no_q_lora"})
    for (std::int64_t seq : {kSeq, std::int64_t(130)}) {
      const MlaConfig cfg = config_by_name(cfg_name);
      SingleRank eager(cfg, p.variant.options(p.layout, AttentionKernel::Eager, DType::F64), kBatch, seq);
      SingleRank fused(cfg, p.variant.options(p.layout, AttentionKernel::Fused, DType::F64), kBatch, seq);
      const SingleResult e = eager.run(), f = fused.run();
      expect_close(f.values, e.values, 1e-10,
                   p.variant.name() + "_" + layout_tag(p.layout) + " (" + cfg_name + ", S = " + std::to_string(seq) +
                       "): fused vs eager");
      // The two kernels keep different tensors (probabilities vs log-sum-exp): both really ran.
      EXPECT_FALSE(same_records(e.saved, f.saved));
    }
}

INSTANTIATE_TEST_SUITE_P(P1, EagerVsFused, ::testing::ValuesIn(form_params(false, true)),
                         [](const ::testing::TestParamInfo<FormParam>& info) {
                           return info.param.variant.name() + "_" + layout_tag(info.param.layout) + "_f64";
                         });

// Backward overwrites the gradients it is given (whatever they held) and leaves x, dy and the weights as
// they were; forward leaves x and the weights as they were.
class BlockInputsUntouched : public ::testing::TestWithParam<FormParam> {};

TEST_P(BlockInputsUntouched, GradientsOverwrittenInputsUnchanged) {
  const FormParam& p = GetParam();
  const MlaConfig cfg = tiny();
  const BlockOptions opts = p.variant.options(p.layout, p.kernel, DType::F64);
  SingleRank rank(cfg, opts, kBatch, kSeq);
  const SingleResult clean = rank.run();
  Backend& be = rank.backend();
  std::vector<std::pair<std::string, std::vector<unsigned char>>> before;
  for (const std::string& n : rank.input_names()) before.emplace_back(n, raw_bytes(be, rank.tensor(n)));
  const std::vector<unsigned char> dy_before = raw_bytes(be, rank.dy());

  SavedContext ctx;
  Tensor y = rank.block().forward(ctx, rank.x(), rank.weights());
  MlaGrads g = allocate_grads(cfg, opts.dtype, be.allocator());
  for (auto& [n, t] : g.named()) be.fill(*t, NAN);  // stale values must not leak into the result
  Tensor dx = rank.block().backward(g, ctx, rank.dy(), rank.x(), rank.weights());
  EXPECT_EQ(raw_bytes(be, y), clean.y_raw);
  EXPECT_EQ(raw_bytes(be, dx), clean.dx_raw);
  std::size_t i = 0;
  for (auto& [n, t] : g.named()) {
    ASSERT_LT(i, clean.grads_raw.size());
    EXPECT_EQ(raw_bytes(be, *t), clean.grads_raw[i++].second) << "gradient of " << n;
  }
  for (const auto& [n, bytes] : before) EXPECT_EQ(raw_bytes(be, rank.tensor(n)), bytes) << n << " was modified";
  EXPECT_EQ(raw_bytes(be, rank.dy()), dy_before) << "dy was modified";
}

INSTANTIATE_TEST_SUITE_P(P1, BlockInputsUntouched, ::testing::ValuesIn(form_params(false, false)),
                         [](const ::testing::TestParamInfo<FormParam>& info) { return form_param_name(info.param); });

// BlockOptions::accumulate_grads: backward adds to what the gradients hold (gradient-accumulation fusion into
// Megatron's main_grad). Starting from 1, one backward gives 1 + g and a second 1 + 2g, g the gradient of a
// plain backward; y and dx are those of the plain run, bit for bit. Tolerance 1e-13 relative in float64: the
// GEMMs fold beta = 1 into their sums, which changes nothing but the last bits.
class BlockAccumulatesGradients : public ::testing::TestWithParam<FormParam> {};

TEST_P(BlockAccumulatesGradients, IntoWhatTheGradientsHold) {
  const FormParam& p = GetParam();
  const MlaConfig cfg = tiny();
  BlockOptions opts = p.variant.options(p.layout, p.kernel, DType::F64);
  const SingleResult clean = SingleRank(cfg, opts, kBatch, kSeq).run();
  opts.accumulate_grads = true;
  SingleRank rank(cfg, opts, kBatch, kSeq);
  Backend& be = rank.backend();
  MlaGrads g = allocate_grads(cfg, opts, be.allocator());
  for (auto& [n, t] : g.named()) be.fill(*t, 1.0);
  for (int step = 1; step <= 2; ++step) {
    SavedContext ctx;
    Tensor y = rank.block().forward(ctx, rank.x(), rank.weights());
    Tensor dx = rank.block().backward(g, ctx, rank.dy(), rank.x(), rank.weights());
    EXPECT_EQ(raw_bytes(be, y), clean.y_raw);
    EXPECT_EQ(raw_bytes(be, dx), clean.dx_raw);
    std::size_t i = 0;
    for (auto& [n, t] : g.named()) {
      const std::vector<double>& ref = clean.values.grads.at(i++).second;
      std::vector<double> got = to_host(be, *t), want(ref.size());
      for (std::size_t k = 0; k < ref.size(); ++k) want[k] = 1.0 + step * ref[k];
      EXPECT_LE(relative_error(got, want), 1e-13) << "gradient of " << n << " after " << step << " backward(s)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(P1, BlockAccumulatesGradients, ::testing::ValuesIn(form_params(false, false)),
                         [](const ::testing::TestParamInfo<FormParam>& info) { return form_param_name(info.param); });

// The gradients' dtype is the weights' or its accumulation dtype; anything else is refused before any op.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}
#define EXPECT_THROW_MSG(stmt, text) \
  EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

TEST(BlockGradDtype, OnlyTheWeightsOrTheAccumulationDtype) {
  const MlaConfig cfg = tiny();
  const BlockShape shape{.batch = 1, .seq = 8, .ranks = 1, .rank = 0};
  BlockOptions o{.dtype = DType::F64};
  o.grad_dtype = DType::BF16;
  EXPECT_THROW_MSG(validate(cfg, o, shape), "grad dtype = bfloat16 with dtype = float64");
  o.dtype = DType::BF16;
  EXPECT_NO_THROW(validate(cfg, o, shape));
  o.grad_dtype = DType::F32;
  EXPECT_NO_THROW(validate(cfg, o, shape));
  EXPECT_EQ(grad_dtype(BlockOptions{.dtype = DType::BF16}), DType::F32);
  // Gradients handed to backward in another dtype than the block's or its accumulation dtype are refused.
  const BlockOptions f64{.dtype = DType::F64};
  SingleRank rank(cfg, f64, 1, 8);
  Backend& be = rank.backend();
  MlaGrads g = allocate_grads(cfg, DType::F32, be.allocator());
  SavedContext ctx;
  rank.block().forward(ctx, rank.x(), rank.weights());
  EXPECT_THROW_MSG(rank.block().backward(g, ctx, rank.dy(), rank.x(), rank.weights()),
                   "gradient q_a_proj is float32 for a float64 block: it must be float64");
}

// ||a - b|| <= tol * max(||b||, scale): a relative error that does not divide by a norm that is zero in exact
// arithmetic.
void expect_close_at_scale(const std::vector<double>& a, const std::vector<double>& b, double tol, double scale,
                           const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  EXPECT_LE(std::sqrt(num), tol * std::max(std::sqrt(den), scale)) << what << " (||ref|| = " << std::sqrt(den) << ")";
}

// Edge shapes at P = 1: one token, one batch; a sequence longer than one 64-row attention tile and not a
// multiple of it. Every variant against explicit in float64 (tolerance 1e-10, as above).
//   With one token the softmax has a single key: the output does not depend on the query, and the gradients
//   of q_a_proj, q_a_layernorm, q_b_proj and kv_b_proj's W_UK rows are zero in exact arithmetic (the fused kernel leaves rounding noise
//   ~1e-16). Gradients are therefore compared relative to the largest gradient norm of the reference.
TEST(BlockEdgeShapes, EveryVariantMatchesExplicit) {
  for (auto [batch, seq] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 1}, {1, 2}, {1, 130}})
    for (Layout l : kAllLayouts)
      for (AttentionKernel k : kAllKernels) {
        SingleRank expl(tiny(), Variant{}.options(l, k, DType::F64), batch, seq);
        const SingleResult e = expl.run();
        for (const Variant& v : all_variants()) {
          SingleRank r(tiny(), v.options(l, k, DType::F64), batch, seq);
          const SingleResult got = r.run();
          const std::string what = v.name() + "_" + layout_name(l) + "_" + kernel_name(k) + " batch " +
                                   std::to_string(batch) + " seq " + std::to_string(seq);
          EXPECT_LE(relative_error(got.values.y, e.values.y), 1e-10) << what << ": y";
          EXPECT_LE(relative_error(got.values.dx, e.values.dx), 1e-10) << what << ": dx";
          double scale = 0;
          for (const auto& [n, g] : e.values.grads) {
            double ss = 0;
            for (double x : g) ss += x * x;
            scale = std::max(scale, std::sqrt(ss));
          }
          ASSERT_GT(scale, 0) << what;
          ASSERT_EQ(got.values.grads.size(), e.values.grads.size()) << what;
          for (std::size_t i = 0; i < e.values.grads.size(); ++i)
            expect_close_at_scale(got.values.grads[i].second, e.values.grads[i].second, 1e-10, scale,
                                  what + ": gradient of " + e.values.grads[i].first);
        }
      }
}

// ================================================================ bit identity can fail

// The bit-identity checks (tests/conformance: LAGA against explicit at P = 1) can fail: a different input
// (another seed) changes the bits.
TEST(LagaBitIdenticalSanity, DifferentInputsGiveDifferentBits) {
  const MlaConfig cfg = tiny();
  const BlockOptions opts = Variant{.form = Form::Laga}.options(Layout::A2A, AttentionKernel::Fused, DType::F32);
  SingleRank a(cfg, opts, kBatch, kSeq, 7), b(cfg, opts, kBatch, kSeq, 8);
  const SingleResult ra = a.run(), rb = b.run();
  EXPECT_NE(ra.y_raw, rb.y_raw);
  EXPECT_NE(ra.grads_raw, rb.grads_raw);
}

// ================================================================ saved-byte accounting

struct SavedParam {
  Variant variant;
  Layout layout;
  AttentionKernel kernel;
  DType dtype;
};
std::string saved_name(const SavedParam& p) {
  return p.variant.name() + "_" + layout_tag(p.layout) + "_" + kernel_name(p.kernel) + "_" + dtype_tag(p.dtype);
}
void PrintTo(const SavedParam& p, std::ostream* os) { *os << saved_name(p); }

std::vector<SavedParam> saved_params() {
  std::vector<SavedParam> out;
  for (const Variant& v : all_variants())
    for (Layout l : kAllLayouts)
      for (AttentionKernel k : kAllKernels)
        for (DType dt : {DType::F32, DType::F64}) out.push_back({v, l, k, dt});
  return out;
}

class SavedBytes : public ::testing::TestWithParam<SavedParam> {};

struct SavedSnapshot {
  std::vector<AllocationRecord> list;
  std::size_t bytes = 0;
  std::size_t fwd_peak = 0, bwd_peak = 0;
};

// The allocator's view of what forward keeps agrees with itself and with the SavedContext, is the same
// every run, and backward gives every byte back.
TEST_P(SavedBytes, AccountingIsConsistentAndBackwardReleasesEverything) {
  const SavedParam& p = GetParam();
  const MlaConfig cfg = tiny();
  const BlockOptions opts = p.variant.options(p.layout, p.kernel, p.dtype);
  SingleRank rank(cfg, opts, kBatch, kSeq);
  Allocator& alloc = rank.backend().allocator();

  std::vector<SavedSnapshot> runs;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    const std::size_t live0 = alloc.live_bytes();
    ASSERT_TRUE(alloc.saved_tensors().empty());
    SavedContext ctx;
    Tensor y = rank.block().forward(ctx, rank.x(), rank.weights());
    SavedSnapshot snap;
    snap.list = alloc.saved_tensors();
    snap.bytes = alloc.saved_bytes();

    std::size_t list_sum = 0;
    for (const auto& r : snap.list) {
      list_sum += r.bytes;
      EXPECT_TRUE(r.saved);
      EXPECT_EQ(r.kind, MemoryKind::Activation) << r.name;
      EXPECT_GT(r.bytes, 0u) << r.name;
    }
    EXPECT_EQ(list_sum, snap.bytes);
    EXPECT_GT(snap.bytes, 0u);

    // The SavedContext holds exactly the allocator's saved buffers. A buffer the context holds under several
    // names (see SavedContextStorage below) is one allocator record named "a/b": compare buffer by buffer,
    // as sets of names with their bytes.
    std::map<const void*, std::pair<std::set<std::string>, std::size_t>> ctx_buffers;
    for (const auto& [name, t] : ctx.tensors) {
      auto& [names, bytes] = ctx_buffers[t.data()];
      names.insert(saved_name(name));
      bytes = t.bytes();
    }
    std::size_t ctx_sum = 0;
    std::set<std::pair<std::set<std::string>, std::size_t>> from_ctx, from_alloc;
    for (const auto& [ptr, entry] : ctx_buffers) {
      ctx_sum += entry.second;
      from_ctx.insert(entry);
    }
    for (const auto& r : snap.list) {
      std::set<std::string> names;
      for (std::size_t b = 0, e; b <= r.name.size(); b = e + 1) {
        e = std::min(r.name.find('/', b), r.name.size());
        names.insert(r.name.substr(b, e - b));
      }
      from_alloc.insert({names, r.bytes});
    }
    EXPECT_EQ(ctx_sum, snap.bytes) << "context: " << ctx.tensors.size()
                                   << " tensors; allocator: " << records_string(snap.list);
    EXPECT_EQ(from_ctx, from_alloc) << "allocator: " << records_string(snap.list);

    // Forward keeps nothing but the saved tensors (y is the caller's memory).
    EXPECT_EQ(alloc.live_bytes(), live0 + snap.bytes) << "activations alive after forward that are not saved";
    EXPECT_GE(rank.block().forward_stats().peak_bytes, snap.bytes);

    MlaGrads g = allocate_grads(cfg, opts.dtype, alloc);
    Tensor dx = rank.block().backward(g, ctx, rank.dy(), rank.x(), rank.weights());
    EXPECT_TRUE(ctx.tensors.empty());
    EXPECT_TRUE(alloc.saved_tensors().empty()) << records_string(alloc.saved_tensors());
    EXPECT_EQ(alloc.saved_bytes(), 0u);
    EXPECT_EQ(alloc.live_bytes(), live0) << "backward leaked activations";
    snap.fwd_peak = rank.block().forward_stats().peak_bytes;
    snap.bwd_peak = rank.block().backward_stats().peak_bytes;
    EXPECT_GT(snap.bwd_peak, 0u);
    runs.push_back(snap);
  }
  EXPECT_TRUE(same_records(runs[0].list, runs[1].list))
      << records_string(runs[0].list) << " vs " << records_string(runs[1].list);
  EXPECT_EQ(runs[0].bytes, runs[1].bytes);
  EXPECT_EQ(runs[0].fwd_peak, runs[1].fwd_peak);
  EXPECT_EQ(runs[0].bwd_peak, runs[1].bwd_peak);

  // run_rank (the CLI's and the demo's path) reports the same list.
  auto be = make_cpu_backend();
  auto single = make_single_rank_communicator(*be);
  const RankRun rr = run_rank(cfg, opts, BlockShape{.batch = kBatch, .seq = kSeq}, *be, *single, 7);
  EXPECT_TRUE(same_records(rr.saved, runs[0].list)) << records_string(rr.saved);
  EXPECT_EQ(rr.saved_bytes, runs[0].bytes);
}

// A forward no backward follows (SavedContext::keep = false: inference, evaluation) keeps nothing: no saved
// tensor, every activation freed by its end, a peak no higher than a keeping forward's, the same output bits.
TEST_P(SavedBytes, ForwardWithoutBackwardKeepsNothing) {
  const SavedParam& p = GetParam();
  const MlaConfig cfg = tiny();
  const BlockOptions opts = p.variant.options(p.layout, p.kernel, p.dtype);
  SingleRank rank(cfg, opts, kBatch, kSeq);
  Allocator& alloc = rank.backend().allocator();  // freed memory poisoned (SingleRank): a read after a free shows
  const std::size_t live0 = alloc.live_bytes();

  SavedContext kept;
  const std::vector<unsigned char> y_kept =
      raw_bytes(rank.backend(), rank.block().forward(kept, rank.x(), rank.weights()));
  const std::size_t kept_peak = rank.block().forward_stats().peak_bytes;
  ASSERT_GT(alloc.saved_bytes(), 0u);
  kept.clear();
  ASSERT_EQ(alloc.live_bytes(), live0);

  SavedContext none;
  none.keep = false;
  Tensor y = rank.block().forward(none, rank.x(), rank.weights());
  EXPECT_TRUE(none.tensors.empty());
  EXPECT_TRUE(alloc.saved_tensors().empty()) << records_string(alloc.saved_tensors());
  EXPECT_EQ(alloc.live_bytes(), live0) << "activations alive after a forward that keeps nothing";
  EXPECT_LE(rank.block().forward_stats().peak_bytes, kept_peak);
  EXPECT_EQ(raw_bytes(rank.backend(), y), y_kept);
}

// The same at P = 4 (ranks as threads) in every layout, the ring's included, with and without overlapped
// collectives: each rank's forward that keeps nothing gives the keeping forward's bits and leaves no activation.
TEST(ForwardWithoutBackward, KeepsNothingAtSeveralRanks) {
  constexpr int kRanks = 4;
  const MlaConfig cfg = tiny();
  for (Layout layout : {Layout::A2A, Layout::AllGather, Layout::P2P})
    for (const Variant& v : variants_for(layout))
      for (AttentionKernel kernel : kAllKernels)
        for (bool overlap : {false, true}) {
          BlockOptions opts = v.options(layout, kernel, DType::F64);
          opts.overlap = overlap;
          const BlockShape shape0{.batch = kBatch, .seq = 32, .ranks = kRanks, .rank = 0};
          try {
            validate(cfg, opts, shape0);
          } catch (const InvalidArgument&) {
            continue;  // a combination the block refuses (the ring's eager kernel)
          }
          const std::string name = v.name() + "_" + layout_tag(layout) + "_" + kernel_name(kernel) +
                                   (overlap ? "_overlap" : "");
          SCOPED_TRACE(name);
          auto comms = make_thread_group(kRanks);
          std::vector<std::unique_ptr<Backend>> backends;
          for (int r = 0; r < kRanks; ++r) backends.push_back(make_cpu_backend());
          std::vector<std::string> failures(kRanks);
          std::vector<std::thread> threads;
          const int blas_threads = set_cpu_blas_threads(1);
          for (int r = 0; r < kRanks; ++r)
            threads.emplace_back([&, r] {
              try {
                Backend& be = *backends[r];
                BlockShape shape = shape0;
                shape.rank = r;
                CountingCommunicator counted(*comms[r]);
                MlaBlock block(cfg, opts, shape, be, counted);
                const MlaWeights w = make_weights(cfg, opts.dtype, be, 7);
                const Tensor x = make_shard(cfg, shape, opts.dtype, be, 7, DataStream::X, layout);
                Allocator& alloc = be.allocator();
                dynamic_cast<CpuAllocator&>(alloc).set_poison_freed(true);
                const std::size_t live0 = alloc.live_bytes();
                SavedContext kept;
                const std::vector<unsigned char> y_kept = raw_bytes(be, block.forward(kept, x, w));
                kept.clear();
                SavedContext none;
                none.keep = false;
                const std::vector<unsigned char> y = raw_bytes(be, block.forward(none, x, w));
                if (y != y_kept) failures[r] = "rank " + std::to_string(r) + ": y differs from the keeping forward's";
                else if (alloc.saved_bytes() != 0 || alloc.live_bytes() != live0)
                  failures[r] = "rank " + std::to_string(r) + ": " + std::to_string(alloc.live_bytes() - live0) +
                                " bytes alive after the forward";
              } catch (const std::exception& e) {
                failures[r] = "rank " + std::to_string(r) + ": " + e.what();
              }
            });
          for (auto& t : threads) t.join();
          set_cpu_blas_threads(blas_threads);
          for (const std::string& f : failures) EXPECT_TRUE(f.empty()) << f;
        }
}

INSTANTIATE_TEST_SUITE_P(P1, SavedBytes, ::testing::ValuesIn(saved_params()),
                         [](const ::testing::TestParamInfo<SavedParam>& info) { return saved_name(info.param); });

// What forward keeps, as the SavedContext lists it, adds up to the allocator's saved bytes: every buffer is
// saved under one name. Fails today for the all_gather layout with the fused kernel (explicit and laga):
// gather_heads() returns the attention output itself when there is no all-to-all (block.cpp, `if (!a2a())
// return att;`), so forward saves one buffer twice, as "o_att" (fused attention output, for the kernel's
// backward) and as "o" (W_O's input). The allocator counts it once (record "o_att/o") while the context
// lists two tensors: summing the SavedContext over-counts by s*B*n_h*d_v elements.
// A buffer kept for two consumers (all_gather + fused: attention's output is also W_O's input) is one
// saved buffer: the distinct buffers of the SavedContext add up to the allocator's saved bytes, and the
// allocator lists the shared buffer once, under both names joined by '/'.
TEST(SavedContextStorage, SharedBuffersCountOnceUnderJoinedNames) {
  int shared_seen = 0;
  for (const Variant& v : all_variants())
    for (Layout l : kAllLayouts)
      for (AttentionKernel k : kAllKernels) {
        SingleRank rank(tiny(), v.options(l, k, DType::F32), kBatch, kSeq);
        SavedContext ctx;
        Tensor y = rank.block().forward(ctx, rank.x(), rank.weights());
        const std::string what = v.name() + "_" + layout_name(l) + "_" + kernel_name(k);
        std::map<const void*, std::vector<std::string>> names_of;
        std::map<const void*, std::size_t> bytes_of;
        for (const auto& [name, t] : ctx.tensors) {
          names_of[t.data()].push_back(saved_name(name));
          bytes_of[t.data()] = t.bytes();
        }
        std::size_t distinct_sum = 0;
        for (const auto& [ptr, b] : bytes_of) distinct_sum += b;
        EXPECT_EQ(distinct_sum, rank.backend().allocator().saved_bytes()) << what;
        std::set<std::string> listed;
        for (const auto& r : rank.backend().allocator().saved_tensors()) listed.insert(r.name);
        for (const auto& [ptr, names] : names_of) {
          if (names.size() == 1) {
            EXPECT_TRUE(listed.count(names[0])) << what << ": '" << names[0] << "' not listed";
            continue;
          }
          ++shared_seen;
          bool found = false;
          for (const auto& n : listed) {
            bool all = true;
            for (const auto& part : names) all = all && n.find(part) != std::string::npos;
            found = found || (all && n.find('/') != std::string::npos);
          }
          EXPECT_TRUE(found) << what << ": a shared buffer is not listed under its joined names";
        }
      }
  EXPECT_GT(shared_seen, 0) << "no variant shares a saved buffer: the all_gather + fused case should";
}

// DESIGN.md section 1, the memory trap: the absorbed form's intermediates are n_h x r_kv per token, more than
// the per-head K/V the explicit form keeps. Preset `small`, per token: absorbed keeps q_abs n_h x (r_kv + d_r)
// = 640 and o_lat n_h x r_kv = 512 values where explicit keeps k n_h x d_qk = 384, v n_h x d_v = 256 and the
// local latent 80 (the rest is common to both); a2a, P = 1.
class AbsorbedMemoryTrap : public ::testing::TestWithParam<AttentionKernel> {};

TEST_P(AbsorbedMemoryTrap, AbsorbedSavesMoreThanExplicitA2aP1Small) {
  const AttentionKernel kernel = GetParam();
  const MlaConfig cfg = preset("small");
  SingleRank expl(cfg, Variant{}.options(Layout::A2A, kernel, DType::F32), 1, 64);
  const SingleResult e = expl.run();
  for (const Variant& v : all_variants()) {
    if (v.form != Form::Absorbed) continue;
    SingleRank absorbed(cfg, v.options(Layout::A2A, kernel, DType::F32), 1, 64);
    const SingleResult a = absorbed.run();
    EXPECT_GT(a.saved_bytes, e.saved_bytes)
        << v.name() << ": " << records_string(a.saved) << " vs explicit " << records_string(e.saved);
  }
}

INSTANTIATE_TEST_SUITE_P(Small, AbsorbedMemoryTrap, ::testing::ValuesIn(kAllKernels),
                         [](const ::testing::TestParamInfo<AttentionKernel>& info) {
                           return std::string(kernel_name(info.param));
                         });

// ================================================================ validation

// `fn` throws laga::InvalidArgument whose message contains every one of `parts` (the value and the rule).
void expect_invalid(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no InvalidArgument thrown; expected a message with '" << parts.at(0) << "'";
  } catch (const InvalidArgument& e) {
    const std::string msg = e.what();
    for (const auto& part : parts) EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected laga::InvalidArgument, got another exception: " << e.what();
  }
}

BlockShape shape_of(std::int64_t seq, int ranks) {
  return BlockShape{.batch = 2, .seq = seq, .ranks = ranks, .rank = 0};
}

TEST(BlockValidate, AcceptsEveryVariantLayoutAndKernelOnValidShapes) {
  for (const Variant& v : all_variants())
    for (Layout l : kAllLayouts)
      for (AttentionKernel k : kAllKernels)
        for (int P : {1, 2, 4})
          EXPECT_NO_THROW(validate(tiny(), v.options(l, k, DType::F32), shape_of(64, P)))
              << v.name() << " " << layout_name(l) << " " << kernel_name(k) << " P=" << P;
}

TEST(BlockValidate, SeqNotDivisibleBySp) {
  for (Layout l : kAllLayouts)
    expect_invalid([&] { validate(tiny(), BlockOptions{.layout = l}, shape_of(30, 4)); },
                   {"seq = 30", "sp = 4", "divisible"});
}

TEST(BlockValidate, MoreRanksThanTokens) {
  for (Layout l : kAllLayouts)
    expect_invalid([&] { validate(tiny(), BlockOptions{.layout = l}, shape_of(4, 8)); },
                   {"sp = 8", "seq = 4", "P <= S"});
}

TEST(BlockValidate, HeadsNotDivisibleBySpForA2aOnly) {
  // tiny has 4 heads.
  expect_invalid([&] { validate(tiny(), BlockOptions{.layout = Layout::A2A}, shape_of(64, 8)); },
                 {"num_attention_heads = 4", "sp = 8", "a2a"});
  expect_invalid([&] { validate(tiny(), BlockOptions{.layout = Layout::A2A}, shape_of(63, 3)); },
                 {"num_attention_heads = 4", "sp = 3"});
  for (const Variant& v : all_variants()) {
    EXPECT_NO_THROW(validate(tiny(), v.options(Layout::AllGather, AttentionKernel::Fused, DType::F32), shape_of(64, 8)))
        << v.name();
    EXPECT_NO_THROW(validate(tiny(), v.options(Layout::AllGather, AttentionKernel::Fused, DType::F32), shape_of(63, 3)))
        << v.name();
  }
  EXPECT_NO_THROW(validate(tiny_8_heads(), BlockOptions{.layout = Layout::A2A}, shape_of(64, 8)));
}

TEST(BlockValidate, RecomputeOnlyWithLaga) {
  for (Form f : kAllForms) {
    const BlockOptions opts{.form = f, .recompute = Recompute::KV};
    if (f == Form::Laga) {
      EXPECT_NO_THROW(validate(tiny(), opts, shape_of(64, 2)));
    } else {
      expect_invalid([&] { validate(tiny(), opts, shape_of(64, 2)); }, {"recompute", form_name(f), "laga"});
    }
  }
}

TEST(BlockValidate, BlockConstructorAndThreadGroupValidateToo) {
  auto be = make_cpu_backend();
  auto single = make_single_rank_communicator(*be);
  CountingCommunicator counted(*single);
  const BlockOptions bad{.form = Form::Explicit, .recompute = Recompute::KV};
  expect_invalid([&] { MlaBlock(tiny(), bad, shape_of(16, 1), *be, counted); }, {"recompute"});
  // Rejected before any thread starts (no rank waits at a collective).
  expect_invalid([&] { run_thread_group(tiny(), BlockOptions{}, 2, 30, 4, 1); }, {"seq = 30", "sp = 4"});
  expect_invalid([&] { run_thread_group(tiny(), BlockOptions{.layout = Layout::A2A}, 2, 64, 8, 1); },
                 {"num_attention_heads = 4", "sp = 8"});
}

}  // namespace
