// `laga plan`: memory, traffic and FLOPs per rank for any configuration, at any size, in well under a
// second (the block's own orchestration on the meta backend; see include/laga/plan.hpp).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "format.hpp"
#include "laga/errors.hpp"
#include "laga/plan.hpp"

namespace laga::cli {
namespace {

struct PlanOptions {
  std::string model = "deepseek-v3";
  std::vector<std::string> seq{"16384"};
  std::vector<std::string> sp{"8"};
  std::int64_t batch = 1;
  std::string layout = "a2a", kernel = "fused", dtype = "bfloat16";
  int layers = 1;
  std::string gpu_mem;
  bool json = false;
  bool kv_grad_reduce_fp32 = false;
  std::string out;
};

nlohmann::json to_json(const RankPlan& p, const DeviceFit& fit) {
  nlohmann::json saved = nlohmann::json::array();
  for (const auto& t : p.saved) saved.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"bytes", t.bytes}});
  nlohmann::json traffic = nlohmann::json::array();
  for (const auto& c : p.traffic)
    traffic.push_back({{"phase", phase_name(c.phase)}, {"collective", collective_name(c.kind)}, {"tensor", c.tensor},
                       {"calls", c.calls}, {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received}});
  auto flops = [](const PassStats& s) {
    nlohmann::json j;
    for (int i = 0; i < kOpPhaseCount; ++i) j[op_phase_name(OpPhase(i))] = s.flops[i];
    return j;
  };
  return {{"saved_bytes", p.saved_bytes}, {"peak_forward_bytes", p.peak_forward}, {"peak_backward_bytes", p.peak_backward},
          {"bytes_sent", p.bytes_sent()}, {"bytes_received", p.bytes_received()}, {"saved", saved}, {"traffic", traffic},
          {"flops_forward", flops(p.fwd)}, {"flops_backward", flops(p.bwd)},
          {"device", {{"activation_peak_bytes", fit.activation_peak}, {"weights_and_grads_bytes", fit.weights_and_grads},
                      {"total_bytes", fit.total()}}}};
}

int run_plan(const PlanOptions& o) {
  const MlaConfig cfg = resolve_model(o.model);
  const BlockOptions base{.layout = parse_layout(o.layout), .kernel = parse_kernel(o.kernel), .dtype = parse_dtype(o.dtype),
                          .kv_grad_reduce_fp32 = o.kv_grad_reduce_fp32};
  LAGA_REQUIRE(o.layers >= 1, "layers = ", o.layers, ": must be >= 1");
  LAGA_REQUIRE(o.batch >= 1, "batch = ", o.batch, ": must be >= 1");
  const double gpu_mem = o.gpu_mem.empty() ? 0.0 : parse_bytes(o.gpu_mem);
  std::vector<std::int64_t> seqs, sps;
  for (const auto& s : o.seq) seqs.push_back(parse_count("seq", s));
  for (const auto& s : o.sp) sps.push_back(parse_count("sp", s));
  // Validate every point before printing anything.
  for (auto S : seqs)
    for (auto P : sps)
      for (const Variant& v : kAllVariants)
        validate(cfg, with_variant(base, v), BlockShape{.batch = o.batch, .seq = S, .ranks = int(P), .rank = 0});

  nlohmann::json doc = {{"model", nlohmann::json::parse(config_to_json(cfg))}, {"layout", o.layout}, {"kernel", o.kernel},
                        {"dtype", o.dtype}, {"batch", o.batch}, {"layers", o.layers}, {"points", nlohmann::json::array()}};
  if (gpu_mem > 0) doc["gpu_mem_bytes"] = gpu_mem;
  for (auto S : seqs)
    for (auto P : sps) {
      // The busiest rank: under causal all_gather the last rank's queries see the most keys; memory and
      // traffic are the same on every rank.
      const BlockShape shape{.batch = o.batch, .seq = S, .ranks = int(P), .rank = int(P) - 1};
      std::vector<RankPlan> plans;
      for (const Variant& v : kAllVariants) plans.push_back(plan_rank(cfg, with_variant(base, v), shape));
      nlohmann::json point = {{"seq", S}, {"sp", P}, {"rank", shape.rank}, {"variants", nlohmann::json::object()}};
      for (std::size_t i = 0; i < plans.size(); ++i)
        point["variants"][kAllVariants[i].label()] = to_json(plans[i], device_fit(plans[i], o.layers));
      doc["points"].push_back(point);
      if (o.json) continue;

      std::printf("%s: S=%ld, batch %ld, SP=%ld, layout %s, kernel %s, %s; per rank (rank %d of %ld)%s\n",
                  cfg.name.c_str(), long(S), long(o.batch), long(P), o.layout.c_str(), o.kernel.c_str(),
                  o.dtype.c_str(), shape.rank, long(P), o.layers > 1 ? (", " + std::to_string(o.layers) + " layers").c_str() : "");
      std::vector<std::string> header{"form", "saved/layer", "vs explicit", "peak fwd", "peak bwd", "sent/layer",
                                      "explicit/this", "TFLOP/layer"};
      if (o.layers > 1) header.insert(header.begin() + 3, "saved, all layers");
      if (gpu_mem > 0) header.push_back("fits " + o.gpu_mem);
      Table t(header);
      const RankPlan& ex = plans[0];
      for (std::size_t i = 0; i < plans.size(); ++i) {
        const RankPlan& p = plans[i];
        const DeviceFit fit = device_fit(p, o.layers);
        std::vector<std::string> row{kAllVariants[i].label(), human_bytes(double(p.saved_bytes)),
                                     fmt("%+.2f%%", 100.0 * (double(p.saved_bytes) / double(ex.saved_bytes) - 1)),
                                     human_bytes(double(p.peak_forward)), human_bytes(double(p.peak_backward)),
                                     human_bytes(double(p.bytes_sent())),
                                     p.bytes_sent() ? fmt("%.2fx", double(ex.bytes_sent()) / double(p.bytes_sent())) : "-",
                                     fmt("%.2f", (p.fwd.total_flops() + p.bwd.total_flops()) * 1e-12)};
        if (o.layers > 1) row.insert(row.begin() + 3, human_bytes(double(p.saved_bytes) * o.layers));
        if (gpu_mem > 0)
          row.push_back(fit.total() <= gpu_mem ? "yes (" + human_bytes(double(fit.total())) + ")"
                                               : "NO (" + human_bytes(double(fit.total())) + ")");
        t.add(row);
      }
      t.print();
      std::printf("largest saved tensors:\n");
      for (std::size_t i = 0; i < plans.size(); ++i) {
        std::string line;
        for (std::size_t k = 0; k < plans[i].saved.size() && k < 4; ++k)
          line += (k ? ", " : "") + plans[i].saved[k].name + " " + shape_string(plans[i].saved[k].shape) + " " +
                  human_bytes(double(plans[i].saved[k].bytes));
        std::printf("  %-20s %s\n", kAllVariants[i].label(), line.c_str());
      }
      std::printf("\n");
    }
  if (!o.json) {
    std::printf("saved: activations kept from forward to backward by one attention block (inputs, weights excluded).\n"
                "peak: highest live activation bytes in one block's forward / backward (backward includes its saved).\n");
    if (gpu_mem > 0)
      std::printf("fits: (layers-1) x saved + max(peak) + the attention weights and gradients of all layers; the\n"
                  "      MLP/MoE part of each layer and optimizer state are not counted.\n");
  }
  if (o.json) std::cout << doc.dump(2) << "\n";
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    LAGA_REQUIRE(f.good(), "out = '", o.out, "': cannot open for writing");
    f << doc.dump(2) << "\n";
  }
  return kExitOk;
}

}  // namespace

std::function<int()> add_plan(CLI::App& app, CLI::App*& sub) {
  auto o = std::make_shared<PlanOptions>();
  sub = app.add_subcommand("plan", "Per-rank memory, traffic and FLOPs of every form at any size (no data, no GPU)");
  sub->add_option("--model", o->model, "Preset or path to a config.json")->capture_default_str();
  sub->add_option("--seq", o->seq, "Sequence length(s), comma separated; 16k = 16384")->delimiter(',')->capture_default_str();
  sub->add_option("--sp", o->sp, "Sequence-parallel ranks, comma separated")->delimiter(',')->capture_default_str();
  sub->add_option("--batch", o->batch, "Micro-batch size")->capture_default_str();
  sub->add_option("--layout", o->layout, "a2a or all_gather")->capture_default_str();
  sub->add_option("--kernel", o->kernel, "eager or fused")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "bfloat16, float32 or float64")->capture_default_str();
  sub->add_option("--layers", o->layers, "Attention layers on the device (DeepSeek-V3 has 61)")->capture_default_str();
  sub->add_option("--gpu-mem", o->gpu_mem, "Device memory for the fit column, e.g. 141GB or 80GiB");
  sub->add_flag("--json", o->json, "Print JSON instead of tables");
  sub->add_flag("--kv-grad-reduce-in-fp32", o->kv_grad_reduce_fp32,
                "all_gather: explicit reduce-scatters its K/V gradients in float32 (default: in the dtype, as "
                "TransformerEngine does)");
  sub->add_option("--out", o->out, "Also write the JSON document to FILE");
  return [o] { return run_plan(*o); };
}

}  // namespace laga::cli
