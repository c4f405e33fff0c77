// `laga run`: one configuration on P ranks. Under mpirun each process is a rank (MPI collectives); launched
// alone with --sp P > 1, the P ranks are threads of this process.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "commands.hpp"
#include "format.hpp"
#include "laga/errors.hpp"
#include "laga/mpi_comm.hpp"
#include "laga/npy.hpp"
#include "laga/problem.hpp"

namespace laga::cli {
namespace {

struct RunOptions {
  std::string model = "small";
  std::int64_t seq = 256;
  std::int64_t batch = 1;
  int sp = 0;  // 0: the number of MPI processes
  std::string form = "laga", layout = "a2a", kernel = "fused", dtype = "float32", recompute = "none";
  std::string absorbed_attention = "mqa";
  std::uint64_t seed = 1;
  bool check = false;
  bool verbose = false;
  std::string save_dir, load_dir;
  double tolerance = 0;  // 0: 1e-5 for float32, 1e-10 for float64
};

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

void save_problem(const RunOptions& o, const MlaConfig& cfg, const BlockShape& sh, Backend& be, Communicator& comm,
                  const MlaWeights& w, const Tensor& x, const Tensor& dy, const GlobalResult& res) {
  auto gather = [&](const Tensor& t) {
    std::vector<double> local = to_host(be, t), full(local.size() * comm.size());
    comm.all_gather(local.data(), full.data(), local.size(), DType::f64);
    return full;
  };
  std::vector<double> gx = gather(x), gdy = gather(dy);
  if (comm.rank() != 0) return;
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

// What one rank needs before any collective: the configuration, options, shape, its backend and, with
// --load, the problem read from disk. Communicates with no one, so bad input is refused on every rank
// before any collective. Throws InvalidArgument for bad input.
struct Prepared {
  MlaConfig cfg;
  BlockOptions opts;
  BlockShape sh;
  std::unique_ptr<Backend> be;
  Loaded loaded;
  bool have = false;  // loaded from --load
};

Prepared prepare(const RunOptions& o, int ranks, int rank) {
  Prepared p;
  p.cfg = resolve_model(o.model);
  p.opts = BlockOptions{.form = parse_form(o.form), .layout = parse_layout(o.layout), .kernel = parse_kernel(o.kernel),
                        .recompute = parse_recompute(o.recompute),
                        .absorbed_attention = parse_absorbed_attention(o.absorbed_attention),
                        .dtype = parse_dtype(o.dtype)};
  p.sh = BlockShape{.batch = o.batch, .seq = o.seq, .ranks = ranks, .rank = rank};
  validate(p.cfg, p.opts, p.sh);
  LAGA_REQUIRE(p.opts.dtype != DType::bf16, "dtype = bfloat16: the cpu backend runs float32 or float64");
  LAGA_REQUIRE(o.tolerance >= 0, "tolerance = ", o.tolerance, ": must be >= 0 (0 picks the dtype's default)");
  if (!o.save_dir.empty() && rank == 0) {  // only rank 0 writes
    std::error_code ec;
    std::filesystem::create_directories(o.save_dir, ec);
    LAGA_REQUIRE(!ec && std::filesystem::is_directory(o.save_dir), "save = \"", o.save_dir,
                 "\": cannot create the directory (", ec ? ec.message() : "not a directory", ")");
  }
  p.be = make_cpu_backend();
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

// Everything one rank does after prepare(). Rank 0 prints. Returns the exit code (the same on every rank).
int run_on_rank(const RunOptions& o, Prepared& p, Communicator& comm) {
  const MlaConfig& cfg = p.cfg;
  const BlockOptions& opts = p.opts;
  const BlockShape& sh = p.sh;
  Backend& be = *p.be;
  const bool have = p.have;
  Loaded& loaded = p.loaded;
  const bool lead = comm.rank() == 0;

  RankRun run = run_rank(cfg, opts, sh, be, comm, o.seed, have ? &loaded.weights : nullptr, have ? &loaded.x : nullptr,
                         have ? &loaded.dy : nullptr);
  maybe_inject_failure(comm.rank());

  // Per-rank figures to rank 0.
  const int P = comm.size();
  std::size_t sent = 0, recv = 0;
  for (const auto& c : run.traffic) sent += c.bytes_sent, recv += c.bytes_received;
  std::vector<double> mine{double(run.saved_bytes), double(run.fwd.peak_bytes), double(run.bwd.peak_bytes),
                           double(sent), double(recv), run.fwd.total_seconds(), run.bwd.total_seconds(),
                           run.fwd.total_flops() + run.bwd.total_flops()};
  std::vector<double> all(mine.size() * P);
  comm.all_gather(mine.data(), all.data(), mine.size(), DType::f64);

  if (lead) {
    std::printf("laga run: model '%s', S=%ld, batch %ld, form %s, layout %s, kernel %s%s%s, %s, P=%d (%s)\n",
                cfg.name.c_str(), long(o.seq), long(o.batch), form_name(opts.form), layout_name(opts.layout),
                kernel_name(opts.kernel), opts.recompute == Recompute::KV ? ", recompute kv" : "",
                opts.form == Form::Absorbed ? (std::string(", attention ") + absorbed_attention_name(opts.absorbed_attention)).c_str() : "",
                dtype_name(opts.dtype), P, comm.name());
    Table t({"rank", "saved", "peak fwd", "peak bwd", "sent", "received", "GFLOP", "fwd ms", "bwd ms"});
    for (int r = 0; r < P; ++r) {
      const double* m = &all[r * mine.size()];
      t.add({std::to_string(r), human_bytes(m[0]), human_bytes(m[1]), human_bytes(m[2]), human_bytes(m[3]),
             human_bytes(m[4]), fmt("%.3f", m[7] * 1e-9), fmt("%.2f", m[5] * 1e3), fmt("%.2f", m[6] * 1e3)});
    }
    t.print();
    std::printf("\ncollectives on rank 0 (bytes this rank sent / received):\n");
    Table c({"phase", "collective", "tensor", "calls", "sent", "received"}, 3);
    for (const auto& rec : run.traffic)
      c.add({phase_name(rec.phase), collective_name(rec.kind), rec.tensor, std::to_string(rec.calls),
             std::to_string(rec.bytes_sent), std::to_string(rec.bytes_received)});
    if (run.traffic.empty()) c.add({"-", "none", "-", "0", "0", "0"});
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

  const bool need_global = o.check || !o.save_dir.empty();
  GlobalResult global;
  if (need_global) global = gather_result(be, comm, run);
  if (!o.save_dir.empty())
    save_problem(o, cfg, sh, be, comm, have ? loaded.weights : make_weights(cfg, opts.dtype, be, o.seed),
                 have ? loaded.x : make_shard(cfg, sh, opts.dtype, be, o.seed, DataStream::x),
                 have ? loaded.dy : make_shard(cfg, sh, opts.dtype, be, o.seed, DataStream::dy), global);

  double failed = 0;
  if (o.check) {
    if (lead) {
      const double tol = o.tolerance > 0 ? o.tolerance : (opts.dtype == DType::f64 ? 1e-10 : 1e-5);
      // The reference runs on rank 0 alone, with the full input.
      auto ref_be = make_cpu_backend();
      BlockShape full{.batch = o.batch, .seq = o.seq, .ranks = 1, .rank = 0};
      Loaded ref_loaded;
      if (have) ref_loaded = load_problem(o, cfg, full, opts.dtype, *ref_be);
      const GlobalResult ref = reference_result(cfg, opts.dtype, opts.kernel, o.batch, o.seq, *ref_be, o.seed,
                                                have ? &ref_loaded.weights : nullptr, have ? &ref_loaded.x : nullptr,
                                                have ? &ref_loaded.dy : nullptr);
      std::printf("\ncheck against the single-rank explicit result (relative Frobenius error, tolerance %.0e):\n", tol);
      Table t({"tensor", "rel. error", "verdict"});
      for (const auto& c : compare(global, ref)) {
        const bool ok = c.rel_error <= tol;  // NaN fails
        if (!ok) failed = 1;
        t.add({c.tensor, fmt("%.3e", c.rel_error), ok ? "ok" : "FAIL"});
      }
      t.print();
      std::printf("check %s\n", failed ? "FAILED" : "passed");
      std::fflush(stdout);
    }
    comm.all_reduce(&failed, 1, DType::f64);
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
  auto comm = make_mpi_communicator();  // collective, reached unconditionally by every rank
  // 1. Refuse bad input on every rank before any collective of the run: every rank checks the same
  //    input, prints its own refusal, then the ranks agree on the verdict (so no rank is left waiting
  //    and no rank exits, taking mpirun's kill of the others with it, before every rank has printed).
  Prepared p;
  int code = kExitOk;
  try {
    LAGA_REQUIRE(o.sp == 0 || o.sp == world, "sp = ", o.sp, " but mpirun started ", world,
                 " processes: under mpirun the ranks are the processes (omit --sp or make it equal)");
    p = prepare(o, world, rank);
  } catch (const std::exception& e) {
    code = exit_code_of(e);
    std::fprintf(stderr, "laga: error: %s\n", e.what());
    std::fflush(stderr);
  }
  try {
    double verdict[2] = {code == kExitInvalidInput ? 1.0 : 0.0, code == kExitRuntimeError ? 1.0 : 0.0};
    comm->all_reduce(verdict, 2, DType::f64);
    if (verdict[0] > 0 || verdict[1] > 0) {
      if (code == kExitOk) {
        std::fprintf(stderr, "laga: error: the input was refused on another rank (its message is above)\n");
        std::fflush(stderr);
      }
      comm->barrier();  // every rank has printed before any exits
      return verdict[0] > 0 ? kExitInvalidInput : kExitRuntimeError;
    }
  } catch (const std::exception& e) {
    fail_all_ranks(e, rank, world);
  }
  // 2. The run. From here a failure on one rank ends all of them (MpiSession::abort): the exception must
  //    not unwind through ~MpiSession, whose MPI_Finalize would wait for ranks stuck in a collective.
  try {
    return run_on_rank(o, p, *comm);
  } catch (const std::exception& e) {
    fail_all_ranks(e, rank, world);
  }
}

int run_command(const RunOptions& o, int* argc, char*** argv) {
  MpiSession mpi(argc, argv);
  if (mpi.size() > 1) return run_mpi(o, mpi);
  const int P = o.sp == 0 ? 1 : o.sp;
  LAGA_REQUIRE(P >= 1, "sp = ", P, ": the number of sequence-parallel ranks must be >= 1");
  // Prepare every rank before starting threads, so bad input never leaves a thread waiting at a barrier.
  std::vector<Prepared> prepared;
  for (int r = 0; r < P; ++r) prepared.push_back(prepare(o, P, r));
  if (P == 1) {
    auto comm = make_single_rank_communicator(*prepared[0].be);
    return run_on_rank(o, prepared[0], *comm);
  }
  auto comms = make_thread_group(P);
  std::vector<int> codes(P, kExitOk);
  std::vector<std::thread> threads;
  for (int r = 0; r < P; ++r)
    threads.emplace_back([&, r] {
      try {
        codes[r] = run_on_rank(o, prepared[r], *comms[r]);
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
                                 "Without mpirun, P > 1 runs P threads in this process");
  sub->add_option("--form", o->form, "explicit, absorbed or laga")->capture_default_str();
  sub->add_option("--layout", o->layout, "a2a (Ulysses) or all_gather (context parallel)")->capture_default_str();
  sub->add_option("--kernel", o->kernel, "eager (scores kept) or fused (online softmax)")->capture_default_str();
  sub->add_option("--dtype", o->dtype, "float32 or float64")->capture_default_str();
  sub->add_option("--recompute", o->recompute, "none, or kv (laga: keep only the gathered latent)")->capture_default_str();
  sub->add_option("--absorbed-attention", o->absorbed_attention,
                  "absorbed form: mqa (native) or expanded (latent copied per head)")->capture_default_str();
  sub->add_option("--seed", o->seed, "Seed of the deterministic weights and inputs")->capture_default_str();
  sub->add_flag("--check", o->check, "Compare with the single-rank explicit result; exit 1 above tolerance");
  sub->add_option("--tolerance", o->tolerance, "Relative error bound of --check (default 1e-5 float32, 1e-10 float64)");
  sub->add_flag("--verbose", o->verbose, "List the saved tensors and the FLOPs and time by phase");
  sub->add_option("--save", o->save_dir, "Write inputs, weights, output and gradients as .npy files to DIR");
  sub->add_option("--load", o->load_dir, "Read x.npy, weights (and dy.npy if present) from DIR");
  return [o, argc, argv] { return run_command(*o, argc, argv); };
}

}  // namespace laga::cli
