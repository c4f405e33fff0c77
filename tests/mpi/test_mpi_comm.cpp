// The MPI communicator, run under mpirun at 2, 4 and 8 ranks (tests/mpi/CMakeLists.txt).
// Every rank runs every test. Data are a function of (seed, rank, index) so each rank can compute what
// the others sent; values are small multiples of 1/8, so sums over ranks are exact in f32 and f64 and
// results are compared exactly. Collectives are called unconditionally before any assertion, so a
// failure on one rank cannot leave the others waiting in a collective.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "laga/comm.hpp"
#include "laga/errors.hpp"
#include "laga/mpi_comm.hpp"

namespace laga::detail {
// Defined in src/comm/mpi_comm.cpp: splits every collective into pieces of at most max_count elements,
// which exercises the path used for counts above INT_MAX with small buffers.
std::unique_ptr<Communicator> make_mpi_communicator_split(std::size_t max_count);
}  // namespace laga::detail

namespace {

using laga::DType;

laga::MpiSession* g_session = nullptr;
int world_rank() { return g_session->rank(); }
int world_size() { return g_session->size(); }

// Exactly representable, sign-mixed, different for every (seed, rank, index).
template <typename T>
T value(int seed, int rank, std::size_t index) {
  const long h = (seed * 7919L + rank * 104729L + static_cast<long>(index) * 31L + static_cast<long>(index / 97)) % 2048;
  return static_cast<T>(h) / T(8) - T(128);
}

template <typename T>
constexpr DType dtype_of() {
  return sizeof(T) == 4 ? DType::F32 : DType::F64;
}

// What the test communicator is: the plain one, or one that splits every call into pieces of 3.
enum class Flavor { plain, split };

std::unique_ptr<laga::Communicator> make(Flavor flavor) {
  return flavor == Flavor::plain ? laga::make_mpi_communicator() : laga::detail::make_mpi_communicator_split(3);
}

template <typename T>
void check_all_gather(laga::Communicator& comm, std::size_t count, int seed, bool in_place) {
  const int r = comm.rank(), P = comm.size();
  std::vector<T> recv(P * count, T(-1000));
  std::vector<T> send(count);
  for (std::size_t i = 0; i < count; ++i) send[i] = value<T>(seed, r, i);
  if (in_place) {
    std::copy(send.begin(), send.end(), recv.begin() + r * count);
    comm.all_gather(recv.data() + r * count, recv.data(), count, dtype_of<T>());
  } else {
    comm.all_gather(send.data(), recv.data(), count, dtype_of<T>());
  }
  int wrong = 0;
  for (int p = 0; p < P; ++p)
    for (std::size_t i = 0; i < count; ++i) wrong += recv[p * count + i] != value<T>(seed, p, i);
  EXPECT_EQ(wrong, 0) << "all_gather count " << count << (in_place ? " in place" : "");
}

template <typename T>
void check_reduce_scatter(laga::Communicator& comm, std::size_t count, int seed) {
  const int r = comm.rank(), P = comm.size();
  std::vector<T> send(P * count), recv(count, T(-1000));
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = value<T>(seed, r, i);
  comm.reduce_scatter(send.data(), recv.data(), count, dtype_of<T>());
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    T expected = 0;
    for (int q = 0; q < P; ++q) expected += value<T>(seed, q, r * count + i);
    wrong += recv[i] != expected;
  }
  EXPECT_EQ(wrong, 0) << "reduce_scatter count " << count;
}

template <typename T>
void check_all_to_all(laga::Communicator& comm, std::size_t count, int seed, bool in_place) {
  const int r = comm.rank(), P = comm.size();
  std::vector<T> send(P * count), recv(P * count, T(-1000));
  for (std::size_t i = 0; i < send.size(); ++i) send[i] = value<T>(seed, r, i);
  if (in_place) {
    recv = send;
    comm.all_to_all(recv.data(), recv.data(), count, dtype_of<T>());
  } else {
    comm.all_to_all(send.data(), recv.data(), count, dtype_of<T>());
  }
  // Chunk p came from rank p, which sent its chunk r.
  int wrong = 0;
  for (int p = 0; p < P; ++p)
    for (std::size_t i = 0; i < count; ++i) wrong += recv[p * count + i] != value<T>(seed, p, r * count + i);
  EXPECT_EQ(wrong, 0) << "all_to_all count " << count << (in_place ? " in place" : "");
}

template <typename T>
void check_all_reduce(laga::Communicator& comm, std::size_t count, int seed) {
  const int r = comm.rank(), P = comm.size();
  std::vector<T> buf(count);
  for (std::size_t i = 0; i < count; ++i) buf[i] = value<T>(seed, r, i);
  comm.all_reduce(buf.data(), count, dtype_of<T>());
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    T expected = 0;
    for (int q = 0; q < P; ++q) expected += value<T>(seed, q, i);
    wrong += buf[i] != expected;
  }
  EXPECT_EQ(wrong, 0) << "all_reduce count " << count;
}

// Blocking and started: the predecessor's chunk arrives; two shifts in flight at once match in order.
template <typename T>
void check_ring_shift(laga::Communicator& comm, std::size_t count, int seed) {
  const int r = comm.rank(), P = comm.size(), prev = (r - 1 + P) % P;
  std::vector<T> send(count), recv(count, T(-1000)), send2(count), recv2(count, T(-1000));
  for (std::size_t i = 0; i < count; ++i) send[i] = value<T>(seed, r, i), send2[i] = value<T>(seed + 1, r, i);
  comm.ring_shift(send.data(), recv.data(), count, dtype_of<T>());
  int wrong = 0;
  for (std::size_t i = 0; i < count; ++i) wrong += recv[i] != value<T>(seed, prev, i);
  EXPECT_EQ(wrong, 0) << "ring_shift count " << count;
  std::fill(recv.begin(), recv.end(), T(-1000));
  laga::CollectiveRequest a = comm.start_ring_shift(send.data(), recv.data(), count, dtype_of<T>());
  laga::CollectiveRequest b = comm.start_ring_shift(send2.data(), recv2.data(), count, dtype_of<T>());
  b.wait();
  a.wait();
  wrong = 0;
  for (std::size_t i = 0; i < count; ++i)
    wrong += (recv[i] != value<T>(seed, prev, i)) + (recv2[i] != value<T>(seed + 1, prev, i));
  EXPECT_EQ(wrong, 0) << "start_ring_shift count " << count;
}

template <typename T>
void check_all(Flavor flavor) {
  auto comm = make(flavor);
  ASSERT_EQ(comm->rank(), world_rank());  // same on every rank, so ASSERT cannot split the ranks
  ASSERT_EQ(comm->size(), world_size());
  int seed = 1;
  // 0 (empty), 1, a count that is not a multiple of the split size, and a larger one.
  for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{10}, std::size_t{4099}}) {
    SCOPED_TRACE("count " + std::to_string(count));
    check_all_gather<T>(*comm, count, seed++, false);
    check_all_gather<T>(*comm, count, seed++, true);
    check_reduce_scatter<T>(*comm, count, seed++);
    check_all_to_all<T>(*comm, count, seed++, false);
    check_all_to_all<T>(*comm, count, seed++, true);
    check_all_reduce<T>(*comm, count, seed++);
    check_ring_shift<T>(*comm, count, seed);
    seed += 2;
  }
  comm->barrier();
}

}  // namespace

TEST(MpiComm, NameRankSize) {
  auto comm = laga::make_mpi_communicator();
  EXPECT_STREQ(comm->name(), "mpi");
  EXPECT_EQ(comm->rank(), world_rank());
  EXPECT_EQ(comm->size(), world_size());
  EXPECT_TRUE(comm->performs_traffic());
  EXPECT_GE(comm->size(), 2) << "launch this suite with mpirun -np 2 or more";
  comm->barrier();
}

TEST(MpiComm, CollectivesF32) { check_all<float>(Flavor::plain); }
TEST(MpiComm, CollectivesF64) { check_all<double>(Flavor::plain); }
TEST(MpiComm, SplitCollectivesF32) { check_all<float>(Flavor::split); }
TEST(MpiComm, SplitCollectivesF64) { check_all<double>(Flavor::split); }

TEST(MpiComm, TwoCommunicatorsCoexist) {
  auto a = laga::make_mpi_communicator();
  auto b = laga::make_mpi_communicator();
  check_all_reduce<double>(*a, 17, 101);
  check_all_gather<float>(*b, 5, 102, false);
}

TEST(MpiComm, Bf16IsRefusedWithAClearError) {
  auto comm = laga::make_mpi_communicator();
  std::vector<unsigned short> buf(2 * comm->size(), 0), out(2 * comm->size(), 0);
  // Refused before any MPI call, on every rank alike, so no rank is left in a collective.
  try {
    comm->all_gather(buf.data(), out.data(), 2, DType::BF16);
    ADD_FAILURE() << "bf16 all_gather did not throw";
  } catch (const laga::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm->reduce_scatter(buf.data(), out.data(), 2, DType::BF16), laga::InvalidArgument);
  EXPECT_THROW(comm->all_to_all(buf.data(), out.data(), 2, DType::BF16), laga::InvalidArgument);
  EXPECT_THROW(comm->all_reduce(buf.data(), 2, DType::BF16), laga::InvalidArgument);
  comm->barrier();
}

TEST(MpiComm, OverlappingReduceScatterIsRefused) {
  auto comm = laga::make_mpi_communicator();
  std::vector<float> buf(4 * comm->size(), 1.0f);
  EXPECT_THROW(comm->reduce_scatter(buf.data(), buf.data() + 1, 4, DType::F32), laga::RuntimeError);
  comm->barrier();
}

TEST(MpiComm, CountingBytesOnTopOfMpi) {
  auto mpi = laga::make_mpi_communicator();
  laga::CountingCommunicator counting(*mpi);
  const int P = counting.size();
  const std::size_t others = static_cast<std::size_t>(P - 1);
  const std::size_t count = 64;

  counting.label(laga::Phase::Forward, "kv_latent");
  check_all_gather<float>(counting, count, 201, false);
  check_all_gather<float>(counting, count, 202, false);
  counting.label(laga::Phase::Forward, "q");
  check_all_to_all<double>(counting, count, 203, false);
  counting.label(laga::Phase::Backward, "kv_latent");
  check_reduce_scatter<float>(counting, count, 204);
  counting.label(laga::Phase::Backward, "grad");
  check_all_reduce<double>(counting, count * P, 205);  // a buffer of P chunks

  const auto& r = counting.records();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].kind, laga::CollectiveKind::AllGather);
  EXPECT_EQ(r[0].tensor, "kv_latent");
  EXPECT_EQ(r[0].calls, 2);
  EXPECT_EQ(r[0].bytes_sent, 2 * others * count * 4);
  EXPECT_EQ(r[1].kind, laga::CollectiveKind::AllToAll);
  EXPECT_EQ(r[1].bytes_sent, others * count * 8);
  EXPECT_EQ(r[1].bytes_received, others * count * 8);
  EXPECT_EQ(r[2].phase, laga::Phase::Backward);
  EXPECT_EQ(r[2].kind, laga::CollectiveKind::ReduceScatter);
  EXPECT_EQ(r[2].bytes_sent, others * count * 4);
  EXPECT_EQ(r[3].kind, laga::CollectiveKind::AllReduce);
  EXPECT_EQ(r[3].bytes_sent, 2 * others * count * 8);
  EXPECT_EQ(counting.total_sent(laga::Phase::Forward), 2 * others * count * 4 + others * count * 8);
  EXPECT_EQ(counting.total_received(laga::Phase::Backward), others * count * 4 + 2 * others * count * 8);
}

TEST(MpiComm, AllOkIsTheSameOnEveryRank) {
  const int r = world_rank(), P = world_size();
  EXPECT_TRUE(laga::mpi_all_ok(true));
  EXPECT_FALSE(laga::mpi_all_ok(false));
  EXPECT_FALSE(laga::mpi_all_ok(r != P - 1)) << "only the last rank is false";
  EXPECT_FALSE(laga::mpi_all_ok(r != 0)) << "only rank 0 is false";
  EXPECT_FALSE(laga::mpi_all_ok(r == 0)) << "only rank 0 is true";
}

namespace {

// On ranks other than 0 the default printer is removed; this one prints only failures, with the rank,
// so a failure on any rank is still explained.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] FAILED %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  laga::MpiSession session(&argc, &argv);
  g_session = &session;
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = session.rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int local = RUN_ALL_TESTS();
  // The exit code reflects a failure on any rank.
  const bool all_ok = laga::mpi_all_ok(local == 0);
  if (rank == 0)
    std::printf("laga_mpi_tests: %d ranks, %s\n", session.size(),
                all_ok ? "all ranks passed" : "FAILED on at least one rank");
  return all_ok ? 0 : 1;
}
