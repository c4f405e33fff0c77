// The block's conformance suite (tests/conformance/block_conformance.hpp) on CUDA backends, against the CPU
// float64 result of the explicit form:
//   CudaBlock        P = 1, the single-rank communicator (moves data with Backend::copy on the device):
//                    `tiny`, `small` and DeepSeek-V3's head dims (the tensor-core kernels), float32 and bf16
//   CudaHostStaging  P = 2 and 4 ranks as threads sharing the GPU, each with its own CUDA backend, host
//                    staging over the thread group (what MPI ranks on one GPU do, without mpirun)
//   CudaNccl         P = 1 through NCCL (a communicator of one rank)
// Each skips without a GPU (or, CudaNccl, without NCCL). Each error is printed as a GPUCHECK line.
#include <gtest/gtest.h>

#include "conformance/block_conformance.hpp"
#include "laga/cuda.hpp"
#include "laga/measure.hpp"
#include "laga/nccl_comm.hpp"

namespace laga::conformance {
namespace {

// Tolerances of the whole block (forward and every gradient) against float64, set from the errors measured
// on an H200 (scripts/gpu.sh check) with a margin of about 10x for f32 and 3x for bf16. f32: fp32 arithmetic
// everywhere (no TF32), at most 9e-7 measured. bf16: every intermediate is stored in bf16 (relative rounding
// up to 2^-9 per store, compounding over ~30 ops), at most 1.1e-2 measured.
double cuda_tolerance(DType t) { return t == DType::BF16 ? 3e-2 : 1e-5; }

std::string no_gpu() { return cuda_available() ? "" : "no usable CUDA device (or built without CUDA)"; }

Platform cuda_platform(const std::string& name, GpuComm comm) {
  return Platform{
      .name = name,
      .unavailable =
          [comm] {
            if (comm == GpuComm::Nccl && !nccl_available()) return std::string("laga was built without NCCL");
            return no_gpu();
          },
      .make_backend = [](int) { return make_cuda_backend(0); },
      .make_comm = [comm](Communicator& host, Backend& gpu) { return make_gpu_communicator(comm, host, gpu); },
      .tolerance = cuda_tolerance,
      // The CUDA allocator's peaks are not compared with the plan (no test has held them to it yet).
      .plan_exact = false,
      .report = true};
}

std::shared_ptr<const Suite> suite(const std::string& name, GpuComm comm) {
  return std::make_shared<const Suite>(Suite{.platform = cuda_platform(name, comm), .ranks = thread_ranks()});
}

std::vector<Param> single_cases() {
  std::vector<Case> shapes;
  for (DType t : {DType::F32, DType::BF16}) {
    shapes.push_back({.config = "tiny", .ranks = 1, .dtype = t, .seq = 16});
    shapes.push_back({.config = "small", .ranks = 1, .dtype = t, .seq = 32});
    shapes.push_back({.config = "mla_dims", .ranks = 1, .dtype = t, .seq = 32});
  }
  return every_layout(suite("cuda", GpuComm::Single), shapes);
}

const std::shared_ptr<const Suite>& staging() {
  static const auto s = suite("cuda_host_staging", GpuComm::HostStaging);
  return s;
}
std::vector<Param> staging_cases() {
  std::vector<Case> shapes;
  for (DType t : {DType::F32, DType::BF16})
    for (int P : {2, 4}) shapes.push_back({.config = "tiny", .ranks = P, .dtype = t, .seq = 64});
  return every_layout(staging(), shapes);
}

std::vector<Param> nccl_cases() {
  std::vector<Case> shapes;
  for (DType t : {DType::F32, DType::BF16}) shapes.push_back({.config = "tiny", .ranks = 1, .dtype = t, .seq = 64});
  return every_layout(suite("cuda_nccl", GpuComm::Nccl), shapes);
}

INSTANTIATE_TEST_SUITE_P(CudaBlock, BlockConformance, testing::ValuesIn(single_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(CudaHostStaging, BlockConformance, testing::ValuesIn(staging_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(CudaNccl, BlockConformance, testing::ValuesIn(nccl_cases()), param_name);
INSTANTIATE_TEST_SUITE_P(CudaHostStaging, BlockRefusals,
                         testing::Values(Param{staging(), Case{.ranks = 2, .dtype = DType::BF16}}), param_name);

}  // namespace
}  // namespace laga::conformance
