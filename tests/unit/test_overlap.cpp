// BlockOptions::overlap: collectives started under compute give the same bits as the blocking order, on
// thread ranks (whose started collectives run only when waited for, so a result read too early or a send
// buffer changed too soon would show), for every form and layout in float32 and float64; the same
// collectives; and the plan, which runs the same orchestration on the meta backend, equals the measurement.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "laga/plan.hpp"
#include "laga/problem.hpp"

namespace laga {
namespace {

struct OverlapCase {
  int ranks;
  Layout layout;
  Variant variant;
  AttentionKernel kernel;
  DType dtype;
  BlockOptions options(bool overlap) const {
    BlockOptions o = variant.options(layout, kernel, dtype);
    o.overlap = overlap;
    return o;
  }
};
std::string case_name(const testing::TestParamInfo<OverlapCase>& info) {
  const OverlapCase& c = info.param;
  return "P" + std::to_string(c.ranks) + "_" + layout_name(c.layout) + "_" + c.variant.name() + "_" +
         kernel_name(c.kernel) + "_" + dtype_name(c.dtype);
}

std::vector<OverlapCase> cases() {
  std::vector<OverlapCase> out;
  for (int P : {2, 4})
    for (Layout l : kAllLayouts)
      for (const Variant& v : kAllVariants)
        for (AttentionKernel k : kAllKernels)
          for (DType dt : {DType::f32, DType::f64}) out.push_back({P, l, v, k, dt});
  return out;
}

std::vector<CollectiveRecord> sorted(std::vector<CollectiveRecord> v) {
  std::sort(v.begin(), v.end(), [](const CollectiveRecord& a, const CollectiveRecord& b) {
    return std::tie(a.phase, a.kind, a.tensor) < std::tie(b.phase, b.kind, b.tensor);
  });
  return v;
}
void expect_same_records(const std::vector<CollectiveRecord>& a, const std::vector<CollectiveRecord>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].phase, b[i].phase);
    EXPECT_EQ(a[i].kind, b[i].kind);
    EXPECT_EQ(a[i].tensor, b[i].tensor);
    EXPECT_EQ(a[i].bytes_sent, b[i].bytes_sent) << a[i].tensor;
    EXPECT_EQ(a[i].calls, b[i].calls) << a[i].tensor;
  }
}

class Overlap : public testing::TestWithParam<OverlapCase> {};

TEST_P(Overlap, BitwiseTheBlockingResultAndPlanEqualsMeasurement) {
  const OverlapCase& c = GetParam();
  const MlaConfig cfg = preset("tiny");
  const std::int64_t batch = 2, seq = 16;
  GroupRun blocking = run_thread_group(cfg, c.options(false), batch, seq, c.ranks, 5);
  GroupRun overlapped = run_thread_group(cfg, c.options(true), batch, seq, c.ranks, 5);
  EXPECT_TRUE(overlapped.result.y == blocking.result.y);
  EXPECT_TRUE(overlapped.result.dx == blocking.result.dx);
  ASSERT_EQ(overlapped.result.grads.size(), blocking.result.grads.size());
  for (std::size_t i = 0; i < blocking.result.grads.size(); ++i)
    EXPECT_TRUE(overlapped.result.grads[i].second == blocking.result.grads[i].second) << blocking.result.grads[i].first;
  for (int r = 0; r < c.ranks; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    const RankRun& run = overlapped.ranks[r];
    expect_same_records(sorted(run.traffic), sorted(blocking.ranks[r].traffic));
    EXPECT_EQ(run.saved_bytes, blocking.ranks[r].saved_bytes);
    // The plan of the overlapped block equals its measurement.
    const BlockShape shape{.batch = batch, .seq = seq, .ranks = c.ranks, .rank = r};
    const RankPlan plan = plan_rank(cfg, c.options(true), shape);
    EXPECT_EQ(plan.saved_bytes, run.saved_bytes);
    EXPECT_EQ(plan.peak_forward, run.fwd.peak_bytes);
    EXPECT_EQ(plan.peak_backward, run.bwd.peak_bytes);
    expect_same_records(plan.traffic, run.traffic);
    for (int p = 0; p < kOpPhaseCount; ++p) {
      EXPECT_EQ(plan.fwd.flops[p], run.fwd.flops[p]);
      EXPECT_EQ(plan.bwd.flops[p], run.bwd.flops[p]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, Overlap, testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace laga
