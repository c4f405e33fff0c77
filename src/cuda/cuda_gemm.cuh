// Row-major strided-batched GEMM through cuBLASLt, for the backend's gemm op and for the eager attention.
//
// cuBLASLt is column-major; a row-major [r, c] matrix with leading dimension ld is the column-major [c, r]
// matrix with the same ld, so C = op(A) op(B) (row-major) is computed as C^T = op(B)^T op(A)^T
// (column-major): the usual swap of A and B. Compute is plain fp32 (CUBLAS_COMPUTE_32F: no TF32), A and B
// share one element type, C/D may be wider (bf16 inputs with an fp32 score matrix).
//
// One handle and one workspace per runner; the heuristic's choice is cached per problem (shape, strides,
// types and pointer alignments), so a problem always runs the same algorithm and results are reproducible.
// Problems cuBLASLt has no algorithm for (a batch stride it rejects, say) run batch by batch, and failing
// that through a plain tiled kernel.
#pragma once

#include <map>
#include <tuple>

#include "cuda/cuda_common.cuh"

namespace laga::cuda {

struct MatmulArgs {
  cudaDataType_t ab_type = CUDA_R_32F;  // element type of A and B
  cudaDataType_t c_type = CUDA_R_32F;   // element type of C (= D)
  Trans trans_a = Trans::No, trans_b = Trans::No;
  i64 m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;  // [m, k] (or [k, m] when trans_a), row-major; stride 0 broadcasts
  i64 lda = 0, stride_a = 0;
  const void* b = nullptr;  // [k, n] (or [n, k] when trans_b)
  i64 ldb = 0, stride_b = 0;
  void* c = nullptr;  // [m, n]; not read when beta == 0
  i64 ldc = 0, stride_c = 0;
  float alpha = 1.f, beta = 0.f;
};

cudaDataType_t cuda_data_type(DType);

class GemmRunner {
 public:
  explicit GemmRunner(cudaStream_t stream);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  void run(const MatmulArgs&);
  // Later problems run on `stream` (the handle, workspace and chosen algorithms kept): the caller orders it
  // after the work queued on the old one, which may still use the workspace.
  void set_stream(cudaStream_t stream) { stream_ = stream; }

  // How problems were run so far (for tests and reports).
  struct Counts {
    long lt_batched = 0, lt_per_batch = 0, fallback = 0;
  };
  const Counts& counts() const { return counts_; }

 private:
  enum class Path { lt_batched, lt_per_batch, fallback };
  struct Plan {
    Path path = Path::fallback;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int, int, int, int, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, unsigned, unsigned,
                         unsigned>;

  Plan plan_for(const MatmulArgs&, const Key&);
  bool find_algo(const MatmulArgs&, i64 batch, cublasLtMatmulAlgo_t* algo);
  void run_lt(const MatmulArgs&, i64 batch, const cublasLtMatmulAlgo_t& algo);
  void run_fallback(const MatmulArgs&);

  cudaStream_t stream_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::size_t workspace_bytes_ = 0;
  std::map<Key, Plan> cache_;
  Counts counts_;
};

}  // namespace laga::cuda
