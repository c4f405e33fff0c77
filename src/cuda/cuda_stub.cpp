// Built instead of src/cuda/*.cu when nvcc was not found at configure time: the same entry points, so
// dependents link the same `laga_cuda` target, and a clear error when the backend is asked for.
#include "laga/cuda.hpp"

#include "laga/errors.hpp"

namespace laga {

bool cuda_available() { return false; }

int cuda_device_count() { return 0; }

std::unique_ptr<Backend> make_cuda_backend(int /*device*/) {
  throw InvalidArgument("laga was built without CUDA");
}

}  // namespace laga
