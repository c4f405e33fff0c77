// cuDNN's fused attention (scaled dot-product attention through the graph API, cudnn-frontend headers) as a
// provider behind the CUDA backend's attention calls. No cuDNN header here: the backend includes this.
//
// Built only when the cudnn-frontend headers (fetched by scripts/fetch_cudnn_frontend.sh into
// build/_deps, pinned) and cudnn.h were found at configure time; otherwise cudnn_attention_stub.cpp
// provides the same entry points and reports cuDNN as not compiled in. libcudnn.so.9 is opened at run
// time (dlopen, the frontend's dynamic loading), so a binary built with the provider still runs where
// cuDNN is missing: the provider reports itself unavailable, with the loader's message.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "laga/backend.hpp"

namespace laga::cuda {

struct CudnnStatus {
  bool compiled = false;     // the provider was built in
  bool loaded = false;       // libcudnn.so.9 opened and answered cudnnGetVersion
  std::int64_t version = 0;  // cudnnGetVersion() of the library loaded (91400 = 9.14.0)
  std::int64_t compiled_version = 0;  // CUDNN_VERSION of the headers built against
  std::string error;         // why not compiled or not loaded
};
// The first call opens the library (once per process).
const CudnnStatus& cudnn_status();

// Empty when this provider takes the call (its rules, checked before any graph is built: bf16, fused, MHA,
// head dims multiples of 8 up to 256, q_offset >= 0, 16-byte aligned pointers, unit inner strides, strides
// multiples of 8), else the reason, naming the value.
std::string cudnn_attention_rejects(const AttentionFwdParams& p);
std::string cudnn_attention_rejects(const AttentionBwdParams& p);  // also dO, dQ, dK, dV

// One per backend: a cuDNN handle on the backend's stream and the graphs built so far, one per shape
// (dims, strides, q_offset, scale, direction), each built once and reused.
class CudnnAttention {
 public:
  // `workspace(bytes)` returns device memory of at least that size, valid until the call's work is done on
  // `stream` (the backend's kernel scratch).
  CudnnAttention(void* stream, std::function<void*(std::size_t)> workspace);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Queue the call on the stream. False, with the reason in *why, when cuDNN has no plan for the shape
  // (nothing was queued; the caller may fall back). Throws RuntimeError when a built plan fails to run.
  bool forward(const AttentionFwdParams& p, std::string* why);
  // deterministic: cuDNN's deterministic backward (bitwise reruns; a workspace of 2 bytes per (head, query,
  // key) on the H200). Otherwise its default one, as PyTorch's SDPA runs it: dQ summed with float32 atomics
  // (reruns differ in the last bits), a workspace of O(heads x queries x d_qk).
  bool backward(const AttentionBwdParams& p, bool deterministic, std::string* why);
  // The workspace cuDNN asks for this call (building its graph if needed, nothing queued); -1 when cuDNN has
  // no plan for it.
  std::int64_t backward_workspace(const AttentionBwdParams& p, bool deterministic);

  // Later calls queue on `stream` (the handle and the graphs built kept).
  void set_stream(void* stream);

  std::size_t graphs_built() const;
  std::size_t largest_workspace() const;  // bytes, over the graphs built

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace laga::cuda
