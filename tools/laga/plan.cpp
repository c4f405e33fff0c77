// `laga plan`: memory, traffic and FLOPs per rank for any configuration, at any size, in well under a
// second (the block's own orchestration on the meta backend; see include/laga/plan.hpp). --json adds the
// closed-form traffic and the collectives priced by the alpha-beta model (include/laga/report.hpp).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "format.hpp"
#include "laga/errors.hpp"
#include "laga/report.hpp"

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
  bool overlap = false;
  std::string out;
  TimeModelOptions time_model;
};

// One point's table: every variant's memory, traffic and FLOPs, then its largest saved tensors.
void print_point(const PlanOptions& o, const PlanQuery& q, const PlanPoint& pt) {
  const double gpu_mem = q.gpu_mem_bytes;
  std::printf("%s: S=%ld, batch %ld, SP=%ld, layout %s, kernel %s, %s; per rank (rank %d of %ld)%s\n",
              q.cfg.name.c_str(), long(pt.seq), long(o.batch), long(pt.sp), o.layout.c_str(), o.kernel.c_str(),
              o.dtype.c_str(), pt.rank, long(pt.sp), o.layers > 1 ? (", " + std::to_string(o.layers) + " layers").c_str() : "");
  std::vector<std::string> header{"form", "saved/layer", "vs explicit", "peak fwd", "peak bwd", "sent/layer",
                                  "explicit/this", "TFLOP/layer"};
  if (o.layers > 1) header.insert(header.begin() + 3, "saved, all layers");
  if (gpu_mem > 0) header.push_back("fits " + o.gpu_mem);
  Table t(header);
  const std::vector<RankPlan>& plans = pt.plans;
  const RankPlan& ex = plans[0];
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const RankPlan& p = plans[i];
    const DeviceFit fit = device_fit(p, o.layers);
    std::vector<std::string> row{variant_of(plans[i].opts).label(), human_bytes(double(p.saved_bytes)),
                                 fmt("%+.2f%%", 100.0 * (double(p.saved_bytes) / double(ex.saved_bytes) - 1)),
                                 human_bytes(double(p.peak_forward)), human_bytes(double(p.peak_backward)),
                                 human_bytes(double(p.bytes_sent())),
                                 p.bytes_sent() ? fmt("%.2fx", double(ex.bytes_sent()) / double(p.bytes_sent())) : "-",
                                 fmt("%.2f", (p.fwd.total_flops() + p.bwd.total_flops()) * 1e-12)};
    if (o.layers > 1) row.insert(row.begin() + 3, human_bytes(double(p.saved_bytes) * o.layers));
    if (gpu_mem > 0)
      row.push_back((fit.total() <= gpu_mem ? "yes (" : "NO (") + human_bytes(double(fit.total())) + ")");
    t.add(row);
  }
  t.print();
  std::printf("largest saved tensors:\n");
  for (std::size_t i = 0; i < plans.size(); ++i) {
    std::string line;
    for (std::size_t k = 0; k < plans[i].saved.size() && k < 4; ++k)
      line += (k ? ", " : "") + plans[i].saved[k].name + " " + shape_string(plans[i].saved[k].shape) + " " +
              human_bytes(double(plans[i].saved[k].bytes));
    std::printf("  %-20s %s\n", variant_of(plans[i].opts).label(), line.c_str());
  }
  if (const std::int64_t ws = plan_cudnn_workspace(q, pt); ws > 0)
    std::printf("kernel scratch outside these figures with --attention-provider cudnn: cuDNN's workspace %s\n"
                "  (its deterministic backward, scaled from bench/attention-providers.json; auto runs laga's kernels\n"
                "  where it exceeds the scratch cap)\n", human_bytes(double(ws)).c_str());
  if (const std::int64_t ws = plan_cudnn_workspace(q, pt, false); ws > 0)
    std::printf("  with --nondeterministic (cuDNN's non-deterministic backward): %s\n", human_bytes(double(ws)).c_str());
  std::printf("\n");
}

int run_plan(const PlanOptions& o) {
  PlanQuery q{.cfg = resolve_model(o.model),
              .base = {.layout = parse_layout(o.layout), .kernel = parse_kernel(o.kernel), .dtype = parse_dtype(o.dtype),
                       .kv_grad_reduce_fp32 = o.kv_grad_reduce_fp32, .overlap = o.overlap},
              .batch = o.batch, .seqs = {}, .sps = {}, .layers = o.layers, .gpu_mem_bytes = 0,
              .model = time_model_of(o.time_model)};
  LAGA_REQUIRE(o.layers >= 1, "layers = ", o.layers, ": must be >= 1");
  LAGA_REQUIRE(o.batch >= 1, "batch = ", o.batch, ": must be >= 1");
  if (!o.gpu_mem.empty()) q.gpu_mem_bytes = parse_bytes(o.gpu_mem);
  for (const auto& s : o.seq) q.seqs.push_back(parse_count("seq", s));
  for (const auto& s : o.sp) q.sps.push_back(parse_count("sp", s));
  const std::vector<PlanPoint> points = plan_points(q);  // every point validated before anything prints
  const nlohmann::json doc = plan_document(q, points);
  if (o.json) {
    std::cout << doc.dump(2) << "\n";
  } else {
    for (const PlanPoint& pt : points) print_point(o, q, pt);
    std::printf("saved: activations kept from forward to backward by one attention block (inputs, weights excluded).\n"
                "peak: highest live activation bytes in one block's forward / backward (backward includes its saved).\n");
    if (q.gpu_mem_bytes > 0)
      std::printf("fits: (layers-1) x saved + max(peak) + the attention weights and gradients of all layers; the\n"
                  "      MLP/MoE part of each layer and optimizer state are not counted.\n");
  }
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    LAGA_REQUIRE(f.good(), "out = '", o.out, "': cannot open for writing");
    f << doc.dump(2) << "\n";
    f.flush();  // a full disk shows only when the buffer is written
    LAGA_CHECK(f.good(), "out = '", o.out, "': writing failed");
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
  sub->add_option("--layout", o->layout, "a2a, all_gather or p2p (p2p: explicit and laga)")->capture_default_str();
  sub->add_option("--kernel", o->kernel, "eager or fused")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "bfloat16, float32 or float64")->capture_default_str();
  sub->add_option("--layers", o->layers, "Attention layers on the device, for the fit (the model's own count, "
                                         "num_hidden_layers, gives the document's model_total)")->capture_default_str();
  sub->add_option("--gpu-mem", o->gpu_mem, "Device memory for the fit column, e.g. 141GB or 80GiB");
  sub->add_flag("--json", o->json, "Print JSON instead of tables");
  sub->add_flag("--kv-grad-reduce-in-fp32", o->kv_grad_reduce_fp32,
                "all_gather: explicit reduce-scatters its K/V gradients in float32 (default: in the dtype, as "
                "TransformerEngine does)");
  sub->add_flag("--overlap", o->overlap, "Plan the block with its collectives started under compute (as laga run "
                                         "--overlap; the same bytes, other peaks)");
  sub->add_option("--out", o->out, "Also write the JSON document to FILE");
  add_time_model_options(sub, o->time_model);
  return [o] { return run_plan(*o); };
}

}  // namespace laga::cli
