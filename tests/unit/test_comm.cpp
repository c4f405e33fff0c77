// Communicators that need no MPI: byte formulas, the counting wrapper, single-rank and phantom ranks.
// A local TestBackend (host strided copy only) keeps these tests independent of the CPU backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "laga/backend.hpp"
#include "laga/comm.hpp"
#include "laga/errors.hpp"

namespace {

using laga::CollectiveKind;
using laga::DType;
using laga::Phase;

class TestBackend final : public laga::Backend {
 public:
  laga::Device device() const override { return laga::Device::Cpu; }
  const char* name() const override { return "test"; }
  laga::Allocator& allocator() override { return alloc_; }

  void copy(const laga::CopyArgs& a) override {
    ++copies;
    last = a;
    if (a.dtype == DType::F32)
      copy_as<float>(a);
    else if (a.dtype == DType::F64)
      copy_as<double>(a);
    else
      throw laga::RuntimeError("TestBackend::copy: f32 and f64 only");
  }
  void gemm(const laga::GemmArgs&) override { fail("gemm"); }
  void fill(const laga::Tensor&, double) override { fail("fill"); }
  void rmsnorm_forward(const laga::RmsNormArgs&) override { fail("rmsnorm_forward"); }
  void rmsnorm_backward(const laga::RmsNormArgs&) override { fail("rmsnorm_backward"); }
  void rope_forward(const laga::RopeArgs&) override { fail("rope_forward"); }
  void rope_backward(const laga::RopeArgs&) override { fail("rope_backward"); }
  void attention_forward(const laga::AttentionFwdParams&) override { fail("attention_forward"); }
  void attention_backward(const laga::AttentionBwdParams&) override { fail("attention_backward"); }
  void attention_merge(const laga::AttentionMergeArgs&) override { fail("attention_merge"); }

  int copies = 0;
  laga::CopyArgs last;

 private:
  template <typename T>
  static void copy_as(const laga::CopyArgs& a) {
    const T* src = static_cast<const T*>(a.src);
    T* dst = static_cast<T*>(a.dst);
    for (std::int64_t b = 0; b < a.batch; ++b)
      for (std::int64_t r = 0; r < a.rows; ++r)
        for (std::int64_t c = 0; c < a.cols; ++c) {
          const T v = src[b * a.src_batch_stride + r * a.src_ld + c];
          T& d = dst[b * a.dst_batch_stride + r * a.dst_ld + c];
          d = a.mode == laga::CopyMode::Accumulate ? d + v : v;
        }
  }
  [[noreturn]] static void fail(const char* op) {
    throw laga::RuntimeError(std::string("TestBackend: ") + op + " is not implemented");
  }
  laga::CpuAllocator alloc_;
};

// A value that says which (rank, chunk, element) it came from.
template <typename T>
T tag(int rank, int chunk, std::size_t i) {
  return static_cast<T>(1000 * rank + 100 * chunk + static_cast<double>(i) + 0.25);
}

template <typename T>
std::vector<T> chunked(int rank, int chunks, std::size_t count) {
  std::vector<T> v(chunks * count);
  for (int p = 0; p < chunks; ++p)
    for (std::size_t i = 0; i < count; ++i) v[p * count + i] = tag<T>(rank, p, i);
  return v;
}

constexpr CollectiveKind kKinds[] = {CollectiveKind::AllGather, CollectiveKind::ReduceScatter,
                                     CollectiveKind::AllToAll, CollectiveKind::AllReduce};

}  // namespace

TEST(CommNames, PhaseAndCollective) {
  EXPECT_STREQ(laga::phase_name(Phase::Forward), "forward");
  EXPECT_STREQ(laga::phase_name(Phase::Backward), "backward");
  EXPECT_STREQ(laga::collective_name(CollectiveKind::AllGather), "all_gather");
  EXPECT_STREQ(laga::collective_name(CollectiveKind::ReduceScatter), "reduce_scatter");
  EXPECT_STREQ(laga::collective_name(CollectiveKind::AllToAll), "all_to_all");
  EXPECT_STREQ(laga::collective_name(CollectiveKind::AllReduce), "all_reduce");
}

TEST(CommBytes, FormulasForOneTwoFourEightRanks) {
  const std::size_t c = 4096;  // chunk bytes (for all_reduce: the whole buffer)
  for (int p : {1, 2, 4, 8}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    const std::size_t others = static_cast<std::size_t>(p - 1);
    EXPECT_EQ(laga::collective_bytes_sent(CollectiveKind::AllGather, c, p), others * c);
    EXPECT_EQ(laga::collective_bytes_sent(CollectiveKind::ReduceScatter, c, p), others * c);
    EXPECT_EQ(laga::collective_bytes_sent(CollectiveKind::AllToAll, c, p), others * c);
    // reduce_scatter + all_gather of chunk c / P each.
    EXPECT_EQ(laga::collective_bytes_sent(CollectiveKind::AllReduce, c, p), 2 * others * (c / p));
  }
  // Hand-checked values.
  EXPECT_EQ(laga::collective_bytes_sent(CollectiveKind::AllGather, 100, 4), 300u);
  EXPECT_EQ(laga::collective_bytes_sent(CollectiveKind::AllReduce, 800, 8), 1400u);
  EXPECT_EQ(laga::collective_bytes_sent(CollectiveKind::AllReduce, 800, 2), 800u);
  for (CollectiveKind k : kKinds) {
    EXPECT_EQ(laga::collective_bytes_sent(k, c, 1), 0u) << laga::collective_name(k);
    EXPECT_EQ(laga::collective_bytes_sent(k, 0, 8), 0u) << laga::collective_name(k);
  }
  EXPECT_THROW(laga::collective_bytes_sent(CollectiveKind::AllGather, c, 0), laga::InvalidArgument);
}

TEST(CommCounting, BytesPerCollectiveMatchFormulas) {
  TestBackend backend;
  for (int p : {1, 2, 4, 8}) {
    SCOPED_TRACE("P = " + std::to_string(p));
    auto phantom = laga::make_phantom_communicator(backend, 0, p);
    laga::CountingCommunicator counting(*phantom);
    const std::size_t count = 24;
    std::vector<double> send(p * count, 1.0), recv(p * count, 0.0);
    const std::size_t chunk = count * sizeof(double);

    counting.label(Phase::Forward, "ag");
    counting.all_gather(send.data(), recv.data(), count, DType::F64);
    counting.label(Phase::Forward, "rs");
    counting.reduce_scatter(send.data(), recv.data(), count, DType::F64);
    counting.label(Phase::Forward, "a2a");
    counting.all_to_all(send.data(), recv.data(), count, DType::F64);
    counting.label(Phase::Forward, "ar");
    counting.all_reduce(recv.data(), p * count, DType::F64);  // buffer of P chunks

    const auto& r = counting.records();
    ASSERT_EQ(r.size(), 4u);
    const std::size_t others = static_cast<std::size_t>(p - 1);
    const std::size_t expected[] = {others * chunk, others * chunk, others * chunk, 2 * others * chunk};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(r[i].kind, kKinds[i]);
      EXPECT_EQ(r[i].bytes_sent, expected[i]) << r[i].tensor;
      EXPECT_EQ(r[i].bytes_received, expected[i]) << r[i].tensor;
      EXPECT_EQ(r[i].calls, 1);
    }
    EXPECT_EQ(counting.total_sent(Phase::Forward), others * chunk * 5);
    EXPECT_EQ(counting.total_received(Phase::Forward), others * chunk * 5);
    EXPECT_EQ(counting.total_sent(Phase::Backward), 0u);
  }
}

TEST(CommCounting, BytesUseDtypeSize) {
  TestBackend backend;
  auto phantom = laga::make_phantom_communicator(backend, 1, 4);
  laga::CountingCommunicator counting(*phantom);
  std::vector<float> send(4 * 10), recv(4 * 10);
  counting.all_gather(send.data(), recv.data(), 10, DType::F32);
  ASSERT_EQ(counting.records().size(), 1u);
  EXPECT_EQ(counting.records()[0].bytes_sent, 3u * 10u * 4u);
  EXPECT_EQ(counting.records()[0].tensor, "unlabelled");  // the default label
  EXPECT_EQ(counting.records()[0].phase, Phase::Forward);
}

TEST(CommCounting, MergesSameLabelInOrderOfFirstAppearance) {
  TestBackend backend;
  auto phantom = laga::make_phantom_communicator(backend, 0, 2);
  laga::CountingCommunicator counting(*phantom);
  std::vector<float> send(2 * 8, 1.0f), recv(2 * 8);
  const std::size_t ag = 1 * 8 * 4;  // (P-1) * chunk bytes for 8 floats

  counting.label(Phase::Forward, "q");
  counting.all_gather(send.data(), recv.data(), 8, DType::F32);
  counting.all_gather(send.data(), recv.data(), 8, DType::F32);
  counting.label(Phase::Forward, "kv_latent");
  counting.all_gather(send.data(), recv.data(), 8, DType::F32);
  counting.label(Phase::Backward, "q");  // same tensor, other phase: a new record
  counting.reduce_scatter(send.data(), recv.data(), 8, DType::F32);
  counting.label(Phase::Forward, "q");
  counting.all_gather(send.data(), recv.data(), 4, DType::F32);  // merges into the first record
  counting.all_to_all(send.data(), recv.data(), 8, DType::F32);  // same label, other kind: new record

  const auto& r = counting.records();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].phase, Phase::Forward);
  EXPECT_EQ(r[0].kind, CollectiveKind::AllGather);
  EXPECT_EQ(r[0].tensor, "q");
  EXPECT_EQ(r[0].calls, 3);
  EXPECT_EQ(r[0].bytes_sent, ag + ag + ag / 2);
  EXPECT_EQ(r[0].bytes_received, ag + ag + ag / 2);

  EXPECT_EQ(r[1].tensor, "kv_latent");
  EXPECT_EQ(r[1].calls, 1);
  EXPECT_EQ(r[1].bytes_sent, ag);

  EXPECT_EQ(r[2].phase, Phase::Backward);
  EXPECT_EQ(r[2].kind, CollectiveKind::ReduceScatter);
  EXPECT_EQ(r[2].tensor, "q");
  EXPECT_EQ(r[2].bytes_sent, ag);

  EXPECT_EQ(r[3].phase, Phase::Forward);
  EXPECT_EQ(r[3].kind, CollectiveKind::AllToAll);
  EXPECT_EQ(r[3].tensor, "q");

  EXPECT_EQ(counting.total_sent(Phase::Forward), ag * 3 + ag / 2 + ag);
  EXPECT_EQ(counting.total_sent(Phase::Backward), ag);
  EXPECT_EQ(counting.total_received(Phase::Backward), ag);

  counting.clear();
  EXPECT_TRUE(counting.records().empty());
  EXPECT_EQ(counting.total_sent(Phase::Forward), 0u);
}

TEST(CommCounting, ForwardsToInnerCommunicator) {
  TestBackend backend;
  auto phantom = laga::make_phantom_communicator(backend, 3, 4);
  laga::CountingCommunicator counting(*phantom);
  EXPECT_EQ(counting.rank(), 3);
  EXPECT_EQ(counting.size(), 4);
  EXPECT_STREQ(counting.name(), "phantom");
  EXPECT_FALSE(counting.performs_traffic());
  counting.barrier();

  // The data goes through the inner communicator: rank 3's chunk of a reduce_scatter.
  const std::size_t count = 5;
  auto send = chunked<float>(3, 4, count);
  std::vector<float> recv(count, -1.0f);
  counting.reduce_scatter(send.data(), recv.data(), count, DType::F32);
  for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(recv[i], tag<float>(3, 3, i));
}

TEST(CommCounting, SingleRankCountsCallsButNoBytes) {
  TestBackend backend;
  auto single = laga::make_single_rank_communicator(backend);
  laga::CountingCommunicator counting(*single);
  std::vector<double> a(16, 1.0), b(16);
  counting.label(Phase::Backward, "o");
  counting.all_gather(a.data(), b.data(), 16, DType::F64);
  counting.all_gather(a.data(), b.data(), 16, DType::F64);
  counting.all_reduce(b.data(), 16, DType::F64);
  ASSERT_EQ(counting.records().size(), 2u);
  EXPECT_EQ(counting.records()[0].calls, 2);
  EXPECT_EQ(counting.records()[0].bytes_sent, 0u);
  EXPECT_EQ(counting.records()[1].bytes_sent, 0u);
  EXPECT_EQ(counting.total_sent(Phase::Backward), 0u);
}

TEST(CommSingleRank, CollectivesCopyThroughBackend) {
  TestBackend backend;
  auto comm = laga::make_single_rank_communicator(backend);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_STREQ(comm->name(), "single");
  comm->barrier();

  const std::size_t count = 7;
  auto send = chunked<float>(0, 1, count);
  std::vector<float> recv(count, -1.0f);
  comm->all_gather(send.data(), recv.data(), count, DType::F32);
  EXPECT_EQ(recv, send);
  EXPECT_EQ(backend.copies, 1);
  // One row of `count` elements, as the brief for device copies says.
  EXPECT_EQ(backend.last.batch, 1);
  EXPECT_EQ(backend.last.rows, 1);
  EXPECT_EQ(backend.last.cols, static_cast<std::int64_t>(count));
  EXPECT_EQ(backend.last.src_ld, static_cast<std::int64_t>(count));
  EXPECT_EQ(backend.last.dst_ld, static_cast<std::int64_t>(count));
  EXPECT_EQ(backend.last.mode, laga::CopyMode::Assign);
  EXPECT_EQ(backend.last.dtype, DType::F32);

  std::fill(recv.begin(), recv.end(), -1.0f);
  comm->reduce_scatter(send.data(), recv.data(), count, DType::F32);
  EXPECT_EQ(recv, send);

  std::fill(recv.begin(), recv.end(), -1.0f);
  comm->all_to_all(send.data(), recv.data(), count, DType::F32);
  EXPECT_EQ(recv, send);
  EXPECT_EQ(backend.copies, 3);

  // all_reduce over one rank leaves the buffer as it is and copies nothing.
  auto buf = chunked<double>(0, 1, count);
  const auto before = buf;
  comm->all_reduce(buf.data(), count, DType::F64);
  EXPECT_EQ(buf, before);
  EXPECT_EQ(backend.copies, 3);
}

TEST(CommSingleRank, InPlaceAndEmptyCallsCopyNothing) {
  TestBackend backend;
  auto comm = laga::make_single_rank_communicator(backend);
  auto buf = chunked<double>(0, 1, 9);
  const auto before = buf;
  comm->all_gather(buf.data(), buf.data(), 9, DType::F64);
  comm->reduce_scatter(buf.data(), buf.data(), 9, DType::F64);
  comm->all_to_all(buf.data(), buf.data(), 9, DType::F64);
  std::vector<double> other(9, -1.0);
  comm->all_gather(buf.data(), other.data(), 0, DType::F64);
  EXPECT_EQ(backend.copies, 0);
  EXPECT_EQ(buf, before);
  // Null (meta-device) buffers: nothing is dereferenced.
  comm->all_gather(nullptr, nullptr, 1 << 20, DType::F32);
  comm->all_reduce(nullptr, 1 << 20, DType::F32);
  EXPECT_EQ(backend.copies, 0);
}

template <typename T>
void check_phantom_semantics(DType dtype) {
  TestBackend backend;
  const int size = 4, rank = 2;
  const std::size_t count = 6;
  auto comm = laga::make_phantom_communicator(backend, rank, size);
  EXPECT_EQ(comm->rank(), rank);
  EXPECT_EQ(comm->size(), size);
  EXPECT_STREQ(comm->name(), "phantom");
  EXPECT_FALSE(comm->performs_traffic());
  comm->barrier();

  // all_gather: every one of the P chunks of recv is this rank's send.
  auto send1 = chunked<T>(rank, 1, count);
  std::vector<T> recv(size * count, T(-1));
  comm->all_gather(send1.data(), recv.data(), count, dtype);
  for (int p = 0; p < size; ++p)
    for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(recv[p * count + i], send1[i]) << "chunk " << p;

  // reduce_scatter: chunk `rank` of send (the other ranks contribute zeros).
  auto sendp = chunked<T>(rank, size, count);
  std::vector<T> out(count, T(-1));
  comm->reduce_scatter(sendp.data(), out.data(), count, dtype);
  for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(out[i], tag<T>(rank, rank, i));

  // all_to_all: recv chunk p = send chunk p.
  std::fill(recv.begin(), recv.end(), T(-1));
  comm->all_to_all(sendp.data(), recv.data(), count, dtype);
  EXPECT_EQ(recv, sendp);

  // all_reduce: unchanged.
  auto buf = sendp;
  comm->all_reduce(buf.data(), buf.size(), dtype);
  EXPECT_EQ(buf, sendp);
}

TEST(CommPhantom, SemanticsF32) { check_phantom_semantics<float>(DType::F32); }
TEST(CommPhantom, SemanticsF64) { check_phantom_semantics<double>(DType::F64); }

TEST(CommPhantom, InPlaceAllGather) {
  TestBackend backend;
  const int size = 8, rank = 5;
  const std::size_t count = 3;
  auto comm = laga::make_phantom_communicator(backend, rank, size);
  std::vector<float> buf(size * count, -1.0f);
  for (std::size_t i = 0; i < count; ++i) buf[rank * count + i] = tag<float>(rank, 0, i);
  comm->all_gather(buf.data() + rank * count, buf.data(), count, DType::F32);
  for (int p = 0; p < size; ++p)
    for (std::size_t i = 0; i < count; ++i) EXPECT_EQ(buf[p * count + i], tag<float>(rank, 0, i));
  EXPECT_EQ(backend.copies, size - 1);  // the own chunk is not copied onto itself
}

TEST(CommPhantom, NullBuffersAreNotDereferenced) {
  TestBackend backend;
  auto comm = laga::make_phantom_communicator(backend, 1, 4);
  laga::CountingCommunicator counting(*comm);
  counting.all_gather(nullptr, nullptr, 1000, DType::F32);
  counting.reduce_scatter(nullptr, nullptr, 1000, DType::F32);
  counting.all_to_all(nullptr, nullptr, 1000, DType::F32);
  counting.all_reduce(nullptr, 4000, DType::F32);
  EXPECT_EQ(backend.copies, 0);
  // Bytes are still counted (the planner runs on the meta device).
  EXPECT_EQ(counting.total_sent(Phase::Forward), 3u * 4000u * 3u + 2u * 3u * 4000u);
}

TEST(CommPhantom, SizeOneBehavesLikeSingleRank) {
  TestBackend backend;
  auto comm = laga::make_phantom_communicator(backend, 0, 1);
  auto send = chunked<double>(0, 1, 4);
  std::vector<double> recv(4, -1.0);
  comm->all_gather(send.data(), recv.data(), 4, DType::F64);
  EXPECT_EQ(recv, send);
}

TEST(CommPhantom, RejectsBadRankOrSize) {
  TestBackend backend;
  EXPECT_THROW(laga::make_phantom_communicator(backend, 0, 0), laga::InvalidArgument);
  EXPECT_THROW(laga::make_phantom_communicator(backend, -1, 4), laga::InvalidArgument);
  EXPECT_THROW(laga::make_phantom_communicator(backend, 4, 4), laga::InvalidArgument);
}
