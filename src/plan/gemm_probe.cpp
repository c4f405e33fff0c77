// The GEMM probe (include/laga/gemm_probe.hpp): records the block's GEMMs with their in-block times, then
// runs each distinct one alone on the same backend.
#include "laga/gemm_probe.hpp"

#include <algorithm>
#include <cmath>
#include <map>

#include "laga/bench.hpp"
#include "laga/errors.hpp"
#include "laga/problem.hpp"

namespace laga {

GemmKey GemmKey::of(const GemmArgs& g) {
  return GemmKey{.dtype = g.dtype, .c_dtype = g.c_dtype.value_or(g.dtype), .trans_a = g.trans_a,
                 .trans_b = g.trans_b, .m = g.m, .n = g.n, .k = g.k, .batch = g.batch, .lda = g.lda,
                 .stride_a = g.stride_a, .ldb = g.ldb, .stride_b = g.stride_b, .ldc = g.ldc,
                 .stride_c = g.stride_c, .alpha = g.alpha, .beta = g.beta};
}

GemmArgs GemmKey::args(const void* a, const void* b, void* c) const {
  GemmArgs g{.dtype = dtype, .trans_a = trans_a, .trans_b = trans_b, .m = m, .n = n, .k = k, .batch = batch,
             .a = a, .lda = lda, .stride_a = stride_a, .b = b, .ldb = ldb, .stride_b = stride_b, .c = c,
             .ldc = ldc, .stride_c = stride_c, .alpha = alpha, .beta = beta};
  if (c_dtype != dtype) g.c_dtype = c_dtype;
  return g;
}

double GemmKey::flops() const { return 2.0 * double(m) * double(n) * double(k) * double(batch); }

namespace {

std::int64_t span(std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch, std::int64_t stride) {
  if (rows <= 0 || cols <= 0 || batch <= 0) return 0;
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

}  // namespace

GemmOperandElements gemm_operand_elements(const GemmKey& g) {
  const bool ta = g.trans_a == Trans::Yes, tb = g.trans_b == Trans::Yes;
  return {.a = span(ta ? g.k : g.m, ta ? g.m : g.k, g.lda, g.batch, g.stride_a),
          .b = span(tb ? g.n : g.k, tb ? g.k : g.n, g.ldb, g.batch, g.stride_b),
          .c = span(g.m, g.n, g.ldc, g.batch, g.stride_c)};
}

// ---------------------------------------------------------------- the decorator

void GemmProbeBackend::gemm(const GemmArgs& g) {
  records_.push_back(GemmRecord{.key = GemmKey::of(g), .pass = pass_, .index_in_pass = index_in_pass_++});
  const int start = inner_.mark();
  inner_.gemm(g);
  pending_.push_back({records_.size() - 1, start, inner_.mark()});
}

void GemmProbeBackend::read_pending_marks() {
  if (pending_.empty()) return;
  inner_.synchronize();
  for (const Pending& p : pending_) records_[p.record].seconds = inner_.elapsed(p.start, p.end);
  pending_.clear();
}

void GemmProbeBackend::reset_marks() {
  // The inner backend forgets its marks (CUDA reuses its events), so ours are read first.
  read_pending_marks();
  inner_.reset_marks();
  ++pass_;
  index_in_pass_ = 0;
}

const std::vector<GemmRecord>& GemmProbeBackend::records() {
  read_pending_marks();
  return records_;
}

void GemmProbeBackend::clear() {
  records_.clear();
  pending_.clear();
  pass_ = 0;
  index_in_pass_ = 0;
}

// ---------------------------------------------------------------- alone

namespace {

// Non-zero values (a zero operand could let a library skip work): magnitudes in [0.5, 1], either sign.
Tensor operand(Backend& be, DType dtype, std::int64_t elements, const char* name, std::uint64_t stream) {
  Tensor t(be.allocator(), dtype, {elements}, name, MemoryKind::External);
  std::vector<double> v(elements);
  for (std::int64_t i = 0; i < elements; ++i) {
    const double u = deterministic_value(/*seed=*/7, stream, std::uint64_t(i));
    v[i] = std::copysign(0.5 + 0.5 * std::abs(u), u);
  }
  from_host(be, t, v);
  return t;
}

}  // namespace

std::vector<GemmProbeResult> time_gemms_alone(Backend& be, const std::vector<GemmRecord>& records, int repeats,
                                              int warmup) {
  LAGA_REQUIRE(repeats >= 1, "repeats = ", repeats, ": each GEMM alone needs at least one timed run");
  LAGA_REQUIRE(warmup >= 0, "warmup = ", warmup, ": must be >= 0");
  std::vector<GemmProbeResult> out;
  std::map<GemmKey, std::size_t> index_of;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const auto [it, first] = index_of.try_emplace(records[i].key, out.size());
    if (first) out.push_back(GemmProbeResult{.key = records[i].key});
    out[it->second].occurrences.push_back(i);
    out[it->second].in_block_s.push_back(records[i].seconds);
  }
  for (std::size_t g = 0; g < out.size(); ++g) {
    GemmProbeResult& r = out[g];
    const GemmOperandElements size = gemm_operand_elements(r.key);
    const Tensor a = operand(be, r.key.dtype, size.a, "gemm_probe.a", 3 * g);
    const Tensor b = operand(be, r.key.dtype, size.b, "gemm_probe.b", 3 * g + 1);
    const Tensor c = operand(be, r.key.c_dtype, size.c, "gemm_probe.c", 3 * g + 2);
    const GemmArgs args = r.key.args(a.data(), b.data(), c.data());
    for (int i = 0; i < warmup; ++i) be.gemm(args);
    std::vector<std::pair<int, int>> marks;
    for (int i = 0; i < repeats; ++i) {
      const int start = be.mark();
      be.gemm(args);
      marks.emplace_back(start, be.mark());
    }
    be.synchronize();
    for (const auto& [start, end] : marks) r.alone_s.push_back(be.elapsed(start, end));
    be.reset_marks();
    r.in_block_median = median(r.in_block_s);
    r.alone_median = median(r.alone_s);
    LAGA_CHECK(r.in_block_median > 0 && r.alone_median > 0, "GEMM m = ", r.key.m, ", n = ", r.key.n, ", k = ",
               r.key.k, ", batch = ", r.key.batch, ": median in block ", r.in_block_median, " s, alone ",
               r.alone_median, " s; both must be positive to compare (clock too coarse?)");
  }
  return out;
}

GemmProbeSummary summarize_gemms(const std::vector<GemmProbeResult>& results) {
  GemmProbeSummary s;
  s.count = results.size();
  for (std::size_t i = 0; i < results.size(); ++i) {
    const GemmProbeResult& r = results[i];
    const double calls = double(r.occurrences.size());
    s.calls += r.occurrences.size();
    s.in_block_s += calls * r.in_block_median;
    s.alone_s += calls * r.alone_median;
    if (i == 0 || r.ratio() > s.worst_ratio) {
      s.worst_ratio = r.ratio();
      s.worst = i;
    }
  }
  s.time_weighted_ratio = s.alone_s > 0 ? s.in_block_s / s.alone_s : 0.0;
  return s;
}

}  // namespace laga
