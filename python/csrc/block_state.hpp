// The state behind one laga.torch.MultiheadLatentAttention: configuration and options, the backend and
// communicator on the module's device, and what the last step measured. Forward and backward take PyTorch
// tensors in the block's layout (x [s, batch, d]; weights as Hugging Face's DeepseekV3Attention holds them) and
// hand laga's outputs back as PyTorch tensors over the same memory.
#pragma once

#include <ATen/ATen.h>
#include <torch/custom_class.h>

#include <memory>
#include <string>
#include <vector>

#include "laga/attention_provider.hpp"
#include "laga/block.hpp"
#include "torch_memory.hpp"

namespace laga_torch {

// What the tensors handed to PyTorch keep alive: declared in construction order, destroyed in reverse.
struct Resources {
  c10::Device device;
  std::unique_ptr<TorchAllocator> alloc;
  std::unique_ptr<BorrowingAllocator> borrow;
  std::unique_ptr<laga::Backend> backend;
  std::unique_ptr<laga::Communicator> inner;
  std::unique_ptr<laga::CountingCommunicator> comm;
  explicit Resources(c10::Device d) : device(d) {}
};

class Saved;

class Block : public torch::CustomClassHolder {
 public:
  // options_json: {"form", "layout", "kernel", "recompute", "absorbed_attention", "attention_provider"} as the
  // CLI spells them, {"kv_grad_reduce_fp32", "overlap", "timing", "accumulate_grads", "deterministic"}
  // booleans; group_name "" = one rank.
  Block(const std::string& config_json, const std::string& options_json, const std::string& group_name, int64_t rank,
        int64_t size);

  // x [s, batch, d] contiguous; weights in MlaWeights::named() order (Hugging Face's parameters). With `expose`,
  // the tensors forward keeps for backward come back as PyTorch tensors (the third element), which the returned
  // object then no longer holds: the caller keeps them (autograd's save_for_backward, where saved-tensor hooks
  // such as activation checkpointing's or offloading's see them) and hands them to backward.
  std::tuple<at::Tensor, c10::intrusive_ptr<Saved>, std::vector<at::Tensor>> forward(
      const at::Tensor& x, const std::vector<at::Tensor>& weights, bool expose);
  // A forward no backward follows (torch.no_grad, inference): keeps nothing (laga::SavedContext::keep), each
  // activation freed as soon as forward is done with it; the last step is this forward alone.
  at::Tensor forward_no_grad(const at::Tensor& x, const std::vector<at::Tensor>& weights);
  // The last forward's and backward's figures as laga::rank_report writes a rank's run (JSON).
  std::string stats_json() const;
  // Whether the next steps are timed (MlaBlock::set_timing).
  void set_timing(bool on) { timing_ = on; }

 private:
  friend class Saved;
  std::shared_ptr<Resources> resources(c10::Device device);
  // Forward's shared part: y, and what it kept (nothing unless `keep`).
  c10::intrusive_ptr<Saved> run_forward(const at::Tensor& x, const std::vector<at::Tensor>& weights, bool keep,
                                        at::Tensor& y);
  laga::MlaWeights borrow_weights(Resources& r, const std::vector<at::Tensor>& weights, laga::DType dtype) const;

  laga::MlaConfig cfg_;
  laga::BlockOptions opts_;
  laga::AttentionProvider provider_ = laga::AttentionProvider::Automatic;
  bool timing_ = false;  // MlaBlock::set_timing
  bool deterministic_ = true;  // cuda_set_attention_deterministic (CUDA only)
  std::string group_name_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Resources> res_;
  // The last step.
  laga::BlockShape shape_;
  laga::PassStats fwd_, bwd_;
  std::vector<laga::AllocationRecord> saved_;
  std::size_t saved_bytes_ = 0;
  std::vector<laga::CollectiveRecord> traffic_;
};

// What one forward kept for its backward (consumed by it).
class Saved : public torch::CustomClassHolder {
 public:
  Saved(c10::intrusive_ptr<Block> block, std::shared_ptr<Resources> res, std::unique_ptr<laga::MlaBlock> mla)
      : block_(std::move(block)), res_(std::move(res)), mla_(std::move(mla)) {}
  // dy [s, batch, d]; returns dx and the weight gradients in the order of the weights, in the weights' dtype,
  // or, given main_grads (one per weight, its shape, the weights' dtype or float32), adds the gradients to them
  // (the module's fuse_wgrad_accumulation) and returns no gradient. Consumes what forward kept, unless `retain`
  // (backward through the same graph again, as gradcheck does: the saved tensors then stay alive until this
  // object goes). `saved`: what an exposing forward returned, or what a saved-tensor hook gave back for it (a
  // recomputation, a copy from the host), each the same shape and dtype; empty otherwise.
  std::tuple<at::Tensor, std::vector<at::Tensor>> backward(const at::Tensor& dy, const at::Tensor& x,
                                                           const std::vector<at::Tensor>& weights,
                                                           const std::vector<at::Tensor>& main_grads, bool retain,
                                                           const std::vector<at::Tensor>& saved);
  laga::SavedContext& context() { return ctx_; }

 private:
  friend class Block;
  c10::intrusive_ptr<Block> block_;
  std::shared_ptr<Resources> res_;
  std::unique_ptr<laga::MlaBlock> mla_;
  laga::SavedContext ctx_;
  // An exposing forward's saved tensors: each name's place in what it returned (one tensor for names that share
  // one, as o and o_att can), with its shape and dtype.
  struct Exposed {
    laga::Saved name;
    std::size_t index;
    laga::Shape shape;
    laga::DType dtype;
  };
  std::vector<Exposed> exposed_;
  std::size_t n_exposed_ = 0;
  bool consumed_ = false;
};

// Before any op on CUDA tensors: the allocator and backend follow PyTorch's current stream of `device`.
void follow_current_stream(Resources& r);

}  // namespace laga_torch
