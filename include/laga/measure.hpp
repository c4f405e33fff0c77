// Measurement: one rank's run measured, the check policy and its comparisons, the report of a rank's run
// as JSON, the variants' command-line names, the device communicator, and ranks as threads of one
// process. The CLI (`laga run`, `laga bench`) and the Python package are layers over these: they parse
// options and print.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "laga/attention_provider.hpp"
#include "laga/problem.hpp"
#include "laga/report.hpp"

namespace laga {

// ---------------------------------------------------------------- names on the command line

// "cpu" or "cuda". Throws InvalidArgument naming the value.
Device parse_device(const std::string&);
// The dtype a device runs unless told otherwise: float32 on the cpu, bfloat16 on cuda.
DType default_dtype(Device);
// Refuses a dtype the device's backend does not run (cpu: float32, float64; cuda: bfloat16, float32).
void require_dtype_runs_on(DType, Device);
// Refuses cuda when no GPU is usable or laga was built without CUDA.
void require_cuda_usable();

// Each variant's one command-line name: explicit, absorbed, absorbed-expanded, laga, laga-recompute
// (Variant::label() is how tables and documents print it).
const char* variant_id(const Variant&);
// "all" or a list of variant names -> indices into kAllVariants, without repeats, explicit first (the
// others compare with it). Throws InvalidArgument naming the value.
std::vector<std::size_t> parse_variant_ids(const std::vector<std::string>&);
// "all" (alone) or a list of names.
std::vector<Layout> parse_layouts(const std::vector<std::string>&);
std::vector<AttentionKernel> parse_kernels(const std::vector<std::string>&);

// ---------------------------------------------------------------- one rank measured

struct Measurement {
  RankRun run;
  DeviceMemory memory;
};

// The problem's weights and inputs on this rank; null: the deterministic ones of the seed.
struct ProblemInputs {
  const MlaWeights* weights = nullptr;
  const Tensor* x = nullptr;
  const Tensor* dy = nullptr;
};

// `warmup` untimed passes (first launches: module loading, GEMM heuristics, the allocator's pool; the same
// collectives on every rank, so every rank runs them), then the measured forward and backward; on cuda
// the device memory around the measured pass (warm-ups and earlier scratch not counted).
Measurement measure(const MlaConfig&, const BlockOptions&, const BlockShape&, Backend&, Communicator&,
                    std::uint64_t seed, int warmup, const ProblemInputs& = {});

// Repeated: `warmup` untimed passes, then `repeat` timed ones (each after a barrier on `comm` when `barrier`,
// so thread ranks start together). `last` holds the last repeat's run; on cuda its device memory is measured
// around the warm-ups and the timed repeats (the pool's unused memory handed back and the peaks reset before
// the warm-ups, so the timed repeats do not pay for it).
struct RepeatedMeasurement {
  Measurement last;
  std::vector<TimedRepeat> repeats;
};
RepeatedMeasurement measure_repeated(const MlaConfig&, const BlockOptions&, const BlockShape&, Backend&,
                                     Communicator&, std::uint64_t seed, int warmup, int repeat,
                                     const ProblemInputs& = {}, bool barrier = false);

// ---------------------------------------------------------------- the check policy (DESIGN.md section 5)

// A GPU run against the CPU's float64 result: the precision of the dtype itself.
double cpu_reference_tolerance(DType);
// Against the single-rank explicit result on the same device and dtype. bf16: the bar for LAGA against
// explicit; the absorbed form rounds at other points (q W_UK^T, the latent output before W_UV), so in bf16
// it is held to the dtype's own precision instead (measured ~5e-3).
double default_tolerance(DType, Form);

// Which references a run of `opts` on `ranks` ranks is held to, and how closely. `tolerance` > 0
// replaces the same-device defaults.
struct CheckPolicy {
  double single_rank = 0;          // explicit at P = 1, same device and dtype
  bool same_p = false;             // bf16, P > 1 or p2p, not explicit: also explicit at the same P and layout
  double same_p_tolerance = 0;
  bool cpu_float64 = false;        // cuda: also the CPU's float64 result of the same problem
  double cpu_float64_tolerance = 0;
};
CheckPolicy check_policy(const BlockOptions&, int ranks, Device, double tolerance);

// The references a run is compared with.
enum class CheckReference { SingleRank, SameP, CpuFloat64 };
// As the report writes it: "explicit P=1, same device", "explicit same P", "CPU float64".
const char* check_reference_name(CheckReference);

struct TensorCheck {
  std::string tensor;
  double rel_error = 0;
  bool ok = false;  // rel_error <= tolerance (NaN fails)
};
struct CheckResult {
  CheckReference reference = CheckReference::SingleRank;
  double tolerance = 0;
  std::vector<TensorCheck> tensors;
  bool ok() const;
};
CheckResult check_against(CheckReference, const GlobalResult& got, const GlobalResult& ref, double tolerance);

// The explicit form's global result on the same ranks, device, dtype and communicator (the same-P
// reference): a collective over `comm` (the block's) and `host` (host buffers, the gather).
GlobalResult explicit_same_p(const MlaConfig&, const BlockOptions&, const BlockShape&, Backend&, Communicator& comm,
                             Communicator& host, std::uint64_t seed, const ProblemInputs& = {});

// A problem's weights and inputs held on one backend (this rank's shards), e.g. read from files.
struct ProblemData {
  MlaWeights weights;
  Tensor x, dy;
  ProblemInputs inputs() const { return {&weights, &x, &dy}; }
};
// Makes the problem's data for a shape at a dtype on a backend; empty: the deterministic data of the seed.
using ProblemLoader = std::function<ProblemData(const BlockShape&, DType, Backend&)>;

// The references of `policy` other than the same-P one, run on this process alone with the full input,
// compared with `global`: the single-rank explicit result on the same device (cuda: GPU `gpu`), and on
// cuda the CPU's float64 result.
// On cuda the single-rank reference runs with `provider` (the run's), so that LAGA at P = 1 is held to being
// bit-identical to explicit on the same backend.
std::vector<CheckResult> check_single_process(const MlaConfig&, const BlockOptions&, std::int64_t batch,
                                              std::int64_t seq, Device, int gpu, std::uint64_t seed,
                                              const CheckPolicy&, const GlobalResult& global,
                                              const ProblemLoader& load = {},
                                              AttentionProvider provider = AttentionProvider::Laga);

// ---------------------------------------------------------------- the report of a rank's run (JSON)

// A rank's run: rank_report (laga/report.hpp).
// The block options a run used, with the variant's label.
nlohmann::json options_report(const BlockOptions&);
nlohmann::json check_report(const std::vector<CheckResult>&);
// One run as the documents hold it (`laga run --json`'s runs, `laga bench`'s points): the block options
// (options_report), each measured rank's rank_report in rank order, with checks their check_report, and on
// cuda (`be`) the attention calls of the run.
nlohmann::json run_report(const BlockOptions&, const std::vector<nlohmann::json>& ranks,
                          const std::vector<CheckResult>* checks, Backend& be);
// What `laga bench` measured at one point of its sweep: each measured rank's last repeat, every timed
// repeat's passes, and what its options add.
struct BenchPoint {
  std::int64_t seq = 0, batch = 0;
  int sp = 1;
  BlockOptions opts;
  std::string ranks_run = "single";  // single (P = 1), threads (every rank of P), phantom (rank P-1 alone)
  int rank = 0;                      // the rank measured in detail: P-1
  std::vector<RankRun> runs;         // each measured rank's last repeat, rank order (one when alone)
  DeviceMemory memory;               // rank `rank`'s (cuda)
  std::vector<std::vector<TimedRepeat>> repeats;  // [rank][repeat], warm-ups excluded; one row when alone
  std::optional<std::vector<CheckResult>> checks;  // --check
  std::optional<bool> bit_identical_to_explicit;   // --check, P = 1, a form other than explicit
  bool gemm_check = false;                         // --gemm-check: rank `rank`'s GEMMs in the instrumented
  std::vector<GemmRecord> gemm_records;            // repeats, and each distinct one alone
  std::vector<GemmProbeResult> gemms;
  bool op_profile = false;                         // --op-profile: every op of the instrumented repeats
  std::vector<OpRecord> op_records;
  std::vector<TimedPlacement> timed;               // --phantom-comm timed: rank `rank` again, per placement

  const RankRun& run() const { return runs.size() == 1 ? runs[0] : runs.at(std::size_t(rank)); }
  const std::vector<TimedRepeat>& reps() const {
    return repeats.size() == 1 ? repeats[0] : repeats.at(std::size_t(rank));
  }
};
// A point of a `laga bench` document (docs/bench.md): where it sits in the sweep, the run as run_report writes
// it (options, every measured rank's rank_report, the check, the attention calls of `be` on cuda), the
// statistics of the repeats, the modeled block time, and the GEMM and op profiles and the exposed
// communication when measured. `repeat` and `warmup` are the sweep's; `gpu` the device index.
nlohmann::ordered_json bench_point_report(const BenchPoint&, const TimeModel&, int repeat, int warmup, int gpu,
                                          Backend& be);

// The schema of `laga bench` documents (docs/bench.md, docs/bench-schema.json).
constexpr const char* kBenchSchema = "laga-bench/2";
// A `laga bench` document before its points: the schema, the UTC start time, the machine (on cuda with the
// cuDNN it loaded), the build, the sweep's configuration `config` (the CLI's options) and the time model.
nlohmann::ordered_json bench_document(Device, nlohmann::ordered_json config, const TimeModel&);

// Every rank's report in rank order, through a communicator over host buffers (a collective).
std::vector<nlohmann::json> gather_reports(Communicator& host, const nlohmann::json& mine);
// Where a run ran: hostname, the build's commit and whether its tracked files differed, the communicator,
// the device (cuda: its name, the device count, its memory).
nlohmann::json machine_report(Device, int gpu, const std::string& communicator);
// cuDNN as this process sees it (cuda): built in, loaded, cudnnGetVersion() of the library loaded, the
// version built against, why not.
nlohmann::json cudnn_report();
// Attention calls by provider on `be` (a CUDA backend) since its last reset, auto's fallbacks, cuDNN graphs.
nlohmann::json attention_calls_report(Backend& be);
// This machine for a benchmark document: hostname, OS, CPU model and cores, memory, the GPUs nvidia-smi
// lists, the CUDA devices visible.
nlohmann::json machine_inventory();
// The build: commit (stamped at build time) and whether tracked files differed, compiler, build type,
// whether CUDA was built.
nlohmann::json build_report();

// The fields of `s` between separators `sep` (an empty field where two separators meet; none after a
// trailing one): the machine record's nvidia-smi lines, the command line's lists.
std::vector<std::string> split(const std::string& s, char sep);

// ---------------------------------------------------------------- communicators and ranks

// Which communicator GPU ranks use.
enum class GpuComm { Single, Nccl, HostStaging };
const char* gpu_comm_name(GpuComm);
// `--comm` (auto, nccl, host-staging) for P ranks on cuda, given whether every rank has a GPU of its own:
// NCCL when every rank has its own GPU, MPI with host staging when ranks share one, a plain copy at
// P = 1. Throws InvalidArgument.
GpuComm choose_gpu_comm(const std::string& text, int ranks, bool every_rank_own_gpu);
// The block's communicator on a CUDA backend; `host` serves host buffers (bootstraps NCCL, carries the
// staged data).
std::unique_ptr<Communicator> make_gpu_communicator(GpuComm, Communicator& host, Backend& cuda_backend);

// Runs fn(rank, comm) on `ranks` threads of this process with in-process collectives and joins them.
// A rank that throws may leave the others waiting in a collective forever, so a failure ends the
// process: "laga: failure on rank r of P (thread): ..." on stderr, exit code 2 for InvalidArgument, 3
// otherwise.
void run_thread_ranks(int ranks, const std::function<void(int rank, Communicator& comm)>& fn);

}  // namespace laga
