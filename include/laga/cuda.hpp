// The CUDA backend: bf16 (storage; fp32 accumulation) and f32 on one NVIDIA GPU. No CUDA header is
// included here, so any translation unit may ask whether a GPU is there and make the backend.
// Built without CUDA (no nvcc at configure time), cuda_available() is false and make_cuda_backend throws.
#pragma once

#include <memory>

#include "laga/backend.hpp"

namespace laga {

// True when laga was built with CUDA and at least one device can be used.
bool cuda_available();

// Number of usable devices (0 without CUDA, driver or device).
int cuda_device_count();

// A backend on device `device`: its own stream, cuBLASLt handle and workspace, and an allocator that counts
// device bytes. Throws InvalidArgument when built without CUDA or when the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

}  // namespace laga
