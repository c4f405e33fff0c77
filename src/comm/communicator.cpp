// The backend-agnostic communicators (single rank, phantom ranks) and the counting wrapper.
// Every data movement goes through Backend::copy so the same code serves host, CUDA and meta buffers.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "laga/backend.hpp"
#include "laga/comm.hpp"
#include "laga/errors.hpp"

namespace laga {

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
  }
  return "unknown";
}

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllToAll: return "all_to_all";
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::RingShift: return "ring_shift";
  }
  return "unknown";
}

// For all_gather, reduce_scatter and all_to_all `chunk_bytes` is one rank chunk (count * dtype size).
// For all_reduce it is the whole buffer (the count passed to all_reduce), counted as a reduce_scatter
// plus an all_gather of chunk n / P each: 2 * (P - 1) * n / P (multiplied first so that a buffer not
// divisible by P is rounded down once, not per chunk).
std::size_t collective_bytes_sent(CollectiveKind kind, std::size_t chunk_bytes, int ranks) {
  LAGA_REQUIRE(ranks >= 1, "ranks = ", ranks, ": must be >= 1");
  const std::size_t others = static_cast<std::size_t>(ranks - 1);
  switch (kind) {
    case CollectiveKind::AllGather:
    case CollectiveKind::ReduceScatter:
    case CollectiveKind::AllToAll:
      return others * chunk_bytes;
    case CollectiveKind::AllReduce:
      return 2 * others * chunk_bytes / static_cast<std::size_t>(ranks);
    case CollectiveKind::RingShift:
      return others > 0 ? chunk_bytes : 0;
  }
  throw RuntimeError(detail::concat("collective_bytes_sent: unknown collective kind ", static_cast<int>(kind)));
}

// ---- CountingCommunicator ----

void CountingCommunicator::record(CollectiveKind kind, std::size_t chunk_bytes) {
  // Every formula is symmetric (each rank receives what it sends), so received == sent.
  const std::size_t bytes = collective_bytes_sent(kind, chunk_bytes, inner_.size());
  for (std::size_t i = 0; i < records_.size(); ++i) {
    CollectiveRecord& r = records_[i];
    if (r.phase == phase_ && r.kind == kind && r.tensor == tensor_) {
      r.bytes_sent += bytes;
      r.bytes_received += bytes;
      ++r.calls;
      last_ = int(i);
      return;
    }
  }
  CollectiveRecord r;
  r.phase = phase_;
  r.kind = kind;
  r.tensor = tensor_;
  r.bytes_sent = bytes;
  r.bytes_received = bytes;
  r.calls = 1;
  records_.push_back(std::move(r));
  last_ = int(records_.size()) - 1;
}

// Record after the inner call so a call that throws is not counted.
void CountingCommunicator::all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
  inner_.all_gather(send, recv, count, dtype);
  record(CollectiveKind::AllGather, count * dtype_size(dtype));
}

void CountingCommunicator::reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) {
  inner_.reduce_scatter(send, recv, count, dtype);
  record(CollectiveKind::ReduceScatter, count * dtype_size(dtype));
}

void CountingCommunicator::all_to_all(const void* send, void* recv, std::size_t count, DType dtype) {
  inner_.all_to_all(send, recv, count, dtype);
  record(CollectiveKind::AllToAll, count * dtype_size(dtype));
}

void CountingCommunicator::all_reduce(void* buf, std::size_t count, DType dtype) {
  inner_.all_reduce(buf, count, dtype);
  record(CollectiveKind::AllReduce, count * dtype_size(dtype));
}

void CountingCommunicator::ring_shift(const void* send, void* recv, std::size_t count, DType dtype) {
  inner_.ring_shift(send, recv, count, dtype);
  record(CollectiveKind::RingShift, count * dtype_size(dtype));
}

CollectiveRequest CountingCommunicator::start_ring_shift(const void* send, void* recv, std::size_t count, DType dtype) {
  CollectiveRequest req = inner_.start_ring_shift(send, recv, count, dtype);
  record(CollectiveKind::RingShift, count * dtype_size(dtype));
  return req;
}

CollectiveRequest CountingCommunicator::start_all_gather(const void* send, void* recv, std::size_t count, DType dtype) {
  CollectiveRequest req = inner_.start_all_gather(send, recv, count, dtype);
  record(CollectiveKind::AllGather, count * dtype_size(dtype));
  return req;
}

CollectiveRequest CountingCommunicator::start_reduce_scatter(const void* send, void* recv, std::size_t count,
                                                             DType dtype) {
  CollectiveRequest req = inner_.start_reduce_scatter(send, recv, count, dtype);
  record(CollectiveKind::ReduceScatter, count * dtype_size(dtype));
  return req;
}

CollectiveRequest CountingCommunicator::start_all_to_all(const void* send, void* recv, std::size_t count, DType dtype) {
  CollectiveRequest req = inner_.start_all_to_all(send, recv, count, dtype);
  record(CollectiveKind::AllToAll, count * dtype_size(dtype));
  return req;
}

std::size_t CountingCommunicator::total_sent(Phase phase) const {
  std::size_t total = 0;
  for (const CollectiveRecord& r : records_)
    if (r.phase == phase) total += r.bytes_sent;
  return total;
}

std::size_t CountingCommunicator::total_received(Phase phase) const {
  std::size_t total = 0;
  for (const CollectiveRecord& r : records_)
    if (r.phase == phase) total += r.bytes_received;
  return total;
}

// ---- single rank and phantom ranks ----

namespace {

// Pointer `elements` elements past `p`; null stays null (meta buffers have no storage, and arithmetic
// on a null pointer is undefined behaviour).
const void* advance(const void* p, std::size_t elements, DType dtype) {
  return p ? static_cast<const char*>(p) + elements * dtype_size(dtype) : nullptr;
}
void* advance(void* p, std::size_t elements, DType dtype) {
  return p ? static_cast<char*>(p) + elements * dtype_size(dtype) : nullptr;
}

// dst[0..count) = src[0..count) on the backend's device. Skipped when it would copy onto itself
// (in-place use), which also covers the meta device where both pointers are null.
void device_copy(Backend& backend, const void* src, void* dst, std::size_t count, DType dtype) {
  if (count == 0 || src == dst) return;
  CopyArgs args;
  args.dtype = dtype;
  args.batch = 1;
  args.rows = 1;
  args.cols = static_cast<std::int64_t>(count);
  args.src = src;
  args.src_ld = static_cast<std::int64_t>(count);
  args.dst = dst;
  args.dst_ld = static_cast<std::int64_t>(count);
  args.mode = CopyMode::Assign;
  backend.copy(args);
}

class SingleRankCommunicator final : public Communicator {
 public:
  explicit SingleRankCommunicator(Backend& backend) : backend_(backend) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "single"; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    device_copy(backend_, send, recv, count, dtype);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) override {
    device_copy(backend_, send, recv, count, dtype);
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override {
    device_copy(backend_, send, recv, count, dtype);
  }
  void all_reduce(void*, std::size_t, DType) override {}  // the sum over one rank is the buffer
  void ring_shift(const void* send, void* recv, std::size_t count, DType dtype) override {
    device_copy(backend_, send, recv, count, dtype);
  }
  void barrier() override {}

 private:
  Backend& backend_;
};

class PhantomCommunicator final : public Communicator {
 public:
  PhantomCommunicator(Backend& backend, int rank, int size) : backend_(backend), rank_(rank), size_(size) {
    LAGA_REQUIRE(size >= 1, "phantom communicator size = ", size, ": must be >= 1");
    LAGA_REQUIRE(rank >= 0 && rank < size, "phantom communicator rank = ", rank, ": must be in [0, ",
                 size, ")");
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "phantom"; }
  bool performs_traffic() const override { return false; }

  // Every chunk of recv is this rank's send (deterministic and fully written). The chunk that aliases
  // send, if any (in-place gather), is skipped by device_copy; the others do not overlap send.
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    for (int p = 0; p < size_; ++p)
      device_copy(backend_, send, advance(recv, static_cast<std::size_t>(p) * count, dtype), count, dtype);
  }
  // As if the other ranks contributed zeros: recv = chunk `rank` of send.
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) override {
    device_copy(backend_, advance(send, static_cast<std::size_t>(rank_) * count, dtype), recv, count, dtype);
  }
  // recv chunk p = send chunk p for every p (as if every rank sent what this rank sends).
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override {
    for (int p = 0; p < size_; ++p) {
      const std::size_t offset = static_cast<std::size_t>(p) * count;
      device_copy(backend_, advance(send, offset, dtype), advance(recv, offset, dtype), count, dtype);
    }
  }
  void all_reduce(void*, std::size_t, DType) override {}  // the other ranks contribute zeros
  // As if the previous rank sent what this rank sends.
  void ring_shift(const void* send, void* recv, std::size_t count, DType dtype) override {
    device_copy(backend_, send, recv, count, dtype);
  }
  void barrier() override {}

 private:
  Backend& backend_;
  int rank_;
  int size_;
};

}  // namespace

std::unique_ptr<Communicator> make_single_rank_communicator(Backend& backend) {
  return std::make_unique<SingleRankCommunicator>(backend);
}

std::unique_ptr<Communicator> make_phantom_communicator(Backend& backend, int rank, int size) {
  return std::make_unique<PhantomCommunicator>(backend, rank, size);
}

}  // namespace laga
