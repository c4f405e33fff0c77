// A whole problem on one rank: deterministic weights and inputs, forward + backward, and what was measured.
// Data come from (seed, stream, global index), so rank r's shard is exactly the slice of the single-rank
// input and results at any P compare with P = 1.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "laga/block.hpp"

namespace laga {

// Uniform in [-1, 1) from a counter-based hash: the same value for the same triple on any rank or machine.
double deterministic_value(std::uint64_t seed, std::uint64_t stream, std::uint64_t index);

// Host <-> tensor in double precision (converting to and from the tensor's dtype).
std::vector<double> to_host(Backend&, const Tensor&);
void from_host(Backend&, const Tensor&, const std::vector<double>&);

// Streams of the deterministic data.
enum class DataStream : std::uint64_t { X = 1, Dy = 2, Weights = 100 };

// t[i] = shift + scale * deterministic_value(seed, stream, first_index + i).
void fill_deterministic(Backend&, const Tensor& t, std::uint64_t seed, std::uint64_t stream,
                        std::uint64_t first_index, double scale, double shift = 0.0);

// Weights (external memory) scaled like a trained model's init: U(-1,1)/sqrt(fan_in); norms 1 + 0.1 U(-1,1).
MlaWeights make_weights(const MlaConfig&, DType, Backend&, std::uint64_t seed);
// This rank's shard [s, batch, d] of the global [S, batch, d] tensor of a stream (external memory): the
// tokens the layout gives the rank (include/laga/token_map.hpp).
Tensor make_shard(const MlaConfig&, const BlockShape&, DType, Backend&, std::uint64_t seed, DataStream, Layout);

struct RankRun {
  Tensor y, dx;   // [s, batch, d]
  MlaGrads grads;  // this rank's weight gradients
  std::vector<AllocationRecord> saved;  // tensors kept from forward to backward, by name
  std::size_t saved_bytes = 0;
  PassStats fwd, bwd;
  std::vector<CollectiveRecord> traffic;
  Layout layout = Layout::A2A;  // which tokens y and dx hold (include/laga/token_map.hpp)
};

// Runs forward then backward of one block on this rank. Weights, x and dy default to the deterministic ones.
RankRun run_rank(const MlaConfig&, const BlockOptions&, const BlockShape&, Backend&, Communicator&,
                 std::uint64_t seed, const MlaWeights* weights = nullptr, const Tensor* x = nullptr,
                 const Tensor* dy = nullptr);

// The global result of a run: y and dx of the whole sequence (the ranks' shards put where the run's layout
// says they belong), weight gradients summed over
// ranks. A collective over `comm`, which must serve HOST buffers (MPI, threads; not NCCL: pass the MPI
// communicator beside it); uncounted; every rank receives it. With one rank no collective is made.
struct GlobalResult {
  std::vector<double> y, dx;  // [S, batch, d]
  std::vector<std::pair<std::string, std::vector<double>>> grads;  // ("kv_b_proj", ...) in MlaWeights order
};
GlobalResult gather_result(Backend&, Communicator&, const RankRun&);

// The single-rank explicit result of the same problem (run on this process alone): the reference that
// every form, layout and P must reproduce.
GlobalResult reference_result(const MlaConfig&, DType, AttentionKernel, std::int64_t batch, std::int64_t seq,
                              Backend&, std::uint64_t seed, const MlaWeights* weights = nullptr,
                              const Tensor* x = nullptr, const Tensor* dy = nullptr);

struct Comparison {
  std::string tensor;  // "y", "dx" or a weight name
  double rel_error = 0;
};

// Relative Frobenius error of every tensor of `got` against `ref`.
std::vector<Comparison> compare(const GlobalResult& got, const GlobalResult& ref);
double max_error(const std::vector<Comparison>&);

// P ranks as threads of this process (own CPU backend and allocator each, in-process collectives): the
// demo's and the in-process tests' way to run P > 1 without mpirun.
struct GroupRun {
  std::vector<std::unique_ptr<Backend>> backends;  // one per rank; outlive `ranks`
  std::vector<RankRun> ranks;
  GlobalResult result;
};
GroupRun run_thread_group(const MlaConfig&, const BlockOptions&, std::int64_t batch, std::int64_t seq, int ranks,
                          std::uint64_t seed);

// Relative Frobenius error ||a - b|| / ||b||  (0 when both are zero).
double relative_error(const std::vector<double>& a, const std::vector<double>& b);

}  // namespace laga
