// Names, parsing and validation of the block's options, and weight allocation.
#include <algorithm>
#include <chrono>
#include <numeric>

#include "laga/block.hpp"
#include "laga/checked.hpp"
#include "laga/errors.hpp"

namespace laga {

const char* form_name(Form f) {
  switch (f) {
    case Form::Explicit: return "explicit";
    case Form::Absorbed: return "absorbed";
    case Form::Laga: return "laga";
  }
  return "?";
}
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::A2A: return "a2a";
    case Layout::AllGather: return "all_gather";
    case Layout::P2P: return "p2p";
  }
  return "?";
}
const char* kernel_name(AttentionKernel k) { return k == AttentionKernel::Eager ? "eager" : "fused"; }
const char* recompute_name(Recompute r) { return r == Recompute::None ? "none" : "kv"; }
const char* absorbed_attention_name(AbsorbedAttention a) { return a == AbsorbedAttention::Mqa ? "mqa" : "expanded"; }
const char* op_phase_name(OpPhase p) {
  switch (p) {
    case OpPhase::Projections: return "projections";
    case OpPhase::UpProjections: return "up_projections";
    case OpPhase::Attention: return "attention";
    case OpPhase::Communication: return "communication";
    case OpPhase::Other: return "other";
  }
  return "?";
}

namespace {
template <typename E, std::size_t N>
E parse_enum(const std::string& what, const std::string& text, const std::array<std::pair<const char*, E>, N>& table) {
  std::string known;
  for (const auto& [name, value] : table) {
    if (text == name) return value;
    known += known.empty() ? name : std::string(", ") + name;
  }
  LAGA_REQUIRE(false, what, " = '", text, "': must be one of ", known);
  return table[0].second;
}
}  // namespace

Form parse_form(const std::string& s) {
  return parse_enum<Form, 3>("form", s, {{{"explicit", Form::Explicit}, {"absorbed", Form::Absorbed}, {"laga", Form::Laga}}});
}
Layout parse_layout(const std::string& s) {
  return parse_enum<Layout, 3>("layout", s,
                               {{{"a2a", Layout::A2A}, {"all_gather", Layout::AllGather}, {"p2p", Layout::P2P}}});
}
AttentionKernel parse_kernel(const std::string& s) {
  return parse_enum<AttentionKernel, 2>("kernel", s,
                                        {{{"eager", AttentionKernel::Eager}, {"fused", AttentionKernel::Fused}}});
}
Recompute parse_recompute(const std::string& s) {
  return parse_enum<Recompute, 2>("recompute", s, {{{"none", Recompute::None}, {"kv", Recompute::KV}}});
}
AbsorbedAttention parse_absorbed_attention(const std::string& s) {
  return parse_enum<AbsorbedAttention, 2>("absorbed-attention", s,
                                          {{{"mqa", AbsorbedAttention::Mqa}, {"expanded", AbsorbedAttention::Expanded}}});
}
DType parse_dtype(const std::string& s) {
  return parse_enum<DType, 3>("dtype", s, {{{"float32", DType::F32}, {"float64", DType::F64}, {"bfloat16", DType::BF16}}});
}

void validate(const MlaConfig& cfg, const BlockOptions& opts, const BlockShape& shape) {
  validate(cfg);
  LAGA_REQUIRE(shape.ranks >= 1, "sp = ", shape.ranks, ": the number of sequence-parallel ranks must be >= 1");
  LAGA_REQUIRE(shape.rank >= 0 && shape.rank < shape.ranks, "rank = ", shape.rank, ": must be in [0, ", shape.ranks, ")");
  LAGA_REQUIRE(shape.batch >= 1, "batch = ", shape.batch, ": must be >= 1");
  LAGA_REQUIRE(shape.seq >= 1, "seq = ", shape.seq, ": must be >= 1");
  LAGA_REQUIRE(shape.ranks <= shape.seq, "sp = ", shape.ranks, " > seq = ", shape.seq,
               ": every rank needs at least one token (P <= S)");
  LAGA_REQUIRE(shape.seq % shape.ranks == 0, "seq = ", shape.seq, " is not divisible by sp = ", shape.ranks,
               ": each rank holds S/P consecutive tokens");
  if (opts.layout == Layout::A2A)
    LAGA_REQUIRE(cfg.num_attention_heads % shape.ranks == 0, "num_attention_heads = ", cfg.num_attention_heads,
                 " is not divisible by sp = ", shape.ranks, ": the a2a layout gives each rank n_h/P heads");
  if (opts.layout == Layout::P2P) {
    LAGA_REQUIRE(shape.seq % (2 * std::int64_t(shape.ranks)) == 0, "seq = ", shape.seq, " is not divisible by 2 x sp = ",
                 2 * shape.ranks, ": the p2p layout gives each rank two chunks of S/(2P) tokens (zigzag)");
    LAGA_REQUIRE(opts.kernel == AttentionKernel::Fused, "kernel = ", kernel_name(opts.kernel),
                 " with layout = p2p: the ring merges partial results by their log-sum-exp, which only the fused "
                 "kernel keeps");
    LAGA_REQUIRE(opts.form != Form::Absorbed, "form = absorbed with layout = p2p: the ring is built for the "
                 "explicit and laga forms (use a2a or all_gather for absorbed)");
    LAGA_REQUIRE(opts.recompute == Recompute::None, "recompute = kv with layout = p2p: the ring rebuilds K/V per "
                 "chunk in forward and backward already");
  }
  if (opts.grad_dtype)
    LAGA_REQUIRE(*opts.grad_dtype == opts.dtype || *opts.grad_dtype == accum_dtype(opts.dtype), "grad dtype = ",
                 dtype_name(*opts.grad_dtype), " with dtype = ", dtype_name(opts.dtype),
                 ": weight gradients are kept in the weights' dtype or in its accumulation dtype (",
                 dtype_name(accum_dtype(opts.dtype)), ")");
  LAGA_REQUIRE(opts.recompute == Recompute::None || opts.form == Form::Laga, "recompute = kv with form = ",
               form_name(opts.form), ": K/V recomputation is defined for the laga form only");
  try {
    validate_sizes(cfg, opts, shape);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::concat(e.what(), " (seq = ", shape.seq, ", batch = ", shape.batch, ", sp = ",
                                         shape.ranks, ", ", dtype_name(opts.dtype), ")"));
  }
}

void validate_sizes(const MlaConfig& cfg, const BlockOptions& opts, const BlockShape& shape) {
  // Every tensor the block allocates is at most [seq x batch rows, one of these widths] (the gathered or
  // attention-layout tensors), or the eager kernel's probabilities [batch, heads, queries, seq]. Their bytes,
  // in the wider of the dtype and its accumulation dtype, must fit in 64 bits, and so must a bound on the
  // sum of everything live at once (the plan's totals, the allocator's counters, collective byte counts);
  // then no index, stride or offset the block, the backends or the plan derive from them can overflow.
  const std::int64_t es = std::int64_t(std::max(dtype_size(opts.dtype), dtype_size(accum_dtype(opts.dtype))));
  const std::int64_t rows = checked_mul(shape.seq, shape.batch, "seq x batch (tokens of the gathered sequence)");
  const std::int64_t nh = cfg.num_attention_heads;
  const std::int64_t widest_head = std::max({cfg.qk_head_dim(), cfg.v_head_dim, cfg.latent_dim()});
  const std::int64_t widths[] = {cfg.hidden_size, cfg.q_up_input_dim(), cfg.latent_dim(), nh * widest_head};
  std::int64_t largest = 0;
  for (std::int64_t w : widths)
    largest = std::max(largest, checked_product({rows, w, es}, detail::concat(
        "bytes of a [seq x batch, ", w, "] activation (seq = ", shape.seq, ", batch = ", shape.batch, ")")));
  if (opts.kernel == AttentionKernel::Eager) {
    const std::int64_t heads = opts.layout == Layout::A2A ? nh / shape.ranks : nh;
    const std::int64_t queries = opts.layout == Layout::A2A ? shape.seq : shape.local_seq();
    largest = std::max(largest, checked_product({shape.batch, heads, queries, shape.seq, es}, detail::concat(
        "bytes of the eager kernel's probabilities [batch, heads, queries, seq] = [", shape.batch, ", ", heads,
        ", ", queries, ", ", shape.seq, "]")));
  }
  checked_mul(largest, kLiveTensorBound, detail::concat("bytes of ", kLiveTensorBound,
                                                        " activations of the largest size (a bound on the block's peak)"));
}

std::vector<std::pair<std::string, Tensor*>> MlaWeights::named() {
  std::vector<std::pair<std::string, Tensor*>> out;
  for (auto [name, t] : std::initializer_list<std::pair<const char*, Tensor*>>{
           {"q_a_proj", &q_a_proj}, {"q_a_layernorm", &q_a_layernorm}, {"q_b_proj", &q_b_proj},
           {"q_proj", &q_proj}, {"kv_a_proj_with_mqa", &kv_a_proj_with_mqa}, {"kv_a_layernorm", &kv_a_layernorm},
           {"kv_b_proj", &kv_b_proj}, {"o_proj", &o_proj}})
    if (t->defined()) out.emplace_back(name, t);
  return out;
}

std::vector<std::pair<std::string, const Tensor*>> MlaWeights::named() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (auto& [name, t] : const_cast<MlaWeights*>(this)->named()) out.emplace_back(name, t);
  return out;
}

MlaWeights allocate_weights(const MlaConfig& c, DType dtype, Allocator& alloc, const std::string& prefix) {
  auto make = [&](const char* name, Shape s) { return Tensor(alloc, dtype, std::move(s), prefix + name, MemoryKind::External); };
  const long nh = c.num_attention_heads;
  MlaWeights w;
  const long dqk = c.qk_head_dim();
  if (c.q_lora_rank) {
    w.q_a_proj = make("q_a_proj", {*c.q_lora_rank, c.hidden_size});
    w.q_a_layernorm = make("q_a_layernorm", {*c.q_lora_rank});
    w.q_b_proj = make("q_b_proj", {nh * dqk, *c.q_lora_rank});
  } else {
    w.q_proj = make("q_proj", {nh * dqk, c.hidden_size});
  }
  w.kv_a_proj_with_mqa = make("kv_a_proj_with_mqa", {c.latent_dim(), c.hidden_size});
  w.kv_a_layernorm = make("kv_a_layernorm", {c.kv_lora_rank});
  w.kv_b_proj = make("kv_b_proj", {nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
  w.o_proj = make("o_proj", {c.hidden_size, nh * c.v_head_dim});
  return w;
}

const char* Variant::label() const {
  if (form == Form::Absorbed) return absorbed == AbsorbedAttention::Mqa ? "absorbed (mqa)" : "absorbed (expanded)";
  if (form == Form::Laga) return recompute == Recompute::KV ? "laga +recompute kv" : "laga";
  return "explicit";
}

std::string Variant::name() const {
  std::string n = form_name(form);
  if (form == Form::Absorbed) n += std::string("_") + absorbed_attention_name(absorbed);
  if (recompute != Recompute::None) n += std::string("_recompute_") + recompute_name(recompute);
  return n;
}

double PassStats::total_flops() const { return std::accumulate(flops.begin(), flops.end(), 0.0); }
double PassStats::total_seconds() const { return std::accumulate(seconds.begin(), seconds.end(), 0.0); }

const char* saved_name(Saved s) {
  switch (s) {
    case Saved::CQ: return "c_q";
    case Saved::KAtt: return "k_att";
    case Saved::KExpanded: return "k_expanded";
    case Saved::KLocal: return "k_local";
    case Saved::KvDown: return "kv_down";
    case Saved::KvRstd: return "kv_rstd";
    case Saved::Latent: return "latent";
    case Saved::LatentGathered: return "latent_gathered";
    case Saved::Lse: return "lse";
    case Saved::O: return "o";
    case Saved::OAtt: return "o_att";
    case Saved::OLat: return "o_lat";
    case Saved::Probs: return "probs";
    case Saved::QAbs: return "q_abs";
    case Saved::QAtt: return "q_att";
    case Saved::QDown: return "q_down";
    case Saved::QRstd: return "q_rstd";
    case Saved::VAtt: return "v_att";
    case Saved::VExpanded: return "v_expanded";
    case Saved::VLocal: return "v_local";
  }
  return "?";
}

void SavedContext::save(Saved name, const Tensor& t) {
  if (!keep) return;
  LAGA_CHECK(!tensors.count(name), "tensor '", saved_name(name), "' saved twice");
  t.mark_saved(saved_name(name));
  tensors[name] = t;
}

const Tensor& SavedContext::get(Saved name) const {
  auto it = tensors.find(name);
  LAGA_CHECK(it != tensors.end(), "saved tensor '", saved_name(name), "' is missing");
  return it->second;
}

}  // namespace laga
