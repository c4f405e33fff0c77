// laga: the command-line front end. A thin layer over the library: parse, run a subcommand, map errors to
// exit codes (2 bad input, 3 runtime failure, 1 failed check).
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "commands.hpp"
#include "laga/errors.hpp"
#include "laga/mpi_comm.hpp"

namespace {
// True when a launcher started this process as one rank of several (OpenMPI, PMIx, MPICH/Hydra).
bool launched_by_mpirun() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(var)) return true;
  return false;
}
// This process's rank as the launcher numbered it (0 when not launched by one).
int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(var)) return std::atoi(v);
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  using namespace laga::cli;
  CLI::App app{
      "laga: Multi-head Latent Attention under sequence parallelism -- the explicit, absorbed and LAGA forms,\n"
      "forward and backward, with their memory, communication and time measured.\n"
      "Without a subcommand, runs the demo."};
  app.require_subcommand(0, 1);
  CLI::App* demo = nullptr;
  CLI::App* run = nullptr;
  CLI::App* plan = nullptr;
  CLI::App* bench = nullptr;
  CLI::App* bench_attention = nullptr;
  auto run_demo = add_demo(app, demo);
  auto run_plan = add_plan(app, plan);
  auto run_run = add_run(app, run, &argc, &argv);
  auto run_bench = add_bench(app, bench);
  auto run_bench_attention = add_bench_attention(app, bench_attention);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    if (code == 0) return kExitOk;  // --help
    // Under mpirun every rank prints the same complaint; wait until all have before exiting, since mpirun
    // kills the remaining ranks as soon as one exits with a non-zero code.
    if (launched_by_mpirun()) {
      std::fflush(nullptr);
      laga::MpiSession session(&argc, &argv);
      laga::mpi_all_ok(false);
    }
    return kExitInvalidInput;
  }
  const int code = [&] {
  try {
    if (run->parsed()) return run_run();
    // demo, plan and bench are one-process commands (bench's ranks are threads or phantoms): started under
    // mpirun, rank 0 runs them and the other ranks leave, so the report prints once.
    if (launched_by_mpirun() && launcher_rank() != 0) return kExitOk;
    if (plan->parsed()) return run_plan();
    if (bench->parsed()) return run_bench();
    if (bench_attention->parsed()) return run_bench_attention();
    return run_demo();
  } catch (const laga::InvalidArgument& e) {
    std::fprintf(stderr, "laga: error: %s\n", e.what());
    return kExitInvalidInput;
  } catch (const std::exception& e) {
    // Under mpirun with P > 1, `laga run` handles its own failures (every rank refuses bad input before
    // any collective; a later failure ends all ranks with MpiSession::abort). What arrives here ran
    // on this process alone.
    std::fprintf(stderr, "laga: failure: %s\n", e.what());
    return kExitRuntimeError;
  }
  }();
  // What was printed must have reached its destination (a full disk is a failure, not a success).
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "laga: failure: writing the standard output failed\n");
    return code == kExitOk ? kExitRuntimeError : code;
  }
  return code;
}
