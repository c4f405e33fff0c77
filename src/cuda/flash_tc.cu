// Launches of the tensor-core attention kernels on a CUDA stream: the launch sequence of flash_launch.cuh
// (also run by the host emulation of tests/emu) on a launcher over the backend's stream, scratch and device.
#include "cuda/flash_tc.cuh"

#include "cuda/flash_launch.cuh"

namespace laga::cuda {
namespace {

ScratchSlot slot_of(flash::LaunchScratch s) {
  switch (s) {
    case flash::LaunchScratch::delta: return ScratchSlot::delta;
    case flash::LaunchScratch::dq_accum: return ScratchSlot::dq_accum;
    case flash::LaunchScratch::dq_count: return ScratchSlot::dq_count;
    case flash::LaunchScratch::split_partial: return ScratchSlot::split_partial;
    case flash::LaunchScratch::taken: return ScratchSlot::taken;
  }
  LAGA_CHECK(false, "unknown scratch slot of the tensor-core attention");
  return ScratchSlot::delta;
}

class StreamLauncher {
 public:
  explicit StreamLauncher(Context& ctx) : ctx_(ctx) {}

  template <typename Kernel, typename... Args>
  void launch(Kernel kernel, const char* name, i64 blocks, int threads, std::size_t smem, Args... args) {
    if (smem > 0) {
      LAGA_REQUIRE(smem <= std::size_t(ctx_.max_smem_per_block), name, " needs ", smem,
                   " bytes of shared memory; the device allows ", ctx_.max_smem_per_block);
      LAGA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    }
    kernel<<<dim3(unsigned(blocks)), threads, smem, ctx_.stream>>>(args...);
    LAGA_CUDA_CHECK_LAUNCH(name);
  }
  void* scratch(flash::LaunchScratch s, std::size_t bytes) { return ctx_.scratch.get(slot_of(s), bytes, ctx_.stream); }
  void zero(void* ptr, std::size_t bytes) { LAGA_CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, ctx_.stream)); }
  int multiprocessors() const { return ctx_.multiprocessors; }
  bool fused_dq() const { return ctx_.flash_fused_dq; }
  int row_splits() const { return ctx_.flash_row_splits; }
  bool warp_specialized_forward() const { return ctx_.flash_ws_forward; }
  int forward_blocks() const { return ctx_.flash_forward_blocks; }
  int forward_head_group() const { return ctx_.flash_forward_head_group; }
  bool warp_specialized_backward() const { return ctx_.flash_ws_backward; }
  int backward_blocks() const { return ctx_.flash_backward_blocks; }
  int backward_head_group() const { return ctx_.flash_backward_head_group; }
  bool rows_resident_vk() const { return ctx_.flash_vk_rows; }
  bool ordered_dq() const { return ctx_.flash_ordered_dq; }

 private:
  Context& ctx_;
};

}  // namespace

bool flash_tc_supported(const AttentionFwdParams& p) { return flash::tc_supported(p); }

bool flash_tc_takes_dv_in_dk(Context& ctx, const AttentionFwdParams& p) {
  StreamLauncher launcher(ctx);
  return flash::takes_dv_in_dk(launcher, p);
}

void flash_tc_forward(Context& ctx, const AttentionFwdParams& p) {
  StreamLauncher launcher(ctx);
  flash::forward(launcher, p);
}

void flash_tc_backward(Context& ctx, const AttentionBwdParams& p) {
  StreamLauncher launcher(ctx);
  flash::backward(launcher, p);
}

}  // namespace laga::cuda
