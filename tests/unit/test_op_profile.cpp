// The op profile (include/laga/op_profile.hpp): it sees every op the block issues, leaves the results bit for
// bit, keeps the block's Timer marks working across reset_marks(), and summarize_ops() gives one row per op of
// a pass with the median over repeats.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "laga/bench.hpp"
#include "laga/errors.hpp"
#include "laga/op_profile.hpp"
#include "laga/problem.hpp"

namespace laga {
namespace {

constexpr std::int64_t kSeq = 16;

RankRun run_on(Backend& be, const BlockOptions& opts, int ranks) {
  auto comm = ranks == 1 ? make_single_rank_communicator(be) : make_phantom_communicator(be, ranks - 1, ranks);
  return run_rank(preset("tiny"), opts, BlockShape{.batch = 1, .seq = kSeq, .ranks = ranks, .rank = ranks - 1}, be,
                  *comm, 3);
}

TEST(OpProfile, SeesEveryOpAndChangesNoBit) {
  int runs = 0;
  for (const Variant& v : kAllVariants)
    for (Layout layout : kAllLayouts)
    for (int ranks : {1, 2}) {
      SCOPED_TRACE(std::string(v.label()) + " " + layout_name(layout) + " P=" + std::to_string(ranks));
      BlockOptions opts = v.options(layout, AttentionKernel::Fused, DType::F32);
      try {
        validate(preset("tiny"), opts, BlockShape{.batch = 1, .seq = kSeq, .ranks = ranks, .rank = ranks - 1});
      } catch (const InvalidArgument&) {
        continue;  // a form the layout does not run
      }
      auto plain_be = make_cpu_backend();
      const RankRun plain = run_on(*plain_be, opts, ranks);
      auto cpu = make_cpu_backend();
      OpProfileBackend profile(*cpu);
      const RankRun profiled = run_on(profile, opts, ranks);
      EXPECT_EQ(to_host(*cpu, profiled.y), to_host(*plain_be, plain.y));
      EXPECT_EQ(to_host(*cpu, profiled.dx), to_host(*plain_be, plain.dx));
      ++runs;
      const std::vector<OpRecord>& recs = profile.records();
      std::map<int, int> calls;
      std::map<std::string, int> kinds;
      double seconds[2] = {0, 0};
      for (const OpRecord& r : recs) {
        ASSERT_TRUE(r.pass == 0 || r.pass == 1) << "run_rank makes two passes";
        EXPECT_EQ(r.index_in_pass, calls[r.pass]++) << "issue order within the pass";
        EXPECT_FALSE(r.what.empty());
        seconds[r.pass] += r.seconds;
        ++kinds[r.op];
      }
      EXPECT_GE(kinds["attention_forward"], 1);
      EXPECT_EQ(kinds["attention_forward"], kinds["attention_backward"]);
      EXPECT_GE(kinds["gemm"], 6);
      EXPECT_EQ(kinds["rmsnorm_forward"], 2);
      EXPECT_EQ(kinds["rmsnorm_backward"], 2);
      // The block's own phase times still come from its marks (the profile's sit inside them).
      EXPECT_GT(profiled.fwd.total_seconds(), 0.0);
      EXPECT_GT(profiled.bwd.total_seconds(), 0.0);
    }
  EXPECT_GE(runs, 2 * int(std::size(kAllVariants)) * 2) << "a2a and all_gather run every form";
}

TEST(OpProfile, SummaryIsTheMedianPerOpOfAPass) {
  auto cpu = make_cpu_backend();
  OpProfileBackend profile(*cpu);
  const BlockOptions opts = Variant{Form::Laga}.options(Layout::A2A, AttentionKernel::Fused, DType::F32);
  for (int i = 0; i < 3; ++i) run_on(profile, opts, 2);
  const std::vector<OpRecord>& recs = profile.records();
  const std::vector<OpProfileRow> rows = summarize_ops(recs, 3);
  ASSERT_EQ(rows.size() * 3, recs.size());
  for (const OpProfileRow& row : rows) {
    std::vector<double> t;
    for (const OpRecord& r : recs)
      if (r.pass % 2 == int(row.backward) && r.index_in_pass == row.index) t.push_back(r.seconds);
    ASSERT_EQ(t.size(), 3u);
    std::sort(t.begin(), t.end());
    EXPECT_EQ(row.median_s, t[1]);
  }
  // Repeats that issue different ops, or a count that does not match, are refused.
  EXPECT_THROW(summarize_ops(recs, 2), InvalidArgument);
  std::vector<OpRecord> odd = recs;
  odd.back().what = "something else";
  EXPECT_THROW(summarize_ops(odd, 3), InvalidArgument);
}

}  // namespace
}  // namespace laga
