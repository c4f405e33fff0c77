// The timed phantom communicator and the host clock (include/laga/timed_comm.hpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "laga/backend.hpp"
#include "laga/errors.hpp"
#include "laga/timed_comm.hpp"

namespace laga {

namespace {

using SteadyClock = std::chrono::steady_clock;

// Sleeping overshoots by tens of microseconds: sleep to within half a millisecond, then spin.
void wait_until(SteadyClock::time_point until) {
  constexpr auto kSpin = std::chrono::microseconds(500);
  if (until - SteadyClock::now() > kSpin) std::this_thread::sleep_until(until - kSpin);
  while (SteadyClock::now() < until) {
  }
}

class HostHold final : public CollectiveRequest::Pending {
 public:
  explicit HostHold(SteadyClock::time_point until) : until_(until) {}
  void wait() override { wait_until(until_); }

 private:
  SteadyClock::time_point until_;
};

// The queue is the time it is busy until: a hold starts when the one before it ends (or now).
class HostCommClock final : public CommClock {
 public:
  const char* name() const override { return "host"; }
  CollectiveRequest start_hold(double seconds) override {
    LAGA_REQUIRE(std::isfinite(seconds) && seconds >= 0, "hold: seconds = ", seconds, ": must be >= 0");
    busy_until_ = std::max(SteadyClock::now(), busy_until_) +
                  std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(seconds));
    return CollectiveRequest(std::make_unique<HostHold>(busy_until_));
  }

 private:
  SteadyClock::time_point busy_until_{};
};

class TimedPhantomCommunicator final : public Communicator {
 public:
  TimedPhantomCommunicator(Backend& backend, int rank, int size, const TimedLinks& links, CommClock& clock)
      : phantom_(make_phantom_communicator(backend, rank, size)), links_(links), clock_(clock) {
    validate(links_.model);
    LAGA_REQUIRE(links_.ranks_per_node >= 1 && links_.ranks_per_node <= std::min(size, links_.model.node_size),
                 "ranks_per_node = ", links_.ranks_per_node, ": must be in [1, min(ranks = ", size,
                 ", node_size = ", links_.model.node_size, ")]");
  }
  int rank() const override { return phantom_->rank(); }
  int size() const override { return phantom_->size(); }
  const char* name() const override { return "timed-phantom"; }
  bool performs_traffic() const override { return false; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->all_gather(send, recv, count, dtype);
    hold(CollectiveKind::AllGather, count, dtype);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->reduce_scatter(send, recv, count, dtype);
    hold(CollectiveKind::ReduceScatter, count, dtype);
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->all_to_all(send, recv, count, dtype);
    hold(CollectiveKind::AllToAll, count, dtype);
  }
  void all_reduce(void* buf, std::size_t count, DType dtype) override {
    phantom_->all_reduce(buf, count, dtype);
    hold(CollectiveKind::AllReduce, count, dtype);
  }
  void ring_shift(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->ring_shift(send, recv, count, dtype);
    hold(CollectiveKind::RingShift, count, dtype);
  }
  CollectiveRequest start_ring_shift(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->ring_shift(send, recv, count, dtype);
    return start(CollectiveKind::RingShift, count, dtype);
  }
  CollectiveRequest start_all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->all_gather(send, recv, count, dtype);
    return start(CollectiveKind::AllGather, count, dtype);
  }
  CollectiveRequest start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->reduce_scatter(send, recv, count, dtype);
    return start(CollectiveKind::ReduceScatter, count, dtype);
  }
  CollectiveRequest start_all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->all_to_all(send, recv, count, dtype);
    return start(CollectiveKind::AllToAll, count, dtype);
  }
  void barrier() override {}

 private:
  CollectiveRequest start(CollectiveKind kind, std::size_t count, DType dtype) {
    return clock_.start_hold(timed_collective_seconds(links_, kind, count * dtype_size(dtype), size()));
  }
  void hold(CollectiveKind kind, std::size_t count, DType dtype) { start(kind, count, dtype).wait(); }
  std::unique_ptr<Communicator> phantom_;
  TimedLinks links_;
  CommClock& clock_;
};

}  // namespace

std::unique_ptr<CommClock> make_host_comm_clock() { return std::make_unique<HostCommClock>(); }

double timed_collective_seconds(const TimedLinks& links, CollectiveKind kind, std::size_t chunk_bytes, int ranks) {
  return collective_seconds(links.model, kind, double(collective_bytes_sent(kind, chunk_bytes, ranks)), 1, ranks,
                            links.ranks_per_node);
}

std::unique_ptr<Communicator> make_timed_phantom_communicator(Backend& backend, int rank, int size,
                                                              const TimedLinks& links, CommClock& clock) {
  return std::make_unique<TimedPhantomCommunicator>(backend, rank, size, links, clock);
}

}  // namespace laga
