// The timed phantom communicator: a phantom rank (rank r of P alone; no traffic, the phantom's stand-in
// data) whose every collective holds its queue for the time the alpha-beta model of include/laga/bench.hpp
// gives its bytes (collective_seconds: NVLink within a node, InfiniBand across; the parameters `laga
// bench` uses). One device then measures how much of a real job's communication the block leaves exposed:
// the block time with timed collectives minus the block time with instant ones (the plain phantom).
#pragma once

#include <memory>

#include "laga/bench.hpp"
#include "laga/comm.hpp"

namespace laga {

class Backend;

// Where a timed phantom's collectives spend their modeled time.
class CommClock {
 public:
  virtual ~CommClock() = default;
  virtual const char* name() const = 0;
  // Holds the clock's communication queue for `seconds` (>= 0), after the caller's work queued so far and
  // after the holds started before it (one queue, as a communicator's collectives run one after another);
  // the request's wait() orders the caller's work after the hold. The host clock's queue is a deadline the
  // calling thread waits for; the CUDA clock's is a stream of its own, where a hold is a one-thread kernel
  // spinning on %globaltimer (events order it after the backend's stream and the backend's stream after it;
  // the host never waits).
  virtual CollectiveRequest start_hold(double seconds) = 0;
  // The blocking form: start_hold(seconds).wait().
  void hold(double seconds) { start_hold(seconds).wait(); }
};

// The calling thread waits at wait() (sleeps, then spins on the steady clock for the last half
// millisecond, so short holds stay accurate).
std::unique_ptr<CommClock> make_host_comm_clock();

// The CUDA backend's stream holds (built into laga_cuda, src/cuda/comm_clock.cu; without CUDA it throws
// InvalidArgument). `cuda_backend` must outlive it.
std::unique_ptr<CommClock> make_cuda_comm_clock(Backend& cuda_backend);

// The time model and the placement a timed phantom prices its collectives with.
struct TimedLinks {
  TimeModel model = default_time_model();
  int ranks_per_node = 1;  // of the P ranks, how many share a node (standard_placements)
};

// The seconds a timed phantom holds for one call of `kind` with chunks of `chunk_bytes` (all_reduce: the
// whole buffer) among `ranks` ranks: collective_seconds of the bytes CountingCommunicator counts.
double timed_collective_seconds(const TimedLinks&, CollectiveKind, std::size_t chunk_bytes, int ranks);

// Rank `rank` of `size` alone: collectives return the phantom's data (make_phantom_communicator, in line on
// the backend) and then hold `clock` for timed_collective_seconds; the start_* forms start the hold
// (CommClock::start_hold) and return its request. `backend` and `clock` must outlive it. Throws InvalidArgument
// for a rank outside [0, size), an invalid model or ranks_per_node outside [1, min(size, node_size)].
std::unique_ptr<Communicator> make_timed_phantom_communicator(Backend& backend, int rank, int size,
                                                              const TimedLinks& links, CommClock& clock);

}  // namespace laga
