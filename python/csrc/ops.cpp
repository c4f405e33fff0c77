// The operators and classes of torch.ops.laga / torch.classes.laga. Loaded with torch.ops.load_library: no
// Python or pybind11 symbol is used, so one build serves every Python version of the same PyTorch.
#include <torch/library.h>

#include <limits>

#include "block_state.hpp"
#include "laga/config.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/plan.hpp"
#include "laga/report.hpp"
#include "laga/token_map.hpp"

namespace laga_torch {
namespace {

// laga's invalid-input errors become Python ValueErrors (c10::ValueError), with laga's message.
template <typename F>
auto translating(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const laga::InvalidArgument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
}

// What this extension was built with and what it runs with: CUDA, and cuDNN's attention (compiled in when the
// cudnn-frontend headers were found; loaded at run time), so a user can tell why `auto` does not take cuDNN.
std::string build_info() {
#ifdef LAGA_HAVE_CUDA
  const bool cuda = true;
#else
  const bool cuda = false;
#endif
  return nlohmann::json{{"cuda", cuda}, {"cudnn", laga::cudnn_info_report(laga::cuda_cudnn_info())}}.dump();
}

std::tuple<at::Tensor, c10::intrusive_ptr<Saved>, std::vector<at::Tensor>> mla_forward(
    const c10::intrusive_ptr<Block>& block, const at::Tensor& x, std::vector<at::Tensor> weights, bool expose) {
  return translating([&] { return block->forward(x, weights, expose); });
}

at::Tensor mla_forward_no_grad(const c10::intrusive_ptr<Block>& block, const at::Tensor& x,
                               std::vector<at::Tensor> weights) {
  return translating([&] { return block->forward_no_grad(x, weights); });
}

std::tuple<at::Tensor, std::vector<at::Tensor>> mla_backward(const c10::intrusive_ptr<Saved>& saved,
                                                             const at::Tensor& dy, const at::Tensor& x,
                                                             std::vector<at::Tensor> weights,
                                                             std::vector<at::Tensor> main_grads, bool retain,
                                                             std::vector<at::Tensor> saved_tensors) {
  return translating([&] { return saved->backward(dy, x, weights, main_grads, retain, saved_tensors); });
}

// A preset name or a config.json path -> the configuration as JSON (every field validated).
std::string resolve_config(const std::string& name_or_path) {
  return translating([&] { return laga::config_to_json(laga::resolve_model(name_or_path)); });
}

// A config.json text (a dict's json.dumps) -> the validated configuration as JSON.
std::string parse_config(const std::string& json_text) {
  return translating([&] {
    laga::MlaConfig c = laga::config_from_json(json_text, "config");
    laga::validate(c);
    return laga::config_to_json(c);
  });
}

// The document of `laga plan --json` for a configuration (JSON text) over a grid of seqs x sps.
std::string plan_json(const std::string& config_json, const std::string& layout, const std::string& kernel,
                      const std::string& dtype, int64_t batch, std::vector<int64_t> seqs, std::vector<int64_t> sps,
                      int64_t layers, const std::string& gpu_mem, bool kv_grad_reduce_fp32) {
  return translating([&] {
    laga::PlanQuery q{.cfg = laga::config_from_json(config_json, "config"),
                      .base = {.layout = laga::parse_layout(layout), .kernel = laga::parse_kernel(kernel),
                               .dtype = laga::parse_dtype(dtype), .kv_grad_reduce_fp32 = kv_grad_reduce_fp32},
                      .batch = batch, .seqs = seqs, .sps = sps, .layers = int(layers), .gpu_mem_bytes = 0};
    LAGA_REQUIRE(layers >= 1, "layers = ", layers, ": must be >= 1");
    LAGA_REQUIRE(batch >= 1, "batch = ", batch, ": must be >= 1");
    if (!gpu_mem.empty()) q.gpu_mem_bytes = laga::parse_bytes(gpu_mem);
    return laga::plan_document(q).dump();
  });
}

std::vector<int64_t> rank_positions(const std::string& layout, int64_t seq, int64_t ranks, int64_t rank) {
  return translating([&] {
    LAGA_REQUIRE(ranks >= 1 && ranks <= std::numeric_limits<int>::max(), "world = ", ranks, ": must be >= 1");
    return laga::rank_positions(laga::parse_layout(layout), seq, int(ranks), int(rank));
  });
}

}  // namespace
}  // namespace laga_torch

TORCH_LIBRARY(laga, m) {
  using laga_torch::Block;
  using laga_torch::Saved;
  m.class_<Block>("Block")
      .def(torch::init([](std::string config_json, std::string options_json, std::string group_name, int64_t rank,
                          int64_t size) {
        return laga_torch::translating(
            [&] { return c10::make_intrusive<Block>(config_json, options_json, group_name, rank, size); });
      }))
      .def("stats_json", &Block::stats_json)
      .def("set_timing", &Block::set_timing);
  m.class_<Saved>("Saved");
  m.def("mla_forward(__torch__.torch.classes.laga.Block block, Tensor x, Tensor[] weights, bool expose) -> "
        "(Tensor, __torch__.torch.classes.laga.Saved, Tensor[])",
        &laga_torch::mla_forward);
  m.def("mla_forward_no_grad(__torch__.torch.classes.laga.Block block, Tensor x, Tensor[] weights) -> Tensor",
        &laga_torch::mla_forward_no_grad);
  m.def("mla_backward(__torch__.torch.classes.laga.Saved saved, Tensor dy, Tensor x, Tensor[] weights, Tensor[] main_grads, "
        "bool retain, Tensor[] saved_tensors) -> "
        "(Tensor, Tensor[])",
        &laga_torch::mla_backward);
  m.def("build_info() -> str", &laga_torch::build_info);
  m.def("resolve_config(str name_or_path) -> str", &laga_torch::resolve_config);
  m.def("rank_positions(str layout, int seq, int ranks, int rank) -> int[]", &laga_torch::rank_positions);
  m.def("parse_config(str json_text) -> str", &laga_torch::parse_config);
  m.def("plan_json(str config_json, str layout, str kernel, str dtype, int batch, int[] seqs, int[] sps, int layers, "
        "str gpu_mem, bool kv_grad_reduce_fp32) -> str",
        &laga_torch::plan_json);
}
