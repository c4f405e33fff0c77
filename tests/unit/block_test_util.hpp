// Shared helpers of the single-rank MLA block tests (test_block.cpp): the variants every test loops over,
// the test configurations, a single-rank runner that drives MlaBlock directly, and comparisons (relative
// Frobenius error by laga::relative_error, raw bytes).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/block_configs.hpp"
#include "laga/backend.hpp"
#include "laga/block.hpp"
#include "laga/comm.hpp"
#include "laga/config.hpp"
#include "laga/problem.hpp"

namespace laga::block_test {

// The variants every suite loops over (laga::kAllVariants): explicit, absorbed_mqa, absorbed_expanded,
// laga, laga_recompute_kv.
inline std::vector<Variant> all_variants() { return {kAllVariants.begin(), kAllVariants.end()}; }

inline const char* dtype_tag(DType t) { return t == DType::F64 ? "f64" : t == DType::F32 ? "f32" : "bf16"; }

// ---------------------------------------------------------------- configurations
inline MlaConfig tiny() { return preset("tiny"); }
using test::config_by_name;
using test::tiny_8_heads;
using test::tiny_mscale;
using test::tiny_no_q_lora;

// ---------------------------------------------------------------- comparisons
// Every tensor of `got` within `tol` of `ref` (y, dx and every weight gradient, matched by name).
// `what` says which comparison failed.
inline void expect_close(const GlobalResult& got, const GlobalResult& ref, double tol, const std::string& what) {
  ASSERT_FALSE(ref.y.empty()) << what;
  EXPECT_LE(relative_error(got.y, ref.y), tol) << what << ": y";
  EXPECT_LE(relative_error(got.dx, ref.dx), tol) << what << ": dx";
  ASSERT_EQ(got.grads.size(), ref.grads.size()) << what;
  for (std::size_t i = 0; i < ref.grads.size(); ++i) {
    EXPECT_EQ(got.grads[i].first, ref.grads[i].first) << what;
    EXPECT_LE(relative_error(got.grads[i].second, ref.grads[i].second), tol)
        << what << ": gradient of " << ref.grads[i].first;
  }
}

// Two saved-tensor lists with the same names and bytes, in the same order.
inline bool same_records(const std::vector<AllocationRecord>& a, const std::vector<AllocationRecord>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].bytes != b[i].bytes) return false;
  return true;
}
inline std::string records_string(const std::vector<AllocationRecord>& v) {
  std::string s;
  for (const auto& r : v) s += r.name + ":" + std::to_string(r.bytes) + " ";
  return s;
}

// ---------------------------------------------------------------- single-rank runner
// The raw bytes of a tensor (for bit-identity checks).
inline std::vector<unsigned char> raw_bytes(Backend& be, const Tensor& t) {
  std::vector<unsigned char> out(t.bytes());
  be.copy_to_host(out.data(), t);
  return out;
}

// What one forward + backward produced, as raw bytes and as doubles.
struct SingleResult {
  std::vector<unsigned char> y_raw, dx_raw;
  std::vector<std::pair<std::string, std::vector<unsigned char>>> grads_raw;
  GlobalResult values;
  std::vector<AllocationRecord> saved;  // allocator's saved list right after forward
  std::size_t saved_bytes = 0;
};

// One rank (P = 1) driving MlaBlock directly: CPU backend, single-rank communicator wrapped in the counter.
// Weights, x and dy are the library's deterministic data for `seed`; tests may overwrite them through
// set_weight / set_x before running.
class SingleRank {
 public:
  SingleRank(const MlaConfig& cfg, const BlockOptions& opts, std::int64_t batch, std::int64_t seq,
             std::uint64_t seed = 7)
      : cfg_(cfg), opts_(opts), shape_{.batch = batch, .seq = seq, .ranks = 1, .rank = 0},
        be_(make_cpu_backend()), inner_(make_single_rank_communicator(*be_)), counted_(*inner_),
        block_(cfg_, opts_, shape_, *be_, counted_) {
    // A read of freed memory (a raw pointer outliving its tensor) gives NaN or other values, not the old ones.
    dynamic_cast<CpuAllocator&>(be_->allocator()).set_poison_freed(true);
    w_ = make_weights(cfg_, opts_.dtype, *be_, seed);
    x_ = make_shard(cfg_, shape_, opts_.dtype, *be_, seed, DataStream::X, opts_.layout);
    dy_ = make_shard(cfg_, shape_, opts_.dtype, *be_, seed, DataStream::Dy, opts_.layout);
  }

  Backend& backend() { return *be_; }
  MlaBlock& block() { return block_; }
  CountingCommunicator& comm() { return counted_; }
  MlaWeights& weights() { return w_; }
  Tensor& x() { return x_; }
  Tensor& dy() { return dy_; }

  // The tensor named `name`: "x" or a weight name.
  Tensor& tensor(const std::string& name) {
    if (name == "x") return x_;
    for (auto& [n, t] : w_.named())
      if (n == name) return *t;
    throw std::runtime_error("no tensor named " + name);
  }
  std::vector<std::string> input_names() {
    std::vector<std::string> out{"x"};
    for (auto& [n, t] : w_.named()) out.push_back(n);
    return out;
  }

  // Forward only; returns loss = sum(y * dy) (in double, from the tensors' values).
  double loss() {
    SavedContext ctx;
    Tensor y = block_.forward(ctx, x_, w_);
    const std::vector<double> yv = to_host(*be_, y), dyv = to_host(*be_, dy_);
    long double l = 0;
    for (std::size_t i = 0; i < yv.size(); ++i) l += (long double)yv[i] * (long double)dyv[i];
    return double(l);
  }

  // Forward then backward with dy (the gradient of loss()).
  SingleResult run() {
    SingleResult r;
    SavedContext ctx;
    Tensor y = block_.forward(ctx, x_, w_);
    r.saved = be_->allocator().saved_tensors();
    r.saved_bytes = be_->allocator().saved_bytes();
    MlaGrads g = allocate_grads(cfg_, opts_.dtype, be_->allocator());
    Tensor dx = block_.backward(g, ctx, dy_, x_, w_);
    r.y_raw = raw_bytes(*be_, y);
    r.dx_raw = raw_bytes(*be_, dx);
    r.values.y = to_host(*be_, y);
    r.values.dx = to_host(*be_, dx);
    for (auto& [n, t] : g.named()) {
      r.grads_raw.emplace_back(n, raw_bytes(*be_, *t));
      r.values.grads.emplace_back(n, to_host(*be_, *t));
    }
    return r;
  }

 private:
  MlaConfig cfg_;
  BlockOptions opts_;
  BlockShape shape_;
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Communicator> inner_;
  CountingCommunicator counted_;
  MlaBlock block_;
  MlaWeights w_;
  Tensor x_, dy_;
};

// Exact equality of two results, byte for byte: y, dx and every gradient.
inline void expect_bit_identical(const SingleResult& a, const SingleResult& b, const std::string& what) {
  EXPECT_TRUE(!a.y_raw.empty() && a.y_raw == b.y_raw) << what << ": y differs";
  EXPECT_TRUE(!a.dx_raw.empty() && a.dx_raw == b.dx_raw) << what << ": dx differs";
  ASSERT_EQ(a.grads_raw.size(), b.grads_raw.size()) << what;
  for (std::size_t i = 0; i < a.grads_raw.size(); ++i) {
    EXPECT_EQ(a.grads_raw[i].first, b.grads_raw[i].first) << what;
    EXPECT_TRUE(!a.grads_raw[i].second.empty() && a.grads_raw[i].second == b.grads_raw[i].second)
        << what << ": gradient of " << a.grads_raw[i].first << " differs (max rel. error "
        << relative_error(a.values.grads[i].second, b.values.grads[i].second) << ")";
  }
}

}  // namespace laga::block_test
