#include "block_state.hpp"

#include <algorithm>

#include <nlohmann/json.hpp>

#ifdef LAGA_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "laga/comm.hpp"
#include "laga/config.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/hosted.hpp"
#include "laga/report.hpp"
#include "process_group_comm.hpp"

namespace laga_torch {

Block::Block(const std::string& config_json, const std::string& options_json, const std::string& group_name,
             int64_t rank, int64_t size)
    : cfg_(laga::config_from_json(config_json, "config")), group_name_(group_name), rank_(int(rank)),
      size_(int(size)) {
  laga::validate(cfg_);
  const nlohmann::json o = nlohmann::json::parse(options_json);
  opts_.form = laga::parse_form(o.at("form"));
  opts_.layout = laga::parse_layout(o.at("layout"));
  opts_.kernel = laga::parse_kernel(o.at("kernel"));
  opts_.recompute = laga::parse_recompute(o.at("recompute"));
  opts_.absorbed_attention = laga::parse_absorbed_attention(o.at("absorbed_attention"));
  opts_.kv_grad_reduce_fp32 = o.at("kv_grad_reduce_fp32");
  opts_.overlap = o.at("overlap");
  opts_.accumulate_grads = o.at("accumulate_grads");
  provider_ = laga::parse_attention_provider(o.at("attention_provider"));
  timing_ = o.at("timing");
  deterministic_ = o.at("deterministic");
  LAGA_REQUIRE(size_ >= 1 && rank_ >= 0 && rank_ < size_, "rank ", rank_, " of ", size_, ": must be in [0, size)");
  LAGA_REQUIRE(!group_name_.empty() || size_ == 1, "a group of ", size_, " ranks needs a process group");
}

std::shared_ptr<Resources> Block::resources(c10::Device device) {
  if (res_ && res_->device == device) return res_;
  auto r = std::make_shared<Resources>(device);
  r->alloc = std::make_unique<TorchAllocator>(device);
  r->borrow = std::make_unique<BorrowingAllocator>(r->alloc->device());
  if (device.is_cuda()) {
    r->backend = laga::make_cuda_backend(device.index(), *r->alloc, nullptr);
    if (provider_ == laga::AttentionProvider::Cudnn) {
      const laga::CudnnInfo info = laga::cuda_cudnn_info();
      LAGA_REQUIRE(info.loaded, "attention_provider = 'cudnn': cuDNN is not available (", info.error,
                   "); use 'auto' or 'laga'");
    }
    laga::cuda_set_attention_provider(*r->backend, provider_);
    laga::cuda_set_attention_deterministic(*r->backend, deterministic_);
  } else {
    LAGA_REQUIRE(provider_ != laga::AttentionProvider::Cudnn,
                 "attention_provider = 'cudnn' on a CPU tensor: cuDNN runs on the GPU");
    r->backend = laga::make_cpu_backend(*r->alloc);
  }
  if (group_name_.empty()) {
    r->inner = laga::make_single_rank_communicator(*r->backend);
  } else {
    r->inner = make_process_group_communicator(group_name_, device);
    LAGA_CHECK(r->inner->size() == size_ && r->inner->rank() == rank_, "the process group has rank ",
               r->inner->rank(), " of ", r->inner->size(), ", the module was made for rank ", rank_, " of ", size_);
  }
  r->comm = std::make_unique<laga::CountingCommunicator>(*r->inner);
  res_ = r;
  return res_;
}

void follow_current_stream(Resources& r) {
  if (!r.device.is_cuda()) return;
#ifdef LAGA_HAVE_CUDA
  void* stream = c10::cuda::getCurrentCUDAStream(r.device.index()).stream();
  r.alloc->set_stream(stream);
  laga::set_cuda_stream(*r.backend, stream);
#endif
}

laga::MlaWeights Block::borrow_weights(Resources& r, const std::vector<at::Tensor>& weights, laga::DType dtype) const {
  // The expected names and shapes: the configuration's weights on the meta device, each replaced below by the
  // caller's tensor once it is checked.
  laga::MetaAllocator meta;
  laga::MlaWeights out = laga::allocate_weights(cfg_, dtype, meta);
  const auto named = out.named();
  LAGA_REQUIRE(weights.size() == named.size(), "got ", weights.size(), " weights, expected ", named.size());
  for (std::size_t i = 0; i < named.size(); ++i) {
    const auto& [name, t] = named[i];
    const at::Tensor& src = weights[i];
    const laga::Shape got(src.sizes().begin(), src.sizes().end());
    LAGA_REQUIRE(got == t->shape(), "weight ", name, " has shape ", laga::shape_string(got), ", expected ",
                 laga::shape_string(t->shape()));
    LAGA_REQUIRE(src.device() == r.device, "weight ", name, " is on ", src.device().str(), " but the input is on ",
                 r.device.str(), ": every tensor must be on one device");
    LAGA_REQUIRE(to_laga(src.scalar_type()) == dtype, "weight ", name, " is ", c10::toString(src.scalar_type()),
                 " but the input is ", laga::dtype_name(dtype), ": one dtype for input and weights");
    LAGA_REQUIRE(src.is_contiguous(), "weight ", name, " must be contiguous");
    *t = r.borrow->borrow(src, name);
  }
  return out;
}

c10::intrusive_ptr<Saved> Block::run_forward(const at::Tensor& x, const std::vector<at::Tensor>& weights, bool keep,
                                             at::Tensor& y) {
  LAGA_REQUIRE(x.dim() == 3, "x has ", x.dim(), " dimensions: expected [s, batch, hidden_size]");
  LAGA_REQUIRE(x.is_contiguous(), "x must be contiguous");
  opts_.dtype = to_laga(x.scalar_type());
  // Gradients in the weights' dtype (autograd's .grad), or added to main_grad in its own.
  opts_.grad_dtype = opts_.accumulate_grads ? std::nullopt : std::optional(opts_.dtype);
  std::shared_ptr<Resources> r = resources(x.device());
  follow_current_stream(*r);
  laga::BlockShape shape{.batch = x.size(1), .seq = x.size(0) * size_, .ranks = size_, .rank = rank_};
  auto mla = std::make_unique<laga::MlaBlock>(cfg_, opts_, shape, *r->backend, *r->comm);
  mla->set_timing(timing_);
  laga::MlaWeights w = borrow_weights(*r, weights, opts_.dtype);
  laga::Tensor xb = r->borrow->borrow(x, "x");
  auto saved = c10::make_intrusive<Saved>(c10::intrusive_ptr<Block>::unsafe_reclaim_from_nonowning(this), r, std::move(mla));
  saved->ctx_.keep = keep;
  r->comm->clear();
  y = as_torch(saved->mla_->forward(saved->context(), xb, w), r->device, r);
  shape_ = shape;
  fwd_ = saved->mla_->forward_stats();
  saved_ = r->alloc->saved_tensors();
  saved_bytes_ = r->alloc->saved_bytes();
  return saved;
}

std::tuple<at::Tensor, c10::intrusive_ptr<Saved>, std::vector<at::Tensor>> Block::forward(
    const at::Tensor& x, const std::vector<at::Tensor>& weights, bool expose) {
  at::Tensor y;
  c10::intrusive_ptr<Saved> saved = run_forward(x, weights, /*keep=*/true, y);
  std::vector<at::Tensor> exposed;
  if (expose) {
    const std::shared_ptr<Resources>& r = saved->res_;
    std::vector<const laga::Tensor*> distinct;
    for (const auto& [name, t] : saved->ctx_.tensors) {
      auto same = [&t](const laga::Tensor* u) {
        return u->data() == t.data() && u->shape() == t.shape() && u->dtype() == t.dtype();
      };
      const std::size_t at = std::size_t(std::find_if(distinct.begin(), distinct.end(), same) - distinct.begin());
      if (at == distinct.size()) {
        distinct.push_back(&t);
        exposed.push_back(as_torch(t, r->device, r));
      }
      saved->exposed_.push_back({name, at, t.shape(), t.dtype()});
    }
    saved->n_exposed_ = exposed.size();
    saved->ctx_.clear();  // the PyTorch tensors hold the memory now, and only they
  }
  return {y, saved, exposed};
}

at::Tensor Block::forward_no_grad(const at::Tensor& x, const std::vector<at::Tensor>& weights) {
  at::Tensor y;
  const c10::intrusive_ptr<Saved> saved = run_forward(x, weights, /*keep=*/false, y);
  // The step is this forward alone: it kept nothing, and no backward follows.
  saved_.clear();
  saved_bytes_ = 0;
  bwd_ = laga::PassStats{};
  traffic_ = saved->res_->comm->records();
  return y;
}

std::tuple<at::Tensor, std::vector<at::Tensor>> Saved::backward(const at::Tensor& dy, const at::Tensor& x,
                                                                const std::vector<at::Tensor>& weights,
                                                                const std::vector<at::Tensor>& main_grads, bool retain,
                                                                const std::vector<at::Tensor>& saved) {
  LAGA_REQUIRE(!consumed_, "this forward's backward has run already (laga's block frees what forward kept; "
               "retain_saved=True keeps it for another backward)");
  // Exposed tensors are autograd's: it keeps them for another backward through the graph, or refuses one.
  consumed_ = !retain && exposed_.empty();
  Resources& r = *res_;
  LAGA_REQUIRE(dy.device() == r.device && x.device() == r.device, "dy and x must be on ", r.device.str());
  LAGA_REQUIRE(dy.sizes() == x.sizes() && dy.is_contiguous(), "dy must be contiguous with x's shape");
  LAGA_REQUIRE(saved.size() == n_exposed_, "got ", saved.size(), " saved tensors for backward, forward gave ",
               n_exposed_);
  if (!exposed_.empty()) {  // borrowed for this backward: its releases drop the borrowings, autograd frees the memory
    ctx_.clear();
    std::vector<laga::Tensor> borrowed(saved.size());
    for (const Exposed& e : exposed_) {
      const at::Tensor& t = saved[e.index];
      const char* name = laga::saved_name(e.name);
      const laga::Shape shape(t.sizes().begin(), t.sizes().end());
      LAGA_REQUIRE(t.device() == r.device && t.is_contiguous() && to_laga(t.scalar_type()) == e.dtype &&
                       shape == e.shape,
                   "saved tensor ", name, " came back as ", c10::toString(t.scalar_type()), " ",
                   laga::shape_string(shape), " on ", t.device().str(),
                   ": forward saved a contiguous ", laga::dtype_name(e.dtype), " ", laga::shape_string(e.shape),
                   " on ", r.device.str());
      if (!borrowed[e.index].defined()) borrowed[e.index] = r.borrow->borrow(t, name);
      ctx_.tensors[e.name] = borrowed[e.index];
    }
  }
  follow_current_stream(r);
  const laga::DType dtype = mla_->options().dtype;
  laga::MlaWeights w = block_->borrow_weights(r, weights, dtype);
  laga::Tensor xb = r.borrow->borrow(x, "x"), dyb = r.borrow->borrow(dy, "dy");
  // The gradients have the weights' fields and shapes: each handle of a copy of `w` is replaced by a new tensor
  // in the weights' dtype, or by the weight's main_grad, which the block adds to.
  laga::MlaGrads g = w;
  std::vector<at::Tensor> grads;
  const bool into_main = !main_grads.empty();
  LAGA_REQUIRE(into_main == mla_->options().accumulate_grads, "main_grads are given exactly when the module adds "
               "to them (fuse_wgrad_accumulation)");
  LAGA_REQUIRE(!into_main || main_grads.size() == weights.size(), main_grads.size(), " main_grads for ",
               weights.size(), " weights");
  std::size_t i = 0;
  for (auto& [name, t] : g.named()) {
    if (into_main) {
      const at::Tensor& m = main_grads[i++];
      LAGA_REQUIRE(m.device() == r.device && m.is_contiguous() && m.sizes() == at::IntArrayRef(t->shape()),
                   name, ".main_grad must be a contiguous tensor of the weight's shape on ", r.device.str());
      *t = r.borrow->borrow(m, "grad." + name);
    } else {
      grads.push_back(at::empty(at::IntArrayRef(t->shape()), at::TensorOptions().dtype(to_torch(dtype)).device(r.device)));
      *t = r.borrow->borrow(grads.back(), "grad." + name);
    }
  }
  laga::SavedContext kept;
  if (retain) kept = ctx_;  // the handles keep every saved tensor alive through backward's releases
  laga::Tensor dx = mla_->backward(g, retain ? kept : ctx_, dyb, xb, w);
  block_->bwd_ = mla_->backward_stats();
  block_->traffic_ = r.comm->records();
  at::Tensor dx_t = as_torch(dx, r.device, res_);
  if (consumed_) mla_.reset();
  return {dx_t, grads};
}

// This rank's last forward and backward as laga::rank_report writes a rank's run (laga run --json, laga bench):
// one schema. The host's allocator holds the device memory, so there is no device memory record.
std::string Block::stats_json() const {
  laga::RankRun run;
  run.saved = saved_;
  run.saved_bytes = saved_bytes_;
  run.fwd = fwd_;
  run.bwd = bwd_;
  run.traffic = traffic_;
  return laga::rank_report(run, shape_.rank, laga::DeviceMemory{}, -1).dump();
}

}  // namespace laga_torch
