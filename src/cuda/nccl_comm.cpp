// NCCL communicator for device buffers, one rank per GPU: the only translation unit of the library that
// includes nccl.h. Bootstrapped over any host communicator (MPI in the CLI): rank 0 makes the unique id and
// every rank receives it through an all_gather of host bytes, so no MPI call is made here.
//
// Every collective is queued on the communicator's own stream (one stream, so this rank's NCCL calls run
// in the order they were issued), after the work queued on the CUDA backend's stream; the blocking forms
// make the backend's stream wait for it at once, the start_* forms at CollectiveRequest::wait(), so compute
// queued in between runs under the collective. Nothing waits for the host except barrier(). Error policy as in mpi_comm.cpp: every NCCL and CUDA call goes through a
// check macro that throws RuntimeError naming the call, file:line and NCCL's own message; the caller
// decides what to do (the CLI ends every rank, since the others may be inside a collective).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/stream_order.hpp"
#include "laga/backend.hpp"
#include "laga/comm.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/nccl_comm.hpp"

#define LAGA_NCCL_CHECK(call)                                                                                \
  do {                                                                                                       \
    const ncclResult_t laga_nccl_rc_ = (call);                                                               \
    if (laga_nccl_rc_ != ncclSuccess) {                                                                      \
      const char* laga_nccl_last_ = ncclGetLastError(nullptr);                                               \
      throw ::laga::RuntimeError(::laga::detail::concat(                                                     \
          #call, " failed at ", __FILE__, ":", __LINE__, ": ", ncclGetErrorString(laga_nccl_rc_),            \
          " (ncclResult_t ", int(laga_nccl_rc_), ")",                                                        \
          laga_nccl_last_ && *laga_nccl_last_ ? ::laga::detail::concat("; last NCCL error: ", laga_nccl_last_) \
                                              : std::string()));                                             \
    }                                                                                                        \
  } while (0)

namespace laga {
namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::BF16: return ncclBfloat16;
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
  }
  throw InvalidArgument("NCCL communicator: unknown dtype");
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}
const char* at(const void* p, std::size_t bytes) { return static_cast<const char*>(p) + bytes; }
char* at(void* p, std::size_t bytes) { return static_cast<char*>(p) + bytes; }

// The unique id travels as whole doubles through Communicator::all_gather (bitwise copies on every
// communicator over host memory).
constexpr std::size_t kIdDoubles = (sizeof(ncclUniqueId) + sizeof(double) - 1) / sizeof(double);

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& bootstrap, Backend& backend)
      : bootstrap_(bootstrap),
        device_(cuda_device_of(backend)),
        stream_(static_cast<cudaStream_t>(cuda_stream(backend))),
        rank_(bootstrap.rank()),
        size_(bootstrap.size()) {
    LAGA_REQUIRE(bootstrap.performs_traffic(), "NCCL bootstrap over communicator '", bootstrap.name(),
                 "': it must perform traffic (a phantom cannot carry the unique id)");
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) LAGA_NCCL_CHECK(ncclGetUniqueId(&id));
    std::vector<double> mine(kIdDoubles, 0.0), all(kIdDoubles * static_cast<std::size_t>(size_), 0.0);
    std::memcpy(mine.data(), &id, sizeof id);
    bootstrap_.all_gather(mine.data(), all.data(), kIdDoubles, DType::F64);
    std::memcpy(&id, all.data(), sizeof id);  // rank 0's chunk
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    comm_stream_ = cuda_detail::make_comm_stream();
    LAGA_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
  }

  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (comm_) {
      // Unwinding an exception: peers may never reach their matching calls, so do not wait for them.
      if (std::uncaught_exceptions() > 0) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
      } else {
        cudaStreamSynchronize(stream_);
        cudaStreamSynchronize(comm_stream_);
        ncclCommDestroy(comm_);  // a destructor must not throw; errors here are ignored
      }
    }
    if (comm_stream_ && !std::uncaught_exceptions()) cudaStreamDestroy(comm_stream_);
  }
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "nccl"; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    start_all_gather(send, recv, count, dtype).wait();
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) override {
    start_reduce_scatter(send, recv, count, dtype).wait();
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override {
    start_all_to_all(send, recv, count, dtype).wait();
  }

  // In place when send is this rank's chunk of recv (as NCCL defines it); any other overlap is refused.
  CollectiveRequest start_all_gather(const void* send, void* recv, std::size_t count, DType dtype) override {
    if (count == 0) return {};
    const std::size_t chunk = count * dtype_size(dtype);
    const bool in_place = send == at(recv, static_cast<std::size_t>(rank_) * chunk);
    LAGA_CHECK(in_place || !overlaps(send, chunk, recv, chunk * size_),
               "all_gather: send overlaps recv without being this rank's chunk of it");
    const cudaStream_t cs = begin();
    LAGA_NCCL_CHECK(ncclAllGather(send, recv, count, nccl_type(dtype), comm_, cs));
    return end();
  }

  // In place when recv is this rank's chunk of send (as NCCL defines it); any other overlap is refused.
  CollectiveRequest start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dtype) override {
    if (count == 0) return {};
    const std::size_t chunk = count * dtype_size(dtype);
    const bool in_place = recv == at(send, static_cast<std::size_t>(rank_) * chunk);
    LAGA_CHECK(in_place || !overlaps(send, chunk * size_, recv, chunk), "reduce_scatter: send and recv overlap");
    const cudaStream_t cs = begin();
    LAGA_NCCL_CHECK(ncclReduceScatter(send, recv, count, nccl_type(dtype), ncclSum, comm_, cs));
    return end();
  }

  // A group of P sends and P receives (the chunk to and from this rank included). In place (send == recv)
  // goes through a temporary device copy of send; any other overlap is refused.
  CollectiveRequest start_all_to_all(const void* send, void* recv, std::size_t count, DType dtype) override {
    if (count == 0) return {};
    const std::size_t chunk = count * dtype_size(dtype);
    const std::size_t total = chunk * static_cast<std::size_t>(size_);
    const bool in_place = send == recv;
    LAGA_CHECK(in_place || !overlaps(send, total, recv, total),
               "all_to_all: send and recv overlap without being the same buffer");
    const cudaStream_t cs = begin();
    void* copy = nullptr;
    if (in_place) {
      LAGA_CUDA_CHECK(cudaMallocAsync(&copy, total, cs));
      LAGA_CUDA_CHECK(cudaMemcpyAsync(copy, send, total, cudaMemcpyDeviceToDevice, cs));
      send = copy;
    }
    const ncclDataType_t type = nccl_type(dtype);
    LAGA_NCCL_CHECK(ncclGroupStart());
    for (int p = 0; p < size_; ++p) {
      const std::size_t off = static_cast<std::size_t>(p) * chunk;
      LAGA_NCCL_CHECK(ncclSend(at(send, off), count, type, p, comm_, cs));
      LAGA_NCCL_CHECK(ncclRecv(at(recv, off), count, type, p, comm_, cs));
    }
    LAGA_NCCL_CHECK(ncclGroupEnd());
    if (copy) LAGA_CUDA_CHECK(cudaFreeAsync(copy, cs));
    return end();
  }

  void ring_shift(const void* send, void* recv, std::size_t count, DType dtype) override {
    start_ring_shift(send, recv, count, dtype).wait();
  }
  // A group of one ncclSend to the successor and one ncclRecv from the predecessor (a device copy at P = 1).
  CollectiveRequest start_ring_shift(const void* send, void* recv, std::size_t count, DType dtype) override {
    if (count == 0) return {};
    const std::size_t bytes = count * dtype_size(dtype);
    LAGA_CHECK(!overlaps(send, bytes, recv, bytes), "ring_shift: send and recv overlap");
    const cudaStream_t cs = begin();
    if (size_ == 1) {
      LAGA_CUDA_CHECK(cudaMemcpyAsync(recv, send, bytes, cudaMemcpyDeviceToDevice, cs));
      return end();
    }
    const ncclDataType_t type = nccl_type(dtype);
    LAGA_NCCL_CHECK(ncclGroupStart());
    LAGA_NCCL_CHECK(ncclSend(send, count, type, (rank_ + 1) % size_, comm_, cs));
    LAGA_NCCL_CHECK(ncclRecv(recv, count, type, (rank_ - 1 + size_) % size_, comm_, cs));
    LAGA_NCCL_CHECK(ncclGroupEnd());
    return end();
  }

  void all_reduce(void* buf, std::size_t count, DType dtype) override {
    if (count == 0) return;
    const cudaStream_t cs = begin();
    LAGA_NCCL_CHECK(ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, comm_, cs));
    end().wait();
  }

  // Waits for this rank's queued work, reports an asynchronous NCCL error if one occurred, then meets the
  // other ranks on the bootstrap communicator.
  void barrier() override {
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    LAGA_CUDA_CHECK(cudaStreamSynchronize(stream_));
    LAGA_CUDA_CHECK(cudaStreamSynchronize(comm_stream_));
    ncclResult_t async = ncclSuccess;
    LAGA_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    LAGA_NCCL_CHECK(async);
    bootstrap_.barrier();
  }

 private:
  // The communication stream, ordered after the backend's stream's work so far.
  cudaStream_t begin() {
    LAGA_CUDA_CHECK(cudaSetDevice(device_));
    cuda_detail::order_after(comm_stream_, stream_);
    return comm_stream_;
  }
  // The request the backend's stream waits on for what was just queued.
  CollectiveRequest end() {
    return CollectiveRequest(std::make_unique<cuda_detail::StreamWait>(device_, stream_, comm_stream_));
  }

  Communicator& bootstrap_;
  int device_;
  cudaStream_t stream_;
  cudaStream_t comm_stream_ = nullptr;
  int rank_;
  int size_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, Backend& cuda_backend) {
  return std::make_unique<NcclCommunicator>(bootstrap, cuda_backend);
}

}  // namespace laga
