// The timed phantom communicator and the host clock (include/laga/timed_comm.hpp).
#include <chrono>
#include <cmath>
#include <thread>

#include "laga/backend.hpp"
#include "laga/errors.hpp"
#include "laga/timed_comm.hpp"

namespace laga {

namespace {

class HostCommClock final : public CommClock {
 public:
  const char* name() const override { return "host"; }
  void hold(double seconds) override {
    LAGA_REQUIRE(std::isfinite(seconds) && seconds >= 0, "hold: seconds = ", seconds, ": must be >= 0");
    using clock = std::chrono::steady_clock;
    const auto until = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
    // Sleeping overshoots by tens of microseconds: sleep to within half a millisecond, then spin.
    constexpr auto kSpin = std::chrono::microseconds(500);
    if (until - clock::now() > kSpin) std::this_thread::sleep_until(until - kSpin);
    while (clock::now() < until) {
    }
  }
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
    hold(CollectiveKind::all_gather, count, dtype);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->reduce_scatter(send, recv, count, dtype);
    hold(CollectiveKind::reduce_scatter, count, dtype);
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override {
    phantom_->all_to_all(send, recv, count, dtype);
    hold(CollectiveKind::all_to_all, count, dtype);
  }
  void all_reduce(void* buf, std::size_t count, DType dtype) override {
    phantom_->all_reduce(buf, count, dtype);
    hold(CollectiveKind::all_reduce, count, dtype);
  }
  void barrier() override {}

 private:
  void hold(CollectiveKind kind, std::size_t count, DType dtype) {
    clock_.hold(timed_collective_seconds(links_, kind, count * dtype_size(dtype), size()));
  }
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
