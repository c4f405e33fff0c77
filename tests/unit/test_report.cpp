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
      const BlockShape shape{.batch = 2, .seq = S, .ranks = int(P), .rank = int(P) - 1};
      const RankPlan ex = plan_rank(q.cfg, with_variant(q.base, kAllVariants[0]), shape);
      ASSERT_EQ(ex.opts.form, Form::Explicit);
      for (const Variant& v : kAllVariants) {
        const RankPlan plan = plan_rank(q.cfg, with_variant(q.base, v), shape);
        const nlohmann::json& j = pt["variants"][v.label()];
        EXPECT_EQ(j, plan_to_json(plan, device_fit(plan, 3), q.model, &ex)) << v.label();
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

// The figures the report scripts read instead of computing: the traffic under the latent's other accountings
// and explicit's over each variant's (tiny, bf16, a2a, S = 16: PlanByHand.TrafficWhatIfs' bytes), and the whole
// model's totals when the configuration gives its layer count.
TEST(PlanDocument, WhatIfsRatiosAndModelTotals) {
  PlanQuery q{.cfg = preset("tiny"), .base = {.layout = Layout::A2A, .dtype = DType::BF16}, .batch = 1,
              .seqs = {16}, .sps = {1, 2}};
  nlohmann::json doc = plan_document(q);
  EXPECT_FALSE(doc["model"].contains("num_hidden_layers"));
  const nlohmann::json& p1 = doc["points"][0]["variants"];
  for (const auto& [label, v] : p1.items()) {
    EXPECT_FALSE(v.contains("explicit_over_this")) << label;  // P = 1 sends nothing
    EXPECT_FALSE(v.contains("model_total")) << label;
    EXPECT_EQ(v["traffic_what_if"]["latent_grad_in_dtype_bytes_sent"], 0) << label;
  }
  const nlohmann::json& p2 = doc["points"][1]["variants"];
  EXPECT_EQ(p2["laga"]["traffic_what_if"]["latent_grad_in_dtype_bytes_sent"], 2304);
  EXPECT_EQ(p2["laga"]["traffic_what_if"]["latent_as_all_to_all_bytes_sent"], 1920.0);
  const nlohmann::json& r = p2["laga"]["explicit_over_this"];
  EXPECT_DOUBLE_EQ(r["bytes_sent"].get<double>(), 3072.0 / 2688);
  EXPECT_DOUBLE_EQ(r["latent_grad_in_dtype_bytes_sent"].get<double>(), 3072.0 / 2304);
  EXPECT_DOUBLE_EQ(r["latent_as_all_to_all_bytes_sent"].get<double>(), 3072.0 / 1920);
  for (const auto& [key, ratio] : p2["explicit"]["explicit_over_this"].items()) EXPECT_EQ(ratio, 1.0) << key;

  q.cfg.num_hidden_layers = 4;
  doc = plan_document(q);
  EXPECT_EQ(doc["model"]["num_hidden_layers"], 4);
  for (const auto& [label, v] : doc["points"][1]["variants"].items()) {
    const nlohmann::json& t = v["model_total"];
    EXPECT_EQ(t["num_hidden_layers"], 4) << label;
    EXPECT_EQ(t["saved_bytes"], 4 * v["saved_bytes"].get<std::int64_t>()) << label;
    EXPECT_EQ(t["bytes_sent"], 4 * v["bytes_sent"].get<std::int64_t>()) << label;
  }
  EXPECT_EQ(doc["points"][1]["variants"]["laga"]["model_total"]["bytes_sent"], 4 * 2688);
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
