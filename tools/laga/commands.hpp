// The CLI's subcommands. Each registers its options on a CLI11 app and runs when chosen.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "laga/bench.hpp"

namespace laga::cli {

// Registers the subcommand; the returned function runs it and returns the process exit code.
std::function<int()> add_demo(CLI::App& app, CLI::App*& sub);
std::function<int()> add_plan(CLI::App& app, CLI::App*& sub);
std::function<int()> add_run(CLI::App& app, CLI::App*& sub, int* argc, char*** argv);
std::function<int()> add_bench(CLI::App& app, CLI::App*& sub);
std::function<int()> add_bench_attention(CLI::App& app, CLI::App*& sub);

// The alpha-beta model's parameters on the command line (laga plan, laga bench); defaults as
// default_time_model().
struct TimeModelOptions {
  int node_size = 8;
  double nvlink_gbs = 450, ib_gbs = 50, nvlink_latency_us = 2, ib_latency_us = 5;
};
inline void add_time_model_options(CLI::App* sub, TimeModelOptions& o) {
  sub->add_option("--node-size", o.node_size, "Model: GPUs a node")->capture_default_str();
  sub->add_option("--nvlink-gbs", o.nvlink_gbs, "Model: NVLink GB/s per GPU per direction")->capture_default_str();
  sub->add_option("--ib-gbs", o.ib_gbs, "Model: InfiniBand GB/s per GPU per direction (50 = 400 Gb/s)")
      ->capture_default_str();
  sub->add_option("--nvlink-latency-us", o.nvlink_latency_us, "Model: NVLink latency a step, us")->capture_default_str();
  sub->add_option("--ib-latency-us", o.ib_latency_us, "Model: InfiniBand latency a step, us")->capture_default_str();
}
// The model of these options; throws InvalidArgument (validate) for non-positive sizes or bandwidths.
inline laga::TimeModel time_model_of(const TimeModelOptions& o) {
  laga::TimeModel m = laga::default_time_model();
  m.node_size = o.node_size;
  m.intra.bandwidth = o.nvlink_gbs * 1e9;
  m.inter.bandwidth = o.ib_gbs * 1e9;
  m.intra.latency = o.nvlink_latency_us / 1e6;
  m.inter.latency = o.ib_latency_us / 1e6;
  laga::validate(m);
  return m;
}

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitInvalidInput = 2;
inline constexpr int kExitRuntimeError = 3;

}  // namespace laga::cli
