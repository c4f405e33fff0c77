#include "laga/agree.hpp"

#include <cstdint>
#include <cstdio>
#include <map>

#include "laga/errors.hpp"
#include "laga/plan.hpp"

namespace laga {

namespace {

std::uint64_t fnv1a(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// Full precision, so two values that differ in the last bit differ here.
std::string exact(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

}  // namespace

void Fingerprint::add(const std::string& name, const std::string& value) {
  LAGA_CHECK(fields.size() < kMaxFingerprintFields, "more than ", kMaxFingerprintFields, " fingerprint fields");
  fields.emplace_back(name, value);
}

Fingerprint run_fingerprint(const MlaConfig& c, const BlockOptions& o, const BlockShape& sh) {
  Fingerprint f;
  f.add("hidden_size", std::to_string(c.hidden_size));
  f.add("num_attention_heads", std::to_string(c.num_attention_heads));
  f.add("q_lora_rank", c.q_lora_rank ? std::to_string(*c.q_lora_rank) : "null");
  f.add("kv_lora_rank", std::to_string(c.kv_lora_rank));
  f.add("qk_nope_head_dim", std::to_string(c.qk_nope_head_dim));
  f.add("qk_rope_head_dim", std::to_string(c.qk_rope_head_dim));
  f.add("v_head_dim", std::to_string(c.v_head_dim));
  f.add("rope_theta", exact(c.rope_theta));
  f.add("rms_norm_eps", exact(c.rms_norm_eps));
  f.add("rope_scaling", c.rope_scaling ? "yarn" : "null");
  if (c.rope_scaling) {
    const YarnScaling& y = *c.rope_scaling;
    f.add("rope_scaling.factor", exact(y.factor));
    f.add("rope_scaling.mscale", exact(y.mscale));
    f.add("rope_scaling.mscale_all_dim", exact(y.mscale_all_dim));
    f.add("rope_scaling.beta_fast", exact(y.beta_fast));
    f.add("rope_scaling.beta_slow", exact(y.beta_slow));
    f.add("rope_scaling.original_max_position_embeddings", std::to_string(y.original_max_position_embeddings));
  }
  f.add("form", form_name(o.form));
  f.add("layout", layout_name(o.layout));
  f.add("kernel", kernel_name(o.kernel));
  f.add("recompute", recompute_name(o.recompute));
  f.add("absorbed_attention", absorbed_attention_name(o.absorbed_attention));
  f.add("dtype", dtype_name(o.dtype));
  f.add("kv_grad_reduce_in_fp32", o.kv_grad_reduce_fp32 ? "true" : "false");
  f.add("grad_dtype", dtype_name(grad_dtype(o)));
  f.add("seq", std::to_string(sh.seq));
  f.add("batch", std::to_string(sh.batch));
  f.add("sp", std::to_string(sh.ranks));
  // Derived sizes: what this rank holds and the bytes of each collective it will issue, in order.
  f.add("local tokens", std::to_string(sh.local_seq()));
  f.add("heads per rank", std::to_string(o.layout == Layout::A2A ? c.num_attention_heads / sh.ranks
                                                                  : c.num_attention_heads));
  std::string traffic;
  for (const CollectiveRecord& r : expected_traffic(c, o, sh))
    traffic += detail::concat(collective_name(r.kind), ":", r.tensor, ":", r.bytes_sent, ";");
  f.add("collectives", traffic);
  return f;
}

void require_agreement(Communicator& comm, const Fingerprint& mine) {
  const std::size_t n = kMaxFingerprintFields * 2;
  std::vector<double> local(n, -1.0), all(n * std::size_t(comm.size()));
  for (std::size_t i = 0; i < mine.fields.size(); ++i) {
    const std::uint64_t h = fnv1a(mine.fields[i].first + "=" + mine.fields[i].second);
    local[2 * i] = double(h >> 32);  // 32-bit halves: exact in a double
    local[2 * i + 1] = double(h & 0xffffffffu);
  }
  comm.all_gather(local.data(), all.data(), n, DType::F64);
  for (std::size_t i = 0; i < mine.fields.size(); ++i) {
    // Ranks grouped by the value they hold, in order of their first rank.
    std::map<std::pair<double, double>, std::vector<int>> groups;
    std::vector<std::pair<double, double>> order;
    for (int r = 0; r < comm.size(); ++r) {
      const std::pair<double, double> key{all[std::size_t(r) * n + 2 * i], all[std::size_t(r) * n + 2 * i + 1]};
      if (!groups.count(key)) order.push_back(key);
      groups[key].push_back(r);
    }
    if (groups.size() == 1) continue;
    std::string text;
    for (const auto& key : order) {
      const std::vector<int>& ranks = groups[key];
      text += text.empty() ? "ranks " : " | ranks ";
      for (std::size_t k = 0; k < ranks.size(); ++k) text += (k ? "," : "") + std::to_string(ranks[k]);
    }
    throw InvalidArgument(detail::concat(
        "the ranks were given different input: ", mine.fields[i].first, " differs across ranks (", text,
        "; each group holds one value). Every rank must run the same configuration, options and files"));
  }
}

}  // namespace laga
