// Communicators for GPU buffers. No CUDA or NCCL header is included here, so any translation unit (the
// CLI, tests) may make them; they are built into laga_cuda (src/cuda/nccl_comm.cpp) and, without CUDA
// or NCCL at configure time, replaced by stubs that throw InvalidArgument.
//
// Which one to use (DESIGN.md): one rank per GPU -> NCCL; several ranks sharing one GPU (NCCL refuses two
// ranks on one device) -> the host-staging wrapper over MPI, which is slow but lets every P be tested for
// correctness on a single GPU; P = 1 -> make_single_rank_communicator on the CUDA backend.
#pragma once

#include <memory>

#include "laga/comm.hpp"

namespace laga {

class Backend;

// True when laga was built with NCCL (make_nccl_communicator works given a GPU).
bool nccl_available();

// NCCL communicator over the ranks of `bootstrap` (normally MPI; any communicator over host buffers with
// the same ranks), on the device and stream of `cuda_backend`. Collective over `bootstrap`: rank 0 makes
// the ncclUniqueId and sends it with bootstrap.all_gather, then every rank calls ncclCommInitRank.
// Collectives are queued on the backend's stream (ordered with its ops; none waits for the host) and
// take bf16, f32 and f64 device buffers. all_to_all is a group of ncclSend/ncclRecv. `bootstrap` and
// `cuda_backend` must outlive the communicator (barrier() uses the bootstrap). Every NCCL call is
// checked: a failure throws RuntimeError naming the call, file:line and ncclGetErrorString.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, Backend& cuda_backend);

// Device buffers through a host communicator: each collective copies its device input to host memory,
// runs `host` (MPI: f32 and f64), and copies the result back; bf16 travels as f32 (exact for gathers and
// all-to-alls; sums are taken in f32 then rounded once). Synchronous: the backend's stream is drained
// first. `host` and `cuda_backend` must outlive it.
std::unique_ptr<Communicator> make_host_staging_communicator(Communicator& host, Backend& cuda_backend);

}  // namespace laga
