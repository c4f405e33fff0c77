// laga bench's arithmetic: medians, quartiles and ranges on known samples; the alpha-beta model of the
// collectives on hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "laga/bench.hpp"
#include "laga/errors.hpp"
#include "laga/plan.hpp"

namespace laga {
namespace {

TEST(BenchStats, OddCountMedianIsTheMiddleSample) {
  const Summary s = summarize({5.0, 1.0, 3.0});
  EXPECT_EQ(s.n, 3u);
  EXPECT_DOUBLE_EQ(s.median, 3.0);
  EXPECT_DOUBLE_EQ(s.min, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 5.0);
  EXPECT_DOUBLE_EQ(s.mean, 3.0);
  // h = 2 * 0.25 = 0.5: halfway between 1 and 3; h = 1.5: halfway between 3 and 5.
  EXPECT_DOUBLE_EQ(s.q1, 2.0);
  EXPECT_DOUBLE_EQ(s.q3, 4.0);
  EXPECT_DOUBLE_EQ(s.iqr(), 2.0);
  EXPECT_DOUBLE_EQ(s.range(), 4.0);
}

TEST(BenchStats, EvenCountMedianIsTheMeanOfTheTwoMiddleSamples) {
  const Summary s = summarize({4.0, 1.0, 3.0, 2.0});
  EXPECT_DOUBLE_EQ(s.median, 2.5);
  // numpy.percentile([1, 2, 3, 4], [25, 75]) = [1.75, 3.25]
  EXPECT_DOUBLE_EQ(s.q1, 1.75);
  EXPECT_DOUBLE_EQ(s.q3, 3.25);
  EXPECT_DOUBLE_EQ(s.iqr(), 1.5);
  EXPECT_DOUBLE_EQ(s.relative_iqr(), 1.5 / 2.5);
}

TEST(BenchStats, KnownSampleWithAnOutlier) {
  // Five repeats, one slow: the median and the quartiles ignore it, the range does not.
  // numpy.percentile([10, 11, 12, 13, 100], [25, 50, 75]) = [11, 12, 13]
  const Summary s = summarize({12.0, 100.0, 11.0, 13.0, 10.0});
  EXPECT_DOUBLE_EQ(s.median, 12.0);
  EXPECT_DOUBLE_EQ(s.q1, 11.0);
  EXPECT_DOUBLE_EQ(s.q3, 13.0);
  EXPECT_DOUBLE_EQ(s.min, 10.0);
  EXPECT_DOUBLE_EQ(s.max, 100.0);
  EXPECT_DOUBLE_EQ(s.mean, 29.2);
  // numpy.percentile(x, 90) for x = 10, 11, 12, 13, 100: h = 3.6 -> 13 + 0.6 * 87 = 65.2
  EXPECT_DOUBLE_EQ(quantile({12.0, 100.0, 11.0, 13.0, 10.0}, 0.9), 65.2);
  EXPECT_DOUBLE_EQ(quantile({12.0, 100.0, 11.0, 13.0, 10.0}, 0.0), 10.0);
  EXPECT_DOUBLE_EQ(quantile({12.0, 100.0, 11.0, 13.0, 10.0}, 1.0), 100.0);
}

TEST(BenchStats, SixSamplesWithTies) {
  // numpy.percentile([1, 2, 2, 2, 7, 9], [25, 50, 75]) = [2, 2, 5.75]
  const Summary s = summarize({2.0, 9.0, 2.0, 1.0, 7.0, 2.0});
  EXPECT_DOUBLE_EQ(s.q1, 2.0);
  EXPECT_DOUBLE_EQ(s.median, 2.0);
  EXPECT_DOUBLE_EQ(s.q3, 5.75);
  EXPECT_DOUBLE_EQ(median({2.0, 9.0, 2.0, 1.0, 7.0, 2.0}), 2.0);
}

TEST(BenchStats, OneSampleHasNoSpread) {
  const Summary s = summarize({0.25});
  EXPECT_DOUBLE_EQ(s.median, 0.25);
  EXPECT_DOUBLE_EQ(s.q1, 0.25);
  EXPECT_DOUBLE_EQ(s.q3, 0.25);
  EXPECT_DOUBLE_EQ(s.iqr(), 0.0);
  EXPECT_DOUBLE_EQ(s.range(), 0.0);
  EXPECT_DOUBLE_EQ(summarize({0.0}).relative_iqr(), 0.0);
}

TEST(BenchStats, RefusesNoSamplesNonFiniteSamplesAndBadQuantiles) {
  EXPECT_THROW(summarize({}), InvalidArgument);
  EXPECT_THROW(summarize({1.0, std::nan("")}), InvalidArgument);
  EXPECT_THROW(summarize({1.0, std::numeric_limits<double>::infinity()}), InvalidArgument);
  EXPECT_THROW(quantile({1.0}, 1.5), InvalidArgument);
  EXPECT_THROW(quantile({1.0}, -0.1), InvalidArgument);
  EXPECT_THROW(median({}), InvalidArgument);
}

// A model with round numbers: 100 GB/s and 1 us in a node, 10 GB/s and 10 us across, 4 GPUs a node.
TimeModel round_model() {
  TimeModel m;
  m.node_size = 4;
  m.intra = Link{"intra", 100e9, 1e-6, ""};
  m.inter = Link{"inter", 10e9, 10e-6, ""};
  return m;
}

TEST(BenchTimeModel, OneNodeRingAndPairwise) {
  const TimeModel m = round_model();
  // P = 4, chunk 1 MB: all-gather sends 3 MB in 3 steps: 3 us + 3e6 / 1e11 s = 3 us + 30 us.
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::AllGather, 3e6, 1, 4, 4), 33e-6, 1e-15);
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::ReduceScatter, 3e6, 1, 4, 4), 33e-6, 1e-15);
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::AllToAll, 3e6, 1, 4, 4), 33e-6, 1e-15);
  // Two calls merged in one record: the latency twice, the bytes once (they are the sum of both calls).
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::AllGather, 6e6, 2, 4, 4), 6e-6 + 60e-6, 1e-15);
  // All-reduce of 4 MB: counted as 2 * 3/4 * 4 MB = 6 MB in 2 * 3 steps.
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::AllReduce, 6e6, 1, 4, 4), 6e-6 + 60e-6, 1e-15);
  // P = 2 on one node: one step.
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::AllGather, 1e6, 1, 2, 2), 1e-6 + 10e-6, 1e-15);
}

TEST(BenchTimeModel, AcrossNodes) {
  const TimeModel m = round_model();
  // P = 8 on two nodes of 4, all-gather of 7 MB (chunk 1 MB): the ring goes at the inter-node link's pace:
  // 7 x 10 us + 7e6 / 1e10 s = 70 us + 700 us.
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::AllGather, 7e6, 1, 8, 4), 770e-6, 1e-12);
  // All-to-all of 7 MB: 3 MB to the 3 peers in the node (3 us + 30 us), 4 MB to the 4 beyond (40 us + 400 us),
  // concurrently: latencies add, bandwidth terms overlap: 3 + 40 + max(30, 400) = 443 us.
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::AllToAll, 7e6, 1, 8, 4), 443e-6, 1e-12);
  // One rank a node: everything on the inter-node link: 7 x 10 us + 700 us, for both kinds.
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::AllToAll, 7e6, 1, 8, 1), 770e-6, 1e-12);
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::ReduceScatter, 7e6, 1, 8, 1), 770e-6, 1e-12);
  // P = 2 a node apart.
  EXPECT_NEAR(collective_seconds(m, CollectiveKind::AllGather, 1e6, 1, 2, 1), 10e-6 + 100e-6, 1e-12);
}

TEST(BenchTimeModel, OneRankCostsNothingAndBadInputIsRefused) {
  const TimeModel m = round_model();
  EXPECT_EQ(collective_seconds(m, CollectiveKind::AllToAll, 0, 1, 1, 1), 0.0);
  EXPECT_EQ(collective_seconds(m, CollectiveKind::AllGather, 1e6, 0, 4, 4), 0.0);
  EXPECT_THROW(collective_seconds(m, CollectiveKind::AllGather, 1e6, 1, 0, 1), InvalidArgument);
  EXPECT_THROW(collective_seconds(m, CollectiveKind::AllGather, 1e6, 1, 8, 5), InvalidArgument);  // > node_size
  EXPECT_THROW(collective_seconds(m, CollectiveKind::AllGather, 1e6, 1, 2, 3), InvalidArgument);  // > ranks
  EXPECT_THROW(collective_seconds(m, CollectiveKind::AllGather, -1.0, 1, 2, 2), InvalidArgument);
  TimeModel bad = m;
  bad.inter.bandwidth = 0;
  EXPECT_THROW(validate(bad), InvalidArgument);
  bad = m;
  bad.node_size = 0;
  EXPECT_THROW(validate(bad), InvalidArgument);
  EXPECT_NO_THROW(validate(default_time_model()));
}

TEST(BenchTimeModel, DefaultsAreTheDocumentedOnes) {
  const TimeModel m = default_time_model();
  EXPECT_EQ(m.node_size, 8);
  EXPECT_DOUBLE_EQ(m.intra.bandwidth, 450e9);  // NVLink 4, per direction
  EXPECT_DOUBLE_EQ(m.inter.bandwidth, 50e9);   // 400 Gb/s
  EXPECT_DOUBLE_EQ(m.intra.latency, 2e-6);
  EXPECT_DOUBLE_EQ(m.inter.latency, 5e-6);
  EXPECT_FALSE(m.intra.source.empty());
  EXPECT_FALSE(m.inter.source.empty());
  const auto pl = standard_placements(m, 16);
  ASSERT_EQ(pl.size(), 2u);
  EXPECT_EQ(pl[0].name, "node");
  EXPECT_EQ(pl[0].ranks_per_node, 8);
  EXPECT_EQ(pl[1].name, "cross-node");
  EXPECT_EQ(pl[1].ranks_per_node, 1);
  EXPECT_EQ(standard_placements(m, 4)[0].ranks_per_node, 4);
}

// The model priced over a real plan's records: DeepSeek-V3, S = 16384, P = 8, a2a, bf16. Each record is priced
// by its own kind and call count, and the sum is what communication_seconds returns.
TEST(BenchTimeModel, PricesAPlansCollectives) {
  const MlaConfig cfg = resolve_model("deepseek-v3");
  const TimeModel m = default_time_model();
  for (Form form : kAllForms) {
    const BlockOptions opts{.form = form, .layout = Layout::A2A, .kernel = AttentionKernel::Fused, .dtype = DType::BF16};
    const RankPlan plan = plan_rank(cfg, opts, BlockShape{.batch = 1, .seq = 16384, .ranks = 8, .rank = 7});
    double by_hand = 0, steps = 0;
    for (const auto& r : plan.traffic) {
      by_hand += double(r.bytes_sent) / m.intra.bandwidth;
      steps += 7.0 * r.calls;
    }
    by_hand += steps * m.intra.latency;
    EXPECT_NEAR(communication_seconds(m, plan.traffic, 8, 8), by_hand, 1e-12 * by_hand) << form_name(form);
    // One rank a node: every byte at InfiniBand's 50 GB/s, every step 5 us.
    double ib = steps * m.inter.latency;
    for (const auto& r : plan.traffic) ib += double(r.bytes_sent) / m.inter.bandwidth;
    EXPECT_NEAR(communication_seconds(m, plan.traffic, 8, 1), ib, 1e-12 * ib) << form_name(form);
  }
  // LAGA moves fewer bytes than explicit in a2a, so the model prices it cheaper in both placements.
  auto priced = [&](Form f, int k) {
    const BlockOptions opts{.form = f, .layout = Layout::A2A, .kernel = AttentionKernel::Fused, .dtype = DType::BF16};
    return communication_seconds(m, plan_rank(cfg, opts, BlockShape{.batch = 1, .seq = 16384, .ranks = 8, .rank = 7}).traffic,
                                 8, k);
  };
  EXPECT_LT(priced(Form::Laga, 8), priced(Form::Explicit, 8));
  EXPECT_LT(priced(Form::Laga, 1), priced(Form::Explicit, 1));
}

}  // namespace
}  // namespace laga
