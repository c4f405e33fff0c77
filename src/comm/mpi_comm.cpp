// MPI communicator for host buffers: the only translation unit of the library that includes mpi.h.
//
// Error policy: the duplicated communicator and MPI_COMM_WORLD use MPI_ERRORS_RETURN, and every MPI call
// goes through LAGA_MPI_CHECK, which throws laga::RuntimeError naming the call, the source location and
// MPI's own message. The caller decides what to do (normally MpiSession::abort, since the other ranks
// may already be inside a collective).
//
// Counts above INT_MAX: MPI's count arguments are int. Such collectives are SPLIT, not refused:
//   all_gather / all_to_all: pieces of at most INT_MAX elements per rank chunk, each described by a
//     contiguous datatype resized to the extent of a whole chunk, so the rank-p slice lands in chunk p;
//   all_reduce: consecutive pieces of the buffer, each reduced in place;
//   reduce_scatter: per piece, one MPI_Reduce per root rank (MPI_SUM is only defined on predefined
//     datatypes, so the resized-datatype trick is not available for the reductions).
// The common case (count <= INT_MAX) is always the single plain MPI call.
// The deprecated MPI C++ bindings are not used (and warn under -Wextra).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <exception>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "laga/comm.hpp"
#include "laga/errors.hpp"
#include "laga/mpi_comm.hpp"

namespace laga {

namespace {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "unknown MPI error";
  return std::string(text, static_cast<std::size_t>(len));
}

}  // namespace

}  // namespace laga

#define LAGA_MPI_CHECK(call)                                                                   \
  do {                                                                                         \
    const int laga_mpi_rc_ = (call);                                                           \
    if (laga_mpi_rc_ != MPI_SUCCESS)                                                           \
      throw ::laga::RuntimeError(::laga::detail::concat(#call, " failed at ", __FILE__, ":",  \
                                                        __LINE__, ": ", ::laga::mpi_error_string(laga_mpi_rc_), \
                                                        " (error code ", laga_mpi_rc_, ")"));  \
  } while (0)

namespace laga {

// ---- MpiSession ----

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  LAGA_MPI_CHECK(MPI_Initialized(&initialized));
  if (!initialized) {
    int finalized = 0;
    LAGA_MPI_CHECK(MPI_Finalized(&finalized));
    if (finalized) throw RuntimeError("MpiSession: MPI was already finalized; it cannot be initialised again");
    // Only the main thread calls MPI (BLAS threads never do), so FUNNELED is enough.
    int provided = 0;
    LAGA_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    owns_ = true;
  }
  // Errors come back as codes (and become exceptions) instead of killing the job without a message.
  LAGA_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

MpiSession::~MpiSession() {
  if (!owns_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // Unwinding an exception: other ranks may be inside a collective, and MPI_Finalize would wait for them
  // forever. End the whole job instead.
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (std::uncaught_exceptions() > 0 && size > 1) MPI_Abort(MPI_COMM_WORLD, 3);
  MPI_Finalize();  // a destructor must not throw; errors here are ignored
}

int MpiSession::rank() const {
  int r = 0;
  LAGA_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &r));
  return r;
}

int MpiSession::size() const {
  int s = 0;
  LAGA_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &s));
  return s;
}

void MpiSession::abort(int code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort should not return; without MPI there is only this process to end
}

bool mpi_all_ok(bool ok) {
  int flag = ok ? 1 : 0;
  LAGA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD));
  return flag != 0;
}

MpiNodeInfo mpi_node_info() {
  MPI_Comm node = MPI_COMM_NULL;
  LAGA_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  MpiNodeInfo info;
  const int rank_rc = MPI_Comm_rank(node, &info.local_rank);
  const int size_rc = MPI_Comm_size(node, &info.local_size);
  MPI_Comm_free(&node);
  LAGA_MPI_CHECK(rank_rc);
  LAGA_MPI_CHECK(size_rc);
  return info;
}

// ---- the communicator ----

namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16:
      throw InvalidArgument(
          "MPI communicator: dtype bf16 is not supported (MPI has no bfloat16 type and host ranks compute "
          "in f32 or f64); use f32 or f64");
  }
  throw InvalidArgument("MPI communicator: unknown dtype");
}

// A committed datatype freed on scope exit.
class TypeGuard {
 public:
  TypeGuard() = default;
  TypeGuard(const TypeGuard&) = delete;
  TypeGuard& operator=(const TypeGuard&) = delete;
  ~TypeGuard() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  MPI_Datatype* out() { return &type_; }
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// `elements` consecutive `base` elements whose extent is `extent_bytes`: one rank's slice of a chunked
// buffer, so that rank p's slice is placed p * extent_bytes further on.
void make_slice_type(TypeGuard& out, MPI_Datatype base, int elements, std::size_t extent_bytes) {
  TypeGuard contiguous;
  LAGA_MPI_CHECK(MPI_Type_contiguous(elements, base, contiguous.out()));
  LAGA_MPI_CHECK(MPI_Type_create_resized(contiguous.get(), 0, static_cast<MPI_Aint>(extent_bytes), out.out()));
  LAGA_MPI_CHECK(MPI_Type_commit(out.out()));
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

const char* at(const void* p, std::size_t bytes) { return static_cast<const char*>(p) + bytes; }
char* at(void* p, std::size_t bytes) { return static_cast<char*>(p) + bytes; }

// A nonblocking collective: wait() is MPI_Wait. Not waited for, it is left to complete (MPI forbids freeing
// or cancelling the request of a nonblocking collective).
class MpiRequest final : public CollectiveRequest::Pending {
 public:
  MpiRequest() = default;
  MPI_Request* out() { return &request_; }
  void wait() override { LAGA_MPI_CHECK(MPI_Wait(&request_, MPI_STATUS_IGNORE)); }

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
};

// Point-to-point requests (a ring shift's receive and send): wait() is MPI_Waitall.
class MpiRequests final : public CollectiveRequest::Pending {
 public:
  MPI_Request* out(int i) { return &requests_[i]; }
  void wait() override { LAGA_MPI_CHECK(MPI_Waitall(2, requests_, MPI_STATUSES_IGNORE)); }

 private:
  MPI_Request requests_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
};

// The tag of ring shifts (MPI orders messages of one tag between two ranks, so shifts in flight at once
// match in the order they were started).
constexpr int kRingTag = 7;

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::size_t max_count) : max_count_(max_count) {
    LAGA_CHECK(max_count_ >= 1 && max_count_ <= static_cast<std::size_t>(INT_MAX), "max_count = ", max_count_);
    int initialized = 0;
    LAGA_MPI_CHECK(MPI_Initialized(&initialized));
    if (!initialized) throw RuntimeError("make_mpi_communicator: MPI is not initialised (create an MpiSession first)");
    LAGA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    LAGA_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    LAGA_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    LAGA_MPI_CHECK(MPI_Comm_size(comm_, &size_));
  }
  ~MpiCommunicator() override {
    // Freeing after MPI_Finalize is erroneous: a communicator that outlives the session just leaks.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
  }
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  // In place when send is this rank's chunk of recv (MPI_IN_PLACE); any other overlap is refused.
  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t elem = dtype_size(dtype);
    const std::size_t chunk = count * elem;
    const bool in_place = send == at(recv, static_cast<std::size_t>(rank_) * chunk);
    LAGA_CHECK(in_place || !overlaps(send, chunk, recv, chunk * size_),
               "all_gather: send overlaps recv without being this rank's chunk of it");
    if (count <= max_count_) {
      LAGA_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), type, recv,
                                   static_cast<int>(count), type, comm_));
      return;
    }
    for (std::size_t off = 0; off < count; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, count - off));
      TypeGuard slice;
      make_slice_type(slice, type, n, chunk);
      LAGA_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : at(send, off * elem), n, type, at(recv, off * elem),
                                   1, slice.get(), comm_));
    }
  }

  // send and recv must not overlap (MPI forbids it and recv is written while send is read).
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t elem = dtype_size(dtype);
    const std::size_t chunk = count * elem;
    LAGA_CHECK(!overlaps(send, chunk * size_, recv, chunk), "reduce_scatter: send and recv overlap");
    // The nonblocking form, waited for: the same reduction algorithm (and so the same bits at any P) as
    // start_reduce_scatter; MPI_Reduce_scatter_block may sum in another order than MPI_Ireduce_scatter_block.
    if (count <= max_count_) {
      start_reduce_scatter(send, recv, count, dtype).wait();
      return;
    }
    for (std::size_t off = 0; off < count; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, count - off));
      for (int root = 0; root < size_; ++root) {
        LAGA_MPI_CHECK(MPI_Reduce(at(send, static_cast<std::size_t>(root) * chunk + off * elem),
                                  root == rank_ ? at(recv, off * elem) : nullptr, n, type, MPI_SUM, root, comm_));
      }
    }
  }

  // In place when send == recv (MPI_IN_PLACE); any other overlap is refused.
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t elem = dtype_size(dtype);
    const std::size_t chunk = count * elem;
    const bool in_place = send == recv && count > 0;
    LAGA_CHECK(in_place || !overlaps(send, chunk * size_, recv, chunk * size_),
               "all_to_all: send and recv overlap without being the same buffer");
    if (count <= max_count_) {
      LAGA_MPI_CHECK(MPI_Alltoall(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), type, recv,
                                  static_cast<int>(count), type, comm_));
      return;
    }
    for (std::size_t off = 0; off < count; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, count - off));
      TypeGuard slice;
      make_slice_type(slice, type, n, chunk);
      LAGA_MPI_CHECK(MPI_Alltoall(in_place ? MPI_IN_PLACE : at(send, off * elem), 1, slice.get(),
                                  at(recv, off * elem), 1, slice.get(), comm_));
    }
  }

  void all_reduce(void* buf, std::size_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t elem = dtype_size(dtype);
    if (count <= max_count_) {
      LAGA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(count), type, MPI_SUM, comm_));
      return;
    }
    for (std::size_t off = 0; off < count; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, count - off));
      LAGA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, at(buf, off * elem), n, type, MPI_SUM, comm_));
    }
  }

  // Nonblocking (MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ialltoall) for counts up to max_count, with
  // the same buffer rules as the blocking forms; larger counts run the blocking split form.
  CollectiveRequest start_all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t chunk = count * dtype_size(dtype);
    const bool in_place = send == at(recv, static_cast<std::size_t>(rank_) * chunk);
    LAGA_CHECK(in_place || !overlaps(send, chunk, recv, chunk * size_),
               "all_gather: send overlaps recv without being this rank's chunk of it");
    if (count > max_count_) return Communicator::start_all_gather(send, recv, count, dtype);
    auto req = std::make_unique<MpiRequest>();
    LAGA_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), type, recv,
                                  static_cast<int>(count), type, comm_, req->out()));
    return CollectiveRequest(std::move(req));
  }
  CollectiveRequest start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t chunk = count * dtype_size(dtype);
    LAGA_CHECK(!overlaps(send, chunk * size_, recv, chunk), "reduce_scatter: send and recv overlap");
    if (count > max_count_) return Communicator::start_reduce_scatter(send, recv, count, dtype);
    auto req = std::make_unique<MpiRequest>();
    LAGA_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), type, MPI_SUM, comm_, req->out()));
    return CollectiveRequest(std::move(req));
  }
  CollectiveRequest start_all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t chunk = count * dtype_size(dtype);
    const bool in_place = send == recv && count > 0;
    LAGA_CHECK(in_place || !overlaps(send, chunk * size_, recv, chunk * size_),
               "all_to_all: send and recv overlap without being the same buffer");
    if (count > max_count_) return Communicator::start_all_to_all(send, recv, count, dtype);
    auto req = std::make_unique<MpiRequest>();
    LAGA_MPI_CHECK(MPI_Ialltoall(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), type, recv,
                                 static_cast<int>(count), type, comm_, req->out()));
    return CollectiveRequest(std::move(req));
  }

  // MPI_Sendrecv to the successor from the predecessor; counts above max_count go in pieces.
  void ring_shift(const void* send, void* recv, std::size_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t elem = dtype_size(dtype);
    LAGA_CHECK(!overlaps(send, count * elem, recv, count * elem), "ring_shift: send and recv overlap");
    const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
    for (std::size_t off = 0; off < count; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, count - off));
      LAGA_MPI_CHECK(MPI_Sendrecv(at(send, off * elem), n, type, next, kRingTag, at(recv, off * elem), n, type, prev,
                                  kRingTag, comm_, MPI_STATUS_IGNORE));
    }
  }
  // MPI_Irecv from the predecessor and MPI_Isend to the successor; larger counts run the blocking form.
  CollectiveRequest start_ring_shift(const void* send, void* recv, std::size_t count, DType dtype) override {
    const MPI_Datatype type = mpi_type(dtype);
    const std::size_t elem = dtype_size(dtype);
    LAGA_CHECK(!overlaps(send, count * elem, recv, count * elem), "ring_shift: send and recv overlap");
    if (count > max_count_) return Communicator::start_ring_shift(send, recv, count, dtype);
    const int next = (rank_ + 1) % size_, prev = (rank_ - 1 + size_) % size_;
    auto req = std::make_unique<MpiRequests>();
    LAGA_MPI_CHECK(MPI_Irecv(recv, static_cast<int>(count), type, prev, kRingTag, comm_, req->out(0)));
    LAGA_MPI_CHECK(MPI_Isend(send, static_cast<int>(count), type, next, kRingTag, comm_, req->out(1)));
    return CollectiveRequest(std::move(req));
  }

  void barrier() override { LAGA_MPI_CHECK(MPI_Barrier(comm_)); }

 private:
  std::size_t max_count_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() {
  return std::make_unique<MpiCommunicator>(static_cast<std::size_t>(INT_MAX));
}

namespace detail {
// Test hook (declared in tests/mpi/test_mpi_comm.cpp): a communicator that splits every collective into
// pieces of at most `max_count` elements, so the INT_MAX path is exercised with small buffers.
std::unique_ptr<Communicator> make_mpi_communicator_split(std::size_t max_count) {
  return std::make_unique<MpiCommunicator>(max_count);
}
}  // namespace detail

}  // namespace laga
