// Where does the block's time go, op by op? A Backend decorator that brackets every op (GEMM, copy, fill,
// RMSNorm, RoPE, attention) with two marks of the inner backend and records what it was, so a pass's time can
// be read per call rather than per phase. Backend-agnostic, like the GEMM probe (laga/gemm_probe.hpp), whose
// mark bookkeeping it shares: the block's own Timer marks keep working, and the profile reads its marks before
// it forwards reset_marks() (the block resets them once a pass, after reading its own).
#pragma once

#include <string>
#include <vector>

#include "laga/backend.hpp"

namespace laga {

// One op as the block issued it.
struct OpRecord {
  int pass = 0;           // reset_marks() calls seen before it: with run_rank, even = forward, odd = backward
  int index_in_pass = 0;  // 0-based order of issue within the pass
  std::string op;         // gemm, copy, fill, rmsnorm_forward, rmsnorm_backward, rope_forward, rope_backward,
                          // attention_forward, attention_backward, attention_merge
  std::string what;       // its sizes and dtypes, e.g. "2048x7168x16384 bf16 beta 0"
  double seconds = 0;     // between marks on the inner backend's queue just before and just after the call
};

// Forwards every op to `inner` (which must outlive it) between two marks of the inner backend. Every call
// must come through the profile, not to `inner` directly.
class OpProfileBackend final : public Backend {
 public:
  explicit OpProfileBackend(Backend& inner) : inner_(inner) {}

  Device device() const override { return inner_.device(); }
  const char* name() const override { return inner_.name(); }
  Allocator& allocator() override { return inner_.allocator(); }

  void gemm(const GemmArgs&) override;
  void copy(const CopyArgs&) override;
  void fill(const Tensor& t, double value) override;
  void rmsnorm_forward(const RmsNormArgs&) override;
  void rmsnorm_backward(const RmsNormArgs&) override;
  void rope_forward(const RopeArgs&) override;
  void rope_backward(const RopeArgs&) override;
  void attention_forward(const AttentionFwdParams&) override;
  void attention_backward(const AttentionBwdParams&) override;
  void attention_merge(const AttentionMergeArgs&) override;
  void copy_from_host(const Tensor& dst, const void* host) override { inner_.copy_from_host(dst, host); }
  void copy_to_host(void* host, const Tensor& src) override { inner_.copy_to_host(host, src); }
  void synchronize() override { inner_.synchronize(); }
  int mark() override { return inner_.mark(); }
  double elapsed(int a, int b) override { return inner_.elapsed(a, b); }
  void reset_marks() override;

  // Every op since construction, in issue order, with its time (reading the marks still pending
  // synchronizes the inner backend).
  const std::vector<OpRecord>& records();

 private:
  template <typename F>
  void timed(const char* op, std::string what, F&& call);
  void read_pending_marks();

  struct Pending {
    std::size_t record;
    int start, end;
  };
  Backend& inner_;
  std::vector<OpRecord> records_;
  std::vector<Pending> pending_;
  int pass_ = 0, index_in_pass_ = 0;
};

// One op of a pass over `repeats` repeats of the same passes (run_rank: forward, backward, forward, ...): the
// median of its times. Throws InvalidArgument when the repeats did not issue the same ops.
struct OpProfileRow {
  bool backward = false;
  int index = 0;
  std::string op, what;
  double median_s = 0;
};
std::vector<OpProfileRow> summarize_ops(const std::vector<OpRecord>& records, int repeats);

}  // namespace laga
