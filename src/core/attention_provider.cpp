// Attention providers: names, and `auto`'s choice from the table of measured times.
#include "laga/attention_provider.hpp"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "laga/errors.hpp"

// bench/attention-providers.json, embedded by CMake (generated/attention_provider_table.cpp).
extern const char* const laga_builtin_attention_provider_json;

namespace laga {

const char* attention_provider_name(AttentionProvider p) {
  switch (p) {
    case AttentionProvider::Automatic: return "auto";
    case AttentionProvider::Laga: return "laga";
    case AttentionProvider::Cudnn: return "cudnn";
  }
  return "?";
}

AttentionProvider parse_attention_provider(const std::string& text) {
  for (auto p : {AttentionProvider::Automatic, AttentionProvider::Laga, AttentionProvider::Cudnn})
    if (text == attention_provider_name(p)) return p;
  throw InvalidArgument(detail::concat("attention provider = '", text, "': must be one of auto, laga, cudnn"));
}

AttentionProvider AttentionTiming::faster(AttentionPass pass, bool deterministic) const {
  // A pass cuDNN did not run (0 ms: no plan, or its workspace did not fit the GPU) goes to laga.
  auto pick = [&](double det, double nondet) { return !deterministic && nondet > 0 ? nondet : det; };
  const double cudnn = pass == AttentionPass::Forward ? cudnn_fwd_ms : pick(cudnn_bwd_ms, cudnn_nondeterministic_bwd_ms);
  const double laga = pass == AttentionPass::Forward ? laga_fwd_ms : pick(laga_bwd_ms, laga_nondeterministic_bwd_ms);
  return cudnn > 0 && cudnn < laga ? AttentionProvider::Cudnn : AttentionProvider::Laga;
}

const AttentionTiming* AttentionProviderTable::nearest(const AttentionShape& s) const {
  if (s.q_heads != s.kv_heads || s.q_heads <= 0 || s.q_len <= 0 || s.kv_len <= 0) return nullptr;
  const AttentionTiming* best = nullptr;
  double best_d = std::numeric_limits<double>::infinity();
  auto gap = [](std::int64_t a, std::int64_t b) { return std::abs(std::log(double(a)) - std::log(double(b))); };
  for (const auto& t : points) {
    if (t.dtype != dtype_name(s.dtype) || t.d_qk != s.d_qk || t.d_v != s.d_v) continue;
    const double d = gap(t.heads, s.q_heads) + gap(t.q_len, s.q_len) + gap(t.kv_len, s.kv_len);
    if (d < best_d) {
      best_d = d;
      best = &t;
    }
  }
  return best;
}

std::int64_t AttentionProviderTable::cudnn_workspace(const AttentionShape& s, bool deterministic) const {
  const AttentionTiming* t = nearest(s);
  if (!t) return 0;
  const std::int64_t bytes = deterministic ? t->cudnn_workspace_bytes : t->cudnn_nondeterministic_workspace_bytes;
  if (bytes == 0) return 0;
  double scale = double(s.q_heads) * double(s.q_len) / (double(t->heads) * double(t->q_len));
  if (deterministic) scale *= double(s.kv_len) / double(t->kv_len);
  return std::int64_t(std::ceil(double(bytes) * scale));
}

AttentionProvider AttentionProviderTable::choose(const AttentionShape& s, AttentionPass pass, std::int64_t max_workspace,
                                                 bool deterministic) const {
  const AttentionTiming* t = nearest(s);
  if (!t || t->faster(pass, deterministic) != AttentionProvider::Cudnn) return AttentionProvider::Laga;
  if (pass == AttentionPass::Forward) return AttentionProvider::Cudnn;
  return cudnn_workspace(s, deterministic) <= max_workspace ? AttentionProvider::Cudnn : AttentionProvider::Laga;
}

AttentionProviderTable AttentionProviderTable::from_json(const std::string& text) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(detail::concat("attention provider table: not JSON (", e.what(), ")"));
  }
  LAGA_REQUIRE(doc.is_object() && doc.contains("points") && doc["points"].is_array(),
               "attention provider table: expected an object with a 'points' array");
  AttentionProviderTable table;
  std::size_t i = 0;
  for (const auto& p : doc["points"]) {
    auto where = [&](const char* key) { return detail::concat("attention provider table: points[", i, "].", key); };
    auto integer = [&](const char* key) {
      LAGA_REQUIRE(p.contains(key) && p[key].is_number_integer() && p[key].get<std::int64_t>() > 0, where(key),
                   " must be a positive integer");
      return p[key].get<std::int64_t>();
    };
    auto ms = [&](const char* key) {
      LAGA_REQUIRE(p.contains(key) && p[key].is_number() && p[key].get<double>() >= 0, where(key),
                   " must be a number of milliseconds >= 0");
      return p[key].get<double>();
    };
    LAGA_REQUIRE(p.is_object() && p.contains("dtype") && p["dtype"].is_string(), where("dtype"), " must be a string");
    AttentionTiming t;
    t.dtype = p["dtype"].get<std::string>();
    t.d_qk = integer("d_qk");
    t.d_v = integer("d_v");
    t.heads = integer("heads");
    t.q_len = integer("q_len");
    t.kv_len = integer("kv_len");
    t.laga_fwd_ms = ms("laga_fwd_ms");
    t.laga_bwd_ms = ms("laga_bwd_ms");
    t.cudnn_fwd_ms = ms("cudnn_fwd_ms");
    t.cudnn_bwd_ms = ms("cudnn_bwd_ms");
    if (p.contains("cudnn_workspace_bytes")) {
      LAGA_REQUIRE(p["cudnn_workspace_bytes"].is_number_integer() && p["cudnn_workspace_bytes"].get<std::int64_t>() >= 0,
                   where("cudnn_workspace_bytes"), " must be an integer >= 0");
      t.cudnn_workspace_bytes = p["cudnn_workspace_bytes"].get<std::int64_t>();
    }
    if (p.contains("cudnn_nondeterministic_bwd_ms")) t.cudnn_nondeterministic_bwd_ms = ms("cudnn_nondeterministic_bwd_ms");
    if (p.contains("laga_nondeterministic_bwd_ms")) t.laga_nondeterministic_bwd_ms = ms("laga_nondeterministic_bwd_ms");
    if (p.contains("cudnn_nondeterministic_workspace_bytes")) {
      const auto& w = p["cudnn_nondeterministic_workspace_bytes"];
      LAGA_REQUIRE(w.is_number_integer() && w.get<std::int64_t>() >= 0, where("cudnn_nondeterministic_workspace_bytes"),
                   " must be an integer >= 0");
      t.cudnn_nondeterministic_workspace_bytes = w.get<std::int64_t>();
    }
    LAGA_REQUIRE(t.laga_fwd_ms > 0 && t.laga_bwd_ms > 0, where("laga_fwd_ms"), " and laga_bwd_ms must be > 0");
    table.points.push_back(t);
    ++i;
  }
  return table;
}

const AttentionProviderTable& builtin_attention_provider_table() {
  static const AttentionProviderTable table = AttentionProviderTable::from_json(laga_builtin_attention_provider_json);
  return table;
}

}  // namespace laga
