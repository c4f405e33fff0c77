// The documents laga writes, built by the library so that every front end (the CLI, the Python package)
// gives the same one.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "laga/bench.hpp"
#include "laga/gemm_probe.hpp"
#include "laga/op_profile.hpp"
#include "laga/plan.hpp"
#include "laga/problem.hpp"

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
// backend) and FLOPs, the device fit, the closed-form traffic (expected_traffic, DESIGN.md section 3), the
// collectives priced by the alpha-beta model at each standard placement (labelled "modeled"), the traffic
// under the latent's other accountings (traffic_what_if) and, when the configuration gives its layer count,
// the whole model's totals (model_total). With `explicit_plan` (the explicit variant's plan at the same
// point) and bytes to send: explicit's byte totals over this plan's (explicit_over_this). docs/architecture.md
nlohmann::json plan_to_json(const RankPlan&, const DeviceFit&, const TimeModel&, const RankPlan* explicit_plan = nullptr);

// The alpha-beta model as the documents record it (plan and bench): its links, node size and placements.
nlohmann::json time_model_json(const TimeModel&);

// The whole document: the model, the base options, the time model, and every point with every variant.
nlohmann::json plan_document(const PlanQuery&, const std::vector<PlanPoint>&);
inline nlohmann::json plan_document(const PlanQuery& q) { return plan_document(q, plan_points(q)); }

// ---- a rank's run: one schema for `laga run --json` (each rank), `laga bench` (each point's ranks) and the
// PyTorch module (last_step) ----

// Device memory as cudaMemGetInfo sees it around one run (have = false on the cpu and in the PyTorch module).
struct DeviceMemory {
  bool have = false;
  std::size_t used_before = 0;   // before the run's weights and inputs (context, workspaces, other ranks)
  std::size_t peak_used = 0;     // high-water mark over the run
  std::size_t scratch_peak = 0;  // the backend's kernel scratch (outside the allocator), high-water mark
};

// Bytes this rank sent / received over all its collectives.
std::size_t bytes_sent(const std::vector<CollectiveRecord>&);
std::size_t bytes_received(const std::vector<CollectiveRecord>&);
std::string host_name();

// The report of one rank's run (docs/bench.md, "a rank's record"): rank, hostname, saved tensors, peaks,
// bytes, traffic (with seconds and bus bandwidth), FLOPs and seconds by phase; with device memory (cuda)
// the GPU and its memory around the run.
nlohmann::json rank_report(const RankRun&, int rank, const DeviceMemory&, int gpu);

struct CudnnInfo;  // laga/cuda.hpp
// cuDNN as a process sees it (cuda_cudnn_info()): compiled in, loaded, the version loaded (cudnnGetVersion()),
// the version built against, why not. Written by laga's documents and the Python package's build_info().
nlohmann::json cudnn_info_report(const CudnnInfo&);

// ---- the statistics of repeated runs (`laga bench`) ----

// One timed repeat of a rank: its forward and backward pass.
struct TimedRepeat {
  PassStats fwd, bwd;
  double block_seconds() const { return fwd.total_seconds() + bwd.total_seconds(); }
  // The two passes' spans: their ops and the gaps between them (what events around each pass see).
  double block_span_seconds() const { return fwd.span_seconds + bwd.span_seconds; }
  double compute_seconds() const;  // the block less its communication phase
};

// median, q1, q3, min, max, mean (seconds rounded to the nanosecond, the clock's resolution) and n.
nlohmann::ordered_json summary_report(const Summary&);

// The statistics of a point's timed repeats (a bench point's "repeats"): each pass's total, span and phases,
// the block, compute and communication of rank `rank`; with every rank measured (`by_rank` holds more than
// one), each rank's block and the slowest rank's of each repeat.
nlohmann::ordered_json repeats_report(const std::vector<std::vector<TimedRepeat>>& by_rank, int rank, int warmup);

// The modeled block time ("modeled"): the median measured compute of `reps` + the collectives of `traffic`
// priced by the alpha-beta model at each standard placement for `ranks` ranks.
nlohmann::ordered_json modeled_report(const TimeModel&, int ranks, const std::vector<CollectiveRecord>& traffic,
                                      const std::vector<TimedRepeat>& reps);

// The same rank measured again with timed collectives at one placement.
struct TimedPlacement {
  Placement placement;
  std::vector<TimedRepeat> repeats;
};
// Exposed communication: the median block with timed collectives against the instant ones, per placement.
nlohmann::ordered_json exposed_report(const TimeModel&, int ranks, const std::vector<CollectiveRecord>& traffic,
                                      const std::vector<TimedRepeat>& instant, const std::vector<TimedPlacement>&);

// Within this of the rate alone, the block's GEMMs pass: time-weighted ratio <= 1.10.
constexpr double kGemmTolerance = 0.10;
// Each distinct GEMM of `repeats` instrumented repeats, its median time in the block against alone, and
// the summary.
nlohmann::ordered_json gemms_report(const std::vector<GemmProbeResult>&, const std::vector<GemmRecord>&, int repeats,
                                    int warmup_alone);
// Every op of a forward and a backward pass with its median over `repeats` instrumented repeats, and the
// time per kind of op.
nlohmann::ordered_json ops_report(const std::vector<OpRecord>&, int repeats);
// Whether two global results are equal bit for bit (y, dx and every weight gradient).
bool bit_identical(const GlobalResult&, const GlobalResult&);

// A bench document as text: indented, each point on one line (short, and a diff shows which points changed).
std::string bench_document_text(const nlohmann::ordered_json&);

}  // namespace laga
