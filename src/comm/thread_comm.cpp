// In-process ranks: P threads exchange host buffers directly. Each collective publishes the send pointers,
// waits, reads the peers' buffers, and waits again so no buffer is reused while a peer still reads it.
// A started collective (start_*) is performed when it is waited for, after the ones started before it, and
// before any later blocking collective: every rank issues the same sequence, so the ranks still meet in
// the same order, and a caller that read a result before waiting or changed a send buffer would see it.
#include <barrier>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "laga/comm.hpp"
#include "laga/errors.hpp"

namespace laga {
namespace {

struct Shared {
  explicit Shared(int size) : bar(size), send(size), recv(size) {}
  std::barrier<> bar;
  std::vector<const void*> send;
  std::vector<void*> recv;
};

template <typename T>
void sum_chunks(const std::vector<const void*>& srcs, std::size_t offset, std::size_t count, void* dst) {
  T* out = static_cast<T*>(dst);
  for (std::size_t i = 0; i < count; ++i) {
    T acc = 0;
    for (const void* s : srcs) acc += static_cast<const T*>(s)[offset + i];
    out[i] = acc;
  }
}

void sum_into(DType dt, const std::vector<const void*>& srcs, std::size_t offset, std::size_t count, void* dst) {
  switch (dt) {
    case DType::F32: sum_chunks<float>(srcs, offset, count, dst); return;
    case DType::F64: sum_chunks<double>(srcs, offset, count, dst); return;
    default: LAGA_REQUIRE(false, "dtype ", dtype_name(dt), ": the thread communicator sums float32 and float64 only");
  }
}

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Shared> shared, int rank) : sh_(std::move(shared)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return int(sh_->send.size()); }
  const char* name() const override { return "threads"; }

  void all_gather(const void* send, void* recv, std::size_t count, DType dt) override {
    flush();
    gather(send, recv, count, dt);
  }
  void reduce_scatter(const void* send, void* recv, std::size_t count, DType dt) override {
    flush();
    reduce(send, recv, count, dt);
  }
  void all_to_all(const void* send, void* recv, std::size_t count, DType dt) override {
    flush();
    exchange(send, recv, count, dt);
  }
  void ring_shift(const void* send, void* recv, std::size_t count, DType dt) override {
    flush();
    shift(send, recv, count, dt);
  }
  CollectiveRequest start_ring_shift(const void* send, void* recv, std::size_t count, DType dt) override {
    return defer(CollectiveKind::RingShift, send, recv, count, dt);
  }
  CollectiveRequest start_all_gather(const void* send, void* recv, std::size_t count, DType dt) override {
    return defer(CollectiveKind::AllGather, send, recv, count, dt);
  }
  CollectiveRequest start_reduce_scatter(const void* send, void* recv, std::size_t count, DType dt) override {
    return defer(CollectiveKind::ReduceScatter, send, recv, count, dt);
  }
  CollectiveRequest start_all_to_all(const void* send, void* recv, std::size_t count, DType dt) override {
    return defer(CollectiveKind::AllToAll, send, recv, count, dt);
  }

 private:
  struct Deferred {
    CollectiveKind kind;
    const void* send;
    void* recv;
    std::size_t count;
    DType dt;
    bool done = false;
  };
  class Pending final : public CollectiveRequest::Pending {
   public:
    Pending(ThreadCommunicator& comm, std::shared_ptr<Deferred> op) : comm_(comm), op_(std::move(op)) {}
    void wait() override {
      while (!op_->done) comm_.run_next();
    }

   private:
    ThreadCommunicator& comm_;
    std::shared_ptr<Deferred> op_;
  };
  CollectiveRequest defer(CollectiveKind kind, const void* send, void* recv, std::size_t count, DType dt) {
    queue_.push_back(std::make_shared<Deferred>(Deferred{kind, send, recv, count, dt}));
    return CollectiveRequest(std::make_unique<Pending>(*this, queue_.back()));
  }
  void run_next() {
    std::shared_ptr<Deferred> op = queue_.front();
    queue_.pop_front();
    switch (op->kind) {
      case CollectiveKind::AllGather: gather(op->send, op->recv, op->count, op->dt); break;
      case CollectiveKind::ReduceScatter: reduce(op->send, op->recv, op->count, op->dt); break;
      case CollectiveKind::AllToAll: exchange(op->send, op->recv, op->count, op->dt); break;
      case CollectiveKind::RingShift: shift(op->send, op->recv, op->count, op->dt); break;
      case CollectiveKind::AllReduce: LAGA_CHECK(false, "all_reduce is never deferred");
    }
    op->done = true;
  }
  void flush() {
    while (!queue_.empty()) run_next();
  }

  void gather(const void* send, void* recv, std::size_t count, DType dt) {
    const std::size_t bytes = count * dtype_size(dt);
    publish(send);
    if (recv)
      for (int p = 0; p < size(); ++p)
        if (sh_->send[p]) std::memcpy(static_cast<char*>(recv) + p * bytes, sh_->send[p], bytes);
    sh_->bar.arrive_and_wait();
  }
  void reduce(const void* send, void* recv, std::size_t count, DType dt) {
    publish(send);
    if (recv) sum_into(dt, sh_->send, std::size_t(rank_) * count, count, recv);
    sh_->bar.arrive_and_wait();
  }
  void exchange(const void* send, void* recv, std::size_t count, DType dt) {
    const std::size_t bytes = count * dtype_size(dt);
    publish(send);
    if (recv)
      for (int p = 0; p < size(); ++p)
        if (sh_->send[p])
          std::memcpy(static_cast<char*>(recv) + p * bytes, static_cast<const char*>(sh_->send[p]) + rank_ * bytes, bytes);
    sh_->bar.arrive_and_wait();
  }
  void shift(const void* send, void* recv, std::size_t count, DType dt) {
    publish(send);
    const void* from = sh_->send[(rank_ - 1 + size()) % size()];
    if (recv && from) std::memcpy(recv, from, count * dtype_size(dt));
    sh_->bar.arrive_and_wait();
  }

 public:
  void all_reduce(void* buf, std::size_t count, DType dt) override {
    flush();
    std::vector<char> sum(count * dtype_size(dt));
    publish(buf);
    if (buf) sum_into(dt, sh_->send, 0, count, sum.data());
    sh_->bar.arrive_and_wait();  // every rank has read every buffer before any is overwritten
    if (buf) std::memcpy(buf, sum.data(), sum.size());
  }
  void barrier() override {
    flush();
    sh_->bar.arrive_and_wait();
  }

 private:
  void publish(const void* send) {
    sh_->send[rank_] = send;
    sh_->bar.arrive_and_wait();
  }
  std::shared_ptr<Shared> sh_;
  int rank_;
  std::deque<std::shared_ptr<Deferred>> queue_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_thread_group(int size) {
  LAGA_REQUIRE(size >= 1 && size <= kMaxThreadRanks, "thread group size = ", size, ": must be in [1, ", kMaxThreadRanks,
               "] (more ranks take one process each, under mpirun)");
  auto shared = std::make_shared<Shared>(size);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<ThreadCommunicator>(shared, r));
  return out;
}

}  // namespace laga
