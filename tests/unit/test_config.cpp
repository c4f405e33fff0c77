// MlaConfig: presets, validation messages, config.json parsing and the YaRN RoPE tables.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numbers>
#include <string>
#include <unistd.h>

#include "laga/config.hpp"
#include "laga/errors.hpp"

#ifndef LAGA_TEST_DATA_DIR
#define LAGA_TEST_DATA_DIR "tests/data"
#endif

namespace laga {
namespace {

namespace fs = std::filesystem;

// Runs `f`, expects InvalidArgument, and returns its message (empty string if nothing was thrown).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InvalidArgument, got another exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected InvalidArgument, nothing was thrown";
  return "";
}

void expect_same(const MlaConfig& a, const MlaConfig& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.q_lora_rank, b.q_lora_rank);
  EXPECT_EQ(a.kv_lora_rank, b.kv_lora_rank);
  EXPECT_EQ(a.qk_nope_head_dim, b.qk_nope_head_dim);
  EXPECT_EQ(a.qk_rope_head_dim, b.qk_rope_head_dim);
  EXPECT_EQ(a.v_head_dim, b.v_head_dim);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  ASSERT_EQ(a.rope_scaling.has_value(), b.rope_scaling.has_value());
  if (a.rope_scaling) {
    EXPECT_EQ(a.rope_scaling->factor, b.rope_scaling->factor);
    EXPECT_EQ(a.rope_scaling->mscale, b.rope_scaling->mscale);
    EXPECT_EQ(a.rope_scaling->mscale_all_dim, b.rope_scaling->mscale_all_dim);
    EXPECT_EQ(a.rope_scaling->beta_fast, b.rope_scaling->beta_fast);
    EXPECT_EQ(a.rope_scaling->beta_slow, b.rope_scaling->beta_slow);
    EXPECT_EQ(a.rope_scaling->original_max_position_embeddings,
              b.rope_scaling->original_max_position_embeddings);
  }
}

// A scratch directory per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string leaf = std::string("laga_cfg_") + std::to_string(::getpid()) + "_" + info->test_suite_name() +
                       "_" + info->name();
    for (char& ch : leaf)
      if (ch == '/') ch = '_';
    path_ = fs::temp_directory_path() / leaf;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  fs::path file(const std::string& name, const std::string& text) const {
    fs::path p = path_ / name;
    std::ofstream(p) << text;
    return p;
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---------------------------------------------------------------------------------------------
// Presets

class PresetTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetTest, ValidatesAndKeepsItsName) {
  const MlaConfig c = preset(GetParam());
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(c.name, GetParam());
}

TEST_P(PresetTest, ResolveModelFindsIt) { expect_same(resolve_model(GetParam()), preset(GetParam())); }

TEST_P(PresetTest, JsonRoundTrip) {
  const MlaConfig c = preset(GetParam());
  const std::string text = config_to_json(c);
  expect_same(config_from_json(text, "roundtrip.json"), c);
  // Writing the parsed configuration again gives the same text.
  EXPECT_EQ(config_to_json(config_from_json(text, "roundtrip.json")), text);
}

INSTANTIATE_TEST_SUITE_P(AllPresets, PresetTest,
                         ::testing::Values("deepseek-v3", "deepseek-v2-lite", "kimi-k2", "tiny", "small"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(Presets, NamesAreTheFiveDocumentedOnes) {
  EXPECT_EQ(preset_names(), (std::vector<std::string>{"deepseek-v3", "deepseek-v2-lite", "kimi-k2", "tiny", "small"}));
}

TEST(Presets, DeepSeekV3MatchesItsConfigJson) {
  const MlaConfig c = preset("deepseek-v3");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_attention_heads, 128);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.kv_lora_rank, 512);
  EXPECT_EQ(c.qk_nope_head_dim, 128);
  EXPECT_EQ(c.qk_rope_head_dim, 64);
  EXPECT_EQ(c.v_head_dim, 128);
  EXPECT_EQ(c.latent_dim(), 576);
  EXPECT_EQ(c.qk_head_dim(), 192);
  EXPECT_EQ(c.q_up_input_dim(), 1536);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->factor, 40.0);
  EXPECT_EQ(c.rope_scaling->mscale, 1.0);
  EXPECT_EQ(c.rope_scaling->mscale_all_dim, 1.0);
  EXPECT_EQ(c.rope_scaling->beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling->beta_slow, 1.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
  EXPECT_EQ(c.num_hidden_layers, 61);
}

TEST(Presets, DeepSeekV2LiteHasNoQueryCompression) {
  const MlaConfig c = preset("deepseek-v2-lite");
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.num_attention_heads, 16);
  EXPECT_EQ(c.q_up_input_dim(), 2048);
  EXPECT_EQ(c.latent_dim(), 576);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->factor, 40.0);
  EXPECT_EQ(c.rope_scaling->mscale, 0.707);
  EXPECT_EQ(c.rope_scaling->mscale_all_dim, 0.707);
  EXPECT_EQ(c.num_hidden_layers, 27);
}

TEST(Presets, KimiK2) {
  const MlaConfig c = preset("kimi-k2");
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_attention_heads, 64);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.rope_theta, 50000.0);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->factor, 32.0);
  EXPECT_EQ(c.rope_scaling->beta_fast, 1.0);  // equal betas: the low == high branch of the ramp is reachable
  EXPECT_EQ(c.rope_scaling->beta_slow, 1.0);
  EXPECT_EQ(c.num_hidden_layers, 61);
}

TEST(Presets, TestModelsGiveNoLayerCount) {
  EXPECT_FALSE(preset("tiny").num_hidden_layers.has_value());
  EXPECT_FALSE(preset("small").num_hidden_layers.has_value());
  EXPECT_EQ(config_to_json(preset("tiny")).find("num_hidden_layers"), std::string::npos);
}

TEST(Presets, TinyAndSmallHaveTheDocumentedShapes) {
  const MlaConfig t = preset("tiny");
  EXPECT_EQ(t.hidden_size, 32);
  EXPECT_EQ(t.num_attention_heads, 4);
  EXPECT_EQ(t.q_lora_rank, 16);
  EXPECT_EQ(t.kv_lora_rank, 16);
  EXPECT_EQ(t.qk_nope_head_dim, 8);
  EXPECT_EQ(t.qk_rope_head_dim, 8);
  EXPECT_EQ(t.v_head_dim, 8);
  ASSERT_TRUE(t.rope_scaling);
  EXPECT_EQ(t.rope_scaling->factor, 4.0);
  EXPECT_EQ(t.rope_scaling->original_max_position_embeddings, 16);

  const MlaConfig s = preset("small");
  EXPECT_EQ(s.hidden_size, 256);
  EXPECT_EQ(s.num_attention_heads, 8);
  EXPECT_EQ(s.q_lora_rank, 96);
  EXPECT_EQ(s.kv_lora_rank, 64);
  EXPECT_EQ(s.qk_nope_head_dim, 32);
  EXPECT_EQ(s.qk_rope_head_dim, 16);
  EXPECT_EQ(s.v_head_dim, 32);
  ASSERT_TRUE(s.rope_scaling);
  EXPECT_EQ(s.rope_scaling->factor, 4.0);
  EXPECT_EQ(s.rope_scaling->original_max_position_embeddings, 64);
}

TEST(Presets, UnknownNameListsTheKnownOnes) {
  const std::string msg = error_of([] { preset("deepseek-v4"); });
  EXPECT_NE(msg.find("deepseek-v4"), std::string::npos) << msg;
  for (const auto& n : preset_names()) EXPECT_NE(msg.find(n), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// validate(): each bad value gives a message naming the field, the value and the rule.

struct BadConfig {
  std::string label;
  std::function<void(MlaConfig&)> mutate;
  std::vector<std::string> expected;  // substrings of the message
};

class ValidateRejects : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ValidateRejects, WithAMessageNamingFieldAndValue) {
  MlaConfig c = preset("tiny");
  GetParam().mutate(c);
  const std::string msg = error_of([&] { validate(c); });
  for (const auto& s : GetParam().expected) EXPECT_NE(msg.find(s), std::string::npos) << "message: " << msg;
}

YarnScaling& yarn(MlaConfig& c) { return *c.rope_scaling; }

INSTANTIATE_TEST_SUITE_P(
    BadValues, ValidateRejects,
    ::testing::Values(
        BadConfig{"zero_hidden", [](MlaConfig& c) { c.hidden_size = 0; },
                  {"hidden_size = 0: must be a positive integer"}},
        BadConfig{"negative_heads", [](MlaConfig& c) { c.num_attention_heads = -4; },
                  {"num_attention_heads = -4", "positive"}},
        BadConfig{"zero_q_lora", [](MlaConfig& c) { c.q_lora_rank = 0; }, {"q_lora_rank = 0", "positive"}},
        BadConfig{"zero_kv_lora", [](MlaConfig& c) { c.kv_lora_rank = 0; }, {"kv_lora_rank = 0", "positive"}},
        BadConfig{"negative_nope", [](MlaConfig& c) { c.qk_nope_head_dim = -1; },
                  {"qk_nope_head_dim = -1", "positive"}},
        BadConfig{"negative_rope", [](MlaConfig& c) { c.qk_rope_head_dim = -2; },
                  {"qk_rope_head_dim = -2: must be a positive integer"}},
        BadConfig{"odd_rope", [](MlaConfig& c) { c.qk_rope_head_dim = 63; },
                  {"qk_rope_head_dim = 63: must be even (RoPE rotates pairs)"}},
        BadConfig{"zero_v", [](MlaConfig& c) { c.v_head_dim = 0; }, {"v_head_dim = 0", "positive"}},
        BadConfig{"zero_layers", [](MlaConfig& c) { c.num_hidden_layers = 0; },
                  {"num_hidden_layers = 0: must be an integer in [1, 1048576]"}},
        BadConfig{"too_many_layers", [](MlaConfig& c) { c.num_hidden_layers = kMaxHiddenLayers + 1; },
                  {"num_hidden_layers = 1048577"}},
        BadConfig{"zero_theta", [](MlaConfig& c) { c.rope_theta = 0; }, {"rope_theta = 0", "> 0"}},
        BadConfig{"nan_theta", [](MlaConfig& c) { c.rope_theta = std::nan(""); }, {"rope_theta = nan"}},
        BadConfig{"negative_eps", [](MlaConfig& c) { c.rms_norm_eps = -1e-6; },
                  {"rms_norm_eps = -1e-06", "> 0"}},
        BadConfig{"factor_below_one", [](MlaConfig& c) { yarn(c).factor = 0.5; },
                  {"rope_scaling.factor = 0.5", ">= 1"}},
        BadConfig{"zero_original_max_pos",
                  [](MlaConfig& c) { yarn(c).original_max_position_embeddings = 0; },
                  {"rope_scaling.original_max_position_embeddings = 0", "positive"}},
        BadConfig{"beta_fast_below_slow",
                  [](MlaConfig& c) {
                    yarn(c).beta_fast = 0.5;
                    yarn(c).beta_slow = 2;
                  },
                  {"rope_scaling.beta_fast = 0.5", "beta_slow (2)"}},
        BadConfig{"zero_beta_slow",
                  [](MlaConfig& c) {
                    yarn(c).beta_fast = 1;
                    yarn(c).beta_slow = 0;
                  },
                  {"rope_scaling.beta_slow = 0", "> 0"}},
        BadConfig{"negative_mscale", [](MlaConfig& c) { yarn(c).mscale = -1; },
                  {"rope_scaling.mscale = -1", ">= 0"}},
        BadConfig{"negative_mscale_all_dim", [](MlaConfig& c) { yarn(c).mscale_all_dim = -0.5; },
                  {"rope_scaling.mscale_all_dim = -0.5", ">= 0"}}),
    [](const auto& info) { return info.param.label; });

TEST(Validate, AcceptsNullQueryRankAndPlainRope) {
  MlaConfig c = preset("tiny");
  c.q_lora_rank.reset();
  c.rope_scaling.reset();
  EXPECT_NO_THROW(validate(c));
  EXPECT_EQ(c.q_up_input_dim(), 32);
}

TEST(Validate, AcceptsEqualBetas) {
  MlaConfig c = preset("tiny");
  yarn(c).beta_fast = yarn(c).beta_slow = 1.0;
  EXPECT_NO_THROW(validate(c));
}

// ---------------------------------------------------------------------------------------------
// config_from_json

// A DeepSeek-V3 style config.json with unrelated keys (which must be ignored).
const char* kDeepSeekLikeJson = R"({
  "architectures": ["DeepseekV3ForCausalLM"],
  "hidden_size": 7168,
  "intermediate_size": 18432,
  "kv_lora_rank": 512,
  "num_attention_heads": 128,
  "num_hidden_layers": 61,
  "q_lora_rank": 1536,
  "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64,
  "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06,
  "rope_scaling": {
    "beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
    "original_max_position_embeddings": 4096, "type": "yarn"
  },
  "rope_theta": 10000,
  "v_head_dim": 128,
  "vocab_size": 129280
})";

TEST(ConfigJson, ParsesAHuggingFaceConfigAndIgnoresUnknownKeys) {
  MlaConfig c = config_from_json(kDeepSeekLikeJson, "ds/config.json");
  MlaConfig want = preset("deepseek-v3");
  want.name = "custom";  // no "name" key
  expect_same(c, want);
}

TEST(ConfigJson, NameKeyIsRead) {
  const MlaConfig c = config_from_json(
      R"({"name": "mine", "hidden_size": 8, "num_attention_heads": 1, "q_lora_rank": null, "kv_lora_rank": 4,
          "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 2})",
      "x.json");
  EXPECT_EQ(c.name, "mine");
}

TEST(ConfigJson, DefaultsForOptionalKeys) {
  const MlaConfig c = config_from_json(
      R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8})",
      "x.json");
  EXPECT_FALSE(c.q_lora_rank.has_value());
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_FALSE(c.num_hidden_layers.has_value());
}

TEST(ConfigJson, NumHiddenLayersIsReadAndWritten) {
  const char* text = R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "num_hidden_layers": 5})";
  const MlaConfig c = config_from_json(text, "x.json");
  EXPECT_EQ(c.num_hidden_layers, 5);
  EXPECT_NE(config_to_json(c).find("\"num_hidden_layers\": 5"), std::string::npos) << config_to_json(c);
  const std::string msg = error_of([] {
    config_from_json(R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "num_hidden_layers": 2.5})",
                     "bad.json");
  });
  EXPECT_NE(msg.find("num_hidden_layers = 2.5"), std::string::npos) << msg;
}

// Keys of a Hugging Face config that change the attention's math: their DeepSeek values are read (and
// accepted), any other is refused by name, never run as a different attention.
TEST(ConfigJson, FieldsThatWouldChangeTheMathAreRefused) {
  const std::string base = R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": null,
      "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8)";
  auto with = [&](const std::string& extra) { return base + ", " + extra + "}"; };
  EXPECT_NO_THROW(config_from_json(
      with(R"("attention_bias": false, "rope_interleave": true, "attention_dropout": 0.0)"), "ok.json"));
  EXPECT_NO_THROW(config_from_json(with(R"("attention_bias": null, "attention_dropout": 0)"), "ok.json"));
  const struct {
    const char* extra;
    const char* says;
  } cases[] = {{R"("attention_bias": true)", "attention_bias = true"},
               {R"("rope_interleave": false)", "rope_interleave = false"},
               {R"("attention_dropout": 0.1)", "attention_dropout = 0.1"},
               {R"("attention_bias": "no")", "attention_bias = \"no\": must be true or false"},
               {R"("attention_dropout": "0")", "attention_dropout = \"0\": must be a number"}};
  for (const auto& c : cases) {
    const std::string msg = error_of([&] { config_from_json(with(c.extra), "bad.json"); });
    EXPECT_NE(msg.find(c.says), std::string::npos) << c.extra << ": " << msg;
    EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;
  }
}

TEST(ConfigJson, YarnDefaultsAreThoseOfHuggingFace) {
  const MlaConfig c = config_from_json(
      R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 16,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
          "rope_scaling": {"rope_type": "yarn", "factor": 8}})",
      "x.json");
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(c.rope_scaling->mscale, 1.0);
  EXPECT_EQ(c.rope_scaling->mscale_all_dim, 0.0);
  EXPECT_EQ(c.rope_scaling->beta_fast, 32.0);
  EXPECT_EQ(c.rope_scaling->beta_slow, 1.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 4096);
}

TEST(ConfigJson, NullRopeScalingIsPlainRope) {
  const MlaConfig c = config_from_json(
      R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 16,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "rope_scaling": null})",
      "x.json");
  EXPECT_FALSE(c.rope_scaling.has_value());
}

// transformers v5 moves rope_theta and the scaling into "rope_parameters".
TEST(ConfigJson, ReadsTransformersV5RopeParameters) {
  const MlaConfig c = config_from_json(
      R"({"hidden_size": 2048, "num_attention_heads": 16, "q_lora_rank": null, "kv_lora_rank": 512,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
          "rope_parameters": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
            "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096, "rope_theta": 20000,
            "rope_type": "yarn", "type": "yarn"}})",
      "v5.json");
  EXPECT_EQ(c.rope_theta, 20000.0);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->mscale, 0.707);
  const MlaConfig plain = config_from_json(
      R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 16,
          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
          "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}})",
      "v5.json");
  EXPECT_FALSE(plain.rope_scaling.has_value());
  EXPECT_EQ(plain.rope_theta, 500000.0);
}

// Every required key, removed in turn from a valid file: the message names the key and the source.
class MissingKey : public ::testing::TestWithParam<std::string> {};

TEST_P(MissingKey, IsReportedWithKeyAndSource) {
  // config_to_json writes one key per line and none of these is last in its object.
  std::string text = config_to_json(preset("small"));
  const auto at = text.find("\"" + GetParam() + "\":");
  ASSERT_NE(at, std::string::npos);
  text.erase(at, text.find('\n', at) - at + 1);
  const std::string msg = error_of([&] { config_from_json(text, "models/small/config.json"); });
  EXPECT_NE(msg.find("missing required key"), std::string::npos) << msg;
  EXPECT_NE(msg.find(GetParam()), std::string::npos) << msg;
  EXPECT_NE(msg.find("models/small/config.json"), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(RequiredKeys, MissingKey,
                         ::testing::Values("hidden_size", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
                                           "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
                         [](const auto& info) { return info.param; });

TEST(ConfigJson, WrongTypeNamesKeyAndValue) {
  std::string msg = error_of([] {
    config_from_json(R"({"hidden_size": "2048", "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8})",
                     "bad.json");
  });
  EXPECT_NE(msg.find("hidden_size"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"2048\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad.json"), std::string::npos) << msg;

  msg = error_of([] {
    config_from_json(R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8, "rope_theta": [1]})",
                     "bad.json");
  });
  EXPECT_NE(msg.find("rope_theta = [1]"), std::string::npos) << msg;

  msg = error_of([] {
    config_from_json(R"({"hidden_size": 64, "num_attention_heads": 2.5, "q_lora_rank": null, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8})",
                     "bad.json");
  });
  EXPECT_NE(msg.find("num_attention_heads = 2.5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("integer"), std::string::npos) << msg;

  msg = error_of([] {
    config_from_json(R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": true, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8})",
                     "bad.json");
  });
  EXPECT_NE(msg.find("q_lora_rank = true"), std::string::npos) << msg;
}

TEST(ConfigJson, BadRopeTypeNamesTheValue) {
  const std::string msg = error_of([] {
    config_from_json(R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                         "rope_scaling": {"type": "linear", "factor": 2}})",
                     "rope.json");
  });
  EXPECT_NE(msg.find("rope_scaling"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"linear\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("yarn"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rope.json"), std::string::npos) << msg;
}

TEST(ConfigJson, RopeScalingWithoutTypeOrFactor) {
  std::string msg = error_of([] {
    config_from_json(R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                         "rope_scaling": {"factor": 2}})",
                     "rope.json");
  });
  EXPECT_NE(msg.find("rope_scaling"), std::string::npos) << msg;
  EXPECT_NE(msg.find("type"), std::string::npos) << msg;

  msg = error_of([] {
    config_from_json(R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                         "rope_scaling": {"type": "yarn"}})",
                     "rope.json");
  });
  EXPECT_NE(msg.find("missing required key \"rope_scaling.factor\""), std::string::npos) << msg;
}

TEST(ConfigJson, MalformedJsonNamesSourceAndParseError) {
  const std::string msg = error_of([] { config_from_json(R"({"hidden_size": 64,,})", "broken.json"); });
  EXPECT_NE(msg.find("broken.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("malformed JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("parse error"), std::string::npos) << msg;  // nlohmann's own text follows
}

TEST(ConfigJson, TopLevelMustBeAnObject) {
  const std::string msg = error_of([] { config_from_json("[1, 2]", "array.json"); });
  EXPECT_NE(msg.find("array.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("object"), std::string::npos) << msg;
}

TEST(ConfigJson, InvalidValuesAreReportedWithTheSource) {
  const std::string msg = error_of([] {
    config_from_json(R"({"hidden_size": 64, "num_attention_heads": 2, "q_lora_rank": null, "kv_lora_rank": 16,
                         "qk_nope_head_dim": 8, "qk_rope_head_dim": 5, "v_head_dim": 8})",
                     "odd.json");
  });
  EXPECT_NE(msg.find("odd.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("qk_rope_head_dim = 5: must be even"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// Files: load_config_file, resolve_model and the sample configs in tests/data.

TEST(ConfigFiles, SampleValidConfigLoads) {
  const std::string path = std::string(LAGA_TEST_DATA_DIR) + "/config_small_yarn.json";
  const MlaConfig c = load_config_file(path);
  EXPECT_EQ(c.name, "sample-small-yarn");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.q_lora_rank, 32);
  EXPECT_EQ(c.kv_lora_rank, 24);
  EXPECT_EQ(c.qk_nope_head_dim, 16);
  EXPECT_EQ(c.qk_rope_head_dim, 8);
  EXPECT_EQ(c.v_head_dim, 12);
  ASSERT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 32);
  expect_same(resolve_model(path), c);
}

TEST(ConfigFiles, SampleMissingKvLoraRankIsRejected) {
  const std::string path = std::string(LAGA_TEST_DATA_DIR) + "/config_missing_kv_lora_rank.json";
  const std::string msg = error_of([&] { load_config_file(path); });
  EXPECT_NE(msg.find("kv_lora_rank"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

TEST(ConfigFiles, MissingFileNamesThePath) {
  const std::string msg = error_of([] { load_config_file("/nonexistent/laga/config.json"); });
  EXPECT_NE(msg.find("/nonexistent/laga/config.json"), std::string::npos) << msg;
}

TEST(ConfigFiles, ResolveModelLoadsAFileOrADirectory) {
  TempDir dir;
  MlaConfig c = preset("small");
  c.name = "from-file";
  const fs::path file = dir.file("config.json", config_to_json(c));
  expect_same(resolve_model(file.string()), c);
  expect_same(resolve_model(dir.path().string()), c);  // a model directory holding config.json
}

TEST(ConfigFiles, ResolveModelRejectsNeitherPresetNorFile) {
  const std::string msg = error_of([] { resolve_model("no-such-model"); });
  EXPECT_NE(msg.find("no-such-model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("neither a preset"), std::string::npos) << msg;
  EXPECT_NE(msg.find("deepseek-v3"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// RoPE tables and softmax scale

// DeepseekV3YarnRotaryEmbedding (modeling_deepseek.py), written out again here line by line:
//   yarn_find_correction_dim(r, dim, base, L) = dim * log(L / (r * 2 pi)) / (2 log(base))
//   low  = max(floor(correction_dim(beta_fast)), 0); high = min(ceil(correction_dim(beta_slow)), dim - 1)
//   ramp(i) = clamp((i - low) / (high - low), 0, 1), with high += 0.001 when low == high
//   inv_freq_mask = 1 - ramp
//   inv_freq = freq_inter * (1 - inv_freq_mask) + freq_extra * inv_freq_mask
//   _mscale = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
RopeTables reference_rope(const MlaConfig& c) {
  const double dim = static_cast<double>(c.qk_rope_head_dim);
  const double base = c.rope_theta;
  RopeTables t;
  for (long i = 0; i < c.qk_rope_head_dim / 2; ++i) {
    const double freq_extra = 1.0 / std::pow(base, 2.0 * i / dim);
    if (!c.rope_scaling) {
      t.inv_freq.push_back(freq_extra);
      continue;
    }
    const YarnScaling& y = *c.rope_scaling;
    const double freq_inter = 1.0 / (y.factor * std::pow(base, 2.0 * i / dim));
    auto corr = [&](double rot) {
      return dim * std::log(y.original_max_position_embeddings / (rot * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    const double low = std::max(std::floor(corr(y.beta_fast)), 0.0);
    double high = std::min(std::ceil(corr(y.beta_slow)), dim - 1);
    if (low == high) high += 0.001;
    const double ramp = std::min(std::max((i - low) / (high - low), 0.0), 1.0);
    const double mask = 1 - ramp;
    t.inv_freq.push_back(freq_inter * (1 - mask) + freq_extra * mask);
  }
  if (c.rope_scaling) {
    auto get_mscale = [](double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; };
    t.cos_sin_mscale = get_mscale(c.rope_scaling->factor, c.rope_scaling->mscale) /
                       get_mscale(c.rope_scaling->factor, c.rope_scaling->mscale_all_dim);
  }
  return t;
}

void expect_tables_near(const RopeTables& got, const RopeTables& want) {
  ASSERT_EQ(got.inv_freq.size(), want.inv_freq.size());
  for (std::size_t i = 0; i < want.inv_freq.size(); ++i)
    EXPECT_NEAR(got.inv_freq[i], want.inv_freq[i], 1e-14 * want.inv_freq[i]) << "i = " << i;
  EXPECT_NEAR(got.cos_sin_mscale, want.cos_sin_mscale, 1e-14);
}

TEST_P(PresetTest, RopeTablesMatchTheReferenceFormula) {
  const MlaConfig c = preset(GetParam());
  expect_tables_near(rope_tables(c), reference_rope(c));
  MlaConfig plain = c;
  plain.rope_scaling.reset();
  expect_tables_near(rope_tables(plain), reference_rope(plain));
}

// Hand-derived: for tiny (d_r = 8, base 1e4, L = 16) the correction dims are 8 ln(16/(2 pi 32)) / (2 ln 1e4)
// = -1.10 and 8 ln(16/(2 pi)) / (2 ln 1e4) = 0.41, so low = 0, high = 1 and the ramp is [0, 1, 1, 1]:
// frequency 0 keeps its value, the others are divided by the factor 4.
TEST(RopeTables, TinyByHand) {
  const RopeTables t = rope_tables(preset("tiny"));
  ASSERT_EQ(t.inv_freq.size(), 4u);
  EXPECT_DOUBLE_EQ(t.inv_freq[0], 1.0);
  EXPECT_DOUBLE_EQ(t.inv_freq[1], 1.0 / (4.0 * 10.0));    // 10000^(2/8) = 10
  EXPECT_DOUBLE_EQ(t.inv_freq[2], 1.0 / (4.0 * 100.0));   // 10000^(4/8) = 100
  EXPECT_DOUBLE_EQ(t.inv_freq[3], 1.0 / (4.0 * 1000.0));  // 10000^(6/8) = 1000
  EXPECT_DOUBLE_EQ(t.cos_sin_mscale, 1.0);                 // mscale == mscale_all_dim
}

// small (d_r = 16, L = 64): correction dims -0.99 and 2.02, so low = 0, high = 3, ramp [0, 1/3, 2/3, 1, ...].
TEST(RopeTables, SmallByHandHasFractionalRamp) {
  const RopeTables t = rope_tables(preset("small"));
  ASSERT_EQ(t.inv_freq.size(), 8u);
  auto extra = [](int i) { return std::pow(10000.0, -2.0 * i / 16.0); };
  EXPECT_DOUBLE_EQ(t.inv_freq[0], extra(0));
  EXPECT_DOUBLE_EQ(t.inv_freq[1], extra(1) * (2.0 / 3.0) + extra(1) / 4.0 * (1.0 / 3.0));
  EXPECT_DOUBLE_EQ(t.inv_freq[2], extra(2) * (1.0 / 3.0) + extra(2) / 4.0 * (2.0 / 3.0));
  for (int i = 3; i < 8; ++i) EXPECT_DOUBLE_EQ(t.inv_freq[i], extra(i) / 4.0) << i;
}

// DeepSeek-V3 (d_r = 64, L = 4096): correction dims 10.47 and 22.51, so low = 10 and high = 23.
TEST(RopeTables, DeepSeekV3KeepsHighFrequenciesAndInterpolatesLowOnes) {
  const RopeTables t = rope_tables(preset("deepseek-v3"));
  ASSERT_EQ(t.inv_freq.size(), 32u);
  auto extra = [](int i) { return std::pow(10000.0, -2.0 * i / 64.0); };
  for (int i = 0; i <= 10; ++i) EXPECT_DOUBLE_EQ(t.inv_freq[i], extra(i)) << i;
  for (int i = 23; i < 32; ++i) EXPECT_DOUBLE_EQ(t.inv_freq[i], extra(i) / 40.0) << i;
  const double r = (16 - 10) / 13.0;
  EXPECT_DOUBLE_EQ(t.inv_freq[16], extra(16) * (1 - r) + extra(16) / 40.0 * r);
  EXPECT_DOUBLE_EQ(t.cos_sin_mscale, 1.0);
}

TEST(RopeTables, PlainRopeWithoutScaling) {
  MlaConfig c = preset("small");
  c.rope_scaling.reset();
  c.rope_theta = 500.0;
  const RopeTables t = rope_tables(c);
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(t.inv_freq[i], 1.0 / std::pow(500.0, i / 8.0)) << i;
  EXPECT_EQ(t.cos_sin_mscale, 1.0);
}

// low == high: tiny with beta_slow = 3 puts both ends of the correction range at 0.
TEST(RopeTables, EqualCorrectionBoundsDoNotDivideByZero) {
  MlaConfig c = preset("tiny");
  yarn(c).beta_slow = 3.0;
  const RopeTables t = rope_tables(c);
  for (double f : t.inv_freq) EXPECT_TRUE(std::isfinite(f));
  expect_tables_near(t, reference_rope(c));
  EXPECT_DOUBLE_EQ(t.inv_freq[0], 1.0);
  EXPECT_DOUBLE_EQ(t.inv_freq[1], 1.0 / 40.0);

  MlaConfig k = preset("kimi-k2");  // equal betas
  expect_tables_near(rope_tables(k), reference_rope(k));
}

TEST(RopeTables, CosSinMscaleWhenMscalesDiffer) {
  MlaConfig c = preset("deepseek-v3");
  yarn(c).mscale = 1.0;
  yarn(c).mscale_all_dim = 0.707;
  const double l = std::log(40.0);
  EXPECT_DOUBLE_EQ(rope_tables(c).cos_sin_mscale, (0.1 * l + 1) / (0.0707 * l + 1));
  yarn(c).mscale_all_dim = 0.0;  // yarn_get_mscale(40, 0) = 1
  EXPECT_DOUBLE_EQ(rope_tables(c).cos_sin_mscale, 0.1 * l + 1);
}

TEST(SoftmaxScale, DeepSeekV3) {
  const double m = 0.1 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(softmax_scale(preset("deepseek-v3")), m * m / std::sqrt(192.0));
}

TEST(SoftmaxScale, DeepSeekV2LiteUsesMscaleAllDim) {
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_DOUBLE_EQ(softmax_scale(preset("deepseek-v2-lite")), m * m / std::sqrt(192.0));
}

TEST(SoftmaxScale, PlainWithoutScalingOrWithZeroMscaleAllDim) {
  MlaConfig c = preset("tiny");
  c.rope_scaling.reset();
  EXPECT_DOUBLE_EQ(softmax_scale(c), 1.0 / 4.0);  // 1/sqrt(8 + 8)
  c = preset("tiny");
  yarn(c).mscale_all_dim = 0.0;
  EXPECT_DOUBLE_EQ(softmax_scale(c), 1.0 / 4.0);
}

TEST(SoftmaxScale, RejectsAnInvalidConfig) {
  MlaConfig c = preset("tiny");
  c.qk_nope_head_dim = 0;
  EXPECT_THROW(softmax_scale(c), InvalidArgument);
  EXPECT_THROW(rope_tables(c), InvalidArgument);
}

}  // namespace
}  // namespace laga
