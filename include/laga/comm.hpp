// One communicator interface for the sequence-parallel group: threads of one process and MPI (CPU
// buffers; include/laga/mpi_comm.hpp), NCCL and MPI with host staging (GPU buffers;
// include/laga/nccl_comm.hpp), a single rank, and phantom ranks; a counting wrapper records the bytes each
// collective moves.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "laga/tensor.hpp"

namespace laga {

class Backend;

// A collective in flight (Communicator::start_*). wait() orders the caller's work after it: a device
// communicator makes the backend's stream wait for it (the host does not wait), a host communicator
// blocks the calling thread until it is complete. The buffers must stay alive and unchanged until then.
// An empty request (the default, and what a blocking start returns) is complete. Every request must be
// waited for: destroying a pending one does not wait (a nonblocking MPI collective cannot be cancelled).
class CollectiveRequest {
 public:
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };
  CollectiveRequest() = default;
  explicit CollectiveRequest(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
  bool pending() const { return pending_ != nullptr; }
  void wait() {
    if (!pending_) return;
    std::unique_ptr<Pending> p = std::move(pending_);
    p->wait();
  }

 private:
  std::unique_ptr<Pending> pending_;
};

// Counts are elements per rank chunk. Buffers live on the device the communicator serves.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;

  // recv = [size][count]: chunk p is rank p's send.
  virtual void all_gather(const void* send, void* recv, std::size_t count, DType) = 0;
  // send = [size][count]; recv = sum over ranks of their chunk `rank()`.
  virtual void reduce_scatter(const void* send, void* recv, std::size_t count, DType) = 0;
  // send = [size][count]: chunk p goes to rank p; recv chunk p came from rank p.
  virtual void all_to_all(const void* send, void* recv, std::size_t count, DType) = 0;
  // In-place sum over ranks.
  virtual void all_reduce(void* buf, std::size_t count, DType) = 0;
  // The ring's step: `count` elements of send go to rank (rank() + 1) % size(), recv receives the `count`
  // elements rank (rank() - 1 + size()) % size() sent (at P = 1 a copy of send). send and recv must not
  // overlap. Every rank calls it with the same count.
  virtual void ring_shift(const void* send, void* recv, std::size_t count, DType) = 0;
  // The same collectives started without waiting for them; wait() on the request orders the caller's work
  // after them. Every rank starts the same collectives in the same order (blocking ones included). The
  // default runs the blocking call and returns a complete request, so every communicator has them.
  virtual CollectiveRequest start_all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
    all_gather(send, recv, count, dtype);
    return {};
  }
  virtual CollectiveRequest start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) {
    reduce_scatter(send, recv, count, dtype);
    return {};
  }
  virtual CollectiveRequest start_all_to_all(const void* send, void* recv, std::size_t count, DType dtype) {
    all_to_all(send, recv, count, dtype);
    return {};
  }
  virtual CollectiveRequest start_ring_shift(const void* send, void* recv, std::size_t count, DType dtype) {
    ring_shift(send, recv, count, dtype);
    return {};
  }
  virtual void barrier() = 0;
  // True when collectives really move data between processes (false for phantom ranks).
  virtual bool performs_traffic() const { return true; }
};

// P = 1: every collective is a copy (or nothing).
std::unique_ptr<Communicator> make_single_rank_communicator(Backend& backend);

// Rank `rank` of `size` run alone: collectives return correctly sized, deterministic data (every chunk
// received is a copy of this rank's own send chunk) and no traffic is performed.
std::unique_ptr<Communicator> make_phantom_communicator(Backend& backend, int rank, int size);

// P ranks as threads of this process sharing host memory (the demo and in-process tests). Element i of
// the result is rank i's communicator; each must be used from its own thread.
// At most kMaxThreadRanks (each thread rank has its own BLAS calls and buffers; more ranks take mpirun).
inline constexpr int kMaxThreadRanks = 64;
std::vector<std::unique_ptr<Communicator>> make_thread_group(int size);

enum class Phase { Forward, Backward };
const char* phase_name(Phase);

enum class CollectiveKind { AllGather, ReduceScatter, AllToAll, AllReduce, RingShift };
const char* collective_name(CollectiveKind);

// One collective call as counted. Bytes are the logical bytes that cross between distinct ranks
// (independent of the algorithm): all_gather and reduce_scatter send and receive (P-1) * chunk;
// all_to_all sends and receives (P-1) * chunk; all_reduce is counted as reduce_scatter + all_gather;
// ring_shift sends and receives one chunk (none at P = 1, where it is a copy).
struct CollectiveRecord {
  Phase phase = Phase::Forward;
  CollectiveKind kind = CollectiveKind::AllGather;
  std::string tensor;  // what was exchanged, e.g. "q", "kv_latent", "o"
  std::size_t bytes_sent = 0;
  std::size_t bytes_received = 0;
  int calls = 1;
  // Time in these calls, on the backend's queue (device events on the GPU), when the block timed them
  // (MlaBlock does); 0 otherwise. Bus bandwidth = bytes_sent / seconds (NCCL's busbw for all-gather,
  // reduce-scatter and all-to-all, whose bytes_sent is already (P-1)/P of the buffer).
  double seconds = 0;
};

std::size_t collective_bytes_sent(CollectiveKind, std::size_t chunk_bytes, int ranks);

// Wraps any communicator and records every call under the label set with label().
class CountingCommunicator final : public Communicator {
 public:
  explicit CountingCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  const char* name() const override { return inner_.name(); }
  bool performs_traffic() const override { return inner_.performs_traffic(); }

  void label(Phase phase, std::string tensor) {
    phase_ = phase;
    tensor_ = std::move(tensor);
  }
  void all_gather(const void* send, void* recv, std::size_t count, DType) override;
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType) override;
  void all_to_all(const void* send, void* recv, std::size_t count, DType) override;
  void all_reduce(void* buf, std::size_t count, DType) override;
  void ring_shift(const void* send, void* recv, std::size_t count, DType) override;
  CollectiveRequest start_all_gather(const void* send, void* recv, std::size_t count, DType) override;
  CollectiveRequest start_reduce_scatter(const void* send, void* recv, std::size_t count, DType) override;
  CollectiveRequest start_all_to_all(const void* send, void* recv, std::size_t count, DType) override;
  CollectiveRequest start_ring_shift(const void* send, void* recv, std::size_t count, DType) override;
  void barrier() override { inner_.barrier(); }

  // Calls with the same (phase, kind, tensor) are merged, in order of first appearance.
  const std::vector<CollectiveRecord>& records() const { return records_; }
  // The record the last call was counted in (-1 before any call), and time added to a record.
  int last_record() const { return last_; }
  void add_seconds(int record, double seconds) { records_.at(std::size_t(record)).seconds += seconds; }
  std::size_t total_sent(Phase) const;
  std::size_t total_received(Phase) const;
  void clear() {
    records_.clear();
    last_ = -1;
  }

 private:
  void record(CollectiveKind kind, std::size_t chunk_bytes);
  Communicator& inner_;
  Phase phase_ = Phase::Forward;
  std::string tensor_ = "unlabelled";
  std::vector<CollectiveRecord> records_;
  int last_ = -1;
};

}  // namespace laga
