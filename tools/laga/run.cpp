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
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.hpp"
#include "format.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga/mpi_comm.hpp"
#include "laga/nccl_comm.hpp"
#include "laga/npy.hpp"
#include "laga/problem.hpp"
#include "laga_build_commit.hpp"


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
  int phantom_rank = -1;  // >= 0: run this rank of --sp alone
  std::uint64_t seed = 1;
  int warmup = 0;  // untimed passes before the measured one
  bool check = false;
  bool verbose = false;
  bool kv_grad_reduce_fp32 = false;
  std::string save_dir, load_dir, json_path;
  double tolerance = 0;  // 0: the dtype's default (default_tolerance)
};

// ---------------------------------------------------------------- devices, dtypes, tolerances

enum class DeviceKind { cpu, cuda };

DeviceKind parse_device(const std::string& s) {
  if (s == "cpu") return DeviceKind::cpu;
  if (s == "cuda") return DeviceKind::cuda;
  throw InvalidArgument(detail::concat("device = '", s, "': must be one of cpu, cuda"));
}

std::string dtype_text(const RunOptions& o) {
  if (!o.dtype.empty()) return o.dtype;
  return parse_device(o.device) == DeviceKind::cuda ? "bfloat16" : "float32";
}

// A GPU run against the CPU's float64 result (the precision of the dtype itself).
double cpu_reference_tolerance(DType dt) { return dt == DType::bf16 ? 3e-2 : 1e-5; }

// Against the single-rank explicit result on the same device and dtype. bf16: the paper's bar for LAGA
// against explicit (DESIGN.md section 5). The absorbed form rounds at other points (q W_UK^T, the latent
// output before W_UV), so in bf16 it is held to the dtype's own precision instead (measured ~5e-3).
double default_tolerance(DType dt, Form form) {
  switch (dt) {
    case DType::f64: return 1e-10;
    case DType::f32: return 1e-5;
    case DType::bf16: return form == Form::Absorbed ? cpu_reference_tolerance(dt) : 1e-3;
  }
  return 1e-5;
}

void require_cuda_usable() {
#ifdef LAGA_HAVE_CUDA
  LAGA_REQUIRE(cuda_available(), "device = cuda: no usable GPU (no device visible to the CUDA runtime); run "
               "with --device cpu");
#else
  LAGA_REQUIRE(false, "device = cuda: laga was built without CUDA (nvcc was not found at configure time); run "
               "with --device cpu");
#endif
}

// Which communicator GPU ranks use.
enum class GpuComm { single, nccl, host_staging };
const char* gpu_comm_name(GpuComm c) {
  switch (c) {
    case GpuComm::single: return "single";
    case GpuComm::nccl: return "nccl";
    case GpuComm::host_staging: return "host-staging";
  }
  return "?";
}

// `--comm` for P ranks on cuda, given whether every rank has a GPU of its own. Throws InvalidArgument.
GpuComm choose_gpu_comm(const std::string& text, int P, bool every_rank_own_gpu) {
  LAGA_REQUIRE(text == "auto" || text == "nccl" || text == "host-staging", "comm = '", text,
               "': must be one of auto, nccl, host-staging");
  if (text == "nccl") {
    LAGA_REQUIRE(nccl_available(), "comm = nccl: laga was built without NCCL; use --comm host-staging");
    LAGA_REQUIRE(every_rank_own_gpu, "comm = nccl: ranks share a GPU, and NCCL needs one rank per GPU; use "
                                     "--comm host-staging (or auto), or give each rank its own GPU");
    return GpuComm::nccl;
  }
  if (text == "host-staging") return GpuComm::host_staging;
  if (P == 1) return GpuComm::single;
  return every_rank_own_gpu && nccl_available() ? GpuComm::nccl : GpuComm::host_staging;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
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

// This rank's [s, B, d] shard of a [B, S, d] array.
std::vector<double> shard_of_bsd(const std::vector<double>& v, const BlockShape& sh, std::int64_t d) {
  const std::int64_t s = sh.local_seq();
  std::vector<double> out(s * sh.batch * d);
  for (std::int64_t t = 0; t < s; ++t)
    for (std::int64_t b = 0; b < sh.batch; ++b)
      for (std::int64_t j = 0; j < d; ++j)
        out[(t * sh.batch + b) * d + j] = v[(b * sh.seq + sh.rank * s + t) * d + j];
  return out;
}

struct Loaded {
  MlaWeights weights;
  Tensor x, dy;
};

Loaded load_problem(const RunOptions& o, const MlaConfig& cfg, const BlockShape& sh, DType dt, Backend& be) {
  Loaded l;
  l.weights = allocate_weights(cfg, dt, be.allocator());
  for (auto& [name, t] : l.weights.named()) from_host(be, *t, load_array(o.load_dir, name, t->shape()));
  const Shape bsd{sh.batch, sh.seq, cfg.hidden_size};
  l.x = Tensor(be.allocator(), dt, {sh.local_seq(), sh.batch, cfg.hidden_size}, "x", MemoryKind::external);
  from_host(be, l.x, shard_of_bsd(load_array(o.load_dir, "x", bsd), sh, cfg.hidden_size));
  l.dy = Tensor(be.allocator(), dt, l.x.shape(), "dy", MemoryKind::external);
  if (std::filesystem::exists(o.load_dir + "/dy.npy"))
    from_host(be, l.dy, shard_of_bsd(load_array(o.load_dir, "dy", bsd), sh, cfg.hidden_size));
  else
    l.dy = make_shard(cfg, sh, dt, be, o.seed, DataStream::dy);
  return l;
}

// `host` serves host buffers (the gathers below are of host vectors).
void save_problem(const RunOptions& o, const MlaConfig& cfg, const BlockShape& sh, Backend& be, Communicator& host,
                  const MlaWeights& w, const Tensor& x, const Tensor& dy, const GlobalResult& res) {
  auto gather = [&](const Tensor& t) {
    std::vector<double> local = to_host(be, t), full(local.size() * host.size());
    host.all_gather(local.data(), full.data(), local.size(), DType::f64);
    return full;
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
  std::printf("saved x, dy, weights, y, dx and grad_* as .npy ([batch, seq, hidden]; weights [in, out]) to %s\n",
              o.save_dir.c_str());
}

// ---------------------------------------------------------------- the JSON document (--json FILE)

json phases_json(const std::array<double, kOpPhaseCount>& v) {
  json j = json::object();
  for (int i = 0; i < kOpPhaseCount; ++i) j[op_phase_name(OpPhase(i))] = v[i];
  return j;
}

json options_json(const BlockOptions& opts) {
  return {{"variant", variant_of(opts).label()},
          {"form", form_name(opts.form)},
          {"layout", layout_name(opts.layout)},
          {"kernel", kernel_name(opts.kernel)},
          {"recompute", recompute_name(opts.recompute)},
          {"absorbed_attention", absorbed_attention_name(opts.absorbed_attention)},
          {"dtype", dtype_name(opts.dtype)},
          {"kv_grad_reduce_in_fp32", opts.kv_grad_reduce_fp32}};
}

// Device memory as cudaMemGetInfo sees it around one run (absent on the cpu).
struct DeviceMemory {
  bool have = false;
  std::size_t used_before = 0;  // before the run's weights and inputs (context, workspaces, other ranks)
  std::size_t peak_used = 0;    // high-water mark over the run
  std::size_t scratch_peak = 0;  // the backend's kernel scratch (outside the allocator), high-water mark
};

// One rank's measurements of one run.
json rank_json(const RankRun& run, int rank, const DeviceMemory& mem, int gpu) {
  json saved = json::array();
  for (const auto& t : run.saved)
    saved.push_back({{"name", t.name}, {"shape", t.shape}, {"dtype", dtype_name(t.dtype)}, {"bytes", t.bytes}});
  json traffic = json::array();
  std::size_t sent = 0, received = 0;
  for (const auto& c : run.traffic) {
    traffic.push_back({{"phase", phase_name(c.phase)}, {"collective", collective_name(c.kind)}, {"tensor", c.tensor},
                       {"calls", c.calls}, {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received},
                       {"seconds", c.seconds},
                       {"bus_bytes_per_s", c.seconds > 0 ? double(c.bytes_sent) / c.seconds : 0.0}});
    sent += c.bytes_sent, received += c.bytes_received;
  }
  json j = {{"rank", rank},
            {"hostname", host_name()},
            {"saved_bytes", run.saved_bytes},
            {"saved", saved},
            {"peak_forward_bytes", run.fwd.peak_bytes},
            {"peak_backward_bytes", run.bwd.peak_bytes},
            {"bytes_sent", sent},
            {"bytes_received", received},
            {"traffic", traffic},
            {"flops_forward", phases_json(run.fwd.flops)},
            {"flops_backward", phases_json(run.bwd.flops)},
            {"seconds_forward", phases_json(run.fwd.seconds)},
            {"seconds_backward", phases_json(run.bwd.seconds)},
            {"seconds_forward_total", run.fwd.total_seconds()},
            {"seconds_backward_total", run.bwd.total_seconds()}};
  if (mem.have) {
    j["gpu"] = gpu;
    j["device_used_before_bytes"] = mem.used_before;
    j["device_peak_used_bytes"] = mem.peak_used;
    j["backend_scratch_peak_bytes"] = mem.scratch_peak;
  }
  return j;
}

json machine_json(DeviceKind device, int gpu, const char* communicator) {
  json j = {{"hostname", host_name()}, {"commit", LAGA_BUILD_COMMIT},
            {"dirty", LAGA_BUILD_DIRTY < 0 ? json(nullptr) : json(LAGA_BUILD_DIRTY == 1)}, {"communicator", communicator},
            {"device", device == DeviceKind::cuda ? "cuda" : "cpu"}};
  if (device == DeviceKind::cuda) {
    j["device_name"] = cuda_device_name(gpu);
    j["device_count"] = cuda_device_count();
    j["device_memory_bytes"] = cuda_mem_info(gpu).total_bytes;
  } else {
    j["device_name"] = "cpu";
  }
  return j;
}

json document_json(const RunOptions& o, const MlaConfig& cfg, int P) {
  return {{"command", "run"},
          {"config", json::parse(config_to_json(cfg))},
          {"options", {{"model", o.model}, {"seq", o.seq}, {"batch", o.batch}, {"sp", P}, {"form", o.form},
                       {"layout", o.layout}, {"kernel", o.kernel}, {"recompute", o.recompute},
                       {"absorbed_attention", o.absorbed_attention}, {"dtype", dtype_text(o)}, {"device", o.device},
                       {"comm", o.comm}, {"seed", o.seed}, {"check", o.check}, {"warmup", o.warmup}}},
          {"runs", json::array()}};
}

void write_json(const std::string& path, const json& doc) {
  std::ofstream f(path);
  LAGA_REQUIRE(f.good(), "json = '", path, "': cannot open for writing");
  f << doc.dump(2) << "\n";
  LAGA_CHECK(f.good(), "writing ", path, " failed");
}

// Refuses a --json path that cannot be written before anything runs (opens it for appending: creates it,
// changes nothing else).
void require_writable(const std::string& path) {
  if (path.empty()) return;
  std::ofstream f(path, std::ios::app);
  LAGA_REQUIRE(f.good(), "json = '", path, "': cannot open for writing");
}

// Every rank's string, in rank order, through a communicator over host buffers.
std::vector<std::string> gather_strings(Communicator& host, const std::string& mine) {
  const int P = host.size();
  if (P == 1) return {mine};
  double len = double(mine.size());
  std::vector<double> lens(P);
  host.all_gather(&len, lens.data(), 1, DType::f64);
  std::size_t longest = 0;
  for (double l : lens) longest = std::max(longest, std::size_t(l));
  const std::size_t words = std::max<std::size_t>(1, (longest + sizeof(double) - 1) / sizeof(double));
  std::vector<double> buf(words, 0.0), all(words * P);
  std::memcpy(buf.data(), mine.data(), mine.size());
  host.all_gather(buf.data(), all.data(), words, DType::f64);
  std::vector<std::string> out;
  for (int r = 0; r < P; ++r)
    out.emplace_back(reinterpret_cast<const char*>(all.data() + std::size_t(r) * words), std::size_t(lens[r]));
  return out;
}

// ---------------------------------------------------------------- one rank of a real run

// What one rank needs before any collective: the configuration, options, shape, its backend and, with
// --load, the problem read from disk. Communicates with no one, so bad input is refused on every rank
// before any collective. Throws InvalidArgument for bad input.
struct Prepared {
  MlaConfig cfg;
  BlockOptions opts;
  BlockShape sh;
  DeviceKind device = DeviceKind::cpu;
  int gpu = -1;  // cuda: the device index
  std::unique_ptr<Backend> be;
  Loaded loaded;
  bool have = false;  // loaded from --load
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
                        .dtype = parse_dtype(dtype_text(o)), .kv_grad_reduce_fp32 = o.kv_grad_reduce_fp32};
  p.sh = BlockShape{.batch = o.batch, .seq = o.seq, .ranks = ranks, .rank = rank};
  validate(p.cfg, p.opts, p.sh);
  if (p.device == DeviceKind::cpu) {
    LAGA_REQUIRE(p.opts.dtype != DType::bf16, "dtype = bfloat16: the cpu backend runs float32 or float64 "
                                              "(bfloat16 needs --device cuda)");
    LAGA_REQUIRE(o.comm == "auto", "comm = '", o.comm, "': --comm chooses between GPU communicators (with --device cuda)");
  } else {
    LAGA_REQUIRE(p.opts.dtype != DType::f64, "dtype = float64: the cuda backend runs bfloat16 or float32 "
                                             "(float64 needs --device cpu)");
  }
  LAGA_REQUIRE(o.tolerance >= 0, "tolerance = ", o.tolerance, ": must be >= 0 (0 picks the dtype's default)");
  LAGA_REQUIRE(o.warmup >= 0 && o.warmup <= 100, "warmup = ", o.warmup, ": must be in [0, 100]");
}

Prepared prepare(const RunOptions& o, int ranks, int rank, int gpu) {
  Prepared p;
  check_options(o, p, ranks, rank);
  if (rank == 0) require_writable(o.json_path);  // only rank 0 writes
  if (!o.save_dir.empty() && rank == 0) {  // only rank 0 writes
    std::error_code ec;
    std::filesystem::create_directories(o.save_dir, ec);
    LAGA_REQUIRE(!ec && std::filesystem::is_directory(o.save_dir), "save = \"", o.save_dir,
                 "\": cannot create the directory (", ec ? ec.message() : "not a directory", ")");
  }
  if (p.device == DeviceKind::cuda) {
    require_cuda_usable();
    p.gpu = gpu;
    p.be = make_cuda_backend(gpu);
  } else {
    p.be = make_cpu_backend();
  }
  if (!o.load_dir.empty()) {
    p.loaded = load_problem(o, p.cfg, p.sh, p.opts.dtype, *p.be);
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

// The block on this rank, with the device memory around it on cuda.
RankRun measured_run(Prepared& p, Communicator& comm, std::uint64_t seed, const MlaWeights* w, const Tensor* x,
                     const Tensor* dy, DeviceMemory& mem, int warmup) {
  // Warm-up passes pay the first-launch costs (module loading, cuBLASLt heuristics, the allocator's pool)
  // outside the measured pass; they are the same collectives on every rank, so every rank runs them.
  for (int i = 0; i < warmup; ++i) run_rank(p.cfg, p.opts, p.sh, *p.be, comm, seed, w, x, dy);
  mem = DeviceMemory{};
  if (p.device == DeviceKind::cuda) {
    p.be->synchronize();
    mem.have = true;
    cuda_reset_scratch_peak(*p.be, /*release=*/true);  // scratch of an earlier run is not this run's
    cuda_reset_peak_used(*p.be);  // hands the pool's unused memory back first, so warm-ups are not counted
    mem.used_before = cuda_mem_info(p.gpu).used_bytes();
  }
  RankRun run = run_rank(p.cfg, p.opts, p.sh, *p.be, comm, seed, w, x, dy);
  if (mem.have) {
    p.be->synchronize();
    mem.peak_used = std::max(cuda_peak_used_bytes(*p.be), cuda_mem_info(p.gpu).used_bytes());
    mem.scratch_peak = cuda_scratch_peak_bytes(*p.be);
  }
  return run;
}

// A table of relative errors against `ref`; returns whether every one is within `tol` (NaN fails).
bool print_comparison(const GlobalResult& got, const GlobalResult& ref, double tol, json& out) {
  bool ok_all = true;
  Table t({"tensor", "rel. error", "verdict"});
  out = json::array();
  for (const auto& c : compare(got, ref)) {
    const bool ok = c.rel_error <= tol;
    ok_all = ok_all && ok;
    t.add({c.tensor, fmt("%.3e", c.rel_error), ok ? "ok" : "FAIL"});
    out.push_back({{"tensor", c.tensor}, {"rel_error", c.rel_error}, {"ok", ok}});
  }
  t.print();
  return ok_all;
}

// Everything one rank does after prepare(): `comm` carries the block's collectives (device buffers),
// `host` the report's gathers (host buffers; the same object on the cpu). Rank 0 prints. Returns the exit
// code (the same on every rank).
int run_on_rank(const RunOptions& o, Prepared& p, Communicator& comm, Communicator& host) {
  const MlaConfig& cfg = p.cfg;
  const BlockOptions& opts = p.opts;
  const BlockShape& sh = p.sh;
  Backend& be = *p.be;
  const bool have = p.have;
  Loaded& loaded = p.loaded;
  const bool lead = comm.rank() == 0;
  LAGA_CHECK(host.size() == comm.size() && host.rank() == comm.rank(), "host communicator rank ", host.rank(), " of ",
             host.size(), " beside block communicator rank ", comm.rank(), " of ", comm.size());

  DeviceMemory mem;
  RankRun run = measured_run(p, comm, o.seed, have ? &loaded.weights : nullptr, have ? &loaded.x : nullptr,
                             have ? &loaded.dy : nullptr, mem, o.warmup);
  maybe_inject_failure(comm.rank());

  // Per-rank figures to rank 0.
  const int P = comm.size();
  std::size_t sent = 0, recv = 0;
  for (const auto& c : run.traffic) sent += c.bytes_sent, recv += c.bytes_received;
  std::vector<double> mine{double(run.saved_bytes), double(run.fwd.peak_bytes), double(run.bwd.peak_bytes),
                           double(sent), double(recv), run.fwd.total_seconds(), run.bwd.total_seconds(),
                           run.fwd.total_flops() + run.bwd.total_flops(), double(mem.used_before),
                           double(mem.peak_used), double(p.gpu), double(mem.scratch_peak)};
  std::vector<double> all(mine.size() * P);
  host.all_gather(mine.data(), all.data(), mine.size(), DType::f64);
  const bool cuda = p.device == DeviceKind::cuda;

  if (lead) {
    std::printf("laga run: model '%s', S=%ld, batch %ld, form %s, layout %s, kernel %s%s%s, %s%s, P=%d (%s%s)\n",
                cfg.name.c_str(), long(o.seq), long(o.batch), form_name(opts.form), layout_name(opts.layout),
                kernel_name(opts.kernel), opts.recompute == Recompute::KV ? ", recompute kv" : "",
                opts.form == Form::Absorbed ? (std::string(", attention ") + absorbed_attention_name(opts.absorbed_attention)).c_str() : "",
                dtype_name(opts.dtype), opts.kv_grad_reduce_fp32 ? " (K/V gradients reduced in float32)" : "", P,
                comm.name(), cuda ? ", cuda" : "");
    if (cuda) std::printf("device: %s (%d visible)\n", cuda_device_name(p.gpu).c_str(), cuda_device_count());
    std::vector<std::string> header{"rank", "saved", "peak fwd", "peak bwd", "sent", "received", "GFLOP", "fwd ms", "bwd ms"};
    if (cuda) header.insert(header.end(), {"gpu", "dev used before", "dev peak", "scratch peak"});
    Table t(header);
    for (int r = 0; r < P; ++r) {
      const double* m = &all[r * mine.size()];
      std::vector<std::string> row{std::to_string(r), human_bytes(m[0]), human_bytes(m[1]), human_bytes(m[2]),
                                   human_bytes(m[3]), human_bytes(m[4]), fmt("%.3f", m[7] * 1e-9),
                                   fmt("%.2f", m[5] * 1e3), fmt("%.2f", m[6] * 1e3)};
      if (cuda) row.insert(row.end(), {fmt("%.0f", m[10]), human_bytes(m[8]), human_bytes(m[9]), human_bytes(m[11])});
      t.add(row);
    }
    t.print();
    if (cuda)
      std::printf("dev: device memory in use (cudaMemGetInfo; all processes on the GPU), before the run and its peak; "
                  "scratch: the backend's kernel scratch outside the allocator (in dev, not in saved/peak)\n");
    std::printf("\ncollectives on rank 0 (bytes this rank sent / received; time on the backend's queue, bus bandwidth = "
                "sent / time%s):\n", comm.performs_traffic() ? "" : "; NOT performed here");
    Table c({"phase", "collective", "tensor", "calls", "sent", "received", "ms", "bus GB/s"}, 3);
    for (const auto& rec : run.traffic)
      c.add({phase_name(rec.phase), collective_name(rec.kind), rec.tensor, std::to_string(rec.calls),
             std::to_string(rec.bytes_sent), std::to_string(rec.bytes_received), fmt("%.3f", rec.seconds * 1e3),
             rec.seconds > 0 && rec.bytes_sent > 0 ? fmt("%.1f", double(rec.bytes_sent) / rec.seconds * 1e-9) : "-"});
    if (run.traffic.empty()) c.add({"-", "none", "-", "0", "0", "0", "-", "-"});
    c.print();
    if (o.verbose) {
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
    std::fflush(stdout);
  }

  // The JSON document: every rank's measurements, gathered to rank 0 (a collective: every rank joins,
  // whether or not it writes).
  std::vector<std::string> rank_docs;
  if (!o.json_path.empty()) rank_docs = gather_strings(host, rank_json(run, comm.rank(), mem, p.gpu).dump());

  const bool need_global = o.check || !o.save_dir.empty();
  GlobalResult global;
  if (need_global) global = gather_result(be, host, run);
  if (!o.save_dir.empty())
    save_problem(o, cfg, sh, be, host, have ? loaded.weights : make_weights(cfg, opts.dtype, be, o.seed),
                 have ? loaded.x : make_shard(cfg, sh, opts.dtype, be, o.seed, DataStream::x),
                 have ? loaded.dy : make_shard(cfg, sh, opts.dtype, be, o.seed, DataStream::dy), global);

  // bf16 at P > 1: DESIGN.md's bar compares LAGA (or absorbed) with explicit at the SAME P, so every rank
  // runs the explicit form too (a collective over `comm`), on the same device, dtype and communicator.
  GlobalResult explicit_same_p;
  const bool same_p = o.check && P > 1 && opts.dtype == DType::bf16 && opts.form != Form::Explicit;
  if (same_p) {
    BlockOptions ex = opts;
    ex.form = Form::Explicit;
    ex.recompute = Recompute::None;
    const RankRun ex_run = run_rank(cfg, ex, sh, be, comm, o.seed, have ? &loaded.weights : nullptr,
                                    have ? &loaded.x : nullptr, have ? &loaded.dy : nullptr);
    explicit_same_p = gather_result(be, host, ex_run);
  }

  double failed = 0;
  json check_doc = json::array();
  if (o.check) {
    if (lead) {
      const double tol_same_p = o.tolerance > 0 ? o.tolerance : default_tolerance(opts.dtype, opts.form);
      // bf16 at P > 1: the paper's bar (1e-3) is LAGA against explicit at the same P (DESIGN.md section 5).
      // Against the single-rank result every form is held to bf16's own precision: at P > 1 the per-rank
      // partial K/V gradients (all_gather) are bf16 outputs of the attention backward, in every implementation
      // (TransformerEngine's too), so even explicit sits ~4e-3 from its single-rank self there.
      const double tol = o.tolerance > 0 || opts.dtype != DType::bf16 || P == 1 ? tol_same_p
                                                                                 : cpu_reference_tolerance(opts.dtype);
      // The reference runs on rank 0 alone, with the full input, on the same device and dtype.
      std::unique_ptr<Backend> ref_be = cuda ? make_cuda_backend(p.gpu) : make_cpu_backend();
      BlockShape full{.batch = o.batch, .seq = o.seq, .ranks = 1, .rank = 0};
      GlobalResult ref;
      {
        Loaded ref_loaded;
        if (have) ref_loaded = load_problem(o, cfg, full, opts.dtype, *ref_be);
        ref = reference_result(cfg, opts.dtype, opts.kernel, o.batch, o.seq, *ref_be, o.seed,
                               have ? &ref_loaded.weights : nullptr, have ? &ref_loaded.x : nullptr,
                               have ? &ref_loaded.dy : nullptr);
      }
      std::printf("\ncheck against the single-rank explicit result on the same device (%s, %s; relative Frobenius "
                  "error, tolerance %.0e):\n", cuda ? "cuda" : "cpu", dtype_name(opts.dtype), tol);
      json rows;
      if (!print_comparison(global, ref, tol, rows)) failed = 1;
      check_doc.push_back({{"reference", "explicit P=1, same device"}, {"tolerance", tol}, {"tensors", rows}});
      if (same_p) {
        std::printf("\ncheck against explicit at the same P=%d (same device, dtype and communicator; tolerance %.0e):\n",
                    P, tol_same_p);
        json rows_p;
        if (!print_comparison(global, explicit_same_p, tol_same_p, rows_p)) {
          failed = 1;
          if (opts.layout == Layout::AllGather && !opts.kv_grad_reduce_fp32)
            std::printf("note: in all_gather, explicit reduce-scatters its K/V gradients in bfloat16 (as "
                        "TransformerEngine does), rounding their sum once, and LAGA never forms that sum; "
                        "--kv-grad-reduce-in-fp32 sums them in float32 (docs/gpu-run.md)\n");
        }
        check_doc.push_back({{"reference", "explicit same P"}, {"tolerance", tol_same_p}, {"tensors", rows_p}});
      }
      if (cuda) {
        // And the precision of the dtype itself: the CPU's float64 result of the same problem (the inputs
        // and weights before rounding to the GPU's dtype).
        const double tol64 = cpu_reference_tolerance(opts.dtype);
        auto cpu_be = make_cpu_backend();
        Loaded ref64_loaded;
        if (have) ref64_loaded = load_problem(o, cfg, full, DType::f64, *cpu_be);
        const GlobalResult ref64 = reference_result(cfg, DType::f64, opts.kernel, o.batch, o.seq, *cpu_be, o.seed,
                                                    have ? &ref64_loaded.weights : nullptr,
                                                    have ? &ref64_loaded.x : nullptr, have ? &ref64_loaded.dy : nullptr);
        std::printf("\ncheck against the CPU float64 result (tolerance %.0e):\n", tol64);
        json rows64;
        if (!print_comparison(global, ref64, tol64, rows64)) failed = 1;
        check_doc.push_back({{"reference", "CPU float64"}, {"tolerance", tol64}, {"tensors", rows64}});
      }
      std::printf("check %s\n", failed ? "FAILED" : "passed");
      std::fflush(stdout);
    }
    host.all_reduce(&failed, 1, DType::f64);
  }

  if (lead && !o.json_path.empty()) {
    json doc = document_json(o, cfg, P);
    doc["machine"] = machine_json(p.device, p.gpu, comm.name());
    doc["phantom"] = false;
    json entry = options_json(opts);
    entry["ranks"] = json::array();
    for (const auto& s : rank_docs) entry["ranks"].push_back(json::parse(s));
    if (o.check) entry["check"] = check_doc;
    doc["runs"].push_back(entry);
    write_json(o.json_path, doc);
  }
  return failed > 0 ? kExitCheckFailed : kExitOk;
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

// Under mpirun: each process is a rank.
int run_mpi(const RunOptions& o, const MpiSession& mpi) {
  const int world = mpi.size(), rank = mpi.rank();
  auto host = make_mpi_communicator();  // collective, reached unconditionally by every rank
  // GPU placement: rank r takes GPU (local rank % device count); NCCL only when no GPU is shared, on
  // every node (collectives, reached unconditionally by every rank).
  const MpiNodeInfo node = mpi_node_info();
  const int gpus = o.device == "cuda" ? cuda_device_count() : 0;
  const bool every_rank_own_gpu = mpi_all_ok(gpus > 0 && node.local_size <= gpus);
  // 1. Refuse bad input on every rank before any collective of the run: every rank checks the same
  //    input, prints its own refusal, then the ranks agree on the verdict (so no rank is left waiting
  //    and no rank exits, taking mpirun's kill of the others with it, before every rank has printed).
  Prepared p;
  GpuComm gpu_comm = GpuComm::single;
  int code = kExitOk;
  try {
    LAGA_REQUIRE(o.sp == 0 || o.sp == world, "sp = ", o.sp, " but mpirun started ", world,
                 " processes: under mpirun the ranks are the processes (omit --sp or make it equal)");
    LAGA_REQUIRE(o.phantom_rank == -1, "phantom-rank = ", o.phantom_rank,
                 ": a phantom rank runs alone; launch it without mpirun");
    if (parse_device(o.device) == DeviceKind::cuda) {
      require_cuda_usable();
      gpu_comm = choose_gpu_comm(o.comm, world, every_rank_own_gpu);
    }
    p = prepare(o, world, rank, gpus > 0 ? node.local_rank % gpus : -1);
  } catch (const std::exception& e) {
    code = exit_code_of(e);
    std::fprintf(stderr, "laga: error: %s\n", e.what());
    std::fflush(stderr);
  }
  try {
    double verdict[2] = {code == kExitInvalidInput ? 1.0 : 0.0, code == kExitRuntimeError ? 1.0 : 0.0};
    host->all_reduce(verdict, 2, DType::f64);
    if (verdict[0] > 0 || verdict[1] > 0) {
      if (code == kExitOk) {
        std::fprintf(stderr, "laga: error: the input was refused on another rank (its message is above)\n");
        std::fflush(stderr);
      }
      host->barrier();  // every rank has printed before any exits
      return verdict[0] > 0 ? kExitInvalidInput : kExitRuntimeError;
    }
  } catch (const std::exception& e) {
    fail_all_ranks(e, rank, world);
  }
  // 2. The run. From here a failure on one rank ends all of them (MpiSession::abort): the exception must
  //    not unwind through ~MpiSession, whose MPI_Finalize would wait for ranks stuck in a collective.
  try {
    std::unique_ptr<Communicator> device_comm;
    if (p.device == DeviceKind::cuda)
      device_comm = gpu_comm == GpuComm::nccl ? make_nccl_communicator(*host, *p.be)
                                              : make_host_staging_communicator(*host, *p.be);
    return run_on_rank(o, p, device_comm ? *device_comm : *host, *host);
  } catch (const std::exception& e) {
    fail_all_ranks(e, rank, world);
  }
}

// ---------------------------------------------------------------- phantom ranks

// The variants a phantom run covers: one, or with 'all' every variant (kAllVariants, block.hpp), layout, kernel.
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
  std::vector<Layout> layouts;
  if (o.layout == "all") layouts.assign(kAllLayouts.begin(), kAllLayouts.end());
  else layouts.push_back(parse_layout(o.layout));
  std::vector<AttentionKernel> kernels;
  if (o.kernel == "all") kernels.assign(kAllKernels.begin(), kAllKernels.end());
  else kernels.push_back(parse_kernel(o.kernel));
  std::vector<BlockOptions> out;
  for (Layout l : layouts)
    for (AttentionKernel k : kernels)
      for (BlockOptions f : forms) {
        f.layout = l;
        f.kernel = k;
        f.dtype = dtype;
        f.kv_grad_reduce_fp32 = o.kv_grad_reduce_fp32;
        out.push_back(f);
      }
  return out;
}

// Rank r of P alone: collectives return correctly sized, deterministic data and move nothing.
int run_phantom(const RunOptions& o) {
  const int P = o.sp == 0 ? 1 : o.sp;
  const int r = o.phantom_rank;
  const MlaConfig cfg = resolve_model(o.model);
  const DeviceKind device = parse_device(o.device);
  const DType dtype = parse_dtype(dtype_text(o));
  LAGA_REQUIRE(P >= 1, "sp = ", P, ": the number of sequence-parallel ranks must be >= 1");
  LAGA_REQUIRE(r < P, "phantom-rank = ", r, ": must be in [0, sp = ", P, ")");
  LAGA_REQUIRE(!o.check && o.save_dir.empty() && o.load_dir.empty(),
               "phantom-rank: a phantom rank exchanges no real data, so --check, --save and --load do not apply");
  LAGA_REQUIRE(o.comm == "auto", "comm = '", o.comm, "': a phantom rank uses no communicator (leave --comm out)");
  require_writable(o.json_path);
  // Every variant is validated before anything runs.
  Prepared base;
  RunOptions one = o;
  one.form = o.form == "all" ? "laga" : o.form;
  one.layout = o.layout == "all" ? "a2a" : o.layout;
  one.kernel = o.kernel == "all" ? "fused" : o.kernel;
  if (o.form == "all") one.recompute = "none", one.absorbed_attention = "mqa";
  check_options(one, base, P, r);
  const std::vector<BlockOptions> variants = phantom_variants(o, dtype);
  for (const BlockOptions& v : variants) validate(cfg, v, base.sh);

  Prepared p;
  p.cfg = cfg;
  p.sh = base.sh;
  p.device = device;
  if (device == DeviceKind::cuda) require_cuda_usable();
  p.gpu = device == DeviceKind::cuda ? 0 : -1;
  auto make_backend = [&] { return device == DeviceKind::cuda ? make_cuda_backend(p.gpu) : make_cpu_backend(); };
  // Weights and inputs live on a backend of their own, made once; each variant runs on a fresh backend,
  // so the memory one variant's kernels keep outside the allocator (scratch, workspaces) is not charged
  // to the next one.
  auto data_be = make_backend();
  const char* notice = "collectives were NOT performed; received data is synthetic";
  std::printf("phantom rank %d of %d: %s\n", r, P, notice);
  std::printf("laga run: model '%s', S=%ld, batch %ld, %s, rank %d of P=%d alone on %s%s, %zu variant(s)\n",
              cfg.name.c_str(), long(o.seq), long(o.batch), dtype_name(dtype), r, P,
              device == DeviceKind::cuda ? "cuda: " : "cpu", device == DeviceKind::cuda ? cuda_device_name(p.gpu).c_str() : "",
              variants.size());
  std::fflush(stdout);

  // Weights and this rank's input are the same for every variant: made once.
  const MlaWeights w = make_weights(cfg, dtype, *data_be, o.seed);
  const Tensor x = make_shard(cfg, p.sh, dtype, *data_be, o.seed, DataStream::x);
  const Tensor dy = make_shard(cfg, p.sh, dtype, *data_be, o.seed, DataStream::dy);
  data_be->synchronize();

  json doc = document_json(o, cfg, P);
  doc["machine"] = machine_json(device, p.gpu, "phantom");
  doc["phantom"] = {{"rank", r}, {"ranks", P}, {"note", std::string("phantom rank ") + std::to_string(r) + " of " +
                                                            std::to_string(P) + ": " + notice}};
  std::vector<std::string> header{"variant", "layout", "kernel", "saved", "peak fwd", "peak bwd", "sent", "GFLOP",
                                  "fwd ms", "bwd ms"};
  if (device == DeviceKind::cuda) header.insert(header.end(), {"dev peak", "scratch peak"});
  Table summary(header, 3);
  const bool details = o.verbose || variants.size() == 1;
  for (const BlockOptions& v : variants) {
    p.opts = v;
    p.be = make_backend();
    auto comm = make_phantom_communicator(*p.be, r, P);
    DeviceMemory mem;
    const RankRun run = measured_run(p, *comm, o.seed, &w, &x, &dy, mem, o.warmup);
    std::size_t sent = 0;
    for (const auto& c : run.traffic) sent += c.bytes_sent;
    std::vector<std::string> row{variant_of(v).label(), layout_name(v.layout), kernel_name(v.kernel),
                                 human_bytes(double(run.saved_bytes)), human_bytes(double(run.fwd.peak_bytes)),
                                 human_bytes(double(run.bwd.peak_bytes)), human_bytes(double(sent)),
                                 fmt("%.4g", (run.fwd.total_flops() + run.bwd.total_flops()) * 1e-9),
                                 fmt("%.2f", run.fwd.total_seconds() * 1e3), fmt("%.2f", run.bwd.total_seconds() * 1e3)};
    if (mem.have) row.insert(row.end(), {human_bytes(double(mem.peak_used)), human_bytes(double(mem.scratch_peak))});
    summary.add(row);
    if (!details) {
      std::string line;
      for (const auto& cell : row) line += (line.empty() ? "" : " | ") + cell;
      std::printf("done: %s\n", line.c_str());
    }
    if (details) {
      std::printf("\n%s, layout %s, kernel %s: saved %zu bytes (%s), peak fwd %s, peak bwd %s, sent %s%s\n",
                  variant_of(v).label(), layout_name(v.layout), kernel_name(v.kernel), run.saved_bytes,
                  human_bytes(double(run.saved_bytes)).c_str(), human_bytes(double(run.fwd.peak_bytes)).c_str(),
                  human_bytes(double(run.bwd.peak_bytes)).c_str(), human_bytes(double(sent)).c_str(),
                  mem.have ? (", device in use " + human_bytes(double(mem.used_before)) + " before, peak " +
                              human_bytes(double(mem.peak_used)) + ", scratch peak " +
                              human_bytes(double(mem.scratch_peak))).c_str() : "");
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
    json entry = options_json(v);
    entry["ranks"] = json::array({rank_json(run, r, mem, p.gpu)});
    doc["runs"].push_back(entry);
    // Rewritten after every variant: a sweep stopped part way still leaves what it measured.
    if (!o.json_path.empty()) write_json(o.json_path, doc);
    std::fflush(stdout);
  }
  p.be.reset();
  std::printf("\nper rank %d of %d (saved: kept from forward to backward; peak: live activation bytes%s):\n", r, P,
              device == DeviceKind::cuda ? "; dev peak: cudaMemGetInfo, whole device; scratch peak: kernel scratch "
                                           "outside the allocator" : "");
  summary.print();
  std::printf("phantom rank %d of %d: %s\n", r, P, notice);
  return kExitOk;
}

// ---------------------------------------------------------------- without mpirun

int run_command(const RunOptions& o, int* argc, char*** argv) {
  MpiSession mpi(argc, argv);
  if (mpi.size() > 1) return run_mpi(o, mpi);
  if (o.phantom_rank >= 0) return run_phantom(o);
  LAGA_REQUIRE(o.phantom_rank == -1, "phantom-rank = ", o.phantom_rank, ": must be >= 0");
  const int P = o.sp == 0 ? 1 : o.sp;
  LAGA_REQUIRE(P >= 1, "sp = ", P, ": the number of sequence-parallel ranks must be >= 1");
  if (parse_device(o.device) == DeviceKind::cuda) {
    LAGA_REQUIRE(P == 1, "sp = ", P, " with --device cuda: GPU ranks are processes, not threads; launch "
                 "mpirun -np ", P, " laga run --device cuda ... (ranks sharing one GPU exchange data over MPI)");
    require_cuda_usable();
    const GpuComm kind = choose_gpu_comm(o.comm, 1, true);
    Prepared p = prepare(o, 1, 0, 0);
    // Host gathers at P = 1 need no collective; a single-rank communicator over a CPU backend serves
    // them (and bootstraps NCCL when --comm nccl asks for it at P = 1).
    auto host_be = make_cpu_backend();
    auto host = make_single_rank_communicator(*host_be);
    std::unique_ptr<Communicator> comm;
    switch (kind) {
      case GpuComm::single: comm = make_single_rank_communicator(*p.be); break;
      case GpuComm::nccl: comm = make_nccl_communicator(*host, *p.be); break;
      case GpuComm::host_staging: comm = make_host_staging_communicator(*host, *p.be); break;
    }
    return run_on_rank(o, p, *comm, *host);
  }
  // Prepare every rank before starting threads, so bad input never leaves a thread waiting at a barrier.
  std::vector<Prepared> prepared;
  for (int r = 0; r < P; ++r) prepared.push_back(prepare(o, P, r, -1));
  if (P == 1) {
    auto comm = make_single_rank_communicator(*prepared[0].be);
    return run_on_rank(o, prepared[0], *comm, *comm);
  }
  auto comms = make_thread_group(P);
  std::vector<int> codes(P, kExitOk);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        codes[r] = run_on_rank(o, prepared[r], *comms[r], *comms[r]);
      } catch (const std::exception& e) {
        // The other threads may wait at a barrier forever: end the process. (Not MPI_Abort: MPI was
        // initialised for the main thread only.)
        std::fprintf(stderr, "laga: failure on rank %d of %d (thread): %s\n", r, P, e.what());
        std::fflush(nullptr);
        std::_Exit(exit_code_of(e));
      }
    });
  for (auto& t : threads) t.join();
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
  sub->add_option("--layout", o->layout, "a2a (Ulysses) or all_gather (context parallel); all: both, phantom ranks only")->capture_default_str();
  sub->add_option("--kernel", o->kernel, "eager (scores kept) or fused (online softmax); all: both, phantom ranks only")->capture_default_str();
  sub->add_option("--device", o->device, "cpu or cuda (one GPU per rank: local rank % device count)")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "float32 or float64 on the cpu (default float32); bfloat16 or float32 on cuda "
                                       "(default bfloat16)");
  sub->add_option("--comm", o->comm, "GPU communicator: auto (NCCL when every rank has its own GPU, else MPI with "
                                     "host staging; a copy at P = 1), nccl or host-staging")->capture_default_str();
  sub->add_option("--recompute", o->recompute, "none, or kv (laga: keep only the gathered latent)")->capture_default_str();
  sub->add_option("--absorbed-attention", o->absorbed_attention,
                  "absorbed form: mqa (native) or expanded (latent copied per head)")->capture_default_str();
  sub->add_option("--phantom-rank", o->phantom_rank,
                  "Run rank R of --sp P alone (no mpirun): collectives are not performed and received data is "
                  "synthetic; memory, FLOPs and time of one rank of a large job on one device");
  sub->add_option("--seed", o->seed, "Seed of the deterministic weights and inputs")->capture_default_str();
  sub->add_option("--warmup", o->warmup, "Untimed passes (forward and backward) before the measured one: first "
                                         "launches load kernels and pick GEMM algorithms")->capture_default_str();
  sub->add_flag("--check", o->check, "Compare with the single-rank explicit result on the same device and dtype "
                                     "(and, on cuda, with the CPU float64 result); exit 1 above tolerance");
  sub->add_option("--tolerance", o->tolerance, "Relative error bound of --check against the same-device results "
                                               "(default 1e-5 float32, 1e-10 float64; bfloat16: 1e-3 against explicit at the "
                                               "same P, and at P = 1, 3e-2 against the single-rank result at P > 1 and for "
                                               "absorbed, which rounds at other points)");
  sub->add_flag("--kv-grad-reduce-in-fp32", o->kv_grad_reduce_fp32,
                "all_gather, bfloat16, P > 1: explicit widens its partial K/V gradients to float32 before the "
                "reduce-scatter (twice that traffic) and up-projects the float32 sums; default: reduce-scatter in "
                "bfloat16, as TransformerEngine does");
  sub->add_flag("--verbose", o->verbose, "List the saved tensors and the FLOPs and time by phase");
  sub->add_option("--save", o->save_dir, "Write inputs, weights, output and gradients as .npy files to DIR");
  sub->add_option("--load", o->load_dir, "Read x.npy, weights (and dy.npy if present) from DIR");
  sub->add_option("--json", o->json_path, "Write the configuration, options, every rank's saved tensors, peaks, "
                                          "traffic, FLOPs and seconds by phase, and the machine to FILE");
  return [o, argc, argv] { return run_command(*o, argc, argv); };
}

}  // namespace laga::cli
