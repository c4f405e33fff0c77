// Backends hosted by another framework: their activation memory comes from the caller's Allocator (for
// PyTorch: c10's CPU allocator, or the CUDA caching allocator) and, on the GPU, their ops run on the
// caller's stream, so laga inside a training step shares memory and ordering with the framework's own ops.
#pragma once

#include <memory>

#include "laga/backend.hpp"

namespace laga {

// A CPU backend allocating through `allocator` (which must outlive it and serve Device::Cpu).
std::unique_ptr<Backend> make_cpu_backend(Allocator& allocator);

// A CUDA backend on `device` allocating through `allocator` (Device::Cuda memory of that device; must
// outlive the backend) and queueing every op on `stream` (a cudaStream_t the caller owns; null: the legacy
// default stream). set_cuda_stream() moves it to another stream between calls (the framework's current
// stream may change from one step to the next): the host waits for the old stream's work first, except where
// either stream is capturing a CUDA graph (the capture's maker orders it after the work before it). Work
// captured in a graph must have run once before with the same shapes (a kernel scratch buffer that must grow,
// or RoPE frequencies to upload, during a capture throw InvalidArgument); the scratch a captured graph uses is
// kept until the backend goes. Throws InvalidArgument when built without CUDA.
std::unique_ptr<Backend> make_cuda_backend(int device, Allocator& allocator, void* stream);
void set_cuda_stream(Backend& backend, void* stream);

}  // namespace laga
