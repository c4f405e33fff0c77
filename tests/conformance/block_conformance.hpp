// The block's conformance suite, written once and instantiated by each test binary with its platform (the
// backend each rank runs on and the communicator between ranks) and its way of starting ranks:
//   tests/unit/test_block_conformance.cpp   CPU backends, ranks as threads of the process
//   tests/mpi/test_mpi_block.cpp            CPU backends, the ranks of an mpirun job
//   tests/gpu/test_cuda_block.cpp           CUDA backends: the single-rank copy at P = 1, host staging over
//                                           thread ranks sharing the GPU, NCCL
// A case is (configuration, P, layout, dtype, batch, S); it runs every variant the layout takes
// (laga::variants_for: forms, absorbed attention, recompute) with every kernel the layout takes, each once in
// the blocking order and once with collectives under compute, and checks:
//   - the global result (y, dx of the whole sequence, weight gradients summed over ranks) against the float64
//     single-rank explicit result on the CPU with the same kernel, within Platform::tolerance; every rank
//     holds the same errors;
//   - every rank took part (saved activations, symmetric traffic, its shard of y) and its collectives equal
//     a closed form written here from DESIGN.md section 3, laga::expected_traffic and the plan's; where the
//     platform's accounting is the plan's (Platform::plan_exact), the plan's saved bytes, peaks and FLOPs
//     equal the measurement;
//   - the overlapped run gives the bits of the blocking one, with the same collectives and saved bytes;
//   - the forms among themselves at the same P: LAGA (and LAGA with K/V recomputation) bit-identical to
//     explicit at P = 1, every other pair within the tolerance; recomputation bit-identical to LAGA, keeping
//     fewer bytes (the gathered latent instead of per-head K/V) and moving the same; in all_gather at P > 1
//     LAGA sends less than explicit; at P = 1 LAGA in all_gather bit-identical to LAGA in a2a.
// BlockRefusals: bad input is refused on every rank with the same message before any collective.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "laga/block.hpp"
#include "laga/comm.hpp"
#include "laga/problem.hpp"

namespace laga::conformance {

// Where each rank's ops run, and the communicator the block uses between the ranks.
struct Platform {
  std::string name;  // "cpu", "cuda", "cuda_host_staging", "cuda_nccl"
  // Why it cannot run here (no GPU, no NCCL), or "" when it can; the suite skips its cases otherwise.
  std::function<std::string()> unavailable = [] { return std::string(); };
  std::function<std::unique_ptr<Backend>(int rank)> make_backend;
  // The block's communicator for one rank over the rank's host communicator (a thread of the group, or
  // MPI); when empty, the host communicator itself.
  std::function<std::unique_ptr<Communicator>(Communicator& host, Backend&)> make_comm;
  // Relative Frobenius error allowed against the float64 reference, and between two forms at the same P.
  std::function<double(DType)> tolerance;
  // The backend's allocator counts what the plan (meta backend) counts: saved bytes, peaks and FLOPs are
  // compared with plan_rank. Traffic is compared on every platform (the counting communicator's).
  bool plan_exact = true;
  // Each error printed as a GPUCHECK line (`bash scripts/gpu.sh check` collects them).
  bool report = false;
};

// How the ranks of a case are started.
class Ranks {
 public:
  virtual ~Ranks() = default;
  virtual std::string name() const = 0;
  // How many ranks a case asking for `wanted` runs on: threads start `wanted`; an MPI job has its size.
  virtual int size(int wanted) const = 0;
  // Runs fn(rank, host) on the ranks of this process (threads: all `size`; MPI: this process's rank) and
  // returns when they are done. `host` carries host buffers.
  virtual void run(int size, const std::function<void(int rank, Communicator& host)>& fn) = 0;
};
// Ranks as threads of this process (laga::run_thread_ranks, one BLAS thread per rank).
std::shared_ptr<Ranks> thread_ranks();

// What a test binary instantiates the suite with.
struct Suite {
  Platform platform;
  std::shared_ptr<Ranks> ranks;
};

struct Case {
  std::string config = "tiny";  // tests/common/block_configs.hpp; in a2a with n_h not divisible by P, n_h = P
  int ranks = 0;                // 0: as many as Ranks::size gives (MPI: the job's)
  Layout layout = Layout::A2A;
  DType dtype = DType::F32;
  std::int64_t batch = 2;
  std::int64_t seq = 0;  // 0: 8 tokens per rank
  std::optional<AttentionKernel> kernel;  // empty: every kernel the layout takes
};

struct Param {
  std::shared_ptr<const Suite> suite;
  Case c;
};
std::string param_name(const testing::TestParamInfo<Param>& info);
void PrintTo(const Param& p, std::ostream* os);

// The cases of `suite`: for each (config, ranks, dtype, batch, seq) of `shapes`, one per layout that can run it
// (p2p needs S divisible by 2P).
std::vector<Param> every_layout(const std::shared_ptr<const Suite>& suite, const std::vector<Case>& shapes);

class BlockConformance : public testing::TestWithParam<Param> {};
class BlockRefusals : public testing::TestWithParam<Param> {};

}  // namespace laga::conformance
