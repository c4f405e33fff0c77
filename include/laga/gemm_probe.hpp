// Are the block's GEMMs as fast inside the block as alone? A Backend decorator records every GEMM the block
// issues and times each call with the inner backend's own marks; time_gemms_alone() then runs each distinct
// GEMM again, alone, on buffers of the same sizes, and compares. Backend-agnostic: the same measurement on
// the CPU (OpenBLAS) and on the GPU (cuBLASLt), where the block should stay within 10% of alone.
#pragma once

#include <compare>
#include <cstdint>
#include <vector>

#include "laga/backend.hpp"

namespace laga {

// A GEMM's arguments without its pointers: what identifies one GEMM when it is run again alone.
struct GemmKey {
  DType dtype = DType::F32;
  DType c_dtype = DType::F32;  // GemmArgs::c_dtype resolved (dtype when unset)
  Trans trans_a = Trans::No, trans_b = Trans::No;
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  std::int64_t lda = 0, stride_a = 0, ldb = 0, stride_b = 0, ldc = 0, stride_c = 0;
  double alpha = 1.0, beta = 0.0;

  static GemmKey of(const GemmArgs&);
  GemmArgs args(const void* a, const void* b, void* c) const;
  double flops() const;  // 2 m n k batch, as the block counts them
  auto operator<=>(const GemmKey&) const = default;
};

// Elements each operand spans, from its shape, leading dimension and batch stride (stride 0: one matrix
// shared by the batch): (batch-1) stride + (rows-1) ld + cols, 0 for an empty operand.
struct GemmOperandElements {
  std::int64_t a = 0, b = 0, c = 0;
};
GemmOperandElements gemm_operand_elements(const GemmKey&);

// One GEMM as the block issued it.
struct GemmRecord {
  GemmKey key;
  // reset_marks() calls the probe had seen before this GEMM. The block resets the marks once at the end of
  // each pass, so with run_rank (forward then backward) even passes are forward, odd ones backward.
  int pass = 0;
  int index_in_pass = 0;  // 0-based order of issue within the pass
  double seconds = 0;     // between marks on the inner backend's queue just before and just after the call
};

// Forwards every op to `inner` (which must outlive it); gemm() is also recorded and bracketed by two marks of
// the inner backend. The marks share the inner backend's numbering with the block's own Timer marks, so
// both keep working; the probe reads its marks before it forwards reset_marks() (the block resets them once
// a pass, after reading its own). Every call must come through the probe, not to `inner` directly.
class GemmProbeBackend final : public Backend {
 public:
  explicit GemmProbeBackend(Backend& inner) : inner_(inner) {}

  Device device() const override { return inner_.device(); }
  const char* name() const override { return inner_.name(); }
  Allocator& allocator() override { return inner_.allocator(); }

  void gemm(const GemmArgs&) override;
  void copy(const CopyArgs& c) override { inner_.copy(c); }
  void fill(const Tensor& t, double value) override { inner_.fill(t, value); }
  void rmsnorm_forward(const RmsNormArgs& a) override { inner_.rmsnorm_forward(a); }
  void rmsnorm_backward(const RmsNormArgs& a) override { inner_.rmsnorm_backward(a); }
  void rope_forward(const RopeArgs& a) override { inner_.rope_forward(a); }
  void rope_backward(const RopeArgs& a) override { inner_.rope_backward(a); }
  void attention_forward(const AttentionFwdParams& p) override { inner_.attention_forward(p); }
  void attention_backward(const AttentionBwdParams& p) override { inner_.attention_backward(p); }
  void attention_merge(const AttentionMergeArgs& a) override { inner_.attention_merge(a); }
  void copy_from_host(const Tensor& dst, const void* host) override { inner_.copy_from_host(dst, host); }
  void copy_to_host(void* host, const Tensor& src) override { inner_.copy_to_host(host, src); }
  void synchronize() override { inner_.synchronize(); }
  int mark() override { return inner_.mark(); }
  double elapsed(int a, int b) override { return inner_.elapsed(a, b); }
  void reset_marks() override;

  // Every GEMM since construction or clear(), in issue order, with its time (reading the marks still
  // pending synchronizes the inner backend).
  const std::vector<GemmRecord>& records();
  // Forgets the records and restarts the pass count (marks still pending are dropped, not read).
  void clear();

 private:
  struct Pending {
    std::size_t record;
    int start, end;
  };
  void read_pending_marks();

  Backend& inner_;
  std::vector<GemmRecord> records_;
  std::vector<Pending> pending_;
  int pass_ = 0, index_in_pass_ = 0;
};

// One distinct GEMM: its in-block times (every occurrence) against the same call run alone.
struct GemmProbeResult {
  GemmKey key;
  std::vector<std::size_t> occurrences;  // indices into the records, in issue order
  std::vector<double> in_block_s;        // each occurrence's time in the block
  std::vector<double> alone_s;           // each timed run alone
  double in_block_median = 0, alone_median = 0;

  double flops() const { return key.flops(); }
  double in_block_flops_per_s() const { return flops() / in_block_median; }
  double alone_flops_per_s() const { return flops() / alone_median; }
  double ratio() const { return in_block_median / alone_median; }  // > 1: slower in the block
};

// For each distinct key of `records` (first-issue order): allocates A, B and C of the sizes its leading
// dimensions and strides span (through be.allocator(), filled with non-zero values in [-1, -0.5] u [0.5, 1]
// through a host buffer), runs it `warmup` times, then `repeats` times, each run between two marks of `be`,
// and reports medians. Throws InvalidArgument for repeats < 1 or warmup < 0, RuntimeError when a median
// is not positive (a clock too coarse for the call: no ratio can be formed).
std::vector<GemmProbeResult> time_gemms_alone(Backend& be, const std::vector<GemmRecord>& records, int repeats,
                                              int warmup);

// Over a set of results: the time-weighted ratio (sum over occurrences of in-block time / the same sum of
// alone times, i.e. each distinct GEMM weighted by its calls) and the worst single ratio.
struct GemmProbeSummary {
  std::size_t count = 0;  // distinct GEMMs
  std::size_t calls = 0;  // occurrences
  double in_block_s = 0, alone_s = 0;  // sum over occurrences of the medians
  double time_weighted_ratio = 0, worst_ratio = 0;
  std::size_t worst = 0;  // index of the worst result
  bool within(double tolerance) const { return time_weighted_ratio <= 1.0 + tolerance; }
};
GemmProbeSummary summarize_gemms(const std::vector<GemmProbeResult>&);

}  // namespace laga
