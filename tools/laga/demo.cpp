// `laga` / `laga demo`: an embedded small model, every form, kernel and layout side by side, on this machine
// (P ranks as threads of one process, the CPU backend).
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>

#include "commands.hpp"
#include "format.hpp"
#include "laga/problem.hpp"

namespace laga::cli {
namespace {

struct DemoOptions {
  std::string model = "small";
  std::int64_t seq = 256;
  std::int64_t batch = 2;
  int sp = 4;
  std::string dtype = "float32";
  std::uint64_t seed = 1;
};

std::size_t total_sent(const RankRun& r) {
  std::size_t b = 0;
  for (const auto& c : r.traffic) b += c.bytes_sent;
  return b;
}

int run_demo(const DemoOptions& o) {
  const MlaConfig cfg = resolve_model(o.model);
  const DType dtype = parse_dtype(o.dtype);
  std::printf("laga demo: model '%s' (d=%ld, n_h=%ld, q_lora_rank=%s, kv_lora_rank=%ld, d_qk=%ld, d_v=%ld)\n",
              cfg.name.c_str(), cfg.hidden_size, cfg.num_attention_heads,
              cfg.q_lora_rank ? std::to_string(*cfg.q_lora_rank).c_str() : "null", cfg.kv_lora_rank, cfg.qk_head_dim(),
              cfg.v_head_dim);
  std::printf("S=%ld tokens, batch %ld, %s, CPU backend (OpenBLAS), P=%d ranks as threads of this process\n\n",
              long(o.seq), long(o.batch), dtype_name(dtype), o.sp);

  const auto t0 = std::chrono::steady_clock::now();
  for (Layout layout : {Layout::A2A, Layout::AllGather, Layout::P2P}) {
    if (layout == Layout::P2P && o.seq % (2 * o.sp) != 0) continue;  // the ring needs S in 2P chunks
    std::printf("layout %s:\n", layout_name(layout));
    Table table({"form", "kernel", "err y", "err grads", "saved/rank", "vs explicit", "peak fwd", "peak bwd",
                 "sent/rank", "fwd ms", "bwd ms"},
                2);
    for (AttentionKernel kernel : kAllKernels) {
      if (layout == Layout::P2P && kernel != AttentionKernel::Fused) continue;  // the ring: fused only
      auto ref_backend = make_cpu_backend();
      const GlobalResult ref = reference_result(cfg, dtype, kernel, o.batch, o.seq, *ref_backend, o.seed);
      double explicit_saved = 0;
      for (const Variant& v : variants_for(layout)) {
        const BlockOptions opts = with_variant({.layout = layout, .kernel = kernel, .dtype = dtype}, v);
        GroupRun g = run_thread_group(cfg, opts, o.batch, o.seq, o.sp, o.seed);
        const RankRun& r0 = g.ranks[0];
        std::vector<Comparison> errs = compare(g.result, ref);
        double grad_err = 0;
        for (std::size_t i = 1; i < errs.size(); ++i) grad_err = std::max(grad_err, errs[i].rel_error);
        if (v.form == Form::Explicit) explicit_saved = double(r0.saved_bytes);
        double fwd_s = 0, bwd_s = 0;
        for (const auto& r : g.ranks) {
          fwd_s = std::max(fwd_s, r.fwd.total_seconds());
          bwd_s = std::max(bwd_s, r.bwd.total_seconds());
        }
        table.add({v.label(), kernel_name(kernel), fmt("%.1e", errs[0].rel_error), fmt("%.1e", grad_err),
                   human_bytes(double(r0.saved_bytes)), fmt("%+.1f%%", 100.0 * (r0.saved_bytes / explicit_saved - 1)),
                   human_bytes(double(r0.fwd.peak_bytes)), human_bytes(double(r0.bwd.peak_bytes)),
                   human_bytes(double(total_sent(r0))), fmt("%.1f", 1e3 * fwd_s), fmt("%.1f", 1e3 * bwd_s)});
      }
    }
    table.print();
    std::printf("\n");
  }
  std::printf(
      "err: relative Frobenius error of the output y and (max over) dx and every weight gradient, summed over ranks,\n"
      "     against the single-rank explicit result with the same kernel.\n"
      "saved/rank: activation bytes kept from forward to backward on rank 0 (inputs and weights excluded);\n"
      "peak: highest live activation bytes during the pass; sent/rank: bytes rank 0 sent, forward + backward;\n"
      "times: slowest rank, host clock (ranks share this machine's %u cores, so they measure correctness, not speed).\n"
      "demo took %.1f s. `laga run --help` runs one configuration, under mpirun for real ranks.\n",
      std::thread::hardware_concurrency(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return kExitOk;
}

}  // namespace

std::function<int()> add_demo(CLI::App& app, CLI::App*& sub) {
  auto o = std::make_shared<DemoOptions>();
  sub = app.add_subcommand("demo", "Embedded small model: every form, kernel and layout side by side (the default)");
  sub->add_option("--model", o->model, "Preset name or path to a config.json")->capture_default_str();
  sub->add_option("--seq", o->seq, "Sequence length S")->capture_default_str();
  sub->add_option("--batch", o->batch, "Micro-batch size")->capture_default_str();
  sub->add_option("--sp", o->sp, "Sequence-parallel ranks (threads of this process)")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "float32 or float64")->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed of the deterministic weights and inputs")->capture_default_str();
  return [o] { return run_demo(*o); };
}

}  // namespace laga::cli
