#include "cuda/cuda_gemm.cuh"

#include <cstdint>

namespace laga::cuda {
namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;  // cuBLASLt's recommendation for Hopper is 32 MiB

std::size_t element_size(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF: return 2;
    case CUDA_R_64F: return 8;
    default: return 0;
  }
}

// Largest power of two (<= 256) dividing the address of every batch's matrix: what cuBLASLt's heuristic is
// told to assume (its default of 256 would let it pick kernels that fault on views into wider rows).
unsigned alignment_of(const void* p, i64 stride_elements, std::size_t esize, i64 batch) {
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  unsigned a = 256;
  while (a > 1 && (addr % a) != 0) a >>= 1;
  if (batch > 1 && stride_elements != 0) {
    const auto bytes = static_cast<std::uint64_t>(stride_elements < 0 ? -stride_elements : stride_elements) * esize;
    while (a > 1 && (bytes % a) != 0) a >>= 1;
  }
  return a;
}

// RAII owners of the cuBLASLt descriptors of one call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtDescs() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

void make_layout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, i64 rows, i64 cols, i64 ld, i64 batch,
                 i64 stride) {
  LAGA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(layout, type, static_cast<std::uint64_t>(rows),
                                               static_cast<std::uint64_t>(cols), ld));
  if (batch > 1) {
    const std::int32_t count = static_cast<std::int32_t>(batch);
    const std::int64_t offset = stride;
    LAGA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                       sizeof(count)));
    LAGA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                       &offset, sizeof(offset)));
  }
}

// The column-major problem: Lt's A is our B, Lt's B is our A, D = C is [n, m] column-major.
void make_descs(const MatmulArgs& g, i64 batch, std::size_t workspace_bytes, LtDescs& d) {
  LAGA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = g.trans_b == Trans::Yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_a == Trans::Yes ? CUBLAS_OP_T : CUBLAS_OP_N;
  LAGA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  LAGA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  const bool tb = g.trans_b == Trans::Yes, ta = g.trans_a == Trans::Yes;
  make_layout(&d.a, g.ab_type, tb ? g.k : g.n, tb ? g.n : g.k, g.ldb, batch, g.stride_b);
  make_layout(&d.b, g.ab_type, ta ? g.m : g.k, ta ? g.k : g.m, g.lda, batch, g.stride_a);
  make_layout(&d.c, g.c_type, g.n, g.m, g.ldc, batch, g.stride_c);

  LAGA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&d.pref));
  const std::uint64_t ws = workspace_bytes;
  LAGA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                         sizeof(ws)));
  const std::size_t es_ab = element_size(g.ab_type), es_c = element_size(g.c_type);
  const std::uint32_t align_a = alignment_of(g.b, g.stride_b, es_ab, batch);
  const std::uint32_t align_b = alignment_of(g.a, g.stride_a, es_ab, batch);
  const std::uint32_t align_c = alignment_of(g.c, g.stride_c, es_c, batch);
  LAGA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                         &align_a, sizeof(align_a)));
  LAGA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                         &align_b, sizeof(align_b)));
  LAGA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                         &align_c, sizeof(align_c)));
  LAGA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                         &align_c, sizeof(align_c)));
}

// ---------------------------------------------------------------- fallback kernel
// One thread per output element, op(A) and op(B) tiles through shared memory, fp32 accumulation.
constexpr int kFallbackTile = 16;
constexpr int kMaxGridZ = 65535;

template <typename TAB, typename TC>
__global__ void __launch_bounds__(kFallbackTile * kFallbackTile)
    gemm_fallback_kernel(MatmulArgs p, i64 batch0) {
  __shared__ float tile_a[kFallbackTile][kFallbackTile + 1];  // op(A)[row][k]
  __shared__ float tile_b[kFallbackTile][kFallbackTile + 1];  // op(B)[k][col]
  const i64 bi = batch0 + blockIdx.z;
  const TAB* a = static_cast<const TAB*>(p.a) + bi * p.stride_a;
  const TAB* b = static_cast<const TAB*>(p.b) + bi * p.stride_b;
  TC* c = static_cast<TC*>(p.c) + bi * p.stride_c;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const i64 row = i64(blockIdx.y) * kFallbackTile + ty;
  const i64 col = i64(blockIdx.x) * kFallbackTile + tx;
  const bool ta = p.trans_a == Trans::Yes, tb = p.trans_b == Trans::Yes;
  float acc = 0.f;
  for (i64 k0 = 0; k0 < p.k; k0 += kFallbackTile) {
    const i64 ka = k0 + tx, kb = k0 + ty;
    tile_a[ty][tx] = (row < p.m && ka < p.k) ? to_float(ta ? a[ka * p.lda + row] : a[row * p.lda + ka]) : 0.f;
    tile_b[ty][tx] = (kb < p.k && col < p.n) ? to_float(tb ? b[col * p.ldb + kb] : b[kb * p.ldb + col]) : 0.f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kFallbackTile; ++kk) acc = fmaf(tile_a[ty][kk], tile_b[kk][tx], acc);
    __syncthreads();
  }
  if (row < p.m && col < p.n) {
    TC* out = c + row * p.ldc + col;
    float v = p.alpha * acc;
    if (p.beta != 0.f) v = fmaf(p.beta, to_float(*out), v);
    *out = from_float<TC>(v);
  }
}

template <typename TAB, typename TC>
void launch_fallback(const MatmulArgs& g, cudaStream_t stream) {
  const dim3 block(kFallbackTile, kFallbackTile);
  const i64 tiles_n = (g.n + kFallbackTile - 1) / kFallbackTile, tiles_m = (g.m + kFallbackTile - 1) / kFallbackTile;
  LAGA_REQUIRE(tiles_m <= 65535, "gemm: m = ", g.m, " is too large for the fallback kernel");
  for (i64 b0 = 0; b0 < g.batch; b0 += kMaxGridZ) {
    const i64 nb = g.batch - b0 < kMaxGridZ ? g.batch - b0 : kMaxGridZ;
    const dim3 grid(static_cast<unsigned>(tiles_n), static_cast<unsigned>(tiles_m), static_cast<unsigned>(nb));
    gemm_fallback_kernel<TAB, TC><<<grid, block, 0, stream>>>(g, b0);
    LAGA_CUDA_CHECK_LAUNCH("gemm_fallback_kernel");
  }
}

}  // namespace

cudaDataType_t cuda_data_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F64: return CUDA_R_64F;
  }
  return CUDA_R_32F;
}

GemmRunner::GemmRunner(cudaStream_t stream) : stream_(stream) {
  LAGA_CUBLAS_CHECK(cublasLtCreate(&handle_));
  LAGA_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
  workspace_bytes_ = kWorkspaceBytes;
}

GemmRunner::~GemmRunner() {
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

bool GemmRunner::find_algo(const MatmulArgs& g, i64 batch, cublasLtMatmulAlgo_t* algo) {
  LtDescs d;
  make_descs(g, batch, workspace_bytes_, d);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle_, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &returned);
  if (st != CUBLAS_STATUS_SUCCESS || returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) return false;
  *algo = result.algo;
  return true;
}

GemmRunner::Plan GemmRunner::plan_for(const MatmulArgs& g, const Key& key) {
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  Plan plan;
  if (g.k == 0) {
    plan.path = Path::fallback;  // C = beta C; cuBLASLt is not asked about an empty reduction
  } else if (find_algo(g, g.batch, &plan.algo)) {
    plan.path = Path::lt_batched;
  } else if (g.batch > 1 && find_algo(g, 1, &plan.algo)) {
    plan.path = Path::lt_per_batch;
  } else {
    plan.path = Path::fallback;
  }
  cache_.emplace(key, plan);
  return plan;
}

void GemmRunner::run_lt(const MatmulArgs& g, i64 batch, const cublasLtMatmulAlgo_t& algo) {
  LtDescs d;
  make_descs(g, batch, workspace_bytes_, d);
  LAGA_CUBLAS_CHECK(cublasLtMatmul(handle_, d.op, &g.alpha, g.b, d.a, g.a, d.b, &g.beta, g.c, d.c, g.c, d.c, &algo,
                                   workspace_, workspace_bytes_, stream_));
}

void GemmRunner::run_fallback(const MatmulArgs& g) {
  if (g.ab_type == CUDA_R_32F && g.c_type == CUDA_R_32F) return launch_fallback<float, float>(g, stream_);
  if (g.ab_type == CUDA_R_16BF && g.c_type == CUDA_R_16BF) return launch_fallback<bf16, bf16>(g, stream_);
  if (g.ab_type == CUDA_R_16BF && g.c_type == CUDA_R_32F) return launch_fallback<bf16, float>(g, stream_);
  LAGA_CHECK(false, "gemm: no fallback kernel for element types ", int(g.ab_type), " -> ", int(g.c_type));
}

void GemmRunner::run(const MatmulArgs& g) {
  LAGA_REQUIRE(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0, "gemm: negative size (m ", g.m, ", n ", g.n,
               ", k ", g.k, ", batch ", g.batch, ")");
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  const bool ta = g.trans_a == Trans::Yes, tb = g.trans_b == Trans::Yes;
  LAGA_REQUIRE(g.lda >= (ta ? g.m : g.k) && g.lda >= 1, "gemm: lda = ", g.lda, " < ", ta ? g.m : g.k);
  LAGA_REQUIRE(g.ldb >= (tb ? g.k : g.n) && g.ldb >= 1, "gemm: ldb = ", g.ldb, " < ", tb ? g.k : g.n);
  LAGA_REQUIRE(g.ldc >= g.n, "gemm: ldc = ", g.ldc, " < n = ", g.n);
  LAGA_REQUIRE(g.a && g.b && g.c, "gemm: a, b and c must be set");
  LAGA_REQUIRE(g.batch <= INT32_MAX, "gemm: batch = ", g.batch, " exceeds cuBLASLt's int32 batch count");
  const std::size_t es_ab = element_size(g.ab_type), es_c = element_size(g.c_type);
  const Key key{int(g.ab_type), int(g.c_type), int(g.trans_a), int(g.trans_b), g.m, g.n, g.k, g.batch, g.lda,
                g.ldb, g.ldc, g.stride_a, g.stride_b, g.stride_c, alignment_of(g.a, g.stride_a, es_ab, g.batch),
                alignment_of(g.b, g.stride_b, es_ab, g.batch), alignment_of(g.c, g.stride_c, es_c, g.batch)};
  const Plan plan = plan_for(g, key);
  switch (plan.path) {
    case Path::lt_batched:
      ++counts_.lt_batched;
      run_lt(g, g.batch, plan.algo);
      return;
    case Path::lt_per_batch: {
      ++counts_.lt_per_batch;
      for (i64 i = 0; i < g.batch; ++i) {
        MatmulArgs one = g;
        one.batch = 1;
        one.a = static_cast<const char*>(g.a) + i * g.stride_a * static_cast<i64>(es_ab);
        one.b = static_cast<const char*>(g.b) + i * g.stride_b * static_cast<i64>(es_ab);
        one.c = static_cast<char*>(g.c) + i * g.stride_c * static_cast<i64>(es_c);
        run_lt(one, 1, plan.algo);
      }
      return;
    }
    case Path::fallback:
      ++counts_.fallback;
      run_fallback(g);
      return;
  }
}

}  // namespace laga::cuda
