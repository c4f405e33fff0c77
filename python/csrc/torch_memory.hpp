// laga's accounting allocator over PyTorch's memory, and laga tensors that borrow PyTorch tensors.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "laga/tensor.hpp"

namespace laga_torch {

laga::DType to_laga(at::ScalarType);
at::ScalarType to_torch(laga::DType);

// Raw memory from c10: the CPU allocator, or the CUDA caching allocator on a stream set per call (PyTorch's
// current stream), so torch.cuda.max_memory_allocated() sees laga's activations and the two allocators
// never compete. laga's base class still counts every byte by name.
class TorchAllocator final : public laga::Allocator {
 public:
  explicit TorchAllocator(c10::Device device) : device_(device) {}
  laga::Device device() const override { return device_.is_cuda() ? laga::Device::Cuda : laga::Device::Cpu; }
  void set_stream(void* stream) { stream_ = stream; }

 protected:
  void* raw_allocate(std::size_t bytes) override;
  void raw_free(void* ptr) override;

 private:
  c10::Device device_;
  void* stream_ = nullptr;  // cudaStream_t of the allocations (CUDA only)
};

// Hands out caller-owned memory: each allocation returns the pointer given to borrow() just before, and
// freeing does nothing. The laga tensors it makes are views of PyTorch tensors (MemoryKind::External).
class BorrowingAllocator final : public laga::Allocator {
 public:
  explicit BorrowingAllocator(laga::Device device) : device_(device) {}
  laga::Device device() const override { return device_; }
  // `t` must be contiguous and outlive the returned tensor.
  laga::Tensor borrow(const at::Tensor& t, const std::string& name);

 protected:
  void* raw_allocate(std::size_t) override;
  void raw_free(void*) override {}

 private:
  laga::Device device_;
  void* next_ = nullptr;
};

// A PyTorch tensor over a laga tensor's memory (no copy); the laga tensor, and whatever `keep_alive` holds
// (its allocator), live until PyTorch frees it.
at::Tensor as_torch(const laga::Tensor& t, c10::Device device, std::shared_ptr<void> keep_alive);

}  // namespace laga_torch
