// The ring's pieces: the ring shift on every host communicator (threads, single rank, phantom, timed
// phantom, counting), its price in the alpha-beta model, and the attention merge of partial results.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "laga/backend.hpp"
#include "laga/bench.hpp"
#include "laga/comm.hpp"
#include "laga/errors.hpp"
#include "laga/timed_comm.hpp"

namespace {

using namespace laga;

double value(int seed, int rank, std::size_t i) { return double((seed * 31 + rank * 1009 + int(i) * 7) % 997) - 498.5; }

// Every rank of a thread group shifts (blocking, then two started at once); each receives its predecessor's.
void check_thread_ring(int P, std::size_t count) {
  auto group = make_thread_group(P);
  std::vector<int> wrong(P, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      Communicator& c = *group[r];
      const int prev = (r - 1 + P) % P;
      std::vector<double> a(count), b(count), ra(count, -1), rb(count, -1);
      for (std::size_t i = 0; i < count; ++i) a[i] = value(1, r, i), b[i] = value(2, r, i);
      c.ring_shift(a.data(), ra.data(), count, DType::F64);
      for (std::size_t i = 0; i < count; ++i) wrong[r] += ra[i] != value(1, prev, i);
      std::fill(ra.begin(), ra.end(), -1.0);
      CollectiveRequest qa = c.start_ring_shift(a.data(), ra.data(), count, DType::F64);
      CollectiveRequest qb = c.start_ring_shift(b.data(), rb.data(), count, DType::F64);
      qb.wait();
      qa.wait();
      for (std::size_t i = 0; i < count; ++i) wrong[r] += (ra[i] != value(1, prev, i)) + (rb[i] != value(2, prev, i));
      c.barrier();
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < P; ++r) EXPECT_EQ(wrong[r], 0) << "rank " << r << " of " << P;
}

}  // namespace

TEST(RingShift, ThreadRanksReceiveThePredecessorsChunk) {
  for (int P : {1, 2, 3, 4, 8}) check_thread_ring(P, 37);
}

TEST(RingShift, SingleRankAndPhantomCopy) {
  auto cpu = make_cpu_backend();
  std::vector<float> send = {1, 2, 3, 4}, recv(4, 0);
  auto single = make_single_rank_communicator(*cpu);
  single->ring_shift(send.data(), recv.data(), 4, DType::F32);
  EXPECT_EQ(recv, send);
  std::fill(recv.begin(), recv.end(), 0.0f);
  auto phantom = make_phantom_communicator(*cpu, 2, 4);
  phantom->start_ring_shift(send.data(), recv.data(), 4, DType::F32).wait();
  EXPECT_EQ(recv, send);
}

TEST(RingShift, CountedAsOneChunkPerCall) {
  auto cpu = make_cpu_backend();
  std::vector<double> send(10, 1.0), recv(10);
  for (int P : {1, 2, 8}) {
    auto phantom = make_phantom_communicator(*cpu, 0, P);
    CountingCommunicator counting(*phantom);
    counting.label(Phase::Forward, "kv_latent");
    counting.ring_shift(send.data(), recv.data(), 10, DType::F64);
    counting.start_ring_shift(send.data(), recv.data(), 10, DType::F64).wait();
    ASSERT_EQ(counting.records().size(), 1u);
    const CollectiveRecord& r = counting.records()[0];
    EXPECT_EQ(r.kind, CollectiveKind::RingShift);
    EXPECT_EQ(r.calls, 2);
    EXPECT_EQ(r.bytes_sent, P > 1 ? 2 * 80u : 0u) << "P = " << P;
    EXPECT_EQ(r.bytes_received, r.bytes_sent);
  }
  EXPECT_STREQ(collective_name(CollectiveKind::RingShift), "ring_shift");
}

TEST(RingShift, PricedAsOneStep) {
  const TimeModel m = default_time_model();
  const double bytes = 3e6;
  // One node: one NVLink step; across nodes, InfiniBand's pace; P = 1 costs nothing.
  EXPECT_DOUBLE_EQ(collective_seconds(m, CollectiveKind::RingShift, bytes, 2, 8, 8),
                   2 * m.intra.latency + bytes / m.intra.bandwidth);
  EXPECT_DOUBLE_EQ(collective_seconds(m, CollectiveKind::RingShift, bytes, 1, 16, 8),
                   m.inter.latency + bytes / m.inter.bandwidth);
  EXPECT_EQ(collective_seconds(m, CollectiveKind::RingShift, bytes, 1, 1, 1), 0.0);
  TimedLinks links;
  links.ranks_per_node = 8;
  EXPECT_DOUBLE_EQ(timed_collective_seconds(links, CollectiveKind::RingShift, 1 << 20, 8),
                   collective_seconds(m, CollectiveKind::RingShift, double(1 << 20), 1, 8, 8));
}

TEST(RingShift, TimedPhantomHoldsAndCopies) {
  auto cpu = make_cpu_backend();
  auto clock = make_host_comm_clock();
  TimedLinks links;
  links.ranks_per_node = 2;
  auto timed = make_timed_phantom_communicator(*cpu, 1, 2, links, *clock);
  std::vector<float> send = {5, 6}, recv(2, 0);
  timed->start_ring_shift(send.data(), recv.data(), 2, DType::F32).wait();
  EXPECT_EQ(recv, send);
}

namespace {

// Softmax attention of one query row over `keys` scores (scale already applied) and values [keys, dv].
void reference_row(const std::vector<double>& scores, const std::vector<double>& v, int dv, std::vector<double>& o,
                   double& lse) {
  double m = -std::numeric_limits<double>::infinity();
  for (double s : scores) m = std::max(m, s);
  double sum = 0;
  for (double s : scores) sum += std::exp(s - m);
  lse = m + std::log(sum);
  o.assign(dv, 0.0);
  for (std::size_t j = 0; j < scores.size(); ++j)
    for (int c = 0; c < dv; ++c) o[c] += std::exp(scores[j] - lse) * v[j * dv + c];
}

}  // namespace

// Two halves of the keys attended separately and merged give attention over all of them.
TEST(AttentionMerge, CpuMergesHalvesIntoTheWhole) {
  auto cpu = make_cpu_backend();
  const int rows = 3, keys = 6, dv = 4;  // rows = (query, head) pairs, batch 1
  std::vector<double> scores(rows * keys), v(keys * dv);
  for (std::size_t i = 0; i < scores.size(); ++i) scores[i] = std::sin(1.7 * double(i)) * 3;
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.3 * double(i));
  std::vector<double> o(rows * dv), lse(rows), o2(rows * dv), lse2(rows), whole(rows * dv), whole_lse(rows);
  for (int q = 0; q < rows; ++q) {
    std::vector<double> part, out;
    double l = 0;
    const auto row = [&](int k0, int k1, double* dst, double& dst_lse) {
      part.assign(scores.begin() + q * keys + k0, scores.begin() + q * keys + k1);
      reference_row(part, std::vector<double>(v.begin() + k0 * dv, v.begin() + k1 * dv), dv, out, l);
      std::copy(out.begin(), out.end(), dst);
      dst_lse = l;
    };
    row(0, 2, &o[q * dv], lse[q]);
    row(2, keys, &o2[q * dv], lse2[q]);
    row(0, keys, &whole[q * dv], whole_lse[q]);
  }
  lse[2] = -std::numeric_limits<double>::infinity();  // a row with no key yet takes the partial's values
  for (int c = 0; c < dv; ++c) o[2 * dv + c] = 0;
  AttentionMergeArgs a{.dtype = DType::F64, .batch = 1, .q_len = rows, .heads = 1, .d_v = dv, .o = o.data(),
                       .o_token_stride = dv, .o_batch_stride = dv, .o_head_stride = dv, .lse = lse.data(),
                       .o_part = o2.data(), .part_token_stride = dv, .part_batch_stride = dv, .part_head_stride = dv,
                       .lse_part = lse2.data()};
  cpu->attention_merge(a);
  for (int q = 0; q < 2; ++q) {
    EXPECT_NEAR(lse[q], whole_lse[q], 1e-12);
    for (int c = 0; c < dv; ++c) EXPECT_NEAR(o[q * dv + c], whole[q * dv + c], 1e-12);
  }
  EXPECT_EQ(lse[2], lse2[2]);
  for (int c = 0; c < dv; ++c) EXPECT_EQ(o[2 * dv + c], o2[2 * dv + c]);
  // A partial with no visible key changes nothing.
  const std::vector<double> before = o;
  std::vector<double> empty_lse(rows, -std::numeric_limits<double>::infinity());
  a.lse_part = empty_lse.data();
  cpu->attention_merge(a);
  EXPECT_EQ(o, before);
}
