// The block's conformance suite (tests/conformance/block_conformance.hpp) on real MPI ranks (mpirun -np 2,
// 4, 8; tests/mpi/CMakeLists.txt), CPU backends: every rank runs every test. Each layout at S = 8P, batch 2,
// every variant, in float32 with every kernel and in float64 with the fused one, blocking and with
// collectives under compute; and bad input refused on every rank with the same message before any collective.
// A rank that throws where the others would wait in a collective aborts the job instead of hanging.
// main() is in test_mpi_comm.cpp; its exit code is the AND over ranks.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>

#include "conformance/block_conformance.hpp"
#include "laga/mpi_comm.hpp"

namespace laga::conformance {
namespace {

class MpiRanks final : public Ranks {
 public:
  std::string name() const override { return "mpi"; }
  int size(int) const override {
    static const int size = make_mpi_communicator()->size();
    return size;
  }
  void run(int size, const std::function<void(int, Communicator&)>& fn) override {
    auto comm = make_mpi_communicator();
    if (comm->size() != size) throw std::logic_error("an MPI case runs on the job's ranks");
    try {
      fn(comm->rank(), *comm);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] %s; aborting every rank\n", comm->rank(), e.what());
      std::fflush(nullptr);
      MpiSession::abort(1);
    }
  }
};

// float32 against float64: rounding is 6e-8 per operation and the forms and P only reorder sums, ~1e-6
// relative; float64 ~1e-15. A mis-routed chunk or a missing rank's gradient is O(1e-1..1).
double cpu_tolerance(DType t) { return t == DType::F64 ? 1e-10 : 1e-5; }

std::shared_ptr<const Suite> cpu_mpi() {
  static const auto suite = std::make_shared<const Suite>(Suite{
      .platform = Platform{.name = "cpu", .make_backend = [](int) { return make_cpu_backend(); },
                           .tolerance = cpu_tolerance},
      .ranks = std::make_shared<MpiRanks>()});
  return suite;
}

INSTANTIATE_TEST_SUITE_P(Mpi, BlockConformance,
                         testing::ValuesIn(every_layout(cpu_mpi(), {Case{.dtype = DType::F32}, Case{.dtype = DType::F64, .kernel = AttentionKernel::Fused}})),
                         param_name);

INSTANTIATE_TEST_SUITE_P(Mpi, BlockRefusals, testing::Values(Param{cpu_mpi(), Case{}}), param_name);

}  // namespace
}  // namespace laga::conformance
