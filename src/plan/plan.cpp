#include "laga/plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string_view>

#include <unistd.h>

#include "laga/checked.hpp"
#include "laga/errors.hpp"
#include "laga/problem.hpp"

namespace laga {

std::size_t RankPlan::bytes_sent() const {
  std::size_t b = 0;
  for (const auto& c : traffic) b += c.bytes_sent;
  return b;
}
std::size_t RankPlan::bytes_received() const {
  std::size_t b = 0;
  for (const auto& c : traffic) b += c.bytes_received;
  return b;
}

RankPlan plan_rank(const MlaConfig& cfg, const BlockOptions& opts, const BlockShape& shape) {
  validate(cfg, opts, shape);
  auto meta = make_meta_backend();
  auto phantom = make_phantom_communicator(*meta, shape.rank, shape.ranks);
  CountingCommunicator comm(*phantom);
  MlaBlock block(cfg, opts, shape, *meta, comm);
  const MlaWeights w = allocate_weights(cfg, opts.dtype, meta->allocator());
  const Tensor x = make_shard(cfg, shape, opts.dtype, *meta, 0, DataStream::X, opts.layout);
  const Tensor dy = make_shard(cfg, shape, opts.dtype, *meta, 0, DataStream::Dy, opts.layout);

  RankPlan plan{.cfg = cfg, .opts = opts, .shape = shape};
  SavedContext ctx;
  block.forward(ctx, x, w);
  for (const auto& r : meta->allocator().saved_tensors()) plan.saved.push_back({r.name, r.shape, r.dtype, r.bytes});
  std::sort(plan.saved.begin(), plan.saved.end(), [](const auto& a, const auto& b) {
    return a.bytes != b.bytes ? a.bytes > b.bytes : a.name < b.name;
  });
  plan.saved_bytes = meta->allocator().saved_bytes();
  MlaGrads g = allocate_grads(cfg, opts, meta->allocator());
  block.backward(g, ctx, dy, x, w);
  plan.peak_forward = block.forward_stats().peak_bytes;
  plan.peak_backward = block.backward_stats().peak_bytes;
  plan.fwd = block.forward_stats();
  plan.bwd = block.backward_stats();
  plan.traffic = comm.records();
  return plan;
}

std::vector<CollectiveRecord> expected_traffic(const MlaConfig& cfg, const BlockOptions& opts, const BlockShape& sh) {
  validate(cfg, opts, sh);
  const std::size_t es = dtype_size(opts.dtype);
  const int P = sh.ranks;
  const std::size_t T = std::size_t(sh.local_seq() * sh.batch);  // local rows
  const std::size_t nh = cfg.num_attention_heads, H = opts.layout == Layout::A2A ? nh / P : nh;
  const std::size_t dqk = cfg.qk_head_dim(), dv = cfg.v_head_dim, dl = cfg.latent_dim();
  const bool latent = opts.form != Form::Explicit;

  std::vector<CollectiveRecord> out;
  // The latent gradient travels in the accumulation dtype (float32 for bf16: src/mla/block.cpp, latent_grad).
  const std::size_t es_latent_grad = dtype_size(accum_dtype(opts.dtype));
  auto add = [&](Phase ph, CollectiveKind kind, const char* tensor, std::size_t chunk_elems) {
    const bool latent_grad = ph == Phase::Backward && std::string_view(tensor) == "kv_latent";
    const std::size_t b = collective_bytes_sent(kind, chunk_elems * (latent_grad ? es_latent_grad : es), P);
    out.push_back({ph, kind, tensor, b, b, 1});
  };
  // p2p: P - 1 ring shifts of this rank's chunk pair in forward and again in backward, and P shifts of the
  // gradient's accumulator back round to its owner (none at P = 1).
  auto ring = [&](Phase ph, const char* tensor, std::size_t elems, std::size_t elem_bytes, int calls) {
    if (calls == 0 || P == 1) return;
    const std::size_t b = std::size_t(calls) * collective_bytes_sent(CollectiveKind::RingShift, elems * elem_bytes, P);
    out.push_back({ph, CollectiveKind::RingShift, tensor, b, b, calls});
  };
  if (opts.layout == Layout::P2P) {
    if (latent) {
      ring(Phase::Forward, "kv_latent", T * dl, es, P - 1);
      ring(Phase::Backward, "kv_latent_resend", T * dl, es, P - 1);
      ring(Phase::Backward, "kv_latent", T * dl, es_latent_grad, P);
    } else {
      const std::size_t es_grad = kv_grads_reduced_in_fp32(opts, P) ? dtype_size(accum_dtype(opts.dtype)) : es;
      ring(Phase::Forward, "k", T * nh * dqk, es, P - 1);
      ring(Phase::Forward, "v", T * nh * dv, es, P - 1);
      ring(Phase::Backward, "k_resend", T * nh * dqk, es, P - 1);
      ring(Phase::Backward, "v_resend", T * nh * dv, es, P - 1);
      ring(Phase::Backward, "k", T * nh * dqk, es_grad, P);
      ring(Phase::Backward, "v", T * nh * dv, es_grad, P);
    }
    return out;
  }
  // a2a chunks: this rank's tokens for one rank's heads, T * H * width.
  if (opts.layout == Layout::A2A) {
    add(Phase::Forward, CollectiveKind::AllToAll, "q", T * H * dqk);
    if (latent) {
      add(Phase::Forward, CollectiveKind::AllGather, "kv_latent", T * dl);
    } else {
      add(Phase::Forward, CollectiveKind::AllToAll, "k", T * H * dqk);
      add(Phase::Forward, CollectiveKind::AllToAll, "v", T * H * dv);
    }
    add(Phase::Forward, CollectiveKind::AllToAll, "o", T * H * dv);
    add(Phase::Backward, CollectiveKind::AllToAll, "o", T * H * dv);
    if (latent) {
      add(Phase::Backward, CollectiveKind::ReduceScatter, "kv_latent", T * dl);
    } else {
      add(Phase::Backward, CollectiveKind::AllToAll, "k", T * H * dqk);
      add(Phase::Backward, CollectiveKind::AllToAll, "v", T * H * dv);
    }
    add(Phase::Backward, CollectiveKind::AllToAll, "q", T * H * dqk);
  } else {
    if (latent) {
      add(Phase::Forward, CollectiveKind::AllGather, "kv_latent", T * dl);
      add(Phase::Backward, CollectiveKind::ReduceScatter, "kv_latent", T * dl);
    } else {
      add(Phase::Forward, CollectiveKind::AllGather, "k", T * nh * dqk);
      add(Phase::Forward, CollectiveKind::AllGather, "v", T * nh * dv);
      // In the accumulation dtype with kv_grad_reduce_fp32 (bf16 at P > 1): twice the bytes.
      const std::size_t scale = kv_grads_reduced_in_fp32(opts, P) ? dtype_size(accum_dtype(opts.dtype)) / es : 1;
      add(Phase::Backward, CollectiveKind::ReduceScatter, "k", T * nh * dqk * scale);
      add(Phase::Backward, CollectiveKind::ReduceScatter, "v", T * nh * dv * scale);
    }
  }
  return out;
}

TrafficWhatIf traffic_what_if(const RankPlan& p) {
  const std::size_t es = dtype_size(p.opts.dtype), es_grad = dtype_size(accum_dtype(p.opts.dtype));
  const int P = p.shape.ranks;
  TrafficWhatIf w;
  for (const CollectiveRecord& r : p.traffic) {
    const bool latent = r.tensor == "kv_latent";
    // The latent's gradient travels in the accumulation dtype: its bytes are whole multiples of es_grad.
    const std::size_t b = latent && r.phase == Phase::Backward ? r.bytes_sent / es_grad * es : r.bytes_sent;
    const bool gathered = latent && (r.kind == CollectiveKind::AllGather || r.kind == CollectiveKind::ReduceScatter);
    w.latent_grad_in_dtype += b;
    w.latent_as_all_to_all += gathered ? double(b) / P : double(b);
  }
  return w;
}

std::optional<ModelTotal> model_total(const RankPlan& p) {
  if (!p.cfg.num_hidden_layers) return std::nullopt;
  const std::int64_t L = *p.cfg.num_hidden_layers;
  auto times = [&](std::size_t b, const char* what) {
    return std::size_t(checked_mul(std::int64_t(b), L, what));
  };
  return ModelTotal{.layers = L,
                    .saved_bytes = times(p.saved_bytes, "saved bytes x num_hidden_layers"),
                    .bytes_sent = times(p.bytes_sent(), "bytes sent x num_hidden_layers"),
                    .bytes_received = times(p.bytes_received(), "bytes received x num_hidden_layers"),
                    .flops = (p.fwd.total_flops() + p.bwd.total_flops()) * double(L)};
}

DeviceFit device_fit(const RankPlan& p, int layers) {
  LAGA_REQUIRE(layers >= 1, "layers = ", layers, ": must be >= 1");
  DeviceFit f;
  f.activation_peak = std::size_t(checked_add(
      checked_mul(layers - 1, std::int64_t(p.saved_bytes), "layers x saved bytes"),
      std::int64_t(std::max(p.peak_forward, p.peak_backward)), "the activation bytes of all layers"));
  std::size_t bytes = 0;
  auto meta = make_meta_backend();
  const MlaWeights w = allocate_weights(p.cfg, p.opts.dtype, meta->allocator());
  const MlaGrads g = allocate_grads(p.cfg, p.opts, meta->allocator());
  for (const auto& [name, t] : w.named()) bytes += t->bytes();
  for (const auto& [name, t] : g.named()) bytes += t->bytes();
  f.weights_and_grads = std::size_t(checked_mul(std::int64_t(bytes), layers, "layers x weight and gradient bytes"));
  checked_add(std::int64_t(f.activation_peak), std::int64_t(f.weights_and_grads), "the device bytes of all layers");
  return f;
}

std::size_t planned_run_bytes(const RankPlan& p) {
  const DeviceFit fit = device_fit(p, 1);
  const BlockShape& sh = p.shape;
  const std::int64_t io = checked_product({4, sh.local_seq(), sh.batch, p.cfg.hidden_size,
                                           std::int64_t(dtype_size(p.opts.dtype))}, "bytes of x, dy, y and dx");
  return std::size_t(checked_add(std::int64_t(fit.total()), io, "bytes of one rank's run"));
}

namespace {
std::string gib(double bytes) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.4g GiB", bytes / double(1ull << 30));
  return buf;
}
}  // namespace

void require_fits(const RankPlan& p, int copies, std::size_t extra, std::size_t available, const std::string& where) {
  if (available == 0) return;  // unknown: nothing to compare with
  const double one = double(planned_run_bytes(p));
  const double need = one * copies + double(extra);
  LAGA_REQUIRE(need <= double(available), "the run needs ", gib(need), " (",
               copies > 1 ? detail::concat(copies, " ranks in this process x ", gib(one), " each") : gib(one),
               extra ? detail::concat(" + ", gib(double(extra)), " for the reference") : std::string(),
               ": weights, gradients, inputs, outputs and the activation peak as laga plan counts them) for ",
               p.cfg.name, " (hidden_size = ", p.cfg.hidden_size, ", num_attention_heads = ", p.cfg.num_attention_heads,
               ") at seq = ", p.shape.seq, ", batch = ", p.shape.batch, ", sp = ", p.shape.ranks, ", ",
               dtype_name(p.opts.dtype), ": more than the ", gib(double(available)), " of ", where);
}

std::size_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return std::size_t(pages) * std::size_t(page);
}

double parse_bytes(const std::string& text) {
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    LAGA_REQUIRE(false, "memory size '", text, "': expected a number with an optional unit (e.g. 141GB, 80GiB)");
  }
  std::string unit = text.substr(pos);
  for (auto& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  else if (unit == "KIB") scale = 1024.0;
  else if (unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  LAGA_REQUIRE(scale > 0, "memory size '", text, "': unknown unit '", text.substr(pos),
               "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  LAGA_REQUIRE(std::isfinite(value) && value > 0, "memory size '", text, "': must be a positive number");
  return value * scale;
}

}  // namespace laga
