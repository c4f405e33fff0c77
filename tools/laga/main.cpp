// laga: the command-line front end. A thin layer over the library: parse, run a subcommand, map errors to
// exit codes (2 bad input, 3 runtime failure, 1 failed check).
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "laga/errors.hpp"
#include "laga/mpi_comm.hpp"

int main(int argc, char** argv) {
  using namespace laga::cli;
  CLI::App app{
      "laga: Multi-head Latent Attention under sequence parallelism -- the explicit, absorbed and LAGA forms,\n"
      "forward and backward, with their memory, communication and time measured.\n"
      "Without a subcommand, runs the demo."};
  app.require_subcommand(0, 1);
  CLI::App* demo = nullptr;
  CLI::App* run = nullptr;
  auto run_demo = add_demo(app, demo);
  auto run_run = add_run(app, run, &argc, &argv);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitInvalidInput;
  }
  int rank = 0;
  try {
    if (run->parsed()) return run_run();
    return run_demo();
  } catch (const laga::InvalidArgument& e) {
    std::fprintf(stderr, "laga: error: %s\n", e.what());
    return kExitInvalidInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "laga: failure%s: %s\n", rank ? " on a rank" : "", e.what());
    // A rank that fails alone may leave the others inside a collective: end them all.
    if (run->parsed()) laga::MpiSession::abort(kExitRuntimeError);
    return kExitRuntimeError;
  }
}
