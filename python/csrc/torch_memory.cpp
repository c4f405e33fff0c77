#include "torch_memory.hpp"

#include <c10/core/CPUAllocator.h>
#ifdef LAGA_HAVE_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

#include "laga/errors.hpp"

namespace laga_torch {

laga::DType to_laga(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return laga::DType::F32;
    case at::kDouble: return laga::DType::F64;
    case at::kBFloat16: return laga::DType::BF16;
    default: break;
  }
  throw laga::InvalidArgument(laga::detail::concat("dtype ", c10::toString(t),
                                                   " is not supported: use float32, float64 or bfloat16"));
}

at::ScalarType to_torch(laga::DType t) {
  switch (t) {
    case laga::DType::F32: return at::kFloat;
    case laga::DType::F64: return at::kDouble;
    case laga::DType::BF16: return at::kBFloat16;
  }
  return at::kFloat;
}

void* TorchAllocator::raw_allocate(std::size_t bytes) {
  if (device_.is_cuda()) {
#ifdef LAGA_HAVE_CUDA
    try {
      return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, static_cast<cudaStream_t>(stream_));
    } catch (const c10::OutOfMemoryError&) {
      return nullptr;  // the base class reports it with the tensor's name
    }
#else
    throw laga::InvalidArgument("a CUDA tensor reached laga's extension, which was built without CUDA");
#endif
  }
  return c10::GetCPUAllocator()->raw_allocate(bytes);
}

void TorchAllocator::raw_free(void* ptr) {
  if (device_.is_cuda()) {
#ifdef LAGA_HAVE_CUDA
    c10::cuda::CUDACachingAllocator::raw_delete(ptr);
#endif
    return;
  }
  c10::GetCPUAllocator()->raw_deallocate(ptr);
}

laga::Tensor BorrowingAllocator::borrow(const at::Tensor& t, const std::string& name) {
  LAGA_CHECK(t.is_contiguous(), name, " must be contiguous");
  next_ = t.data_ptr();
  laga::Shape shape(t.sizes().begin(), t.sizes().end());
  return laga::Tensor(*this, to_laga(t.scalar_type()), std::move(shape), name, laga::MemoryKind::External);
}

void* BorrowingAllocator::raw_allocate(std::size_t) {
  void* p = next_;
  next_ = nullptr;
  return p;
}

at::Tensor as_torch(const laga::Tensor& t, c10::Device device, std::shared_ptr<void> keep_alive) {
  auto holder = std::make_shared<laga::Tensor>(t);
  std::vector<int64_t> sizes(t.shape().begin(), t.shape().end());
  return at::from_blob(
      t.data(), sizes, [holder, keep_alive](void*) mutable { holder.reset(); keep_alive.reset(); },
      at::TensorOptions().dtype(to_torch(t.dtype())).device(device));
}

}  // namespace laga_torch
