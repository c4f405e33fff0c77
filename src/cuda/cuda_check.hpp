// The CUDA backend's one header of check macros, host code only (so plain .cpp files such as the NCCL and
// host-staging communicators use the same ones as the .cu files).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "laga/errors.hpp"

// A failed call throws RuntimeError naming the call, the file and line, and the error's name and text.
#define LAGA_CUDA_CHECK(expr)                                                                         \
  do {                                                                                                \
    const cudaError_t laga_err_ = (expr);                                                             \
    if (laga_err_ != cudaSuccess)                                                                     \
      throw ::laga::RuntimeError(::laga::detail::concat(__FILE__, ":", __LINE__, ": ", #expr, " failed: ", \
                                                        cudaGetErrorName(laga_err_), " (",            \
                                                        cudaGetErrorString(laga_err_), ")"));         \
  } while (0)

#define LAGA_CUBLAS_CHECK(expr)                                                                       \
  do {                                                                                                \
    const cublasStatus_t laga_st_ = (expr);                                                           \
    if (laga_st_ != CUBLAS_STATUS_SUCCESS)                                                            \
      throw ::laga::RuntimeError(::laga::detail::concat(__FILE__, ":", __LINE__, ": ", #expr,         \
                                                        " failed: cublas status ", int(laga_st_), " (", \
                                                        cublasLtGetStatusString(laga_st_), ")"));     \
  } while (0)

// After every kernel launch: a bad configuration (too much shared memory, grid too large) shows here.
#define LAGA_CUDA_CHECK_LAUNCH(name)                                                                  \
  do {                                                                                                \
    const cudaError_t laga_err_ = cudaGetLastError();                                                 \
    if (laga_err_ != cudaSuccess)                                                                     \
      throw ::laga::RuntimeError(::laga::detail::concat(__FILE__, ":", __LINE__, ": launch of ", name, \
                                                        " failed: ", cudaGetErrorName(laga_err_), " (", \
                                                        cudaGetErrorString(laga_err_), ")"));         \
  } while (0)
