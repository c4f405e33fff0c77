// The CUDA backend: bf16 (storage; fp32 accumulation) and f32 on one NVIDIA GPU. No CUDA header is
// included here, so any translation unit may ask whether a GPU is there and make the backend.
// Built without CUDA (no nvcc at configure time), cuda_available() is false and make_cuda_backend throws.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "laga/backend.hpp"

namespace laga {

// True when laga was built with CUDA and at least one device can be used.
bool cuda_available();

// Number of usable devices (0 without CUDA, driver or device).
int cuda_device_count();

// A backend on device `device`: its own stream, cuBLASLt handle and workspace, and an allocator that counts
// device bytes. Throws InvalidArgument when built without CUDA or when the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

// ---- what other components need from a CUDA backend (the NCCL communicator, the CLI's reports) ----
// Each throws InvalidArgument when `backend` is not a CUDA backend (or laga was built without CUDA).

// The backend's stream (a cudaStream_t): every op of the backend is queued on it, so collectives queued
// on it are ordered with the ops.
void* cuda_stream(Backend& backend);
// The device the backend runs on.
int cuda_device_of(Backend& backend);

// Device memory as the driver sees it (cudaMemGetInfo): used = total - free, all processes and contexts on
// the device included (ranks sharing one GPU see each other's memory).
struct CudaMemInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  std::size_t used_bytes() const { return total_bytes - free_bytes; }
};
CudaMemInfo cuda_mem_info(int device);

// The device's name ("NVIDIA H200"); throws InvalidArgument for a device that does not exist.
std::string cuda_device_name(int device);

// High-water mark of cudaMemGetInfo's used bytes on the backend's device, sampled after every allocation
// the backend's allocator makes (device memory only grows at an allocation, so this is the peak up to the
// memory the backend takes outside its allocator: cuBLASLt workspace and kernel scratch, which stay
// allocated and show at the next sample). reset sets it to the current used bytes.
std::size_t cuda_peak_used_bytes(Backend& backend);
void cuda_reset_peak_used(Backend& backend);

}  // namespace laga
