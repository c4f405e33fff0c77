// Attention providers: names, the table of measured times, and `auto`'s choice from it (laga's kernels where
// the table has no point of the shape's dtype and head dims, or the shape is not MHA).
#include <gtest/gtest.h>

#include <string>

#include "laga/attention_provider.hpp"
#include "laga/errors.hpp"

namespace laga {
namespace {

const char* kTable = R"({
  "about": "test",
  "points": [
    {"dtype": "bfloat16", "d_qk": 192, "d_v": 128, "heads": 16, "q_len": 4096, "kv_len": 4096,
     "laga_fwd_ms": 1.0, "laga_bwd_ms": 3.0, "cudnn_fwd_ms": 0.8, "cudnn_bwd_ms": 2.0,
     "cudnn_workspace_bytes": 536870912},
    {"dtype": "bfloat16", "d_qk": 192, "d_v": 128, "heads": 128, "q_len": 2048, "kv_len": 16384,
     "laga_fwd_ms": 1.0, "laga_bwd_ms": 2.0, "cudnn_fwd_ms": 1.5, "cudnn_bwd_ms": 2.0,
     "cudnn_workspace_bytes": 8589934592, "cudnn_nondeterministic_bwd_ms": 1.0,
     "cudnn_nondeterministic_workspace_bytes": 201326592, "laga_nondeterministic_bwd_ms": 1.5},
    {"dtype": "bfloat16", "d_qk": 192, "d_v": 128, "heads": 16, "q_len": 32768, "kv_len": 32768,
     "laga_fwd_ms": 50.0, "laga_bwd_ms": 150.0, "cudnn_fwd_ms": 0, "cudnn_bwd_ms": 0}
  ]})";

AttentionShape mha(std::int64_t heads, std::int64_t q_len, std::int64_t kv_len) {
  return AttentionShape{.dtype = DType::BF16, .d_qk = 192, .d_v = 128, .q_heads = heads, .kv_heads = heads,
                        .q_len = q_len, .kv_len = kv_len};
}

TEST(AttentionProvider, NamesRoundTripAndBadNamesAreRefused) {
  for (auto p : {AttentionProvider::Automatic, AttentionProvider::Laga, AttentionProvider::Cudnn})
    EXPECT_EQ(parse_attention_provider(attention_provider_name(p)), p);
  try {
    parse_attention_provider("flash");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'flash'"), std::string::npos) << m;
    EXPECT_NE(m.find("auto, laga, cudnn"), std::string::npos) << m;
  }
}

TEST(AttentionProvider, AutoTakesTheNearestPointsFasterProviderPerPass) {
  const auto t = AttentionProviderTable::from_json(kTable);
  ASSERT_EQ(t.points.size(), 3u);
  constexpr AttentionPass F = AttentionPass::Forward, B = AttentionPass::Backward;
  constexpr AttentionProvider kLaga = AttentionProvider::Laga, kCudnn = AttentionProvider::Cudnn;
  // At a measured point, and near it (S 6000 is nearer 4k than 32k in log terms): cuDNN is faster both ways.
  EXPECT_EQ(t.choose(mha(16, 4096, 4096), F), kCudnn);
  EXPECT_EQ(t.choose(mha(16, 4096, 4096), B), kCudnn);
  EXPECT_EQ(t.choose(mha(16, 6000, 6000), B), kCudnn);
  // all_gather-like shape: laga's forward 1.0 ms < cuDNN's 1.5; the deterministic backwards tie (laga).
  EXPECT_EQ(t.choose(mha(128, 2048, 16384), F), kLaga);
  EXPECT_EQ(t.choose(mha(128, 2048, 16384), B), kLaga);
  // cuDNN did not run the nearest point: laga.
  EXPECT_EQ(t.choose(mha(16, 32768, 32768), F), kLaga);
  EXPECT_EQ(t.choose(mha(16, 32768, 32768), B), kLaga);
  // Head dims, dtype or MQA the table does not cover: laga.
  AttentionShape other = mha(16, 4096, 4096);
  other.d_qk = 576, other.d_v = 512;
  EXPECT_EQ(t.nearest(other), nullptr);
  AttentionShape f32 = mha(16, 4096, 4096);
  f32.dtype = DType::F32;
  AttentionShape mqa = mha(16, 4096, 4096);
  mqa.kv_heads = 1;
  for (const AttentionShape& s : {other, f32, mqa})
    for (const AttentionPass pass : {F, B}) EXPECT_EQ(t.choose(s, pass), kLaga);
  // cuDNN's workspace scales with heads x q_len x kv_len; auto keeps the backward's under the cap it is given,
  // and the forward is not held to it.
  EXPECT_EQ(t.cudnn_workspace(mha(16, 4096, 4096)), 536870912);
  EXPECT_EQ(t.cudnn_workspace(mha(16, 8192, 8192)), 4 * 536870912LL);
  EXPECT_EQ(t.choose(mha(16, 4096, 4096), B, 536870912), kCudnn);
  EXPECT_EQ(t.choose(mha(16, 4096, 4096), B, 536870911), kLaga);
  EXPECT_EQ(t.choose(mha(16, 4096, 4096), F, 0), kCudnn);
  EXPECT_EQ(t.choose(mha(16, 6000, 6000), B, 1LL << 30), kLaga);  // 1.07 GiB > 1 GiB
  // Non-deterministic: cuDNN's non-deterministic backward where the point has it (1.0 < 2.0), its workspace
  // scaled by heads x q_len only, beside laga's forward; the deterministic choice and workspace stay as they were.
  EXPECT_EQ(t.choose(mha(128, 2048, 16384), B, INT64_MAX, false), kCudnn);  // 1.0 < laga's 1.5
  EXPECT_EQ(t.points[1].laga_nondeterministic_bwd_ms, 1.5);
  EXPECT_EQ(t.points[0].laga_nondeterministic_bwd_ms, 0) << "not measured";
  EXPECT_EQ(t.choose(mha(128, 2048, 16384), F, INT64_MAX, false), kLaga);
  EXPECT_EQ(t.cudnn_workspace(mha(128, 2048, 16384), false), 201326592);
  EXPECT_EQ(t.cudnn_workspace(mha(128, 2048, 32768), false), 201326592);
  EXPECT_EQ(t.cudnn_workspace(mha(128, 4096, 32768), false), 2 * 201326592LL);
  EXPECT_EQ(t.cudnn_workspace(mha(128, 4096, 32768)), 4 * 8589934592LL);
  EXPECT_EQ(t.choose(mha(128, 2048, 16384), B, 201326591, false), kLaga);
  EXPECT_EQ(t.cudnn_workspace(mha(16, 4096, 4096), false), 0) << "not measured at that point";
  EXPECT_EQ(t.choose(mha(16, 4096, 4096), B, INT64_MAX, false), kCudnn) << "deterministic times";
  // cuDNN ran the forward and the non-deterministic backward but not the deterministic one (its workspace did
  // not fit): each pass on its own times.
  AttentionTiming partial{.dtype = "bfloat16", .d_qk = 192, .d_v = 128, .heads = 128, .q_len = 32768,
                          .kv_len = 32768, .laga_fwd_ms = 70, .laga_bwd_ms = 240, .cudnn_fwd_ms = 65,
                          .cudnn_bwd_ms = 0, .cudnn_nondeterministic_bwd_ms = 230};
  EXPECT_EQ(partial.faster(F), kCudnn);
  EXPECT_EQ(partial.faster(B), kLaga);
  EXPECT_EQ(partial.faster(B, false), kCudnn);
  partial.cudnn_nondeterministic_bwd_ms = 250;
  EXPECT_EQ(partial.faster(B, false), kLaga);
  // laga's non-deterministic backward where the point has it: against cuDNN's non-deterministic one only.
  partial.cudnn_nondeterministic_bwd_ms = 230, partial.laga_nondeterministic_bwd_ms = 225;
  EXPECT_EQ(partial.faster(B, false), kLaga);
  EXPECT_EQ(partial.faster(B), kLaga) << "deterministic: cuDNN's did not run";
  partial.cudnn_bwd_ms = 220;
  EXPECT_EQ(partial.faster(B), kCudnn) << "deterministic: 220 < 240, whatever the non-deterministic times";
  EXPECT_EQ(partial.faster(B, false), kLaga);
  partial.cudnn_fwd_ms = 0;
  EXPECT_EQ(partial.faster(F), kLaga);
  // An empty table: laga everywhere.
  EXPECT_EQ(AttentionProviderTable{}.choose(mha(16, 4096, 4096), F), kLaga);
  EXPECT_EQ(AttentionProviderTable{}.choose(mha(16, 4096, 4096), B), kLaga);
}

TEST(AttentionProvider, MalformedTablesNameTheField) {
  auto message = [](const std::string& text) {
    try {
      AttentionProviderTable::from_json(text);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("not json").find("not JSON"), std::string::npos);
  EXPECT_NE(message("{}").find("'points'"), std::string::npos);
  EXPECT_NE(message(R"({"points": [{"dtype": "bfloat16", "d_qk": 192}]})").find("points[0].d_v"), std::string::npos);
  EXPECT_NE(message(R"({"points": [{"dtype": "bfloat16", "d_qk": 192, "d_v": 128, "heads": 16, "q_len": 8,
    "kv_len": 8, "laga_fwd_ms": -1, "laga_bwd_ms": 1, "cudnn_fwd_ms": 0, "cudnn_bwd_ms": 0}]})")
                .find("points[0].laga_fwd_ms"),
            std::string::npos);
  EXPECT_NE(message(R"({"points": [{"dtype": "bfloat16", "d_qk": 192, "d_v": 128, "heads": 16, "q_len": 8,
    "kv_len": 8, "laga_fwd_ms": 1, "laga_bwd_ms": 1, "cudnn_fwd_ms": 0, "cudnn_bwd_ms": 0,
    "laga_nondeterministic_bwd_ms": "fast"}]})")
                .find("points[0].laga_nondeterministic_bwd_ms"),
            std::string::npos);
}

// The table compiled into the binary parses (bench/attention-providers.json), and every point of it is a
// 192/128 bfloat16 MHA shape with laga's times measured.
TEST(AttentionProvider, BuiltInTableParses) {
  const auto& t = builtin_attention_provider_table();
  for (const auto& p : t.points) {
    EXPECT_EQ(p.dtype, "bfloat16");
    EXPECT_GT(p.laga_fwd_ms + p.laga_bwd_ms, 0);
  }
}

}  // namespace
}  // namespace laga
