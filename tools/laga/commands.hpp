// The CLI's subcommands. Each registers its options on a CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace laga::cli {

// Registers the subcommand; the returned function runs it and returns the process exit code.
std::function<int()> add_demo(CLI::App& app, CLI::App*& sub);
std::function<int()> add_plan(CLI::App& app, CLI::App*& sub);
std::function<int()> add_run(CLI::App& app, CLI::App*& sub, int* argc, char*** argv);
std::function<int()> add_bench(CLI::App& app, CLI::App*& sub);
std::function<int()> add_bench_attention(CLI::App& app, CLI::App*& sub);

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitInvalidInput = 2;
inline constexpr int kExitRuntimeError = 3;

}  // namespace laga::cli
