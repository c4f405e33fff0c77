// The documents laga writes, built by the library so that every front end (the CLI, the Python package)
// gives the same one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "laga/bench.hpp"
#include "laga/plan.hpp"

namespace laga {

// ---- the plan document (`laga plan --json`) ----

// What to plan: one model at one base configuration, over a grid of sequence lengths and rank counts.
// Every variant (kAllVariants) is planned at every point; the base's form, absorbed attention and
// recompute are replaced by each variant's.
struct PlanQuery {
  MlaConfig cfg;
  BlockOptions base;  // layout, kernel, dtype, kv_grad_reduce_fp32
  std::int64_t batch = 1;
  std::vector<std::int64_t> seqs{16384};
  std::vector<std::int64_t> sps{8};
  int layers = 1;              // attention layers on the device (the fit)
  double gpu_mem_bytes = 0;    // > 0: recorded in the document as the device memory of the fit
  TimeModel model = default_time_model();  // prices each variant's collectives ("modeled")
};

// One (seq, sp) point: the busiest rank's plan of every variant, in kAllVariants order.
struct PlanPoint {
  std::int64_t seq = 0;
  std::int64_t sp = 0;
  int rank = 0;  // the last rank: under causal all_gather its queries see the most keys
  std::vector<RankPlan> plans;  // one per variant the layout runs (variants_for), explicit first
};

// Validates every point of every variant (InvalidArgument before any is planned), then plans them.
std::vector<PlanPoint> plan_points(const PlanQuery&);

// Kernel scratch outside the plan's figures when cuDNN runs the fused attention (--attention-provider cudnn):
// its deterministic backward's workspace for the point's attention call (explicit and LAGA), scaled from the
// nearest shape of the built-in provider table (laga/attention_provider.hpp); 0 when the kernel is eager or
// the table has no cuDNN time for these head dims. The document gives it per point as cudnn_workspace_bytes.
// deterministic = false: its non-deterministic backward's (--nondeterministic), scaled by heads x queries;
// cudnn_nondeterministic_workspace_bytes in the document (0, and absent, when the table has not measured it).
std::int64_t plan_cudnn_workspace(const PlanQuery&, const PlanPoint&, bool deterministic = true);

// One rank's plan as the document holds it: saved tensors, peaks, traffic (the block's own, on the meta
// backend) and FLOPs, the device fit, the closed-form traffic (expected_traffic, DESIGN.md section 3), and
// the collectives priced by the alpha-beta model at each standard placement (labelled "modeled").
nlohmann::json plan_to_json(const RankPlan&, const DeviceFit&, const TimeModel&);

// The alpha-beta model as the documents record it (plan and bench): its links, node size and placements.
nlohmann::json time_model_json(const TimeModel&);

// The whole document: the model, the base options, the time model, and every point with every variant.
nlohmann::json plan_document(const PlanQuery&, const std::vector<PlanPoint>&);
inline nlohmann::json plan_document(const PlanQuery& q) { return plan_document(q, plan_points(q)); }

}  // namespace laga
