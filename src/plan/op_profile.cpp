// The op profile (include/laga/op_profile.hpp): every op of the block with its time on the backend's queue.
#include "laga/op_profile.hpp"

#include <algorithm>
#include <map>
#include <sstream>

#include "laga/errors.hpp"

namespace laga {

namespace {

std::string dtypes(DType from, std::optional<DType> to) {
  std::string s = dtype_name(from);
  if (to && *to != from) s += std::string("->") + dtype_name(*to);
  return s;
}

std::string describe(const GemmArgs& g) {
  std::ostringstream s;
  s << g.m << "x" << g.n << "x" << g.k;
  if (g.batch != 1) s << " batch " << g.batch;
  if (g.trans_a == Trans::Yes || g.trans_b == Trans::Yes)
    s << " " << (g.trans_a == Trans::Yes ? "T" : "N") << (g.trans_b == Trans::Yes ? "T" : "N");
  s << " " << dtypes(g.dtype, g.c_dtype) << " beta " << g.beta;
  return s.str();
}

std::string describe(const CopyArgs& c) {
  std::ostringstream s;
  if (c.batch != 1) s << c.batch << "x";
  s << c.rows << "x" << c.cols << " " << dtypes(c.dtype, c.dst_dtype);
  if (c.mode == CopyMode::Accumulate) s << (c.dst_batch_stride == 0 && c.batch > 1 ? " sum" : " add");
  if (c.mode == CopyMode::Sum) s << " sum into";
  if (c.src_batch_stride == 0 && c.batch > 1) s << " broadcast";
  return s.str();
}

std::string describe(const RmsNormArgs& a) {
  std::ostringstream s;
  s << a.rows << "x" << a.cols << " " << dtypes(a.dtype, a.dy_dtype);
  return s.str();
}

std::string describe(const RopeArgs& a) {
  std::ostringstream s;
  s << a.tokens << "x" << a.batch << "x" << a.heads << "x" << a.dim << " " << dtypes(a.dtype, a.x_dtype);
  return s.str();
}

std::string describe(const AttentionFwdParams& p) {
  std::ostringstream s;
  s << "heads " << p.q_heads << "/" << p.kv_heads << " q " << p.q_len << " kv " << p.kv_len << " d " << p.d_qk << "/"
    << p.d_v << " " << dtype_name(p.dtype) << (p.kernel == AttentionKernel::Fused ? " fused" : " eager");
  return s.str();
}

std::string describe(const AttentionMergeArgs& a) {
  std::ostringstream s;
  s << a.q_len << "x" << a.batch << "x" << a.heads << "x" << a.d_v << " " << dtypes(a.dtype, a.o_dtype);
  return s.str();
}

}  // namespace

template <typename F>
void OpProfileBackend::timed(const char* op, std::string what, F&& call) {
  records_.push_back(OpRecord{.pass = pass_, .index_in_pass = index_in_pass_++, .op = op, .what = std::move(what)});
  const int start = inner_.mark();
  call();
  pending_.push_back({records_.size() - 1, start, inner_.mark()});
}

void OpProfileBackend::gemm(const GemmArgs& g) { timed("gemm", describe(g), [&] { inner_.gemm(g); }); }
void OpProfileBackend::copy(const CopyArgs& c) { timed("copy", describe(c), [&] { inner_.copy(c); }); }
void OpProfileBackend::fill(const Tensor& t, double value) {
  timed("fill", std::to_string(t.numel()) + " " + dtype_name(t.dtype()), [&] { inner_.fill(t, value); });
}
void OpProfileBackend::rmsnorm_forward(const RmsNormArgs& a) {
  timed("rmsnorm_forward", describe(a), [&] { inner_.rmsnorm_forward(a); });
}
void OpProfileBackend::rmsnorm_backward(const RmsNormArgs& a) {
  timed("rmsnorm_backward", describe(a), [&] { inner_.rmsnorm_backward(a); });
}
void OpProfileBackend::rope_forward(const RopeArgs& a) {
  timed("rope_forward", describe(a), [&] { inner_.rope_forward(a); });
}
void OpProfileBackend::rope_backward(const RopeArgs& a) {
  timed("rope_backward", describe(a), [&] { inner_.rope_backward(a); });
}
void OpProfileBackend::attention_forward(const AttentionFwdParams& p) {
  timed("attention_forward", describe(p), [&] { inner_.attention_forward(p); });
}
void OpProfileBackend::attention_backward(const AttentionBwdParams& p) {
  timed("attention_backward", describe(p), [&] { inner_.attention_backward(p); });
}

void OpProfileBackend::attention_merge(const AttentionMergeArgs& a) {
  timed("attention_merge", describe(a), [&] { inner_.attention_merge(a); });
}

void OpProfileBackend::read_pending_marks() {
  if (pending_.empty()) return;
  inner_.synchronize();
  for (const Pending& p : pending_) records_[p.record].seconds = inner_.elapsed(p.start, p.end);
  pending_.clear();
}

void OpProfileBackend::reset_marks() {
  read_pending_marks();  // the inner backend forgets its marks (CUDA reuses its events)
  inner_.reset_marks();
  ++pass_;
  index_in_pass_ = 0;
}

const std::vector<OpRecord>& OpProfileBackend::records() {
  read_pending_marks();
  return records_;
}

std::vector<OpProfileRow> summarize_ops(const std::vector<OpRecord>& records, int repeats) {
  LAGA_REQUIRE(repeats >= 1, "op profile: repeats = ", repeats, " must be >= 1");
  // (backward, index) -> the first occurrence's row and every occurrence's time.
  std::map<std::pair<bool, int>, std::pair<OpProfileRow, std::vector<double>>> by_op;
  for (const OpRecord& r : records) {
    const bool backward = r.pass % 2 == 1;
    auto [it, fresh] = by_op.try_emplace({backward, r.index_in_pass});
    if (fresh) it->second.first = OpProfileRow{.backward = backward, .index = r.index_in_pass, .op = r.op, .what = r.what};
    LAGA_REQUIRE(it->second.first.op == r.op && it->second.first.what == r.what, "op profile: op ", r.index_in_pass,
                 " of a ", backward ? "backward" : "forward", " pass was ", it->second.first.op, " ",
                 it->second.first.what, " in one repeat and ", r.op, " ", r.what, " in another");
    it->second.second.push_back(r.seconds);
  }
  std::vector<OpProfileRow> rows;
  for (auto& [key, entry] : by_op) {
    std::vector<double>& t = entry.second;
    LAGA_REQUIRE(t.size() == std::size_t(repeats), "op profile: op ", key.second, " of the ",
                 key.first ? "backward" : "forward", " pass ran ", t.size(), " times in ", repeats, " repeats");
    std::sort(t.begin(), t.end());
    entry.first.median_s = t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
    rows.push_back(entry.first);
  }
  return rows;
}

}  // namespace laga
