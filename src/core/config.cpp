// MlaConfig: presets, validation, Hugging Face config.json I/O, and the RoPE/YaRN tables.
#include "laga/config.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <sstream>

#include <nlohmann/json.hpp>

#include "laga/checked.hpp"
#include "laga/errors.hpp"

namespace laga {

namespace {

using nlohmann::json;

// --- YaRN helpers, transcribed from DeepSeek's modeling_deepseek.py (DeepseekV3YarnRotaryEmbedding) ---

// The dimension index whose wavelength makes `num_rotations` turns over `max_position_embeddings` positions.
double yarn_find_correction_dim(double num_rotations, long dim, double base, long max_position_embeddings) {
  return (static_cast<double>(dim) *
          std::log(static_cast<double>(max_position_embeddings) / (num_rotations * 2.0 * std::numbers::pi))) /
         (2.0 * std::log(base));
}

void yarn_find_correction_range(double low_rot, double high_rot, long dim, double base, long max_pos,
                                double* low, double* high) {
  const double lo = std::floor(yarn_find_correction_dim(low_rot, dim, base, max_pos));
  const double hi = std::ceil(yarn_find_correction_dim(high_rot, dim, base, max_pos));
  *low = std::max(lo, 0.0);
  *high = std::min(hi, static_cast<double>(dim - 1));
}

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

// --- JSON field readers: every error names the source, the key and the offending value ---

std::string where(const std::string& source) { return source.empty() ? "<json>" : source; }

[[noreturn]] void type_error(const std::string& source, const std::string& key, const json& value,
                             const char* expected) {
  throw InvalidArgument(
      detail::concat(where(source), ": ", key, " = ", value.dump(), ": must be ", expected));
}

const json& require_key(const json& obj, const std::string& key, const std::string& prefix,
                        const std::string& source) {
  auto it = obj.find(key);
  LAGA_REQUIRE(it != obj.end(), where(source), ": missing required key \"", prefix, key, "\"");
  return *it;
}

long as_long(const json& v, const std::string& key, const std::string& source) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<long>::max()))
      type_error(source, key, v, "an integer that fits in 64 bits");
    return v.get<long>();
  }
  // Python tools sometimes write integers as floats (4096.0); accept those when exact.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9.0e15) return static_cast<long>(d);
  }
  type_error(source, key, v, "an integer");
}

double as_double(const json& v, const std::string& key, const std::string& source) {
  if (!v.is_number()) type_error(source, key, v, "a number");
  return v.get<double>();
}

// Optional number: absent or null gives the default.
double opt_double(const json& obj, const std::string& key, double def, const std::string& prefix,
                  const std::string& source) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  return as_double(*it, prefix + key, source);
}

long opt_long(const json& obj, const std::string& key, long def, const std::string& prefix,
              const std::string& source) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return def;
  return as_long(*it, prefix + key, source);
}

// rope_scaling (or transformers v5's rope_parameters) -> YarnScaling, or nullopt for plain RoPE.
std::optional<YarnScaling> parse_rope_scaling(const json& rs, const std::string& key, bool default_is_plain,
                                              const std::string& source) {
  if (rs.is_null()) return std::nullopt;
  if (!rs.is_object()) type_error(source, key, rs, "an object or null");
  const std::string prefix = key + ".";

  std::optional<std::string> type;
  for (const char* k : {"type", "rope_type"}) {
    auto it = rs.find(k);
    if (it == rs.end() || it->is_null()) continue;
    if (!it->is_string()) type_error(source, prefix + k, *it, "a string");
    const std::string t = it->get<std::string>();
    LAGA_REQUIRE(!type || *type == t, where(source), ": ", prefix, "type = \"", *type, "\" but ", prefix,
                 "rope_type = \"", t, "\": they must agree");
    type = t;
  }
  // rope_parameters carries "default" for plain RoPE; rope_scaling must say what it scales.
  if (default_is_plain && (!type || *type == "default")) return std::nullopt;
  LAGA_REQUIRE(type.has_value(), where(source), ": ", key, " has neither \"type\" nor \"rope_type\"; only \"yarn\" is supported");
  LAGA_REQUIRE(*type == "yarn", where(source), ": ", prefix, "type = \"", *type,
               "\": unsupported rope scaling (only \"yarn\" is supported)");

  YarnScaling y;
  y.factor = as_double(require_key(rs, "factor", prefix, source), prefix + "factor", source);
  // Defaults are those of DeepseekV3YarnRotaryEmbedding / DeepseekV3Attention.
  y.mscale = opt_double(rs, "mscale", 1.0, prefix, source);
  y.mscale_all_dim = opt_double(rs, "mscale_all_dim", 0.0, prefix, source);
  y.beta_fast = opt_double(rs, "beta_fast", 32.0, prefix, source);
  y.beta_slow = opt_double(rs, "beta_slow", 1.0, prefix, source);
  y.original_max_position_embeddings = opt_long(rs, "original_max_position_embeddings", 4096, prefix, source);
  return y;
}

// "key = number" for the number quoted in a parser's message ("... parsing '1e400'"), found in the text
// after the nearest preceding "key":. The number alone when no key precedes it.
std::string key_of_number(const std::string& text, const std::string& message) {
  const auto open = message.rfind("'", message.size() - 2), close = message.rfind("'");
  if (open == std::string::npos || close <= open) return "a number";
  const std::string number = message.substr(open + 1, close - open - 1);
  for (std::size_t at = text.find(number); at != std::string::npos; at = text.find(number, at + 1)) {
    std::size_t k = at;
    while (k > 0 && std::isspace(static_cast<unsigned char>(text[k - 1]))) --k;
    if (k == 0 || text[k - 1] != ':') continue;
    --k;
    while (k > 0 && std::isspace(static_cast<unsigned char>(text[k - 1]))) --k;
    if (k < 2 || text[k - 1] != '"') continue;
    const std::size_t start = text.rfind('"', k - 2);
    if (start == std::string::npos) continue;
    return text.substr(start + 1, k - 2 - start) + " = " + number;
  }
  return number;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

}  // namespace

// --- validation ---

namespace {
// Every width the block derives and every weight matrix, in bytes of the widest dtype (float64), weights and
// their gradients together, must fit in 64 bits; nothing downstream computes them unchecked.
void validate_config_sizes(const MlaConfig& c) {
  const std::int64_t dqk = checked_add(c.qk_nope_head_dim, c.qk_rope_head_dim, "qk_nope_head_dim + qk_rope_head_dim");
  const std::int64_t dl = checked_add(c.kv_lora_rank, c.qk_rope_head_dim, "kv_lora_rank + qk_rope_head_dim");
  const std::int64_t nh = c.num_attention_heads, d = c.hidden_size, rq_in = c.q_up_input_dim();
  const std::int64_t widths[] = {
      checked_mul(nh, dqk, "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)"),
      checked_mul(nh, c.v_head_dim, "num_attention_heads x v_head_dim"),
      checked_mul(nh, dl, "num_attention_heads x (kv_lora_rank + qk_rope_head_dim)")};
  for (std::int64_t w : widths) checked_mul(w, 8, "bytes of one token's per-head tensor");
  std::int64_t weights = 0;
  auto weight = [&](std::int64_t rows, std::int64_t cols, const char* name) {
    const std::string what = std::string("bytes of ") + name;
    weights = checked_add(weights, checked_product({rows, cols, 8}, what), "bytes of the weights");
  };
  if (c.q_lora_rank) weight(d, *c.q_lora_rank, "W_DQ [hidden_size, q_lora_rank]");
  weight(rq_in, widths[0], c.q_lora_rank ? "W_UQ [q_lora_rank, num_attention_heads x qk_head_dim]"
                                         : "W_Q [hidden_size, num_attention_heads x qk_head_dim]");
  weight(d, dl, "W_DKV [hidden_size, kv_lora_rank + qk_rope_head_dim]");
  weight(c.kv_lora_rank, checked_mul(nh, c.qk_nope_head_dim, "num_attention_heads x qk_nope_head_dim"),
         "W_UK [kv_lora_rank, num_attention_heads x qk_nope_head_dim]");
  weight(c.kv_lora_rank, widths[1], "W_UV [kv_lora_rank, num_attention_heads x v_head_dim]");
  weight(widths[1], d, "W_O [num_attention_heads x v_head_dim, hidden_size]");
  checked_mul(weights, 4, "bytes of the weights, their gradients and working copies");
}
}  // namespace

void validate(const MlaConfig& c) {
  auto positive = [](long v, const char* field) {
    LAGA_REQUIRE(v > 0, field, " = ", v, ": must be a positive integer");
  };
  positive(c.hidden_size, "hidden_size");
  positive(c.num_attention_heads, "num_attention_heads");
  if (c.q_lora_rank)
    LAGA_REQUIRE(*c.q_lora_rank > 0, "q_lora_rank = ", *c.q_lora_rank,
                 ": must be a positive integer, or null for no query compression");
  positive(c.kv_lora_rank, "kv_lora_rank");
  positive(c.qk_nope_head_dim, "qk_nope_head_dim");
  positive(c.qk_rope_head_dim, "qk_rope_head_dim");
  // RoPE's frequency table has d_r / 2 entries, built on every rank before anything runs.
  LAGA_REQUIRE(c.qk_rope_head_dim <= kMaxRopeHeadDim, "qk_rope_head_dim = ", c.qk_rope_head_dim, ": must be <= ",
               kMaxRopeHeadDim);
  LAGA_REQUIRE(c.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim = ", c.qk_rope_head_dim,
               ": must be even (RoPE rotates pairs)");
  positive(c.v_head_dim, "v_head_dim");
  if (c.num_hidden_layers)
    LAGA_REQUIRE(*c.num_hidden_layers > 0 && *c.num_hidden_layers <= kMaxHiddenLayers, "num_hidden_layers = ",
                 *c.num_hidden_layers, ": must be an integer in [1, ", kMaxHiddenLayers, "], or absent");
  try {
    validate_config_sizes(c);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::concat(e.what(), " (hidden_size = ", c.hidden_size, ", num_attention_heads = ",
                                         c.num_attention_heads, ", q_lora_rank = ",
                                         c.q_lora_rank ? std::to_string(*c.q_lora_rank) : "null", ", kv_lora_rank = ",
                                         c.kv_lora_rank, ", qk_nope_head_dim = ", c.qk_nope_head_dim,
                                         ", qk_rope_head_dim = ", c.qk_rope_head_dim, ", v_head_dim = ", c.v_head_dim,
                                         ")"));
  }
  // `!(x > 0)` also rejects NaN.
  LAGA_REQUIRE(c.rope_theta > 0 && std::isfinite(c.rope_theta), "rope_theta = ", c.rope_theta,
               ": must be a finite number > 0");
  LAGA_REQUIRE(c.rms_norm_eps > 0 && std::isfinite(c.rms_norm_eps), "rms_norm_eps = ", c.rms_norm_eps,
               ": must be a finite number > 0");
  if (c.rope_scaling) {
    const YarnScaling& y = *c.rope_scaling;
    LAGA_REQUIRE(y.factor >= 1 && std::isfinite(y.factor), "rope_scaling.factor = ", y.factor,
                 ": must be a finite number >= 1");
    // Negative values could make yarn_get_mscale zero or negative (a division by zero in cos_sin_mscale).
    LAGA_REQUIRE(y.mscale >= 0 && std::isfinite(y.mscale), "rope_scaling.mscale = ", y.mscale,
                 ": must be a finite number >= 0");
    LAGA_REQUIRE(y.mscale_all_dim >= 0 && std::isfinite(y.mscale_all_dim), "rope_scaling.mscale_all_dim = ",
                 y.mscale_all_dim, ": must be a finite number >= 0");
    LAGA_REQUIRE(y.original_max_position_embeddings > 0, "rope_scaling.original_max_position_embeddings = ",
                 y.original_max_position_embeddings, ": must be a positive integer");
    // The correction range takes log(1 / beta): both must be positive.
    LAGA_REQUIRE(y.beta_slow > 0 && std::isfinite(y.beta_slow), "rope_scaling.beta_slow = ", y.beta_slow,
                 ": must be a finite number > 0");
    // Equal is allowed (Kimi-K2 ships beta_fast = beta_slow = 1); smaller would invert the ramp.
    LAGA_REQUIRE(y.beta_fast >= y.beta_slow && std::isfinite(y.beta_fast), "rope_scaling.beta_fast = ",
                 y.beta_fast, ": must be a finite number >= rope_scaling.beta_slow (", y.beta_slow, ")");
  }
}

// --- presets ---

// One row per preset, in MlaConfig's field order: name, hidden_size, num_attention_heads, q_lora_rank
// (nullopt = none), kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim, rope_theta, YaRN {factor,
// mscale, mscale_all_dim, beta_fast, beta_slow, original_max_position_embeddings}, rms_norm_eps,
// num_hidden_layers (nullopt for the test models, which stand for no real one).
const std::vector<MlaConfig>& preset_table() {
  static const std::vector<MlaConfig> table = {
      // deepseek-ai/DeepSeek-V3 config.json
      {"deepseek-v3", 7168, 128, 1536, 512, 128, 64, 128, 10000.0, YarnScaling{40.0, 1.0, 1.0, 32.0, 1.0, 4096}, 1e-6,
       61},
      // deepseek-ai/DeepSeek-V2-Lite config.json: no query compression.
      {"deepseek-v2-lite", 2048, 16, std::nullopt, 512, 128, 64, 128, 10000.0,
       YarnScaling{40.0, 0.707, 0.707, 32.0, 1.0, 4096}, 1e-6, 27},
      // moonshotai/Kimi-K2-Instruct config.json (the 0905 release raised factor to 64).
      {"kimi-k2", 7168, 64, 1536, 512, 128, 64, 128, 50000.0, YarnScaling{32.0, 1.0, 1.0, 1.0, 1.0, 4096}, 1e-6,
       61},
      // For unit tests: every width distinct where it can be, query compression on, and YaRN with
      // original_max_position_embeddings = 16 so the interpolation changes 3 of the 4 frequencies
      // (correction range [0, 1]) at sequence lengths tests can afford. mscale = mscale_all_dim = 1
      // as in DeepSeek-V3, so the softmax scale carries YaRN's (0.1 ln 4 + 1)^2.
      {"tiny", 32, 4, 16, 16, 8, 8, 8, 10000.0, YarnScaling{4.0, 1.0, 1.0, 32.0, 1.0, 16}, 1e-6},
      // For demos and larger tests: d_n != d_r, r_q != r_kv, latent width 80. With d_r = 16 and
      // original_max_position_embeddings = 64 the correction range is [0, 3], so the ramp takes the
      // fractional values 1/3 and 2/3 (the full YaRN blend, not just extrapolate/interpolate).
      {"small", 256, 8, 96, 64, 32, 16, 32, 10000.0, YarnScaling{4.0, 1.0, 1.0, 32.0, 1.0, 64}, 1e-6},
  };
  return table;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& c : preset_table()) names.push_back(c.name);
  return names;
}

MlaConfig preset(const std::string& name) {
  for (const auto& c : preset_table())
    if (c.name == name) return c;
  throw InvalidArgument(
      detail::concat("unknown model preset \"", name, "\"; known presets: ", join(preset_names(), ", ")));
}

// --- JSON ---

MlaConfig config_from_json(const std::string& json_text, const std::string& source_name) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::out_of_range& e) {  // a number beyond a double, like 1e400: name its key
    throw InvalidArgument(detail::concat(where(source_name), ": ", key_of_number(json_text, e.what()),
                                         ": out of the range of a 64-bit float (", e.what(), ")"));
  } catch (const json::exception& e) {
    throw InvalidArgument(detail::concat(where(source_name), ": malformed JSON: ", e.what()));
  }
  LAGA_REQUIRE(j.is_object(), where(source_name), ": expected a JSON object at the top level, got ",
               j.type_name());

  MlaConfig c;
  const std::string& src = source_name;
  if (auto it = j.find("name"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) type_error(src, "name", *it, "a string");
    c.name = it->get<std::string>();
  }
  auto req_long = [&](const char* key) { return as_long(require_key(j, key, "", src), key, src); };
  c.hidden_size = req_long("hidden_size");
  c.num_attention_heads = req_long("num_attention_heads");
  // Required, but null means "no query compression" (DeepSeek-V2-Lite).
  const json& q = require_key(j, "q_lora_rank", "", src);
  if (!q.is_null()) c.q_lora_rank = as_long(q, "q_lora_rank", src);
  c.kv_lora_rank = req_long("kv_lora_rank");
  c.qk_nope_head_dim = req_long("qk_nope_head_dim");
  c.qk_rope_head_dim = req_long("qk_rope_head_dim");
  c.v_head_dim = req_long("v_head_dim");
  c.rms_norm_eps = opt_double(j, "rms_norm_eps", 1e-6, "", src);
  if (auto it = j.find("num_hidden_layers"); it != j.end() && !it->is_null())
    c.num_hidden_layers = as_long(*it, "num_hidden_layers", src);
  // Fields of a Hugging Face config that would change the attention's result: the block computes one math
  // (no projection biases, no dropout, RoPE on interleaved pairs as DeepSeek's and Kimi's checkpoints
  // rotate them), so a config asking for another is refused rather than run differently.
  auto flag = [&](const char* key, bool def) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return def;
    if (!it->is_boolean()) type_error(src, key, *it, "true or false");
    return it->get<bool>();
  };
  LAGA_REQUIRE(!flag("attention_bias", false), where(src),
               ": attention_bias = true: laga's MLA block has no projection biases");
  LAGA_REQUIRE(flag("rope_interleave", true), where(src),
               ": rope_interleave = false: laga rotates RoPE's interleaved pairs (2i, 2i + 1), as DeepSeek's "
               "checkpoints do (transformers' default, rope_interleave = true)");
  const double dropout = opt_double(j, "attention_dropout", 0.0, "", src);
  LAGA_REQUIRE(dropout == 0.0, where(src), ": attention_dropout = ", dropout,
               ": laga's attention has no dropout (DeepSeek's configs train with 0.0)");

  // rope_scaling is the DeepSeek/Kimi key; transformers v5 writes rope_parameters (with rope_theta inside).
  const auto rs = j.find("rope_scaling");
  const auto rp = j.find("rope_parameters");
  c.rope_theta = opt_double(j, "rope_theta", 10000.0, "", src);
  if (rs != j.end()) {
    c.rope_scaling = parse_rope_scaling(*rs, "rope_scaling", false, src);
  } else if (rp != j.end()) {
    c.rope_scaling = parse_rope_scaling(*rp, "rope_parameters", true, src);
    if (rp->is_object() && !j.contains("rope_theta"))
      c.rope_theta = opt_double(*rp, "rope_theta", 10000.0, "rope_parameters.", src);
  }

  try {
    validate(c);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::concat(where(src), ": ", e.what()));
  }
  return c;
}

MlaConfig load_config_file(const std::string& path) {
  // Opening a FIFO or a device would block or never end: only regular files are read.
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  LAGA_REQUIRE(ec || st.type() == std::filesystem::file_type::not_found ||
                   st.type() == std::filesystem::file_type::regular,
               "config file \"", path, "\": not a regular file (a FIFO, device or directory cannot be read)");
  std::ifstream in(path, std::ios::binary);
  LAGA_REQUIRE(in.good(), "cannot open config file \"", path, "\"");
  std::ostringstream ss;
  ss << in.rdbuf();
  LAGA_REQUIRE(!in.bad(), "cannot read config file \"", path, "\"");
  return config_from_json(ss.str(), path);
}

MlaConfig resolve_model(const std::string& name_or_path) {
  const auto names = preset_names();
  for (const auto& n : names)
    if (n == name_or_path) return preset(n);
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p(name_or_path);
  // A Hugging Face model directory holds its config.json.
  if (fs::is_directory(p, ec) && fs::is_regular_file(p / "config.json", ec))
    return load_config_file((p / "config.json").string());
  if (fs::is_regular_file(p, ec) && std::ifstream(p).good()) return load_config_file(name_or_path);
  throw InvalidArgument(detail::concat("model \"", name_or_path, "\" is neither a preset (", join(names, ", "),
                                       ") nor a readable config.json file"));
}

std::string config_to_json(const MlaConfig& c) {
  nlohmann::ordered_json j;  // keeps the keys in a readable order
  j["name"] = c.name;
  j["hidden_size"] = c.hidden_size;
  j["num_attention_heads"] = c.num_attention_heads;
  j["q_lora_rank"] = c.q_lora_rank ? nlohmann::ordered_json(*c.q_lora_rank) : nlohmann::ordered_json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_nope_head_dim;
  j["qk_rope_head_dim"] = c.qk_rope_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["rope_theta"] = c.rope_theta;
  if (c.rope_scaling) {
    const YarnScaling& y = *c.rope_scaling;
    nlohmann::ordered_json rs;
    rs["type"] = "yarn";
    rs["factor"] = y.factor;
    rs["mscale"] = y.mscale;
    rs["mscale_all_dim"] = y.mscale_all_dim;
    rs["beta_fast"] = y.beta_fast;
    rs["beta_slow"] = y.beta_slow;
    rs["original_max_position_embeddings"] = y.original_max_position_embeddings;
    j["rope_scaling"] = rs;
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["rms_norm_eps"] = c.rms_norm_eps;
  if (c.num_hidden_layers) j["num_hidden_layers"] = *c.num_hidden_layers;
  return j.dump(2) + "\n";
}

// --- RoPE ---

RopeTables rope_tables(const MlaConfig& c) {
  validate(c);
  const long dim = c.qk_rope_head_dim;
  const long half = dim / 2;
  const double base = c.rope_theta;
  RopeTables t;
  t.inv_freq.resize(static_cast<std::size_t>(half));
  if (!c.rope_scaling) {
    for (long i = 0; i < half; ++i) t.inv_freq[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / dim);
    t.cos_sin_mscale = 1.0;
    return t;
  }
  const YarnScaling& y = *c.rope_scaling;
  double low = 0, high = 0;
  yarn_find_correction_range(y.beta_fast, y.beta_slow, dim, base, y.original_max_position_embeddings, &low, &high);
  if (low == high) high += 0.001;  // yarn_linear_ramp_mask: avoid a zero division
  for (long i = 0; i < half; ++i) {
    const double pos = std::pow(base, static_cast<double>(2 * i) / dim);
    const double freq_extra = 1.0 / pos;
    const double freq_inter = 1.0 / (y.factor * pos);
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double mask = 1.0 - ramp;  // 1 = keep the original (extrapolated) frequency
    t.inv_freq[i] = freq_inter * (1.0 - mask) + freq_extra * mask;
  }
  t.cos_sin_mscale = yarn_get_mscale(y.factor, y.mscale) / yarn_get_mscale(y.factor, y.mscale_all_dim);
  return t;
}

double softmax_scale(const MlaConfig& c) {
  validate(c);
  double scale = 1.0 / std::sqrt(static_cast<double>(c.qk_head_dim()));
  // DeepseekV3Attention: only a non-zero mscale_all_dim changes the softmax scale.
  if (c.rope_scaling && c.rope_scaling->mscale_all_dim != 0.0) {
    const double m = yarn_get_mscale(c.rope_scaling->factor, c.rope_scaling->mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

}  // namespace laga
