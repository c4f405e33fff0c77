// The cuDNN provider's entry points when it is not built in (the cudnn-frontend headers or cudnn.h were not
// found at configure time): cuDNN reports itself not compiled in, and no call is taken.
#include "cuda/cudnn_attention.hpp"

namespace laga::cuda {

const CudnnStatus& cudnn_status() {
  static const CudnnStatus status{.error = "laga was built without the cuDNN provider (the cudnn-frontend headers "
                                           "or cudnn.h were not found at configure time: "
                                           "scripts/fetch_cudnn_frontend.sh)"};
  return status;
}

std::string cudnn_attention_rejects(const AttentionFwdParams&) { return cudnn_status().error; }
std::string cudnn_attention_rejects(const AttentionBwdParams&) { return cudnn_status().error; }

struct CudnnAttention::Impl {};
CudnnAttention::CudnnAttention(void*, std::function<void*(std::size_t)>) {}
CudnnAttention::~CudnnAttention() = default;
void CudnnAttention::set_stream(void*) {}
bool CudnnAttention::forward(const AttentionFwdParams&, std::string* why) {
  if (why) *why = cudnn_status().error;
  return false;
}
bool CudnnAttention::backward(const AttentionBwdParams&, bool, std::string* why) {
  if (why) *why = cudnn_status().error;
  return false;
}
std::int64_t CudnnAttention::backward_workspace(const AttentionBwdParams&, bool) { return -1; }
std::size_t CudnnAttention::graphs_built() const { return 0; }
std::size_t CudnnAttention::largest_workspace() const { return 0; }

}  // namespace laga::cuda
