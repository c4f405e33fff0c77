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
  ProcessGroupCommunicator(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, std::string group_name,
                           c10::Device device)
      : group_(pg), group_name_(std::move(group_name)), rank_(pg->getRank()), size_(pg->getSize()),
        device_(device) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "torch.distributed"; }

  void all_gather(const void* send, void* recv, std::size_t count, laga::DType dt) override {
    at::Tensor in = view(send, count, dt), out = view(recv, count * size(), dt);
    group()->_allgather_base(out, in)->wait();
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, laga::DType dt) override {
    at::Tensor in = view(send, count * size(), dt), out = view(recv, count, dt);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    group()->_reduce_scatter_base(out, in, opts)->wait();
  }
  void all_to_all(const void* send, void* recv, std::size_t count, laga::DType dt) override {
    at::Tensor in = view(send, count * size(), dt), out = view(recv, count * size(), dt);
    std::vector<int64_t> even;  // empty split sizes: equal chunks
    group()->alltoall_base(out, in, even, even)->wait();
  }
  void all_reduce(void* buf, std::size_t count, laga::DType dt) override {
    std::vector<at::Tensor> t{view(buf, count, dt)};
    group()->allreduce(t)->wait();
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
    const c10::intrusive_ptr<c10d::ProcessGroup> pg = group();
    if (device_.is_cuda()) {
      pg->startCoalescing(c10::DeviceType::CUDA);
      pg->send(out, (r + 1) % P, kTag);
      pg->recv(in, (r - 1 + P) % P, kTag);
      pg->endCoalescing(c10::DeviceType::CUDA)->wait();
      return;
    }
    c10::intrusive_ptr<c10d::Work> sent = pg->send(out, (r + 1) % P, kTag);
    c10::intrusive_ptr<c10d::Work> received = pg->recv(in, (r - 1 + P) % P, kTag);
    received->wait();
    sent->wait();
  }
  void barrier() override { group()->barrier()->wait(); }

 private:
  at::Tensor view(const void* p, std::size_t count, laga::DType dt) const {
    return at::from_blob(const_cast<void*>(p), {static_cast<int64_t>(count)},
                         at::TensorOptions().dtype(to_torch(dt)).device(device_));
  }
  // The group is the caller's: held weakly, so that its last reference is never laga's. Dropped by laga's
  // destructor (a module outliving destroy_process_group, freed at the interpreter's exit) with Python's lock
  // held, a gloo group's destructor joined gloo's threads while one of them waited for that lock to release a
  // finished collective's tensors: a hang. A collective after the group is gone is refused by name.
  c10::intrusive_ptr<c10d::ProcessGroup> group() const {
    c10::intrusive_ptr<c10d::ProcessGroup> pg = group_.lock();
    LAGA_REQUIRE(pg, "process group '", group_name_, "' was destroyed (torch.distributed.destroy_process_group) "
                 "while laga's block on it lives: make the module again on a live group");
    return pg;
  }
  c10::weak_intrusive_ptr<c10d::ProcessGroup> group_;
  std::string group_name_;
  int rank_, size_;
  c10::Device device_;
};

}  // namespace

std::unique_ptr<laga::Communicator> make_process_group_communicator(const std::string& group_name,
                                                                    c10::Device device) {
  c10::intrusive_ptr<c10d::ProcessGroup> pg = c10d::resolve_process_group(group_name);
  LAGA_REQUIRE(pg, "process group '", group_name, "' is not registered");
  return std::make_unique<ProcessGroupCommunicator>(pg, group_name, device);
}

}  // namespace laga_torch
