// Built instead of src/cuda/*.cu when nvcc was not found at configure time: the same entry points, so
// dependents link the same `laga_cuda` target, and a clear error when the backend is asked for.
#include "laga/cuda.hpp"

#include "laga/errors.hpp"
#include "laga/hosted.hpp"
#include "laga/nccl_comm.hpp"
#include "laga/timed_comm.hpp"

namespace laga {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw InvalidArgument(detail::concat(what, ": laga was built without CUDA"));
}
}  // namespace

bool cuda_available() { return false; }

int cuda_device_count() { return 0; }

std::unique_ptr<Backend> make_cuda_backend(int /*device*/) { no_cuda("make_cuda_backend"); }
std::unique_ptr<Backend> make_cuda_backend(int, Allocator&, void*) { no_cuda("make_cuda_backend"); }
void set_cuda_stream(Backend&, void*) { no_cuda("set_cuda_stream"); }

void* cuda_stream(Backend&) { no_cuda("cuda_stream"); }
int cuda_device_of(Backend&) { no_cuda("cuda_device_of"); }
CudaMemInfo cuda_mem_info(int) { no_cuda("cuda_mem_info"); }
std::string cuda_device_name(int) { no_cuda("cuda_device_name"); }
int cuda_multiprocessor_count(int) { no_cuda("cuda_multiprocessor_count"); }
std::size_t cuda_peak_used_bytes(Backend&) { no_cuda("cuda_peak_used_bytes"); }
void cuda_reset_peak_used(Backend&) { no_cuda("cuda_reset_peak_used"); }
CudaScratchInfo cuda_scratch_info(Backend&) { no_cuda("cuda_scratch_info"); }
std::size_t cuda_scratch_peak_bytes(Backend&) { no_cuda("cuda_scratch_peak_bytes"); }
void cuda_reset_scratch_peak(Backend&, bool) { no_cuda("cuda_reset_scratch_peak"); }
std::size_t cuda_default_eager_scratch_cap() { no_cuda("cuda_default_eager_scratch_cap"); }
std::size_t cuda_eager_scratch_cap(Backend&) { no_cuda("cuda_eager_scratch_cap"); }
void cuda_set_eager_scratch_cap(Backend&, std::size_t) { no_cuda("cuda_set_eager_scratch_cap"); }
bool cuda_default_flash_fused_dq() { no_cuda("cuda_default_flash_fused_dq"); }
bool cuda_flash_fused_dq(Backend&) { no_cuda("cuda_flash_fused_dq"); }
void cuda_set_flash_fused_dq(Backend&, bool) { no_cuda("cuda_set_flash_fused_dq"); }
int cuda_flash_row_splits(Backend&) { no_cuda("cuda_flash_row_splits"); }
int cuda_flash_forward_blocks(Backend&) { no_cuda("cuda_flash_forward_blocks"); }
void cuda_set_flash_forward_blocks(Backend&, int) { no_cuda("cuda_set_flash_forward_blocks"); }
int cuda_flash_forward_head_group(Backend&) { no_cuda("cuda_flash_forward_head_group"); }
void cuda_set_flash_forward_head_group(Backend&, int) { no_cuda("cuda_set_flash_forward_head_group"); }
int cuda_flash_backward_blocks(Backend&) { no_cuda("cuda_flash_backward_blocks"); }
int cuda_default_flash_backward_blocks(int) { no_cuda("cuda_default_flash_backward_blocks"); }
void cuda_set_flash_backward_blocks(Backend&, int) { no_cuda("cuda_set_flash_backward_blocks"); }
int cuda_flash_backward_head_group(Backend&) { no_cuda("cuda_flash_backward_head_group"); }
void cuda_set_flash_backward_head_group(Backend&, int) { no_cuda("cuda_set_flash_backward_head_group"); }
void cuda_set_flash_row_splits(Backend&, int) { no_cuda("cuda_set_flash_row_splits"); }
bool cuda_flash_ws_forward(Backend&) { no_cuda("cuda_flash_ws_forward"); }
void cuda_set_flash_ws_forward(Backend&, bool) { no_cuda("cuda_set_flash_ws_forward"); }
bool cuda_flash_ws_backward(Backend&) { no_cuda("cuda_flash_ws_backward"); }
void cuda_set_flash_ws_backward(Backend&, bool) { no_cuda("cuda_set_flash_ws_backward"); }
bool cuda_flash_vk_rows(Backend&) { no_cuda("cuda_flash_vk_rows"); }
void cuda_set_flash_vk_rows(Backend&, bool) { no_cuda("cuda_set_flash_vk_rows"); }

std::unique_ptr<CommClock> make_cuda_comm_clock(Backend&) { no_cuda("make_cuda_comm_clock"); }
void cuda_set_attention_provider(Backend&, AttentionProvider) { no_cuda("cuda_set_attention_provider"); }
AttentionProvider cuda_attention_provider(Backend&) { no_cuda("cuda_attention_provider"); }
void cuda_set_attention_deterministic(Backend&, bool) { no_cuda("cuda_set_attention_deterministic"); }
bool cuda_attention_deterministic(Backend&) { no_cuda("cuda_attention_deterministic"); }
CudnnInfo cuda_cudnn_info() { return CudnnInfo{.error = "laga was built without CUDA"}; }
AttentionProviderCounts cuda_attention_provider_counts(Backend&) { no_cuda("cuda_attention_provider_counts"); }
void cuda_reset_attention_provider_counts(Backend&) { no_cuda("cuda_reset_attention_provider_counts"); }

std::unique_ptr<Communicator> make_host_staging_communicator(Communicator&, Backend&) {
  no_cuda("make_host_staging_communicator");
}

}  // namespace laga
