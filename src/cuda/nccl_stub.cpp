// Built instead of src/cuda/nccl_comm.cpp when NCCL (or CUDA) was not found at configure time: the same
// entry points and a clear error when an NCCL communicator is asked for.
#include "laga/errors.hpp"
#include "laga/nccl_comm.hpp"

namespace laga {

bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, Backend&) {
  throw InvalidArgument(
      "make_nccl_communicator: laga was built without NCCL (configure with CUDA and NCCL found, or use "
      "MPI with host staging: one process per rank sharing the GPU)");
}

}  // namespace laga
