// The alpha-beta model of the collectives (include/laga/bench.hpp, docs/bench.md).
#include <algorithm>
#include <cmath>

#include "laga/bench.hpp"
#include "laga/errors.hpp"

namespace laga {

TimeModel default_time_model() {
  TimeModel m;
  m.node_size = 8;
  m.intra = Link{"NVLink", 450e9, 2e-6,
                 "NVLink 4 (H100/H200 SXM): 18 links x 25 GB/s = 450 GB/s per direction per GPU (datasheet: "
                 "900 GB/s bidirectional); 2 us a step assumed (NCCL small-message order)"};
  m.inter = Link{"InfiniBand", 50e9, 5e-6,
                 "InfiniBand NDR 400 Gb/s = 50 GB/s per direction, one NIC per GPU (DGX H100/H200: 8 x "
                 "ConnectX-7); 5 us a step assumed (RDMA + NCCL proxy order)"};
  return m;
}

void validate(const TimeModel& m) {
  LAGA_REQUIRE(m.node_size >= 1, "node_size = ", m.node_size, ": must be >= 1");
  for (const Link* l : {&m.intra, &m.inter}) {
    LAGA_REQUIRE(std::isfinite(l->bandwidth) && l->bandwidth > 0, l->name, " bandwidth = ", l->bandwidth,
                 " bytes/s: must be > 0");
    LAGA_REQUIRE(std::isfinite(l->latency) && l->latency >= 0, l->name, " latency = ", l->latency,
                 " s: must be >= 0");
  }
}

std::vector<Placement> standard_placements(const TimeModel& m, int ranks) {
  LAGA_REQUIRE(ranks >= 1, "ranks = ", ranks, ": must be >= 1");
  return {Placement{"node", std::min(ranks, m.node_size)}, Placement{"cross-node", 1}};
}

double collective_seconds(const TimeModel& m, CollectiveKind kind, double bytes_sent, int calls, int ranks,
                          int ranks_per_node) {
  LAGA_REQUIRE(ranks >= 1, "ranks = ", ranks, ": must be >= 1");
  LAGA_REQUIRE(ranks_per_node >= 1 && ranks_per_node <= std::min(ranks, m.node_size), "ranks_per_node = ",
               ranks_per_node, ": must be in [1, min(ranks = ", ranks, ", node_size = ", m.node_size, ")]");
  LAGA_REQUIRE(std::isfinite(bytes_sent) && bytes_sent >= 0, "bytes_sent = ", bytes_sent, ": must be >= 0");
  LAGA_REQUIRE(calls >= 0, "calls = ", calls, ": must be >= 0");
  if (ranks == 1 || calls == 0) return 0.0;
  const double P = ranks, k = ranks_per_node, n = calls;
  // A ring shift is one step: every rank sends to its successor at once; across nodes, the ranks at a
  // node's edge send over the slower link and set the pace, as in the ring collectives.
  const double steps = kind == CollectiveKind::AllReduce ? 2.0 * (P - 1.0)
                       : kind == CollectiveKind::RingShift ? 1.0
                                                            : P - 1.0;
  if (ranks_per_node >= ranks)  // one node: NVLink only
    return n * steps * m.intra.latency + bytes_sent / m.intra.bandwidth;
  if (kind != CollectiveKind::AllToAll)  // ring across nodes: the slowest link sets the pace
    return n * steps * m.inter.latency + bytes_sent / m.inter.bandwidth;
  // Pairwise all-to-all across nodes: k-1 peers on the node, P-k beyond it, sent concurrently.
  const double intra_bytes = bytes_sent * (k - 1.0) / (P - 1.0);
  const double inter_bytes = bytes_sent * (P - k) / (P - 1.0);
  return n * ((k - 1.0) * m.intra.latency + (P - k) * m.inter.latency) +
         std::max(intra_bytes / m.intra.bandwidth, inter_bytes / m.inter.bandwidth);
}

double communication_seconds(const TimeModel& m, const std::vector<CollectiveRecord>& records, int ranks,
                             int ranks_per_node) {
  double total = 0;
  for (const CollectiveRecord& r : records)
    total += collective_seconds(m, r.kind, double(r.bytes_sent), r.calls, ranks, ranks_per_node);
  return total;
}

}  // namespace laga
