// The model configurations the block suites run (unit, conformance, GPU), by name: the presets and a few
// variations of `tiny` that exercise one more code path each.
#pragma once

#include <string>

#include "laga/config.hpp"

namespace laga::test {

// `tiny` without query compression (x W_Q directly, as DeepSeek-V2-Lite): no w_dq, no q_norm.
inline MlaConfig tiny_no_q_lora() {
  MlaConfig c = preset("tiny");
  c.name = "tiny_no_q_lora";
  c.q_lora_rank = std::nullopt;
  validate(c);
  return c;
}

// `tiny` with 8 heads, so that a2a can split the heads over P = 8 ranks.
inline MlaConfig tiny_8_heads() {
  MlaConfig c = preset("tiny");
  c.name = "tiny_8_heads";
  c.num_attention_heads = 8;
  validate(c);
  return c;
}

// `tiny` with YaRN's mscale != mscale_all_dim, so RoPE's cos/sin carry a factor != 1 (0.1 ln 4 + 1) / (0.05 ln 4 + 1)
// and the softmax scale another one: exercises the mscale in RoPE forward and backward.
inline MlaConfig tiny_mscale() {
  MlaConfig c = preset("tiny");
  c.name = "tiny_mscale";
  c.rope_scaling->mscale = 1.0;
  c.rope_scaling->mscale_all_dim = 0.5;
  validate(c);
  return c;
}

// DeepSeek-V3's head dims (192/128 per head, latent 576/512) on a small model: the tensor-core attention
// kernels at the real MLA dims inside the block.
inline MlaConfig mla_dims() {
  MlaConfig c = preset("deepseek-v3");
  c.name = "mla_dims";
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.q_lora_rank = 96;
  c.rope_scaling = std::nullopt;
  validate(c);
  return c;
}

// A preset, or one of the variations above.
inline MlaConfig config_by_name(const std::string& name) {
  if (name == "tiny_no_q_lora") return tiny_no_q_lora();
  if (name == "tiny_mscale") return tiny_mscale();
  if (name == "tiny_8_heads") return tiny_8_heads();
  if (name == "mla_dims") return mla_dims();
  return preset(name);
}

}  // namespace laga::test
