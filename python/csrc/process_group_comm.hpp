// laga's Communicator over a torch.distributed process group (gloo for CPU tensors, NCCL for CUDA tensors):
// the collectives of the caller's sequence-parallel group, issued through c10d on laga's buffers without
// copies.
#pragma once

#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "laga/comm.hpp"

namespace laga_torch {

// The group registered under `group_name` (torch.distributed's ProcessGroup.group_name), serving buffers of
// `device`. Collectives wait for completion on PyTorch's current stream (NCCL) or on the host (gloo).
std::unique_ptr<laga::Communicator> make_process_group_communicator(const std::string& group_name,
                                                                    c10::Device device);

}  // namespace laga_torch
