// The timed phantom communicator: its data is the phantom's, each call holds its clock for the alpha-beta
// model's time of the call's bytes (the function `laga bench` prices with), and a model that costs nothing
// holds for nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include "laga/backend.hpp"
#include "laga/bench.hpp"
#include "laga/errors.hpp"
#include "laga/problem.hpp"
#include "laga/timed_comm.hpp"

namespace {

using namespace laga;

// Records what it was asked to hold, and holds nothing.
class RecordingClock final : public CommClock {
 public:
  const char* name() const override { return "recording"; }
  CollectiveRequest start_hold(double seconds) override {
    holds.push_back(seconds);
    return {};
  }
  std::vector<double> holds;
};

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

// P = 8 on one node and one rank a node: the holds of a whole block's collectives add up to what the model
// gives the counted records, and the data equals the plain phantom's.
TEST(TimedPhantom, HoldsFollowTheModelForEveryFormAndLayout) {
  const MlaConfig cfg = resolve_model("small");
  auto be = make_cpu_backend();
  const int P = 8;
  const BlockShape shape{.batch = 1, .seq = 64, .ranks = P, .rank = P - 1};
  for (Layout layout : kAllLayouts)
    for (const Variant& v : kAllVariants)
      for (int rpn : {8, 1}) {
        const BlockOptions opts = v.options(layout, AttentionKernel::Fused, DType::F64);
        SCOPED_TRACE(std::string(layout_name(layout)) + " " + v.label() + " ranks_per_node " + std::to_string(rpn));
        RecordingClock clock;
        const TimedLinks links{default_time_model(), rpn};
        auto timed = make_timed_phantom_communicator(*be, P - 1, P, links, clock);
        auto plain = make_phantom_communicator(*be, P - 1, P);
        const RankRun a = run_rank(cfg, opts, shape, *be, *timed, 1);
        const RankRun b = run_rank(cfg, opts, shape, *be, *plain, 1);
        int calls = 0;
        for (const CollectiveRecord& r : a.traffic) calls += r.calls;
        ASSERT_EQ(int(clock.holds.size()), calls);
        const double modeled = communication_seconds(links.model, a.traffic, P, rpn);
        EXPECT_GT(modeled, 0);
        EXPECT_NEAR(sum(clock.holds), modeled, 1e-12 * modeled);
        EXPECT_EQ(to_host(*be, a.y), to_host(*be, b.y));
        EXPECT_EQ(to_host(*be, a.dx), to_host(*be, b.dx));
      }
}

TEST(TimedPhantom, OneCallIsPricedByCollectiveSeconds) {
  TimedLinks links;
  links.ranks_per_node = 4;
  const std::size_t chunk = 3 << 20;
  for (CollectiveKind k : {CollectiveKind::AllGather, CollectiveKind::ReduceScatter, CollectiveKind::AllToAll,
                           CollectiveKind::AllReduce})
    EXPECT_DOUBLE_EQ(timed_collective_seconds(links, k, chunk, 8),
                     collective_seconds(links.model, k, double(collective_bytes_sent(k, chunk, 8)), 1, 8, 4));
  links.ranks_per_node = 1;
  EXPECT_EQ(timed_collective_seconds(links, CollectiveKind::AllGather, chunk, 1), 0.0);
}

// A model with no latency and (practically) unbounded bandwidth: every hold is zero, and the host clock
// returns at once.
TEST(TimedPhantom, ZeroCostModelIsInstant) {
  TimedLinks links;
  links.model.intra.latency = links.model.inter.latency = 0;
  links.model.intra.bandwidth = links.model.inter.bandwidth = 1e300;
  links.ranks_per_node = 8;
  auto be = make_cpu_backend();
  RecordingClock clock;
  auto comm = make_timed_phantom_communicator(*be, 7, 8, links, clock);
  std::vector<double> send(8 * 16, 1.0), recv(8 * 16);
  comm->all_gather(send.data(), recv.data(), 16, DType::F64);
  comm->all_to_all(send.data(), recv.data(), 16, DType::F64);
  ASSERT_EQ(clock.holds.size(), 2u);
  EXPECT_LT(clock.holds[0], 1e-250);
  auto host = make_host_comm_clock();
  const auto t0 = std::chrono::steady_clock::now();
  host->hold(0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1e-3);
}

// The host clock blocks the calling thread at least as long as asked.
TEST(TimedPhantom, HostClockWaitsAtLeastTheTime) {
  auto host = make_host_comm_clock();
  for (double s : {2e-4, 3e-3}) {
    const auto t0 = std::chrono::steady_clock::now();
    host->hold(s);
    EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), s);
  }
  EXPECT_THROW(host->hold(-1), InvalidArgument);
}

// On the CPU the block's communication phase contains the holds: at least the model's time.
TEST(TimedPhantom, BlockCommunicationTimeCoversTheModel) {
  const MlaConfig cfg = resolve_model("small");
  auto be = make_cpu_backend();
  auto clock = make_host_comm_clock();
  const TimedLinks links{default_time_model(), 1};
  const BlockShape shape{.batch = 1, .seq = 64, .ranks = 4, .rank = 3};
  auto comm = make_timed_phantom_communicator(*be, 3, 4, links, *clock);
  const RankRun run = run_rank(cfg, Variant{Form::Laga}.options(Layout::A2A, AttentionKernel::Fused, DType::F32),
                               shape, *be, *comm, 1);
  const int c = int(OpPhase::Communication);
  EXPECT_GE(run.fwd.seconds[c] + run.bwd.seconds[c], communication_seconds(links.model, run.traffic, 4, 1));
}

TEST(TimedPhantom, RefusesBadPlacement) {
  auto be = make_cpu_backend();
  RecordingClock clock;
  EXPECT_THROW(make_timed_phantom_communicator(*be, 0, 4, TimedLinks{default_time_model(), 5}, clock), InvalidArgument);
  EXPECT_THROW(make_timed_phantom_communicator(*be, 4, 4, TimedLinks{default_time_model(), 1}, clock), InvalidArgument);
}

}  // namespace
