// `laga run`: one configuration on P ranks, on the CPU or on GPUs.
//
//   CPU (--device cpu, the default): under mpirun each process is a rank (MPI collectives); launched alone
//     with --sp P > 1, the P ranks are threads of this process.
//   GPU (--device cuda): one process per rank (mpirun), rank r on GPU (local rank % device count). The
//     communicator is NCCL when every rank has its own GPU, MPI with host staging when ranks share one
//     (correct at any P on a single GPU, not fast), and a plain copy at P = 1; --comm forces a choice.
//   Phantom (--phantom-rank r --sp P): rank r of P alone, on either device. Collectives are not performed
//     (received data is synthetic), so memory, FLOPs and time of one rank of a large job are measured on
//     one device; --form/--layout/--kernel all runs every variant in turn.
//
// Host-side gathers (the per-rank report, --check, --save) always go through a communicator over host
// buffers: the MPI one beside NCCL, or a single-rank one at P = 1.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "format.hpp"
#include "laga/agree.hpp"
#include "provider.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/measure.hpp"
#include "laga/mpi_comm.hpp"
#include "laga/npy.hpp"
#include "laga/plan.hpp"
#include "laga/timed_comm.hpp"
#include "laga/token_map.hpp"


namespace laga::cli {
namespace {

using nlohmann::json;

struct RunOptions {
  std::string model = "small";
  std::int64_t seq = 256;
  std::int64_t batch = 1;
  int sp = 0;  // 0: the number of MPI processes
  std::string form = "laga", layout = "a2a", kernel = "fused", recompute = "none";
  std::string dtype;  // empty: float32 on the cpu, bfloat16 on cuda
  std::string absorbed_attention = "mqa";
  std::string device = "cpu";
  std::string comm = "auto";
  std::string attention_provider = "auto";
  bool nondeterministic = false;  // the attention backward may add its sums in any order
  int phantom_rank = -1;  // >= 0: run this rank of --sp alone
  std::string phantom_comm = "instant";  // or timed: collectives hold the queue for the model's time
  std::string phantom_link = "node";     // timed: node (NVLink) or cross-node (InfiniBand)
  std::uint64_t seed = 1;
  int warmup = 0;  // untimed passes before the measured one
  bool check = false;
  bool verbose = false;
  bool kv_grad_reduce_fp32 = false;
  bool overlap = false;
  std::string grad_dtype;  // "": the accumulation dtype
  std::string save_dir, load_dir, json_path;
  double tolerance = 0;  // 0: the dtype's default (default_tolerance)
};

std::string dtype_text(const RunOptions& o) {
  if (!o.dtype.empty()) return o.dtype;
  return dtype_name(default_dtype(parse_device(o.device)));
}
std::optional<DType> grad_dtype_of(const RunOptions& o) {
  if (o.grad_dtype.empty()) return std::nullopt;
  return parse_dtype(o.grad_dtype);
}

// ---------------------------------------------------------------- .npy interchange (--save, --load)

// Tensors of the .npy interchange are [batch, seq, hidden]; the library's activations are [seq, batch, hidden].
std::vector<double> sbd_to_bsd(const std::vector<double>& v, std::int64_t S, std::int64_t B, std::int64_t d) {
  std::vector<double> out(v.size());
  for (std::int64_t t = 0; t < S; ++t)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < d; ++j) out[(b * S + t) * d + j] = v[(t * B + b) * d + j];
  return out;
}

std::vector<double> load_array(const std::string& dir, const std::string& name, const Shape& expected) {
  const std::string path = dir + "/" + name + ".npy";
  Shape shape;
  std::vector<double> v = read_npy_doubles(path, &shape);
  LAGA_REQUIRE(shape == expected, path, " has shape ", shape_string(shape), ": expected ", shape_string(expected));
  return v;
}

// This rank's [s, B, d] shard of a [B, S, d] array: the tokens the layout gives it (include/laga/token_map.hpp).
std::vector<double> shard_of_bsd(const std::vector<double>& v, const BlockShape& sh, Layout layout, std::int64_t d) {
  const std::vector<std::int64_t> pos = rank_positions(layout, sh.seq, sh.ranks, sh.rank);
  std::vector<double> out(pos.size() * sh.batch * d);
  for (std::size_t t = 0; t < pos.size(); ++t)
    for (std::int64_t b = 0; b < sh.batch; ++b)
      for (std::int64_t j = 0; j < d; ++j)
        out[(t * sh.batch + b) * d + j] = v[(b * sh.seq + pos[t]) * d + j];
  return out;
}

ProblemData load_problem(const RunOptions& o, const MlaConfig& cfg, const BlockShape& sh, Layout layout, DType dt,
                         Backend& be) {
  ProblemData l;
  l.weights = allocate_weights(cfg, dt, be.allocator());
  for (auto& [name, t] : l.weights.named()) from_host(be, *t, load_array(o.load_dir, name, t->shape()));
  const Shape bsd{sh.batch, sh.seq, cfg.hidden_size};
  l.x = Tensor(be.allocator(), dt, {sh.local_seq(), sh.batch, cfg.hidden_size}, "x", MemoryKind::External);
  from_host(be, l.x, shard_of_bsd(load_array(o.load_dir, "x", bsd), sh, layout, cfg.hidden_size));
  l.dy = Tensor(be.allocator(), dt, l.x.shape(), "dy", MemoryKind::External);
  if (std::filesystem::exists(o.load_dir + "/dy.npy"))
    from_host(be, l.dy, shard_of_bsd(load_array(o.load_dir, "dy", bsd), sh, layout, cfg.hidden_size));
  else
    l.dy = make_shard(cfg, sh, dt, be, o.seed, DataStream::Dy, layout);
  return l;
}

// `host` serves host buffers (the gathers below are of host vectors).
void save_problem(const RunOptions& o, const MlaConfig& cfg, const BlockShape& sh, Layout layout, Backend& be,
                  Communicator& host, const MlaWeights& w, const Tensor& x, const Tensor& dy, const GlobalResult& res) {
  auto gather = [&](const Tensor& t) {
    std::vector<double> local = to_host(be, t), full(local.size() * host.size());
    host.all_gather(local.data(), full.data(), local.size(), DType::F64);
    return assemble_sequence(layout, full, sh.seq, host.size(), sh.batch * cfg.hidden_size);
  };
  std::vector<double> gx = gather(x), gdy = gather(dy);
  if (host.rank() != 0) return;
  std::filesystem::create_directories(o.save_dir);
  const std::int64_t S = sh.seq, B = sh.batch, d = cfg.hidden_size;
  const Shape bsd{B, S, d};
  auto put = [&](const std::string& name, const Shape& shape, const std::vector<double>& v) {
    write_npy(o.save_dir + "/" + name + ".npy", shape, v);
  };
  put("x", bsd, sbd_to_bsd(gx, S, B, d));
  put("dy", bsd, sbd_to_bsd(gdy, S, B, d));
  put("y", bsd, sbd_to_bsd(res.y, S, B, d));
  put("dx", bsd, sbd_to_bsd(res.dx, S, B, d));
  std::size_t i = 0;
  for (const auto& [name, t] : w.named()) {
    put(name, t->shape(), to_host(be, *t));
    put("grad_" + name, t->shape(), res.grads.at(i++).second);
  }
  std::printf("saved x, dy, weights, y, dx and grad_* as .npy ([batch, seq, hidden]; weights [out, in] as nn.Linear) to %s\n",
              o.save_dir.c_str());
}

// ---------------------------------------------------------------- the JSON document (--json FILE)

json document_json(const RunOptions& o, const MlaConfig& cfg, int P) {
  return {{"command", "run"},
          {"config", json::parse(config_to_json(cfg))},
          {"options", {{"model", o.model}, {"seq", o.seq}, {"batch", o.batch}, {"sp", P}, {"form", o.form},
                       {"layout", o.layout}, {"kernel", o.kernel}, {"recompute", o.recompute},
                       {"absorbed_attention", o.absorbed_attention}, {"dtype", dtype_text(o)}, {"grad_dtype", o.grad_dtype.empty() ? json(nullptr) : json(o.grad_dtype)}, {"device", o.device},
                       {"comm", o.comm}, {"attention_provider", o.attention_provider}, {"deterministic", !o.nondeterministic}, {"seed", o.seed}, {"check", o.check}, {"warmup", o.warmup}}},
          {"runs", json::array()}};
}

void write_json(const std::string& path, const json& doc) {
  std::ofstream f(path);
  LAGA_REQUIRE(f.good(), "json = '", path, "': cannot open for writing");
  f << doc.dump(2) << "\n";
  f.flush();  // a full disk shows only when the buffer is written
  LAGA_CHECK(f.good(), "writing ", path, " failed");
}

// Refuses a --json path that cannot be written before anything runs (opens it for appending: creates it,
// changes nothing else).
void require_writable(const std::string& path) {
  if (path.empty()) return;
  std::ofstream f(path, std::ios::app);
  LAGA_REQUIRE(f.good(), "json = '", path, "': cannot open for writing");
}

// ---------------------------------------------------------------- one rank of a real run

// What one rank needs before any collective: the configuration, options, shape, its backend and, with
// --load, the problem read from disk. Communicates with no one, so bad input is refused on every rank
// before any collective. Throws InvalidArgument for bad input.
struct Prepared {
  MlaConfig cfg;
  BlockOptions opts;
  BlockShape sh;
  Device device = Device::Cpu;
  int gpu = -1;  // cuda: the device index
  std::unique_ptr<Backend> be;
  ProblemData loaded;
  bool have = false;  // loaded from --load
  ProblemInputs inputs() const { return have ? loaded.inputs() : ProblemInputs{}; }
};

// Checks that need no backend: the model, options, shape, device and dtype.
void check_options(const RunOptions& o, Prepared& p, int ranks, int rank) {
  p.cfg = resolve_model(o.model);
  p.device = parse_device(o.device);
  for (const auto* field : {&o.form, &o.layout, &o.kernel})
    LAGA_REQUIRE(*field != "all" || o.phantom_rank >= 0, "'all' for --form, --layout or --kernel runs a sweep of "
                 "phantom ranks: add --phantom-rank R (a real run takes one variant)");
  p.opts = BlockOptions{.form = parse_form(o.form), .layout = parse_layout(o.layout), .kernel = parse_kernel(o.kernel),
                        .recompute = parse_recompute(o.recompute),
                        .absorbed_attention = parse_absorbed_attention(o.absorbed_attention),
                        .dtype = parse_dtype(dtype_text(o)), .kv_grad_reduce_fp32 = o.kv_grad_reduce_fp32,
                        .overlap = o.overlap, .grad_dtype = grad_dtype_of(o)};
  p.sh = BlockShape{.batch = o.batch, .seq = o.seq, .ranks = ranks, .rank = rank};
  validate(p.cfg, p.opts, p.sh);
  require_dtype_runs_on(p.opts.dtype, p.device);
  LAGA_REQUIRE(p.device == Device::Cuda || o.comm == "auto", "comm = '", o.comm,
               "': --comm chooses between GPU communicators (with --device cuda)");
  check_attention_provider(o.attention_provider, p.device == Device::Cuda);
  LAGA_REQUIRE(o.tolerance >= 0, "tolerance = ", o.tolerance, ": must be >= 0 (0 picks the dtype's default)");
  LAGA_REQUIRE(o.warmup >= 0 && o.warmup <= 100, "warmup = ", o.warmup, ": must be in [0, 100]");
}

// Only rank 0 writes: the --json file and the --save directory are refused there before anything runs.
void check_outputs(const RunOptions& o) {
  require_writable(o.json_path);
  if (o.save_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(o.save_dir, ec);
  LAGA_REQUIRE(!ec && std::filesystem::is_directory(o.save_dir), "save = \"", o.save_dir,
               "\": cannot create the directory (", ec ? ec.message() : "not a directory", ")");
}

// The plan's bytes of `copies` ranks (and of --check's single-rank reference) must fit the memory they run
// in: the GPU's (cudaMemGetInfo's total), or the host's for the cpu backend. Refused before any allocation.
void require_run_fits(const RunOptions& o, const Prepared& p, int copies) {
  const RankPlan plan = plan_rank(p.cfg, p.opts, p.sh);
  std::size_t reference = 0;
  if (o.check) {
    BlockOptions ex = p.opts;
    ex.form = Form::Explicit;
    ex.recompute = Recompute::None;
    reference = planned_run_bytes(plan_rank(p.cfg, ex, BlockShape{.batch = o.batch, .seq = o.seq}));
  }
  if (p.device == Device::Cuda)
    require_fits(plan, copies, reference, cuda_mem_info(p.gpu).total_bytes, "GPU " + std::to_string(p.gpu) + " memory");
  else
    require_fits(plan, copies, reference, host_memory_bytes(), "host memory");
}

// `copies`: the ranks of this process whose memory is checked here (0: checked by another rank's call).
Prepared prepare(const RunOptions& o, int ranks, int rank, int gpu, int copies) {
  Prepared p;
  check_options(o, p, ranks, rank);
  if (rank == 0) check_outputs(o);
  if (p.device == Device::Cuda) {
    require_cuda_usable();
    p.gpu = gpu;
  }
  if (copies > 0) require_run_fits(o, p, copies);
  p.be = p.device == Device::Cuda ? make_cuda_backend(gpu) : make_cpu_backend();
  if (p.device == Device::Cuda) {
    cuda_set_attention_provider(*p.be, parse_attention_provider(o.attention_provider));
    cuda_set_attention_deterministic(*p.be, !o.nondeterministic);
  }
  if (!o.load_dir.empty()) {
    p.loaded = load_problem(o, p.cfg, p.sh, p.opts.layout, p.opts.dtype, *p.be);
    p.have = true;
  }
  return p;
}

// Test hook for tests/mpi/failure_abort.sh: LAGA_TEST_FAIL_RANK=r makes rank r throw after the block's
// collectives, while the other ranks go on into the next collective. The run must end every rank (exit
// code 3) instead of hanging.
void maybe_inject_failure(int rank) {
  const char* v = std::getenv("LAGA_TEST_FAIL_RANK");
  if (v && *v && std::atoi(v) == rank)
    throw RuntimeError(detail::concat("failure injected by LAGA_TEST_FAIL_RANK=", v, " after the block's collectives"));
}

// ---------------------------------------------------------------- rank 0's tables

// One rank's figures for rank 0's table; every rank's, gathered (a collective over `host`).
enum Figure { kSaved, kPeakFwd, kPeakBwd, kSent, kReceived, kFwdS, kBwdS, kFlops, kUsedBefore, kDevPeak, kGpu,
              kScratch, kFigures };
std::vector<double> gather_figures(Communicator& host, const Measurement& m, int gpu) {
  const RankRun& run = m.run;
  const DeviceMemory& mem = m.memory;
  std::vector<double> mine{double(run.saved_bytes), double(run.fwd.peak_bytes), double(run.bwd.peak_bytes),
                           double(bytes_sent(run.traffic)), double(bytes_received(run.traffic)),
                           run.fwd.total_seconds(), run.bwd.total_seconds(),
                           run.fwd.total_flops() + run.bwd.total_flops(), double(mem.used_before),
                           double(mem.peak_used), double(gpu), double(mem.scratch_peak)};
  std::vector<double> all(mine.size() * host.size());
  host.all_gather(mine.data(), all.data(), mine.size(), DType::F64);
  return all;
}

void print_run_header(const RunOptions& o, const Prepared& p, const Communicator& comm) {
  const BlockOptions& opts = p.opts;
  const bool cuda = p.device == Device::Cuda;
  std::string extras;
  if (opts.recompute == Recompute::KV) extras += ", recompute kv";
  if (opts.form == Form::Absorbed) extras += std::string(", attention ") + absorbed_attention_name(opts.absorbed_attention);
  std::printf("laga run: model '%s', S=%ld, batch %ld, form %s, layout %s, kernel %s%s, %s%s, P=%d (%s%s)\n",
              p.cfg.name.c_str(), long(o.seq), long(o.batch), form_name(opts.form), layout_name(opts.layout),
              kernel_name(opts.kernel), extras.c_str(), dtype_name(opts.dtype),
              opts.kv_grad_reduce_fp32 ? " (K/V gradients reduced in float32)" : "", comm.size(), comm.name(),
              cuda ? ", cuda" : "");
  if (cuda) std::printf("device: %s (%d visible)\n", cuda_device_name(p.gpu).c_str(), cuda_device_count());
}

void print_rank_table(const std::vector<double>& all, int P, bool cuda) {
  std::vector<std::string> header{"rank", "saved", "peak fwd", "peak bwd", "sent", "received", "GFLOP", "fwd ms", "bwd ms"};
  if (cuda) header.insert(header.end(), {"gpu", "dev used before", "dev peak", "scratch peak"});
  Table t(header);
  for (int r = 0; r < P; ++r) {
    const double* m = &all[std::size_t(r) * kFigures];
    std::vector<std::string> row{std::to_string(r), human_bytes(m[kSaved]), human_bytes(m[kPeakFwd]),
                                 human_bytes(m[kPeakBwd]), human_bytes(m[kSent]), human_bytes(m[kReceived]),
                                 fmt("%.3f", m[kFlops] * 1e-9), fmt("%.2f", m[kFwdS] * 1e3), fmt("%.2f", m[kBwdS] * 1e3)};
    if (cuda)
      row.insert(row.end(), {fmt("%.0f", m[kGpu]), human_bytes(m[kUsedBefore]), human_bytes(m[kDevPeak]),
                             human_bytes(m[kScratch])});
    t.add(row);
  }
  t.print();
  if (cuda)
    std::printf("dev: device memory in use (cudaMemGetInfo; all processes on the GPU), before the run and its peak; "
                "scratch: the backend's kernel scratch outside the allocator (in dev, not in saved/peak)\n");
}

void print_collectives(const RankRun& run, bool performed) {
  std::printf("\ncollectives on rank 0 (bytes this rank sent / received; time on the backend's queue, bus bandwidth = "
              "sent / time%s):\n", performed ? "" : "; NOT performed here");
  Table c({"phase", "collective", "tensor", "calls", "sent", "received", "ms", "bus GB/s"}, 3);
  for (const auto& rec : run.traffic)
    c.add({phase_name(rec.phase), collective_name(rec.kind), rec.tensor, std::to_string(rec.calls),
           std::to_string(rec.bytes_sent), std::to_string(rec.bytes_received), fmt("%.3f", rec.seconds * 1e3),
           rec.seconds > 0 && rec.bytes_sent > 0 ? fmt("%.1f", double(rec.bytes_sent) / rec.seconds * 1e-9) : "-"});
  if (run.traffic.empty()) c.add({"-", "none", "-", "0", "0", "0", "-", "-"});
  c.print();
}

// --verbose: the saved tensors and the FLOPs and time by phase.
void print_rank0_details(const RankRun& run) {
  std::printf("\ntensors kept for backward on rank 0:\n");
  Table s({"tensor", "bytes"});
  for (const auto& rec : run.saved) s.add({rec.name, std::to_string(rec.bytes)});
  s.add({"total", std::to_string(run.saved_bytes)});
  s.print();
  std::printf("\nFLOPs and time by phase on rank 0:\n");
  Table f({"phase", "fwd GFLOP", "bwd GFLOP", "fwd ms", "bwd ms"});
  for (int ph = 0; ph < kOpPhaseCount; ++ph)
    f.add({op_phase_name(OpPhase(ph)), fmt("%.4f", run.fwd.flops[ph] * 1e-9), fmt("%.4f", run.bwd.flops[ph] * 1e-9),
           fmt("%.2f", run.fwd.seconds[ph] * 1e3), fmt("%.2f", run.bwd.seconds[ph] * 1e3)});
  f.print();
}

// ---------------------------------------------------------------- --check

// The title above each check's table.
std::string check_title(const CheckResult& c, const Prepared& p, int P) {
  switch (c.reference) {
    case CheckReference::SingleRank:
      return detail::concat("\ncheck against the single-rank explicit result on the same device (",
                            p.device == Device::Cuda ? "cuda" : "cpu", ", ", dtype_name(p.opts.dtype),
                            "; relative Frobenius error, tolerance ", fmt("%.0e", c.tolerance), "):\n");
    case CheckReference::SameP:
      return detail::concat("\ncheck against explicit at the same P=", P,
                            " (same device, dtype and communicator; tolerance ", fmt("%.0e", c.tolerance), "):\n");
    case CheckReference::CpuFloat64:
      return detail::concat("\ncheck against the CPU float64 result (tolerance ", fmt("%.0e", c.tolerance), "):\n");
  }
  return "";
}

// Each check's table of relative errors; returns whether every tensor passed.
bool print_checks(const Prepared& p, int P, const std::vector<CheckResult>& checks) {
  bool ok = true;
  for (const CheckResult& c : checks) {
    std::printf("%s", check_title(c, p, P).c_str());
    Table t({"tensor", "rel. error", "verdict"});
    for (const TensorCheck& tc : c.tensors) t.add({tc.tensor, fmt("%.3e", tc.rel_error), tc.ok ? "ok" : "FAIL"});
    t.print();
    ok = ok && c.ok();
    if (c.reference == CheckReference::SameP && !c.ok() && p.opts.layout == Layout::AllGather &&
        !p.opts.kv_grad_reduce_fp32)
      std::printf("note: in all_gather, explicit reduce-scatters its K/V gradients in bfloat16 (as "
                  "TransformerEngine does), rounding their sum once, and LAGA never forms that sum; "
                  "--kv-grad-reduce-in-fp32 sums them in float32 (docs/gpu-run.md)\n");
  }
  std::printf("check %s\n", ok ? "passed" : "FAILED");
  std::fflush(stdout);
  return ok;
}

// --check on every rank: the same-P explicit rerun where the policy asks for it (a collective over `comm`),
// the single-process references on rank 0 (which prints them into `checks`), and the verdict, agreed by
// all ranks. Returns whether the run passed.
bool check_run(const RunOptions& o, Prepared& p, Communicator& comm, Communicator& host, const GlobalResult& global,
               std::vector<CheckResult>& checks) {
  const int P = comm.size();
  const CheckPolicy policy = check_policy(p.opts, P, p.device, o.tolerance);
  GlobalResult same_p;
  if (policy.same_p) same_p = explicit_same_p(p.cfg, p.opts, p.sh, *p.be, comm, host, o.seed, p.inputs());
  double failed = 0;
  if (comm.rank() == 0) {
    ProblemLoader load;
    if (p.have)
      load = [&](const BlockShape& sh, DType dt, Backend& be) {  // one rank: every layout holds the sequence in order
        return load_problem(o, p.cfg, sh, Layout::A2A, dt, be);
      };
    checks = check_single_process(p.cfg, p.opts, o.batch, o.seq, p.device, p.gpu, o.seed, policy, global, load,
                                  parse_attention_provider(o.attention_provider));
    if (policy.same_p)
      checks.insert(checks.begin() + 1,
                    check_against(CheckReference::SameP, global, same_p, policy.same_p_tolerance));
    failed = print_checks(p, P, checks) ? 0 : 1;
  }
  host.all_reduce(&failed, 1, DType::F64);
  return failed == 0;
}

// --save: the inputs, weights, output and gradients as .npy files (rank 0 writes; the gathers are collectives).
void save_run(const RunOptions& o, Prepared& p, Communicator& host, const GlobalResult& global) {
  Backend& be = *p.be;
  const Layout l = p.opts.layout;
  if (p.have) return save_problem(o, p.cfg, p.sh, l, be, host, p.loaded.weights, p.loaded.x, p.loaded.dy, global);
  save_problem(o, p.cfg, p.sh, l, be, host, make_weights(p.cfg, p.opts.dtype, be, o.seed),
               make_shard(p.cfg, p.sh, p.opts.dtype, be, o.seed, DataStream::X, l),
               make_shard(p.cfg, p.sh, p.opts.dtype, be, o.seed, DataStream::Dy, l), global);
}

// Everything one rank does after prepare(): `comm` carries the block's collectives (device buffers),
// `host` the report's gathers (host buffers; the same object on the cpu). Rank 0 prints. Returns the exit
// code (the same on every rank).
int run_on_rank(const RunOptions& o, Prepared& p, Communicator& comm, Communicator& host) {
  LAGA_CHECK(host.size() == comm.size() && host.rank() == comm.rank(), "host communicator rank ", host.rank(), " of ",
             host.size(), " beside block communicator rank ", comm.rank(), " of ", comm.size());
  const bool lead = comm.rank() == 0;
  const Measurement m = measure(p.cfg, p.opts, p.sh, *p.be, comm, o.seed, o.warmup, p.inputs());
  maybe_inject_failure(comm.rank());
  const std::vector<double> figures = gather_figures(host, m, p.gpu);
  if (lead) {
    print_run_header(o, p, comm);
    print_rank_table(figures, comm.size(), p.device == Device::Cuda);
    print_collectives(m.run, comm.performs_traffic());
    if (o.verbose) print_rank0_details(m.run);
    std::fflush(stdout);
  }
  // Every rank's report, gathered to rank 0 (a collective: every rank joins, whether or not it writes).
  std::vector<json> reports;
  if (!o.json_path.empty()) reports = gather_reports(host, rank_report(m.run, comm.rank(), m.memory, p.gpu));

  GlobalResult global;
  if (o.check || !o.save_dir.empty()) global = gather_result(*p.be, host, m.run);
  if (!o.save_dir.empty()) save_run(o, p, host, global);
  std::vector<CheckResult> checks;
  const bool passed = !o.check || check_run(o, p, comm, host, global, checks);

  if (lead && !o.json_path.empty()) {
    json doc = document_json(o, p.cfg, comm.size());
    doc["machine"] = machine_report(p.device, p.gpu, comm.name());
    doc["phantom"] = false;
    doc["runs"].push_back(run_report(p.opts, reports, o.check ? &checks : nullptr, *p.be));
    write_json(o.json_path, doc);
  }
  return passed ? kExitOk : kExitCheckFailed;
}

int exit_code_of(const std::exception& e) {
  return dynamic_cast<const InvalidArgument*>(&e) ? kExitInvalidInput : kExitRuntimeError;
}

// A rank that fails once collectives may have begun: the others may be waiting in one, so end them all.
[[noreturn]] void fail_all_ranks(const std::exception& e, int rank, int ranks) {
  std::fprintf(stderr, "laga: failure on rank %d of %d: %s\n", rank, ranks, e.what());
  std::fflush(nullptr);
  MpiSession::abort(exit_code_of(e));
}

// Under mpirun, step 1: every rank checks the same input and prints its own refusal, then the ranks agree
// on the verdict (so no rank is left waiting and no rank exits, taking mpirun's kill of the others with it,
// before every rank has printed). Returns the exit code of a refusal, or kExitOk to go on.
int agree_on_input(Communicator& host, int code) {
  double verdict[2] = {code == kExitInvalidInput ? 1.0 : 0.0, code == kExitRuntimeError ? 1.0 : 0.0};
  host.all_reduce(verdict, 2, DType::F64);
  if (verdict[0] == 0 && verdict[1] == 0) return kExitOk;
  if (code == kExitOk) {
    std::fprintf(stderr, "laga: error: the input was refused on another rank (its message is above)\n");
    std::fflush(stderr);
  }
  host.barrier();  // every rank has printed before any exits
  return verdict[0] > 0 ? kExitInvalidInput : kExitRuntimeError;
}

// Under mpirun, step 2: the ranks agree on what they run (one small collective): a config file or flag that
// differs on one node would otherwise run mismatched collectives (a hang) or a mismatched computation.
// Returns kExitInvalidInput (every rank has printed) when they differ, kExitOk to go on.
int agree_on_run(const RunOptions& o, const Prepared& p, Communicator& host, int rank, int world) {
  auto on_off = [](bool b) -> std::string { return b ? "on" : "off"; };
  try {
    Fingerprint fp = run_fingerprint(p.cfg, p.opts, p.sh);
    for (auto& [name, value] : std::initializer_list<std::pair<const char*, std::string>>{
             {"device", o.device}, {"comm", o.comm}, {"seed", std::to_string(o.seed)},
             {"warmup", std::to_string(o.warmup)}, {"check", on_off(o.check)},
             {"tolerance", std::to_string(o.tolerance)}, {"verbose", on_off(o.verbose)},
             {"json", on_off(!o.json_path.empty())}, {"save", on_off(!o.save_dir.empty())},
             {"load", on_off(!o.load_dir.empty())}})
      fp.add(name, value);
    require_agreement(host, fp);
  } catch (const InvalidArgument& e) {
    std::fprintf(stderr, "laga: error: %s\n", e.what());
    std::fflush(stderr);
    host.barrier();  // every rank has printed before any exits
    return kExitInvalidInput;
  } catch (const std::exception& e) {
    fail_all_ranks(e, rank, world);
  }
  return kExitOk;
}

// Under mpirun: each process is a rank.
int run_mpi(const RunOptions& o, const MpiSession& mpi) {
  const int world = mpi.size(), rank = mpi.rank();
  // A rank whose command line did not parse answers this first collective with "not ok" (main.cpp) and
  // leaves: the others leave with it instead of waiting for it in the next collective.
  if (!mpi_all_ok(true)) {
    std::fprintf(stderr, "laga: error: the command line was refused on another rank (its message is above)\n");
    return kExitInvalidInput;
  }
  auto host = make_mpi_communicator();  // collective, reached unconditionally by every rank
  // GPU placement: rank r takes GPU (local rank % device count); NCCL only when no GPU is shared, on
  // every node (collectives, reached unconditionally by every rank).
  const MpiNodeInfo node = mpi_node_info();
  const int gpus = o.device == "cuda" ? cuda_device_count() : 0;
  const bool every_rank_own_gpu = mpi_all_ok(gpus > 0 && node.local_size <= gpus);
  // 1. Refuse bad input on every rank before any collective of the run.
  Prepared p;
  GpuComm gpu_comm = GpuComm::Single;
  int code = kExitOk;
  try {
    LAGA_REQUIRE(o.sp == 0 || o.sp == world, "sp = ", o.sp, " but mpirun started ", world,
                 " processes: under mpirun the ranks are the processes (omit --sp or make it equal)");
    LAGA_REQUIRE(o.phantom_rank == -1, "phantom-rank = ", o.phantom_rank,
                 ": a phantom rank runs alone; launch it without mpirun");
    if (parse_device(o.device) == Device::Cuda) {
      require_cuda_usable();
      gpu_comm = choose_gpu_comm(o.comm, world, every_rank_own_gpu);
    }
    p = prepare(o, world, rank, gpus > 0 ? node.local_rank % gpus : -1, 1);
  } catch (const std::exception& e) {
    code = exit_code_of(e);
    std::fprintf(stderr, "laga: error: %s\n", e.what());
    std::fflush(stderr);
  }
  try {
    if (const int refused = agree_on_input(*host, code); refused != kExitOk) return refused;
  } catch (const std::exception& e) {
    fail_all_ranks(e, rank, world);
  }
  // 2. The ranks agree on what they run (one small collective).
  if (const int refused = agree_on_run(o, p, *host, rank, world); refused != kExitOk) return refused;
  // 3. The run. From here a failure on one rank ends all of them (MpiSession::abort): the exception must
  //    not unwind through ~MpiSession, whose MPI_Finalize would wait for ranks stuck in a collective.
  try {
    std::unique_ptr<Communicator> device_comm;
    if (p.device == Device::Cuda) device_comm = make_gpu_communicator(gpu_comm, *host, *p.be);
    return run_on_rank(o, p, device_comm ? *device_comm : *host, *host);
  } catch (const std::exception& e) {
    fail_all_ranks(e, rank, world);
  }
}

// ---------------------------------------------------------------- phantom ranks

// The variants a phantom run covers: one, or with 'all' every variant (kAllVariants), layout, kernel.
std::vector<BlockOptions> phantom_variants(const RunOptions& o, DType dtype) {
  std::vector<BlockOptions> forms;
  if (o.form == "all") {
    LAGA_REQUIRE(o.recompute == "none" && o.absorbed_attention == "mqa", "form = all covers every variant (",
                 "absorbed mqa and expanded, laga with and without recompute): leave --recompute and "
                 "--absorbed-attention out");
    for (const Variant& v : kAllVariants) forms.push_back(with_variant(BlockOptions{}, v));
  } else {
    forms.push_back(BlockOptions{.form = parse_form(o.form), .recompute = parse_recompute(o.recompute),
                                 .absorbed_attention = parse_absorbed_attention(o.absorbed_attention)});
  }
  std::vector<BlockOptions> out;
  for (Layout l : parse_layouts({o.layout}))
    for (AttentionKernel k : parse_kernels({o.kernel}))
      for (BlockOptions f : forms) {
        if (o.form == "all" && !layout_supports(l, variant_of(f))) continue;  // p2p: explicit and laga
        if (o.kernel == "all" && l == Layout::P2P && k != AttentionKernel::Fused) continue;  // p2p: fused
        f.layout = l;
        f.kernel = k;
        f.dtype = dtype;
        f.kv_grad_reduce_fp32 = o.kv_grad_reduce_fp32;
        f.overlap = o.overlap;
        f.grad_dtype = grad_dtype_of(o);
        out.push_back(f);
      }
  return out;
}

// Validates a phantom sweep before anything runs: the options, and every variant at the shape. Returns
// the rank's shape.
BlockShape check_phantom(const RunOptions& o, const std::vector<BlockOptions>& variants, int P, int r) {
  LAGA_REQUIRE(P >= 1, "sp = ", P, ": the number of sequence-parallel ranks must be >= 1");
  LAGA_REQUIRE(r < P, "phantom-rank = ", r, ": must be in [0, sp = ", P, ")");
  LAGA_REQUIRE(!o.check && o.save_dir.empty() && o.load_dir.empty(),
               "phantom-rank: a phantom rank exchanges no real data, so --check, --save and --load do not apply");
  LAGA_REQUIRE(o.comm == "auto", "comm = '", o.comm, "': a phantom rank uses no communicator (leave --comm out)");
  LAGA_REQUIRE(o.phantom_comm == "instant" || o.phantom_comm == "timed", "phantom-comm = '", o.phantom_comm,
               "': expected instant or timed");
  LAGA_REQUIRE(o.phantom_link == "node" || o.phantom_link == "cross-node", "phantom-link = '", o.phantom_link,
               "': expected node or cross-node");
  require_writable(o.json_path);
  Prepared base;
  RunOptions one = o;
  one.form = o.form == "all" ? "laga" : o.form;
  one.layout = o.layout == "all" ? "a2a" : o.layout;
  one.kernel = o.kernel == "all" ? "fused" : o.kernel;
  if (o.form == "all") one.recompute = "none", one.absorbed_attention = "mqa";
  check_options(one, base, P, r);
  for (const BlockOptions& v : variants) validate(base.cfg, v, base.sh);
  return base.sh;
}

// One variant's line of the phantom summary.
std::vector<std::string> phantom_row(const BlockOptions& v, const Measurement& m) {
  const RankRun& run = m.run;
  std::vector<std::string> row{variant_of(v).label(), layout_name(v.layout), kernel_name(v.kernel),
                               human_bytes(double(run.saved_bytes)), human_bytes(double(run.fwd.peak_bytes)),
                               human_bytes(double(run.bwd.peak_bytes)), human_bytes(double(bytes_sent(run.traffic))),
                               fmt("%.4g", (run.fwd.total_flops() + run.bwd.total_flops()) * 1e-9),
                               fmt("%.2f", run.fwd.total_seconds() * 1e3), fmt("%.2f", run.bwd.total_seconds() * 1e3)};
  if (m.memory.have)
    row.insert(row.end(), {human_bytes(double(m.memory.peak_used)), human_bytes(double(m.memory.scratch_peak))});
  return row;
}

// One variant in detail: its saved tensors and its FLOPs and time by phase.
void print_phantom_details(const BlockOptions& v, const Measurement& m) {
  const RankRun& run = m.run;
  const DeviceMemory& mem = m.memory;
  const std::string device = !mem.have ? "" : ", device in use " + human_bytes(double(mem.used_before)) + " before, peak " +
                                               human_bytes(double(mem.peak_used)) + ", scratch peak " +
                                               human_bytes(double(mem.scratch_peak));
  std::printf("\n%s, layout %s, kernel %s: saved %zu bytes (%s), peak fwd %s, peak bwd %s, sent %s%s\n",
              variant_of(v).label(), layout_name(v.layout), kernel_name(v.kernel), run.saved_bytes,
              human_bytes(double(run.saved_bytes)).c_str(), human_bytes(double(run.fwd.peak_bytes)).c_str(),
              human_bytes(double(run.bwd.peak_bytes)).c_str(), human_bytes(double(bytes_sent(run.traffic))).c_str(),
              device.c_str());
  Table s({"saved tensor", "shape", "bytes"}, 2);
  for (const auto& rec : run.saved) s.add({rec.name, shape_string(rec.shape), std::to_string(rec.bytes)});
  s.add({"total", "", std::to_string(run.saved_bytes)});
  s.print();
  Table f({"phase", "fwd GFLOP", "bwd GFLOP", "fwd ms", "bwd ms"});
  for (int ph = 0; ph < kOpPhaseCount; ++ph)
    f.add({op_phase_name(OpPhase(ph)), fmt("%.3f", run.fwd.flops[ph] * 1e-9), fmt("%.3f", run.bwd.flops[ph] * 1e-9),
           fmt("%.2f", run.fwd.seconds[ph] * 1e3), fmt("%.2f", run.bwd.seconds[ph] * 1e3)});
  f.print();
}

// Refuses a phantom sweep whose variants (one at a time) do not fit the device or the host.
void require_phantom_fits(const RunOptions& o, const MlaConfig& cfg, const BlockShape& shape, Device device, int gpu,
                          const std::vector<BlockOptions>& variants) {
  Prepared fit;
  fit.cfg = cfg;
  fit.sh = shape;
  fit.device = device;
  fit.gpu = gpu;
  for (const BlockOptions& v : variants) {
    fit.opts = v;
    require_run_fits(o, fit, 1);
  }
}

// One variant of a phantom sweep: its line (or its details), and its entry in the document.
json phantom_entry(const BlockOptions& v, const Measurement& m, Backend& be, int r, int gpu, bool details) {
  std::string line;
  for (const auto& cell : phantom_row(v, m)) line += (line.empty() ? "" : " | ") + cell;
  if (details) print_phantom_details(v, m);
  else std::printf("done: %s\n", line.c_str());
  json entry = run_report(v, std::vector<json>{rank_report(m.run, r, m.memory, gpu)}, nullptr, be);
  if (details && entry.contains("attention_calls"))
    std::printf("attention calls: %s\n", entry["attention_calls"].dump().c_str());
  return entry;
}

// Rank r of P alone: collectives return correctly sized, deterministic data and move nothing.
int run_phantom(const RunOptions& o) {
  const int P = o.sp == 0 ? 1 : o.sp;
  const int r = o.phantom_rank;
  const MlaConfig cfg = resolve_model(o.model);
  const Device device = parse_device(o.device);
  const DType dtype = parse_dtype(dtype_text(o));
  const std::vector<BlockOptions> variants = phantom_variants(o, dtype);
  const BlockShape shape = check_phantom(o, variants, P, r);
  const bool cuda = device == Device::Cuda;
  if (cuda) require_cuda_usable();
  const int gpu = cuda ? 0 : -1;
  require_phantom_fits(o, cfg, shape, device, gpu, variants);
  auto make_backend = [&] {
    if (!cuda) return make_cpu_backend();
    auto be = make_cuda_backend(gpu);
    cuda_set_attention_provider(*be, parse_attention_provider(o.attention_provider));
    cuda_set_attention_deterministic(*be, !o.nondeterministic);
    return be;
  };
  // Weights and inputs live on a backend of their own, made once; each variant runs on a fresh backend,
  // so the memory one variant's kernels keep outside the allocator (scratch, workspaces) is not charged
  // to the next one.
  auto data_be = make_backend();
  const bool timed = o.phantom_comm == "timed";
  const char* notice = timed ? "collectives were NOT performed but held the queue for the model's time of their "
                               "bytes; received data is synthetic"
                             : "collectives were NOT performed; received data is synthetic";
  TimedLinks links;
  for (const Placement& pl : standard_placements(links.model, P))
    if (pl.name == o.phantom_link) links.ranks_per_node = pl.ranks_per_node;
  std::printf("phantom rank %d of %d: %s\n", r, P, notice);
  std::printf("laga run: model '%s', S=%ld, batch %ld, %s, rank %d of P=%d alone on %s%s, %zu variant(s)\n",
              cfg.name.c_str(), long(o.seq), long(o.batch), dtype_name(dtype), r, P, cuda ? "cuda: " : "cpu",
              cuda ? cuda_device_name(gpu).c_str() : "", variants.size());
  std::fflush(stdout);

  // Weights and this rank's input are the same for every variant: made once (received data are synthetic, so
  // the tokens of one layout serve them all).
  const Layout data_layout = o.layout == "all" ? Layout::A2A : parse_layout(o.layout);
  ProblemData data{.weights = make_weights(cfg, dtype, *data_be, o.seed),
                   .x = make_shard(cfg, shape, dtype, *data_be, o.seed, DataStream::X, data_layout),
                   .dy = make_shard(cfg, shape, dtype, *data_be, o.seed, DataStream::Dy, data_layout)};
  data_be->synchronize();

  json doc = document_json(o, cfg, P);
  doc["machine"] = machine_report(device, gpu, "phantom");
  doc["phantom"] = {{"rank", r}, {"ranks", P}, {"comm", o.phantom_comm},
                    {"link", timed ? json(o.phantom_link) : json(nullptr)}, {"note", std::string("phantom rank ") + std::to_string(r) + " of " +
                                                            std::to_string(P) + ": " + notice}};
  std::vector<std::string> header{"variant", "layout", "kernel", "saved", "peak fwd", "peak bwd", "sent", "GFLOP",
                                  "fwd ms", "bwd ms"};
  if (cuda) header.insert(header.end(), {"dev peak", "scratch peak"});
  Table summary(header, 3);
  const bool details = o.verbose || variants.size() == 1;
  for (const BlockOptions& v : variants) {
    auto be = make_backend();
    std::unique_ptr<CommClock> clock = cuda ? make_cuda_comm_clock(*be) : make_host_comm_clock();
    auto comm = timed ? make_timed_phantom_communicator(*be, r, P, links, *clock) : make_phantom_communicator(*be, r, P);
    const Measurement m = measure(cfg, v, shape, *be, *comm, o.seed, o.warmup, data.inputs());
    summary.add(phantom_row(v, m));
    doc["runs"].push_back(phantom_entry(v, m, *be, r, gpu, details));
    // Rewritten after every variant: a sweep stopped part way still leaves what it measured.
    if (!o.json_path.empty()) write_json(o.json_path, doc);
    std::fflush(stdout);
  }
  std::printf("\nper rank %d of %d (saved: kept from forward to backward; peak: live activation bytes%s):\n", r, P,
              cuda ? "; dev peak: cudaMemGetInfo, whole device; scratch peak: kernel scratch outside the allocator" : "");
  summary.print();
  std::printf("phantom rank %d of %d: %s\n", r, P, notice);
  return kExitOk;
}

// ---------------------------------------------------------------- without mpirun

// One GPU rank in this process (P = 1).
int run_single_gpu(const RunOptions& o) {
  require_cuda_usable();
  const GpuComm kind = choose_gpu_comm(o.comm, 1, true);
  Prepared p = prepare(o, 1, 0, 0, 1);
  // Host gathers at P = 1 need no collective; a single-rank communicator over a CPU backend serves
  // them (and bootstraps NCCL when --comm nccl asks for it at P = 1).
  auto host_be = make_cpu_backend();
  auto host = make_single_rank_communicator(*host_be);
  auto comm = make_gpu_communicator(kind, *host, *p.be);
  return run_on_rank(o, p, *comm, *host);
}

int run_command(const RunOptions& o, int* argc, char*** argv) {
  MpiSession mpi(argc, argv);
  if (mpi.size() > 1) return run_mpi(o, mpi);
  if (o.phantom_rank >= 0) return run_phantom(o);
  LAGA_REQUIRE(o.phantom_comm == "instant", "phantom-comm = ", o.phantom_comm, ": timed collectives are a phantom "
               "rank's (add --phantom-rank R)");
  LAGA_REQUIRE(o.phantom_rank == -1, "phantom-rank = ", o.phantom_rank, ": must be >= 0");
  const int P = o.sp == 0 ? 1 : o.sp;
  LAGA_REQUIRE(P >= 1, "sp = ", P, ": the number of sequence-parallel ranks must be >= 1");
  LAGA_REQUIRE(P <= kMaxThreadRanks, "sp = ", P, ": without mpirun the ranks are threads of this process, at most ",
               kMaxThreadRanks, "; launch mpirun -np ", P, " laga run ... for more");
  if (parse_device(o.device) == Device::Cuda) {
    LAGA_REQUIRE(P == 1, "sp = ", P, " with --device cuda: GPU ranks are processes, not threads; launch "
                 "mpirun -np ", P, " laga run --device cuda ... (ranks sharing one GPU exchange data over MPI)");
    return run_single_gpu(o);
  }
  // Prepare every rank before starting threads, so bad input never leaves a thread waiting at a barrier.
  std::vector<Prepared> prepared;
  for (int r = 0; r < P; ++r) prepared.push_back(prepare(o, P, r, -1, r == 0 ? P : 0));
  if (P == 1) {
    auto comm = make_single_rank_communicator(*prepared[0].be);
    return run_on_rank(o, prepared[0], *comm, *comm);
  }
  std::vector<int> codes(P, kExitOk);
  run_thread_ranks(P, [&](int r, Communicator& comm) { codes[r] = run_on_rank(o, prepared[r], comm, comm); });
  return codes[0];
}

}  // namespace

std::function<int()> add_run(CLI::App& app, CLI::App*& sub, int* argc, char*** argv) {
  auto o = std::make_shared<RunOptions>();
  sub = app.add_subcommand("run", "Run one configuration forward and backward on P ranks (mpirun -np P laga run ...)");
  sub->add_option("--model", o->model, "Preset (" + [] {
    std::string s;
    for (const auto& n : preset_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }() + ") or path to a Hugging Face config.json")->capture_default_str();
  sub->add_option("--seq", o->seq, "Sequence length S (all ranks together)")->capture_default_str();
  sub->add_option("--batch", o->batch, "Micro-batch size")->capture_default_str();
  sub->add_option("--sp", o->sp, "Sequence-parallel ranks; default: the mpirun process count (1 alone). "
                                 "Without mpirun, P > 1 runs P threads in this process (cpu only)");
  sub->add_option("--form", o->form, "explicit, absorbed or laga (all: every variant, phantom ranks only)")->capture_default_str();
  sub->add_option("--layout", o->layout, "a2a (Ulysses), all_gather (context parallel) or p2p (the ring); all: a2a and all_gather, phantom ranks only")->capture_default_str();
  sub->add_option("--kernel", o->kernel, "eager (scores kept) or fused (online softmax); all: both, phantom ranks only")->capture_default_str();
  sub->add_option("--device", o->device, "cpu or cuda (one GPU per rank: local rank % device count)")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "float32 or float64 on the cpu (default float32); bfloat16 or float32 on cuda "
                                       "(default bfloat16)");
  sub->add_option("--comm", o->comm, "GPU communicator: auto (NCCL when every rank has its own GPU, else MPI with "
                                     "host staging; a copy at P = 1), nccl or host-staging")->capture_default_str();
  sub->add_option("--attention-provider", o->attention_provider,
                  "Who runs the fused attention on cuda: auto (per shape, the faster of laga and cuDNN by the table "
                  "bench/attention-providers.json, within the scratch cap; laga where cuDNN cannot run it), laga or "
                  "cudnn")
      ->capture_default_str();
  sub->add_flag("--nondeterministic", o->nondeterministic,
                "Let the attention backward add its float32 sums in any order (cuDNN's default backward, as "
                "PyTorch's SDPA runs it, with a small workspace; laga's kernels without waiting for the blocks "
                "before them): faster, and reruns differ in the last bits");
  sub->add_option("--recompute", o->recompute, "none, or kv (laga: keep only the gathered latent)")->capture_default_str();
  sub->add_option("--absorbed-attention", o->absorbed_attention,
                  "absorbed form: mqa (native) or expanded (latent copied per head)")->capture_default_str();
  sub->add_option("--phantom-rank", o->phantom_rank,
                  "Run rank R of --sp P alone (no mpirun): collectives are not performed and received data is "
                  "synthetic; memory, FLOPs and time of one rank of a large job on one device");
  sub->add_option("--phantom-comm", o->phantom_comm, "Phantom rank: instant (collectives cost nothing) or timed "
                  "(each holds the queue for the alpha-beta model's time of its bytes, laga bench's default "
                  "parameters)")->capture_default_str();
  sub->add_option("--phantom-link", o->phantom_link, "Timed phantom: node (NVLink within a node) or cross-node "
                  "(InfiniBand, one rank a node)")->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed of the deterministic weights and inputs")->capture_default_str();
  sub->add_option("--warmup", o->warmup, "Untimed passes (forward and backward) before the measured one: first "
                                         "launches load kernels and pick GEMM algorithms")->capture_default_str();
  sub->add_flag("--check", o->check, "Compare with the single-rank explicit result on the same device and dtype "
                                     "(and, on cuda, with the CPU float64 result); exit 1 above tolerance");
  sub->add_option("--tolerance", o->tolerance, "Relative error bound of --check against the same-device results "
                                               "(default 1e-5 float32, 1e-10 float64; bfloat16: 1e-3 against explicit at the "
                                               "same P, and at P = 1, 3e-2 against the single-rank result at P > 1 and for "
                                               "absorbed, which rounds at other points)");
  sub->add_option("--grad-dtype", o->grad_dtype,
                  "The weight gradients' dtype: the weights' (as PyTorch's .grad; one GEMM writes each in it) or "
                  "their accumulation dtype (the default: float32 for bfloat16, as Megatron's main_grad)");
  sub->add_flag("--kv-grad-reduce-in-fp32", o->kv_grad_reduce_fp32,
                "all_gather, bfloat16, P > 1: explicit widens its partial K/V gradients to float32 before the "
                "reduce-scatter (twice that traffic) and up-projects the float32 sums; default: reduce-scatter in "
                "bfloat16, as TransformerEngine does");
  sub->add_flag("--overlap", o->overlap, "Start each collective as soon as its input exists and compute what does "
                                         "not need it meanwhile (latent all-gather under the query path, reduce-scatter "
                                         "under the weight-gradient GEMMs); results are bitwise the same");
  sub->add_flag("--verbose", o->verbose, "List the saved tensors and the FLOPs and time by phase");
  sub->add_option("--save", o->save_dir, "Write inputs, weights, output and gradients as .npy files to DIR");
  sub->add_option("--load", o->load_dir, "Read x.npy, weights (and dy.npy if present) from DIR");
  sub->add_option("--json", o->json_path, "Write the configuration, options, every rank's saved tensors, peaks, "
                                          "traffic, FLOPs and seconds by phase, and the machine to FILE");
  return [o, argc, argv] { return run_command(*o, argc, argv); };
}

}  // namespace laga::cli
