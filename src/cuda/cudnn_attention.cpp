// cuDNN's fused attention through the cudnn-frontend graph API (see cudnn_attention.hpp).
//
// Layout: laga's [tokens, batch, heads, d] views are cuDNN's [b, h, s, d] dims with strides (batch stride,
// head stride, token stride, 1); the log-sum-exp [batch, heads, q_len] is cuDNN's Stats [b, h, s_q, 1],
// float32, the same convention (natural log of the sum of exp of the scaled scores). The mask: query i sees
// key j iff j <= i + q_offset, cuDNN's diagonal band aligned top-left with right bound q_offset. The
// backward runs cuDNN's deterministic algorithm (reruns bitwise identical) unless the caller asks for its
// default, non-deterministic one (dQ summed with atomics, a small workspace).
#include "cuda/cudnn_attention.hpp"

#include <cudnn_frontend.h>
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "laga/errors.hpp"

// The frontend's dynamic loading resolves every cuDNN call through this handle (set before the first call).
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}

namespace laga::cuda {
namespace fe = cudnn_frontend;
using i64 = std::int64_t;

const CudnnStatus& cudnn_status() {
  static const CudnnStatus status = [] {
    CudnnStatus s;
    s.compiled = true;
    s.compiled_version = CUDNN_VERSION;
    dlerror();
    void* h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
      const char* e = dlerror();
      s.error = std::string("cannot open libcudnn.so.9 (") + (e ? e : "unknown error") +
                "); put the folder holding it on LD_LIBRARY_PATH";
      return s;
    }
    fe::cudnn_dlhandle = h;
    try {
      s.version = static_cast<i64>(fe::detail::get_backend_version());
      s.loaded = s.version >= 90000;
      if (!s.loaded) s.error = "libcudnn.so.9 reports version " + std::to_string(s.version) + " (9.0 or later needed)";
    } catch (const std::exception& e) {
      s.error = e.what();
    }
    return s;
  }();
  return status;
}

std::string cudnn_attention_rejects(const AttentionFwdParams& p) {
  auto say = [](auto&&... a) { return detail::concat(a...); };
  if (p.dtype != DType::BF16) return say("dtype ", dtype_name(p.dtype), " (cuDNN provider: bfloat16 only)");
  if (p.kernel != AttentionKernel::Fused) return "the eager kernel (cuDNN provider: fused only)";
  if (p.q_heads != p.kv_heads) return say("q_heads ", p.q_heads, " != kv_heads ", p.kv_heads, " (cuDNN provider: MHA only)");
  if (p.d_qk % 8 || p.d_v % 8 || p.d_qk > 256 || p.d_v > 256)
    return say("head dims d_qk ", p.d_qk, ", d_v ", p.d_v, " (cuDNN: multiples of 8, at most 256)");
  if (p.q_offset < 0) return say("q_offset ", p.q_offset, " (cuDNN's causal band: q_offset >= 0)");
  if (p.q_len > INT32_MAX || p.kv_len > INT32_MAX || p.q_offset > INT32_MAX)
    return say("q_len ", p.q_len, " / kv_len ", p.kv_len, " / q_offset ", p.q_offset, " beyond 32 bits");
  const void* ptrs[] = {p.q, p.k, p.v, p.o};
  for (const void* x : ptrs)
    if (x == nullptr || reinterpret_cast<std::uintptr_t>(x) % 16) return "q, k, v or o null or not 16-byte aligned";
  if (p.lse == nullptr) return "no lse buffer";
  const i64 strides[] = {p.q_token_stride, p.q_batch_stride, p.q_head_stride, p.k_token_stride, p.k_batch_stride,
                         p.k_head_stride,  p.v_token_stride, p.v_batch_stride, p.v_head_stride, p.o_token_stride,
                         p.o_batch_stride, p.o_head_stride};
  for (i64 s : strides)
    if (s % 8) return say("stride ", s, " (cuDNN: strides multiples of 8 elements)");
  return {};
}

std::string cudnn_attention_rejects(const AttentionBwdParams& p) {
  std::string why = cudnn_attention_rejects(static_cast<const AttentionFwdParams&>(p));
  if (!why.empty()) return why;
  if (p.dv_in_dk) return "dv_in_dk (dK and dV summed into dk)";
  const void* ptrs[] = {p.dout, p.dq, p.dk, p.dv};
  for (const void* x : ptrs)
    if (x == nullptr || reinterpret_cast<std::uintptr_t>(x) % 16) return "dout, dq, dk or dv null or not 16-byte aligned";
  const i64 strides[] = {p.dout_token_stride, p.dout_batch_stride, p.dout_head_stride, p.dq_token_stride,
                         p.dq_batch_stride,   p.dq_head_stride,    p.dk_token_stride,   p.dk_batch_stride,
                         p.dk_head_stride,    p.dv_token_stride,   p.dv_batch_stride,   p.dv_head_stride};
  for (i64 s : strides)
    if (s % 8) return detail::concat("gradient stride ", s, " (cuDNN: strides multiples of 8 elements)");
  return {};
}

namespace {

enum Uid : i64 { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Built {
  std::shared_ptr<fe::graph::Graph> graph;
  i64 workspace = 0;
  std::string error;  // non-empty: cuDNN has no plan for this shape (kept, so it is not retried every call)
};

// Every field of the call that the graph depends on (pointers excluded): a backward graph also bakes in the
// gradients' strides (bp). backward: 0 forward, 1 deterministic backward, 2 non-deterministic backward.
std::vector<i64> shape_key(const AttentionFwdParams& p, const AttentionBwdParams* bp, int backward) {
  i64 scale_bits = 0;
  std::memcpy(&scale_bits, &p.scale, sizeof(double));
  std::vector<i64> k = {backward,         i64(p.dtype),     p.batch,          p.q_len,          p.kv_len,
                        p.q_heads,        p.kv_heads,       p.d_qk,           p.d_v,            p.q_offset,
                        scale_bits,       p.q_token_stride, p.q_batch_stride, p.q_head_stride,  p.k_token_stride,
                        p.k_batch_stride, p.k_head_stride,  p.v_token_stride, p.v_batch_stride, p.v_head_stride,
                        p.o_token_stride, p.o_batch_stride, p.o_head_stride};
  if (bp)
    k.insert(k.end(), {bp->dout_token_stride, bp->dout_batch_stride, bp->dout_head_stride, bp->dq_token_stride,
                       bp->dq_batch_stride, bp->dq_head_stride, bp->dk_token_stride, bp->dk_batch_stride,
                       bp->dk_head_stride, bp->dv_token_stride, bp->dv_batch_stride, bp->dv_head_stride});
  return k;
}

// A [b, h, s, d] view of a [tokens, batch, heads, d] tensor.
std::shared_ptr<fe::graph::Tensor_attributes> view(fe::graph::Graph& g, const char* name, Uid uid, i64 b, i64 h,
                                                   i64 s, i64 d, i64 token_stride, i64 batch_stride,
                                                   i64 head_stride) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name(name)
                      .set_uid(uid)
                      .set_dim({b, h, s, d})
                      .set_stride({batch_stride, head_stride, token_stride, 1}));
}

void set_view(fe::graph::Tensor_attributes& t, const char* name, Uid uid, i64 b, i64 h, i64 s, i64 d,
              i64 token_stride, i64 batch_stride, i64 head_stride) {
  t.set_name(name).set_uid(uid).set_output(true).set_dim({b, h, s, d}).set_stride(
      {batch_stride, head_stride, token_stride, 1});
}

}  // namespace

struct CudnnAttention::Impl {
  void* stream = nullptr;
  std::function<void*(std::size_t)> workspace;
  cudnnHandle_t handle = nullptr;
  std::map<std::vector<i64>, Built> graphs;
  i64 largest_workspace = 0;

  void ensure_handle() {
    if (handle) return;
    const CudnnStatus& st = cudnn_status();
    LAGA_CHECK(st.loaded, "cuDNN is not available: ", st.error);
    cudnnStatus_t s = fe::detail::create_handle(&handle);
    LAGA_CHECK(s == CUDNN_STATUS_SUCCESS, "cudnnCreate failed: ", fe::detail::get_error_string(s));
    s = fe::detail::set_stream(handle, static_cast<cudaStream_t>(stream));
    LAGA_CHECK(s == CUDNN_STATUS_SUCCESS, "cudnnSetStream failed: ", fe::detail::get_error_string(s));
  }

  Built& graph_for(const AttentionFwdParams& p, const AttentionBwdParams* bp, bool deterministic) {
    auto key = shape_key(p, bp, bp == nullptr ? 0 : deterministic ? 1 : 2);
    auto it = graphs.find(key);
    if (it != graphs.end()) return it->second;
    Built& b = graphs[key];
    try {
      build(b, p, bp, deterministic);
    } catch (const std::exception& e) {  // the frontend throws for what it cannot describe
      b.graph.reset();
      b.error = e.what();
    }
    if (b.error.empty()) largest_workspace = std::max(largest_workspace, b.workspace);
    return b;
  }

  void build(Built& b, const AttentionFwdParams& p, const AttentionBwdParams* bp, bool deterministic) {
    ensure_handle();
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const i64 B = p.batch, H = p.q_heads;
    auto q = view(*g, "Q", kQ, B, H, p.q_len, p.d_qk, p.q_token_stride, p.q_batch_stride, p.q_head_stride);
    auto k = view(*g, "K", kK, B, H, p.kv_len, p.d_qk, p.k_token_stride, p.k_batch_stride, p.k_head_stride);
    auto v = view(*g, "V", kV, B, H, p.kv_len, p.d_v, p.v_token_stride, p.v_batch_stride, p.v_head_stride);
    const std::vector<i64> stats_dim = {B, H, p.q_len, 1}, stats_stride = {H * p.q_len, p.q_len, 1, 1};
    if (bp == nullptr) {
      auto opts = fe::graph::SDPA_attributes()
                      .set_name("laga_attention_forward")
                      .set_generate_stats(true)
                      .set_attn_scale(float(p.scale))
                      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                      .set_diagonal_band_right_bound(int(p.q_offset));
      auto [o, stats] = g->sdpa(q, k, v, opts);
      set_view(*o, "O", kO, B, H, p.q_len, p.d_v, p.o_token_stride, p.o_batch_stride, p.o_head_stride);
      stats->set_name("Stats").set_uid(kStats).set_output(true).set_data_type(fe::DataType_t::FLOAT)
          .set_dim(stats_dim).set_stride(stats_stride);
    } else {
      auto o = view(*g, "O", kO, B, H, p.q_len, p.d_v, p.o_token_stride, p.o_batch_stride, p.o_head_stride);
      auto dO = view(*g, "dO", kDO, B, H, p.q_len, p.d_v, bp->dout_token_stride, bp->dout_batch_stride,
                     bp->dout_head_stride);
      auto stats = g->tensor(fe::graph::Tensor_attributes()
                                 .set_name("Stats")
                                 .set_uid(kStats)
                                 .set_dim(stats_dim)
                                 .set_stride(stats_stride)
                                 .set_data_type(fe::DataType_t::FLOAT));
      auto opts = fe::graph::SDPA_backward_attributes()
                      .set_name("laga_attention_backward")
                      .set_attn_scale(float(p.scale))
                      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                      .set_diagonal_band_right_bound(int(p.q_offset))
                      .set_deterministic_algorithm(deterministic);
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dO, stats, opts);
      set_view(*dq, "dQ", kDQ, B, H, p.q_len, p.d_qk, bp->dq_token_stride, bp->dq_batch_stride, bp->dq_head_stride);
      set_view(*dk, "dK", kDK, B, H, p.kv_len, p.d_qk, bp->dk_token_stride, bp->dk_batch_stride, bp->dk_head_stride);
      set_view(*dv, "dV", kDV, B, H, p.kv_len, p.d_v, bp->dv_token_stride, bp->dv_batch_stride, bp->dv_head_stride);
    }
    auto step = [&](fe::error_t e, const char* what) {
      if (e.is_bad() && b.error.empty()) b.error = std::string(what) + ": " + e.get_message();
      return e.is_good();
    };
    const bool ok = step(g->validate(), "validate") && step(g->build_operation_graph(handle), "operation graph") &&
                    step(g->create_execution_plans({fe::HeurMode_t::A}), "execution plans") &&
                    step(g->check_support(handle), "support") && step(g->build_plans(handle), "build plans") &&
                    step(g->get_workspace_size(b.workspace), "workspace size");
    if (ok) b.graph = std::move(g);
  }

  bool run(const AttentionFwdParams& p, const AttentionBwdParams* bp, bool deterministic, std::string* why) {
    Built& b = graph_for(p, bp, deterministic);
    if (!b.graph) {
      if (why) *why = b.error;
      return false;
    }
    std::unordered_map<i64, void*> pack = {{kQ, const_cast<void*>(p.q)}, {kK, const_cast<void*>(p.k)},
                                           {kV, const_cast<void*>(p.v)}, {kO, p.o},
                                           {kStats, p.lse}};
    if (bp) {
      pack[kDO] = const_cast<void*>(bp->dout);
      pack[kDQ] = bp->dq;
      pack[kDK] = bp->dk;
      pack[kDV] = bp->dv;
    }
    void* ws = b.workspace > 0 ? workspace(std::size_t(b.workspace)) : nullptr;
    auto e = b.graph->execute(handle, pack, ws);
    LAGA_CHECK(e.is_good(), "cuDNN attention ", bp ? "backward" : "forward", " failed: ", e.get_message());
    return true;
  }
};

CudnnAttention::CudnnAttention(void* stream, std::function<void*(std::size_t)> workspace)
    : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  impl_->workspace = std::move(workspace);
}

void CudnnAttention::set_stream(void* stream) {
  impl_->stream = stream;
  if (!impl_->handle) return;
  const cudnnStatus_t s = fe::detail::set_stream(impl_->handle, static_cast<cudaStream_t>(stream));
  LAGA_CHECK(s == CUDNN_STATUS_SUCCESS, "cudnnSetStream failed: ", fe::detail::get_error_string(s));
}

CudnnAttention::~CudnnAttention() {
  if (impl_ && impl_->handle) {
    impl_->graphs.clear();
    (void)fe::detail::destroy_handle(impl_->handle);
  }
}

bool CudnnAttention::forward(const AttentionFwdParams& p, std::string* why) {
  return impl_->run(p, nullptr, true, why);
}
bool CudnnAttention::backward(const AttentionBwdParams& p, bool deterministic, std::string* why) {
  return impl_->run(p, &p, deterministic, why);
}
std::int64_t CudnnAttention::backward_workspace(const AttentionBwdParams& p, bool deterministic) {
  const Built& b = impl_->graph_for(p, &p, deterministic);
  return b.graph ? b.workspace : -1;
}
std::size_t CudnnAttention::graphs_built() const { return impl_->graphs.size(); }
std::size_t CudnnAttention::largest_workspace() const { return std::size_t(impl_->largest_workspace); }

}  // namespace laga::cuda
