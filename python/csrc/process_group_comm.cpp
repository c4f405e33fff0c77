#include "process_group_comm.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "laga/errors.hpp"
#include "torch_memory.hpp"

namespace laga_torch {
namespace {

class ProcessGroupCommunicator final : public laga::Communicator {
 public:
  ProcessGroupCommunicator(c10::intrusive_ptr<c10d::ProcessGroup> pg, c10::Device device)
      : pg_(std::move(pg)), device_(device) {}
  int rank() const override { return pg_->getRank(); }
  int size() const override { return pg_->getSize(); }
  const char* name() const override { return "torch.distributed"; }

  void all_gather(const void* send, void* recv, std::size_t count, laga::DType dt) override {
    at::Tensor in = view(send, count, dt), out = view(recv, count * size(), dt);
    pg_->_allgather_base(out, in)->wait();
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, laga::DType dt) override {
    at::Tensor in = view(send, count * size(), dt), out = view(recv, count, dt);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    pg_->_reduce_scatter_base(out, in, opts)->wait();
  }
  void all_to_all(const void* send, void* recv, std::size_t count, laga::DType dt) override {
    at::Tensor in = view(send, count * size(), dt), out = view(recv, count * size(), dt);
    std::vector<int64_t> even;  // empty split sizes: equal chunks
    pg_->alltoall_base(out, in, even, even)->wait();
  }
  void all_reduce(void* buf, std::size_t count, laga::DType dt) override {
    std::vector<at::Tensor> t{view(buf, count, dt)};
    pg_->allreduce(t)->wait();
  }
  // send to the successor, recv from the predecessor (batch_isend_irecv's pair): coalesced into one NCCL group
  // on the GPU (two ranks sending to each other would otherwise wait on each other), plain on gloo.
  void ring_shift(const void* send, void* recv, std::size_t count, laga::DType dt) override {
    if (count == 0) return;
    const int P = size(), r = rank();
    if (P == 1) {
      view(recv, count, dt).copy_(view(send, count, dt));
      return;
    }
    std::vector<at::Tensor> out{view(send, count, dt)}, in{view(recv, count, dt)};
    constexpr int kTag = 0;
    if (device_.is_cuda()) {
      pg_->startCoalescing(c10::DeviceType::CUDA);
      pg_->send(out, (r + 1) % P, kTag);
      pg_->recv(in, (r - 1 + P) % P, kTag);
      pg_->endCoalescing(c10::DeviceType::CUDA)->wait();
      return;
    }
    c10::intrusive_ptr<c10d::Work> sent = pg_->send(out, (r + 1) % P, kTag);
    c10::intrusive_ptr<c10d::Work> received = pg_->recv(in, (r - 1 + P) % P, kTag);
    received->wait();
    sent->wait();
  }
  void barrier() override { pg_->barrier()->wait(); }

 private:
  at::Tensor view(const void* p, std::size_t count, laga::DType dt) const {
    return at::from_blob(const_cast<void*>(p), {static_cast<int64_t>(count)},
                         at::TensorOptions().dtype(to_torch(dt)).device(device_));
  }
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  c10::Device device_;
};

}  // namespace

std::unique_ptr<laga::Communicator> make_process_group_communicator(const std::string& group_name,
                                                                    c10::Device device) {
  c10::intrusive_ptr<c10d::ProcessGroup> pg = c10d::resolve_process_group(group_name);
  LAGA_REQUIRE(pg, "process group '", group_name, "' is not registered");
  return std::make_unique<ProcessGroupCommunicator>(std::move(pg), device);
}

}  // namespace laga_torch
