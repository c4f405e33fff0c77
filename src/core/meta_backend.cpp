// The meta backend: shapes and bytes only. The planner runs the real orchestration on it, so the plan's
// saved tensors, peak bytes and traffic are those of the code that runs, not of a separate model.
#include "laga/backend.hpp"

namespace laga {
namespace {

// Shapes and bytes only: every op is a no-op. The planner runs the real orchestration on it.
class MetaBackend final : public Backend {
 public:
  Device device() const override { return Device::Meta; }
  const char* name() const override { return "meta"; }
  Allocator& allocator() override { return alloc_; }
  void gemm(const GemmArgs&) override {}
  void copy(const CopyArgs&) override {}
  void fill(const Tensor&, double) override {}
  void rmsnorm_forward(const RmsNormArgs&) override {}
  void rmsnorm_backward(const RmsNormArgs&) override {}
  void rope_forward(const RopeArgs&) override {}
  void rope_backward(const RopeArgs&) override {}
  void attention_forward(const AttentionFwdParams&) override {}
  void attention_backward(const AttentionBwdParams&) override {}
  void attention_merge(const AttentionMergeArgs&) override {}

 private:
  MetaAllocator alloc_;
};

}  // namespace

std::unique_ptr<Backend> make_meta_backend() { return std::make_unique<MetaBackend>(); }

}  // namespace laga
