// The library's documents: the plan document every front end prints (laga plan --json, the Python package).
#include <gtest/gtest.h>

#include "laga/errors.hpp"
#include "laga/report.hpp"

namespace laga {
namespace {

TEST(PlanDocument, EveryPointAndVariantAsPlanned) {
  PlanQuery q{.cfg = preset("tiny"), .base = {.layout = Layout::AllGather, .dtype = DType::F32}, .batch = 2,
              .seqs = {64, 128}, .sps = {1, 2}, .layers = 3, .gpu_mem_bytes = 1e9};
  const nlohmann::json doc = plan_document(q);
  EXPECT_EQ(doc["layout"], "all_gather");
  EXPECT_EQ(doc["kernel"], "fused");
  EXPECT_EQ(doc["dtype"], "float32");
  EXPECT_EQ(doc["batch"], 2);
  EXPECT_EQ(doc["layers"], 3);
  EXPECT_EQ(doc["gpu_mem_bytes"], 1e9);
  EXPECT_EQ(doc["model"]["num_attention_heads"], q.cfg.num_attention_heads);
  EXPECT_EQ(doc["time_model"]["node_size"], 8);
  ASSERT_EQ(doc["points"].size(), 4u);
  std::size_t i = 0;
  for (auto S : q.seqs)
    for (auto P : q.sps) {
      const nlohmann::json& pt = doc["points"][i++];
      EXPECT_EQ(pt["seq"], S);
      EXPECT_EQ(pt["sp"], P);
      EXPECT_EQ(pt["rank"], P - 1);
      ASSERT_EQ(pt["variants"].size(), kAllVariants.size());
      for (const Variant& v : kAllVariants) {
        const BlockShape shape{.batch = 2, .seq = S, .ranks = int(P), .rank = int(P) - 1};
        const RankPlan plan = plan_rank(q.cfg, with_variant(q.base, v), shape);
        const nlohmann::json& j = pt["variants"][v.label()];
        EXPECT_EQ(j, plan_to_json(plan, device_fit(plan, 3), q.model)) << v.label();
        EXPECT_EQ(j["closed_form"]["bytes_sent"], plan.bytes_sent()) << v.label();
        const nlohmann::json& node = j["modeled"]["placements"][0];
        EXPECT_EQ(node["placement"], "node");
        EXPECT_EQ(node["collective_s"], communication_seconds(q.model, plan.traffic, int(P), int(std::min<std::int64_t>(P, 8))));
        if (P > 1) EXPECT_GT(node["collective_s"].get<double>(), 0.0);
        EXPECT_EQ(j["saved_bytes"], plan.saved_bytes);
        EXPECT_EQ(j["bytes_sent"], plan.bytes_sent());
        EXPECT_EQ(j["traffic"].size(), plan.traffic.size());
      }
    }
}

TEST(PlanDocument, EveryPointValidatedBeforeAnyIsPlanned) {
  // The first point is valid, the last is not (65 is not divisible by 2): nothing is planned.
  PlanQuery q{.cfg = preset("tiny"), .base = {}, .batch = 1, .seqs = {64, 65}, .sps = {1, 2}};
  EXPECT_THROW(plan_points(q), InvalidArgument);
  q.seqs = {64};
  q.layers = 0;
  EXPECT_THROW(plan_points(q), InvalidArgument);
}

}  // namespace
}  // namespace laga
