// The MLA configuration, with the field names of DeepSeek's Hugging Face config.json.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace laga {

// YaRN rope scaling (DeepSeek-V2/V3 "rope_scaling" with "type": "yarn").
struct YarnScaling {
  double factor = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  long original_max_position_embeddings = 4096;
};

struct MlaConfig {
  std::string name = "custom";
  long hidden_size = 0;                 // d
  long num_attention_heads = 0;         // n_h
  std::optional<long> q_lora_rank;      // r_q; nullopt = no query compression (x W_Q directly)
  long kv_lora_rank = 0;                // r_kv
  long qk_nope_head_dim = 0;            // d_n
  long qk_rope_head_dim = 0;            // d_r (even)
  long v_head_dim = 0;                  // d_v
  double rope_theta = 10000.0;
  std::optional<YarnScaling> rope_scaling;  // nullopt = plain RoPE
  double rms_norm_eps = 1e-6;
  // The model's decoder layers, each with one attention block (DeepSeek-V3: 61); nullopt when the config.json
  // does not give it. Model-level figures of the plan (its model_total) are a layer's times this; the device
  // fit's layer count (`laga plan --layers`, the layers one device holds) is a separate option.
  std::optional<long> num_hidden_layers;

  long qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  long latent_dim() const { return kv_lora_rank + qk_rope_head_dim; }  // the gathered latent width
  // Input width of the query up-projection: r_q, or d when there is no query compression.
  long q_up_input_dim() const { return q_lora_rank ? *q_lora_rank : hidden_size; }
};

// The widest RoPE part validate() accepts (DeepSeek's is 64): its frequency table is built on every rank.
inline constexpr long kMaxRopeHeadDim = 1L << 16;
// The most layers validate() accepts, far above any model's (the plan's model totals are checked besides).
inline constexpr long kMaxHiddenLayers = 1L << 20;

// Throws InvalidArgument naming the field, the value and the rule; also refuses a configuration whose widths
// or weights (in float64 bytes, with their gradients) do not fit in 64 bits.
void validate(const MlaConfig&);

// Names accepted by preset(): deepseek-v3, deepseek-v2-lite, kimi-k2, tiny, small.
std::vector<std::string> preset_names();
MlaConfig preset(const std::string& name);
// Parses a Hugging Face style config.json text; unknown keys are ignored, required ones must be present.
MlaConfig config_from_json(const std::string& json_text, const std::string& source_name);
MlaConfig load_config_file(const std::string& path);
// A preset name, or else a path to a config.json.
MlaConfig resolve_model(const std::string& name_or_path);
std::string config_to_json(const MlaConfig&);

// RoPE tables derived from the configuration (YaRN when rope_scaling is set).
struct RopeTables {
  std::vector<double> inv_freq;  // [d_r / 2]
  double cos_sin_mscale = 1.0;   // multiplies cos and sin (YaRN's _mscale)
};
RopeTables rope_tables(const MlaConfig&);
// Softmax scale: mscale^2 / sqrt(d_n + d_r), mscale from YaRN's mscale_all_dim (1 without YaRN).
double softmax_scale(const MlaConfig&);

}  // namespace laga
