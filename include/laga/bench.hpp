// What `laga bench` needs beside the block: statistics of repeated measurements, and the alpha-beta time
// model that prices collectives on links this machine does not have (docs/bench.md).
//
// Every figure the time model produces is *modeled*; the CLI, the JSON document and the plots label it so,
// next to the measured ones.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "laga/comm.hpp"

namespace laga {

// ---------------------------------------------------------------- statistics of repeats

// Summary of n >= 1 samples. Quartiles interpolate linearly between order statistics (Hyndman & Fan type 7,
// numpy.percentile's default): q(p) = x[floor(h)] + (h - floor(h)) (x[floor(h)+1] - x[floor(h)]), h = (n-1) p
// on the sorted samples. The median is q(0.5): the middle sample, or the mean of the two middle ones.
struct Summary {
  std::size_t n = 0;
  double median = 0, min = 0, max = 0, q1 = 0, q3 = 0, mean = 0;
  double iqr() const { return q3 - q1; }
  double range() const { return max - min; }
  // Spread relative to the median: iqr / median (0 when the median is 0).
  double relative_iqr() const { return median != 0 ? iqr() / median : 0.0; }
};

// Throws InvalidArgument for no samples or a non-finite one.
Summary summarize(const std::vector<double>& samples);
// q in [0, 1], type 7 as above. Throws InvalidArgument for no samples, q outside [0, 1] or a non-finite sample.
double quantile(std::vector<double> samples, double q);
double median(const std::vector<double>& samples);

// ---------------------------------------------------------------- alpha-beta model of collectives

// One kind of link: a per-step latency (alpha) and the bandwidth one GPU gets per direction (1/beta).
struct Link {
  std::string name;          // "NVLink", "InfiniBand"
  double bandwidth = 0;      // bytes/s per GPU per direction
  double latency = 0;        // seconds per algorithm step
  std::string source;        // where the default comes from
};

// The cluster the model prices: nodes of `node_size` GPUs joined by `intra` links, nodes joined by `inter`.
struct TimeModel {
  int node_size = 8;
  Link intra, inter;
};

// Defaults: 8 GPUs a node (DGX/HGX H100/H200); NVLink 4 at 450 GB/s per direction per GPU (18 links x
// 25 GB/s, H200 SXM datasheet "900 GB/s" bidirectional), 2 us a step; InfiniBand NDR 400 Gb/s = 50 GB/s
// per direction, one NIC per GPU (DGX H100/H200: 8 ConnectX-7), 5 us a step. The latencies are assumptions
// of the order of NCCL's small-message times; the collectives here move megabytes to gigabytes, where
// they hardly matter. All are parameters (`laga bench --nvlink-gbs --ib-gbs --nvlink-latency-us
// --ib-latency-us --node-size`).
TimeModel default_time_model();
// Throws InvalidArgument unless node_size >= 1 and bandwidths > 0 and latencies >= 0 (finite).
void validate(const TimeModel&);

// Where the P ranks of the sequence-parallel group sit: `ranks_per_node` of them share a node.
struct Placement {
  std::string name;  // "node" (the group fills nodes of node_size) or "cross-node" (one rank a node)
  int ranks_per_node = 1;
};
// "node": min(P, node_size) ranks a node (all on NVLink when P <= node_size); "cross-node": one rank a
// node, so every byte crosses InfiniBand (the regime where SP spans nodes, the node's other GPUs serving
// tensor or expert parallelism).
std::vector<Placement> standard_placements(const TimeModel&, int ranks);

// Seconds one rank spends in `calls` calls of a collective among `ranks` ranks that together send
// `bytes_sent` bytes from this rank, as CountingCommunicator counts them ((P-1)/P of the buffer for
// all-gather, reduce-scatter and all-to-all; 2(P-1)/P for all-reduce). Classic cost model (Thakur,
// Rabenseifner & Gropp 2005): ring all-gather / reduce-scatter and pairwise-exchange all-to-all take P-1
// steps, all-reduce (reduce-scatter + all-gather) 2(P-1), a ring shift (each rank sends one chunk to its
// successor) one; time = steps x alpha + bytes_sent / bandwidth.
//  - all ranks on one node: NVLink alpha and bandwidth.
//  - across nodes, ring collectives and ring shifts run at the pace of their slowest link (NCCL's bus bandwidth across nodes
//    is the NIC's): every step costs InfiniBand's alpha, all bytes go at InfiniBand's bandwidth.
//  - across nodes, all-to-all sends (k-1)/(P-1) of its bytes to the k-1 peers on its node over NVLink and the
//    rest over InfiniBand, concurrently: (k-1) alpha_intra + (P-k) alpha_inter + max(intra bytes / intra bw,
//    inter bytes / inter bw), k = ranks_per_node.
// Reduction arithmetic is not priced. P = 1 costs 0. Throws InvalidArgument for ranks < 1,
// ranks_per_node outside [1, min(ranks, node_size)] or a negative byte count.
double collective_seconds(const TimeModel&, CollectiveKind, double bytes_sent, int calls, int ranks,
                          int ranks_per_node);

// Sum over the records (each priced with its own kind and number of calls).
double communication_seconds(const TimeModel&, const std::vector<CollectiveRecord>&, int ranks, int ranks_per_node);

}  // namespace laga
