// Sizes that do not fit: every width, weight and activation the block derives is computed with
// overflow-checked arithmetic at validation, and refused (InvalidArgument naming the sizes) when it leaves
// 64-bit bytes; the plan answers any size that fits in closed form, quickly, with the figures it gave before.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <string>

#include "laga/checked.hpp"
#include "laga/errors.hpp"
#include "laga/plan.hpp"

namespace laga {
namespace {

constexpr std::int64_t k2p62 = std::int64_t(1) << 62;

std::string refusal(const auto& call) {
  try {
    call();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(Checked, MultipliesAddsAndRefusesOverflowNamingTheValues) {
  EXPECT_EQ(checked_mul(3, 5, "x"), 15);
  EXPECT_EQ(checked_add(kMaxSize - 1, 1, "x"), kMaxSize);
  EXPECT_EQ(checked_product({2, 3, 7}, "x"), 42);
  const std::string m = refusal([] { checked_mul(k2p62, 2, "bytes of w"); });
  EXPECT_NE(m.find("bytes of w = 4611686018427387904 x 2"), std::string::npos) << m;
  EXPECT_NE(m.find("64 bits"), std::string::npos) << m;
  EXPECT_THROW(checked_add(kMaxSize, 1, "x"), InvalidArgument);
  EXPECT_THROW(checked_product({k2p62, 1, 4}, "x"), InvalidArgument);
}

struct HugeField {
  const char* field;
  long MlaConfig::*member;
};

class HugeConfigField : public testing::TestWithParam<HugeField> {};

TEST_P(HugeConfigField, IsRefusedNamingTheField) {
  for (std::int64_t v : {k2p62, std::numeric_limits<std::int64_t>::max(), std::int64_t(1) << 58}) {
    MlaConfig c = preset("deepseek-v3");
    c.*(GetParam().member) = v;
    if (std::string(GetParam().field) == "qk_rope_head_dim") c.qk_rope_head_dim = v & ~std::int64_t(1);
    const std::string m = refusal([&] { validate(c); });
    EXPECT_NE(m.find(GetParam().field), std::string::npos) << v << ": " << m;
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, HugeConfigField,
                         testing::Values(HugeField{"hidden_size", &MlaConfig::hidden_size},
                                         HugeField{"num_attention_heads", &MlaConfig::num_attention_heads},
                                         HugeField{"kv_lora_rank", &MlaConfig::kv_lora_rank},
                                         HugeField{"qk_nope_head_dim", &MlaConfig::qk_nope_head_dim},
                                         HugeField{"qk_rope_head_dim", &MlaConfig::qk_rope_head_dim},
                                         HugeField{"v_head_dim", &MlaConfig::v_head_dim}),
                         [](const auto& info) { return std::string(info.param.field); });

TEST(Sizes, HugeQueryRankIsRefused) {
  MlaConfig c = preset("deepseek-v3");
  c.q_lora_rank = k2p62;
  EXPECT_NE(refusal([&] { validate(c); }).find("q_lora_rank"), std::string::npos);
}

TEST(Sizes, HugeBatchOrSequenceIsRefusedNamingIt) {
  const MlaConfig c = preset("deepseek-v3");
  const BlockOptions o{.dtype = DType::BF16};
  std::string m = refusal([&] { validate(c, o, BlockShape{.batch = k2p62, .seq = 16384, .ranks = 8}); });
  EXPECT_NE(m.find("batch"), std::string::npos) << m;
  m = refusal([&] { validate(c, o, BlockShape{.batch = 4, .seq = k2p62, .ranks = 8}); });
  EXPECT_NE(m.find("seq = 4611686018427387904"), std::string::npos) << m;
  // The eager kernel's probabilities are S x S per head: refused where the fused kernel's tensors fit.
  BlockOptions eager = o;
  eager.kernel = AttentionKernel::Eager;
  const BlockShape s3g{.batch = 1, .seq = 3000000000, .ranks = 1};
  EXPECT_NO_THROW(validate(c, o, s3g));
  m = refusal([&] { validate(c, eager, s3g); });
  EXPECT_NE(m.find("probabilities"), std::string::npos) << m;
}

// The closed form of the causal pairs gives what adding them one query at a time gives.
TEST(Sizes, PlanFlopsAreThoseOfThePerTokenSum) {
  const MlaConfig c = preset("small");
  for (Layout layout : kAllLayouts)
    for (int P : {1, 2, 4, 8})
      for (int rank : {0, P - 1}) {
        const BlockShape sh{.batch = 2, .seq = 96, .ranks = P, .rank = rank};
        const RankPlan p = plan_rank(c, BlockOptions{.layout = layout}, sh);
        const std::int64_t S = sh.seq, s = S / P, Sq = layout == Layout::A2A ? S : s;
        const std::int64_t q_offset = layout == Layout::A2A ? 0 : rank * s, H = layout == Layout::A2A ? 8 / P : 8;
        double pairs = 0;
        for (std::int64_t i = 0; i < Sq; ++i) pairs += double(std::min<std::int64_t>(S, i + q_offset + 1));
        pairs *= double(sh.batch) * double(H);
        EXPECT_EQ(p.fwd.flops[int(OpPhase::Attention)], 2.0 * double(c.qk_head_dim() + c.v_head_dim) * pairs)
            << layout_name(layout) << " P=" << P << " rank " << rank;
      }
}

TEST(Sizes, PlanAnswersAHugeSequenceQuickly) {
  const auto t0 = std::chrono::steady_clock::now();
  const RankPlan p = plan_rank(preset("deepseek-v3"), BlockOptions{.dtype = DType::BF16},
                               BlockShape{.batch = 1, .seq = 1000000000, .ranks = 8, .rank = 7});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(p.saved_bytes, 0u);
  EXPECT_LT(seconds, 1.0);
}

TEST(Sizes, DeviceFitRefusesLayersThatOverflow) {
  const RankPlan p = plan_rank(preset("deepseek-v3"), BlockOptions{.dtype = DType::BF16},
                               BlockShape{.batch = 1, .seq = 1 << 30, .ranks = 1});
  EXPECT_THROW(device_fit(p, std::numeric_limits<int>::max()), InvalidArgument);
}

TEST(Sizes, RequireFitsRefusesNamingTheConfigurationAndTheLimit) {
  const RankPlan p = plan_rank(preset("small"), BlockOptions{}, BlockShape{.batch = 1, .seq = 64});
  EXPECT_NO_THROW(require_fits(p, 1, 0, planned_run_bytes(p), "host memory"));
  const std::string m = refusal([&] { require_fits(p, 2, 0, planned_run_bytes(p), "host memory"); });
  EXPECT_NE(m.find("seq = 64"), std::string::npos) << m;
  EXPECT_NE(m.find("host memory"), std::string::npos) << m;
  EXPECT_NE(m.find("hidden_size = 256"), std::string::npos) << m;
}

TEST(Sizes, ThreadGroupsHaveACap) {
  EXPECT_THROW(make_thread_group(kMaxThreadRanks + 1), InvalidArgument);
  EXPECT_EQ(make_thread_group(2).size(), 2u);
}

}  // namespace
}  // namespace laga
