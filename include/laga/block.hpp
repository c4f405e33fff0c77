// The MLA attention block for training under sequence parallelism: three forms x two layouts, forward and
// backward, written once as an orchestration of Backend ops and Communicator collectives.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "laga/backend.hpp"
#include "laga/comm.hpp"
#include "laga/config.hpp"
#include "laga/tensor.hpp"

namespace laga {

enum class Form {
  Explicit,  // per-head K/V built locally and exchanged (Megatron-Core's training path)
  Absorbed,  // latent exchanged; W_UK folded into the query, W_UV after attention (MQA over the latent)
  Laga,      // latent exchanged; per-head K/V rebuilt locally from the gathered latent
};
enum class Layout {
  A2A,        // Ulysses: attention over the full sequence for n_h/P heads
  AllGather,  // context parallel: local queries, keys/values over the whole sequence
  P2P,        // ring (context parallel): local queries; keys/values pass around the ring chunk by chunk,
              // causal load balanced by the zigzag of include/laga/token_map.hpp
};
enum class Recompute { None, KV };  // KV: LAGA keeps only the gathered latent, rebuilds K/V in backward
// How the absorbed form runs attention: natively as MQA over the shared latent, or with the latent
// expanded to every head (what a kernel without MQA or without head dim 576 forces).
enum class AbsorbedAttention { Mqa, Expanded };

const char* form_name(Form);
const char* layout_name(Layout);
const char* kernel_name(AttentionKernel);
const char* recompute_name(Recompute);
const char* absorbed_attention_name(AbsorbedAttention);
Form parse_form(const std::string&);
Layout parse_layout(const std::string&);
AttentionKernel parse_kernel(const std::string&);
Recompute parse_recompute(const std::string&);
AbsorbedAttention parse_absorbed_attention(const std::string&);
DType parse_dtype(const std::string&);
inline constexpr std::array<Form, 3> kAllForms = {Form::Explicit, Form::Absorbed, Form::Laga};
inline constexpr std::array<Layout, 2> kAllLayouts = {Layout::A2A, Layout::AllGather};
inline constexpr std::array<AttentionKernel, 2> kAllKernels = {AttentionKernel::Eager,
                                                               AttentionKernel::Fused};

struct BlockOptions {
  Form form = Form::Laga;
  Layout layout = Layout::A2A;
  AttentionKernel kernel = AttentionKernel::Fused;
  Recompute recompute = Recompute::None;
  AbsorbedAttention absorbed_attention = AbsorbedAttention::Mqa;
  DType dtype = DType::F32;
  // all_gather, P > 1, bfloat16: the explicit form widens its per-rank partial K/V gradients to float32
  // before the reduce-scatter (twice its backward K/V traffic) and runs the up-projection's backward on the
  // float32 sums. Off (the default), it reduce-scatters them in bfloat16 as TransformerEngine's all_gather
  // context parallelism does, which rounds the summed K/V gradient once to bfloat16: LAGA, which sums its
  // latent gradient in float32 and never forms that sum, then differs from explicit by ~1e-3..3e-3 relative
  // in the gradients downstream of K/V. On, both sum in float32 (the way Megatron's --grad-reduce-in-fp32
  // treats the data-parallel gradients). p2p likewise: explicit's dK/dV accumulators travel the ring in
  // bfloat16 (TransformerEngine's ring), or in float32 with this option. No effect elsewhere (a2a sends no
  // K/V gradient sums; float32 and float64 runs sum in their own dtype).
  bool kv_grad_reduce_fp32 = false;
  // Collectives under compute: each is started (Communicator::start_*) as soon as its input exists and waited
  // for only where its result is needed. Forward: LAGA's and absorbed's latent all-gather runs under the
  // query path (down-projection, RMSNorm, up-projection, RoPE), explicit's K/V exchange likewise, and the
  // queries' all-to-all under LAGA's K/V up-projection. Backward: the output gradient's all-to-all runs under
  // W_O's weight gradient; the latent gradient's reduce-scatter (LAGA, absorbed) and the query gradient's
  // all-to-all under the up-projections' weight-gradient GEMMs; explicit's query gradient all-to-all under
  // its up-projection backward. The same ops on the same data: results are bitwise those without overlap;
  // the order of allocations changes, so peaks may differ (the plan runs the same orchestration). Off by
  // default. No effect on p2p, whose ring always starts the next shift before the chunk in hand's attention.
  bool overlap = false;
  // The weight gradients' dtype: accum_dtype(dtype) when unset (float32 for a bfloat16 block, as Megatron's
  // main_grad), or the weights' own dtype (PyTorch's .grad of bfloat16 parameters). A gradient one GEMM writes
  // whole, or head slice by head slice, is written in that dtype by the GEMM (float32 accumulation, one
  // rounding: the float32 result rounded once); the norms' scales and gradients summed over ring steps are
  // summed in float32 and rounded once at the end of backward.
  std::optional<DType> grad_dtype;
  // Backward adds this rank's weight gradients to what the gradient tensors hold (Megatron's gradient-
  // accumulation fusion into main_grad over micro-batches) instead of overwriting them: no zero fill, every
  // weight-gradient GEMM with beta = 1.
  bool accumulate_grads = false;
};

// The dtype of the weight gradients under these options.
inline DType grad_dtype(const BlockOptions& o) { return o.grad_dtype.value_or(accum_dtype(o.dtype)); }

// Whether explicit's K/V gradients are summed over `ranks` ranks in float32 under these options: only where
// there is such a sum (all_gather's reduce-scatter, p2p's accumulators going round the ring; P > 1) and only
// for a storage dtype below its accumulation dtype.
inline bool kv_grads_reduced_in_fp32(const BlockOptions& o, int ranks) {
  return o.kv_grad_reduce_fp32 && o.layout != Layout::A2A && ranks > 1 && accum_dtype(o.dtype) != o.dtype;
}

// One strategy as reports and tests enumerate them: a form plus the options only some forms take.
struct Variant {
  Form form = Form::Explicit;
  Recompute recompute = Recompute::None;
  AbsorbedAttention absorbed = AbsorbedAttention::Mqa;

  const char* label() const;  // as printed: "explicit", "absorbed (mqa)", ..., "laga +recompute kv"
  std::string name() const;   // an identifier: "explicit", "absorbed_mqa", ..., "laga_recompute_kv"
  BlockOptions options(Layout layout, AttentionKernel kernel, DType dtype) const {
    return BlockOptions{.form = form, .layout = layout, .kernel = kernel, .recompute = recompute,
                        .absorbed_attention = absorbed, .dtype = dtype};
  }
};
// `base` with the variant's form, recompute and absorbed attention; every other option is base's.
inline BlockOptions with_variant(BlockOptions base, const Variant& v) {
  base.form = v.form;
  base.recompute = v.recompute;
  base.absorbed_attention = v.absorbed;
  return base;
}
// The variant a set of options runs (the absorbed attention choice only matters for the absorbed form).
inline Variant variant_of(const BlockOptions& o) {
  return Variant{o.form, o.recompute, o.form == Form::Absorbed ? o.absorbed_attention : AbsorbedAttention::Mqa};
}
// Every variant a report sets side by side, explicit first (the reference).
inline constexpr std::array<Variant, 5> kAllVariants = {
    Variant{Form::Explicit}, Variant{Form::Absorbed, Recompute::None, AbsorbedAttention::Mqa},
    Variant{Form::Absorbed, Recompute::None, AbsorbedAttention::Expanded}, Variant{Form::Laga},
    Variant{Form::Laga, Recompute::KV}};

// Whether a layout runs a variant: p2p runs explicit and laga (the fused kernel, no K/V recomputation: its
// ring rebuilds K/V per chunk anyway); a2a and all_gather run every variant. validate() says why not.
inline bool layout_supports(Layout l, const Variant& v) {
  return l != Layout::P2P || (v.form != Form::Absorbed && v.recompute == Recompute::None);
}
// The variants of kAllVariants a layout runs, in that order.
inline std::vector<Variant> variants_for(Layout l) {
  std::vector<Variant> out;
  for (const Variant& v : kAllVariants)
    if (layout_supports(l, v)) out.push_back(v);
  return out;
}

// The problem one rank sees: `seq` is the full sequence S; each rank holds s = S / ranks tokens.
struct BlockShape {
  std::int64_t batch = 1;
  std::int64_t seq = 0;
  int ranks = 1;
  int rank = 0;
  std::int64_t local_seq() const { return seq / ranks; }
};

// Throws InvalidArgument for what the strategy cannot run: S divisible by P, P <= S, n_h divisible by P
// for a2a, recompute only with LAGA, dtype supported by the device. Call on every rank before any
// collective.
void validate(const MlaConfig&, const BlockOptions&, const BlockShape&);

// Refuses (InvalidArgument, naming the sizes) a problem whose tensors, in bytes, or a bound on what is live at
// once (kLiveTensorBound tensors of the largest size), do not fit in 64 bits. Part of validate().
inline constexpr std::int64_t kLiveTensorBound = 64;
void validate_sizes(const MlaConfig&, const BlockOptions&, const BlockShape&);

// Weights in Hugging Face DeepSeek-V3's layout: each projection's weight is nn.Linear's [out, in] (the block
// computes x W^T), named as DeepseekV3Attention's parameters, so a state dict maps onto them one to one.
// Replicated over the SP group. Names match the .npy files.
struct MlaWeights {
  Tensor q_a_proj;            // [r_q, d]; undefined when q_lora_rank is null
  Tensor q_a_layernorm;       // [r_q]; undefined when q_lora_rank is null
  Tensor q_b_proj;            // [n_h * (d_n + d_r), r_q]: per head [nope | rope]; undefined when q_lora_rank is null
  Tensor q_proj;              // [n_h * (d_n + d_r), d]: only when q_lora_rank is null
  Tensor kv_a_proj_with_mqa;  // [r_kv + d_r, d]: [c_kv | k_pe]
  Tensor kv_a_layernorm;      // [r_kv]
  Tensor kv_b_proj;           // [n_h * (d_n + d_v), r_kv]: per head [W_UK (d_n rows) | W_UV (d_v rows)]
  Tensor o_proj;              // [d, n_h * d_v]

  // The queries' up-projection: q_b_proj, or q_proj when q_lora_rank is null.
  const Tensor& q_up() const { return q_b_proj.defined() ? q_b_proj : q_proj; }
  Tensor& q_up() { return q_b_proj.defined() ? q_b_proj : q_proj; }
  // (name, tensor) pairs in a fixed order, undefined ones skipped.
  std::vector<std::pair<std::string, Tensor*>> named();
  std::vector<std::pair<std::string, const Tensor*>> named() const;
};
using MlaGrads = MlaWeights;  // same shapes and names; dtype grad_dtype(options), by default accum_dtype

// Allocate weights (or gradients) of the configuration as external memory, uninitialised.
MlaWeights allocate_weights(const MlaConfig&, DType, Allocator&, const std::string& prefix = "");
// Weight gradients of weights of `dtype`: accum_dtype(dtype), so a bfloat16 run keeps float32 gradients (as
// Megatron's main_grad) and their sum over ranks is not a sum of rounded partials.
inline MlaGrads allocate_grads(const MlaConfig& c, DType dtype, Allocator& a) {
  return allocate_weights(c, accum_dtype(dtype), a, "grad.");
}
// Weight gradients in grad_dtype(opts).
inline MlaGrads allocate_grads(const MlaConfig& c, const BlockOptions& opts, Allocator& a) {
  return allocate_weights(c, grad_dtype(opts), a, "grad.");
}

// Counters of one forward or backward pass on one rank.
enum class OpPhase { Projections, UpProjections, Attention, Communication, Other };
inline constexpr int kOpPhaseCount = 5;
const char* op_phase_name(OpPhase);

struct PassStats {
  std::array<double, kOpPhaseCount> flops{};    // by OpPhase
  std::array<double, kOpPhaseCount> seconds{};  // time in the ops of each OpPhase (the backend's queue)
  // From the start of the pass's first op to the end of its last, on the backend's queue: the ops' time plus
  // every gap between them (launch and host work the queue waited for). What a caller timing the whole pass
  // with events around it sees; total_seconds() counts the ops alone.
  double span_seconds = 0;
  std::size_t peak_bytes = 0;                   // peak live activation bytes during the pass
  double total_flops() const;
  double total_seconds() const;
};

// The tensors forward keeps for backward, by name. saved_name() is what reports, the plan and the allocator's
// records print ("q_att", "latent", ...); the enumerators are in the order of those names.
enum class Saved {
  CQ,              // c_q: the queries' normalized down-projection
  KAtt,            // k_att: K in the attention layout
  KExpanded,       // k_expanded: the absorbed form's latent copied per head
  KLocal,          // k_local: the ring's local K
  KvDown,          // kv_down: x W_DKV before the norm
  KvRstd,          // kv_rstd: its norm's reciprocal RMS
  Latent,          // latent: this rank's latent
  LatentGathered,  // latent_gathered: every rank's latent
  Lse,             // lse: attention's log-sum-exp
  O,               // o: attention's output at the local tokens
  OAtt,            // o_att: attention's output in the attention layout
  OLat,            // o_lat: the absorbed form's attention output over the latent
  Probs,           // probs: the eager kernel's probabilities
  QAbs,            // q_abs: the absorbed query
  QAtt,            // q_att: the queries in the attention layout
  QDown,           // q_down: x W_DQ before the norm
  QRstd,           // q_rstd: its norm's reciprocal RMS
  VAtt,            // v_att: V in the attention layout
  VExpanded,       // v_expanded: the absorbed form's latent values copied per head
  VLocal,          // v_local: the ring's local V
};
const char* saved_name(Saved);

// What forward keeps for backward. The tensors are flagged as saved in the allocator under saved_name().
// keep = false: a forward no backward follows (inference, evaluation without gradients) keeps nothing, each tensor
// freed when forward is done with it.
struct SavedContext {
  std::map<Saved, Tensor> tensors;
  bool keep = true;
  void save(Saved name, const Tensor& t);
  const Tensor& get(Saved name) const;
  // Drops tensors backward no longer needs (so the peak is what an autograd engine's would be).
  void release(std::initializer_list<Saved> names) {
    for (Saved n : names) tensors.erase(n);
  }
  void clear() { tensors.clear(); }
};

class MlaBlock {
 public:
  MlaBlock(const MlaConfig& cfg, const BlockOptions& opts, const BlockShape& shape, Backend& backend,
           CountingCommunicator& comm);

  // x: this rank's tokens [s, batch, d] (Megatron's sbhd layout). Returns y [s, batch, d]; fills ctx.
  Tensor forward(SavedContext& ctx, const Tensor& x, const MlaWeights& w);
  // dy [s, batch, d]. Consumes ctx; writes this rank's weight gradients into grads (overwritten, or added to
  // with BlockOptions::accumulate_grads) and returns dx [s, batch, d]. The sum of grads over ranks is the
  // single-rank gradient. Each gradient is kept in its own tensor's dtype: the block's dtype or its
  // accumulation dtype (they may differ between gradients: see BlockOptions::grad_dtype).
  Tensor backward(MlaGrads& grads, SavedContext& ctx, const Tensor& dy, const Tensor& x,
                  const MlaWeights& w);

  // Timing (on by default): every op is marked on the backend's queue and each pass ends by waiting for the
  // queue to read the marks (PassStats::seconds, span_seconds). Off, the block marks nothing and never waits,
  // so a device queue runs ahead of the host as any framework op would; seconds stay 0.
  void set_timing(bool on) { timing_ = on; }
  bool timing() const { return timing_; }
  const PassStats& forward_stats() const { return fwd_; }
  const PassStats& backward_stats() const { return bwd_; }
  const MlaConfig& config() const { return cfg_; }
  const BlockOptions& options() const { return opts_; }
  const BlockShape& shape() const { return shape_; }

 private:
  friend struct BlockImpl;
  MlaConfig cfg_;
  BlockOptions opts_;
  BlockShape shape_;
  Backend& backend_;
  CountingCommunicator& comm_;
  RopeTables rope_;
  PassStats fwd_, bwd_;
  bool timing_ = true;
};

}  // namespace laga
