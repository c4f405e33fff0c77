#include "laga/problem.hpp"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <thread>

#include "laga/errors.hpp"
#include "laga/token_map.hpp"

namespace laga {

double deterministic_value(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  // splitmix64 over a mix of the three counters
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull ^ (stream + 0x632BE59BD9B4E019ull) * 0xBF58476D1CE4E5B9ull ^
                    (index + 1) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * (2.0 / 9007199254740992.0) - 1.0;  // 53 bits -> [-1, 1)
}

namespace {
std::uint16_t to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                     // round to nearest even
  return std::uint16_t(u >> 16);
}
float from_bf16(std::uint16_t h) {
  std::uint32_t u = std::uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

std::vector<double> to_host(Backend& be, const Tensor& t) {
  std::vector<double> out(t.numel());
  if (!t.data()) return out;
  std::vector<char> raw(t.bytes());
  be.copy_to_host(raw.data(), t);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype()) {
      case DType::F32: out[i] = reinterpret_cast<const float*>(raw.data())[i]; break;
      case DType::F64: out[i] = reinterpret_cast<const double*>(raw.data())[i]; break;
      case DType::BF16: out[i] = from_bf16(reinterpret_cast<const std::uint16_t*>(raw.data())[i]); break;
    }
  }
  return out;
}

void from_host(Backend& be, const Tensor& t, const std::vector<double>& v) {
  LAGA_CHECK(std::int64_t(v.size()) == t.numel(), "from_host: ", v.size(), " values for tensor '", t.name(), "' of ",
             t.numel());
  if (!t.data()) return;
  std::vector<char> raw(t.bytes());
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    switch (t.dtype()) {
      case DType::F32: reinterpret_cast<float*>(raw.data())[i] = float(v[i]); break;
      case DType::F64: reinterpret_cast<double*>(raw.data())[i] = v[i]; break;
      case DType::BF16: reinterpret_cast<std::uint16_t*>(raw.data())[i] = to_bf16(float(v[i])); break;
    }
  }
  be.copy_from_host(t, raw.data());
}

void fill_deterministic(Backend& be, const Tensor& t, std::uint64_t seed, std::uint64_t stream,
                        std::uint64_t first_index, double scale, double shift) {
  if (!t.data()) return;
  std::vector<double> v(t.numel());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    v[i] = shift + scale * deterministic_value(seed, stream, first_index + std::uint64_t(i));
  from_host(be, t, v);
}

MlaWeights make_weights(const MlaConfig& cfg, DType dtype, Backend& be, std::uint64_t seed) {
  MlaWeights w = allocate_weights(cfg, dtype, be.allocator());
  std::uint64_t stream = std::uint64_t(DataStream::Weights);
  for (auto& [name, t] : w.named()) {
    if (t->rank() == 1)
      fill_deterministic(be, *t, seed, stream++, 0, 0.1, 1.0);
    else
      fill_deterministic(be, *t, seed, stream++, 0, 1.0 / std::sqrt(double(t->dim(1))));  // [out, in]
  }
  return w;
}

Tensor make_shard(const MlaConfig& cfg, const BlockShape& shape, DType dtype, Backend& be, std::uint64_t seed,
                  DataStream stream, Layout layout) {
  const std::int64_t s = shape.local_seq();
  Tensor t(be.allocator(), dtype, {s, shape.batch, cfg.hidden_size}, stream == DataStream::X ? "x" : "dy",
           MemoryKind::External);
  if (!t.data()) return t;  // the meta device: no values
  const std::int64_t row = shape.batch * cfg.hidden_size;
  std::vector<double> v(std::size_t(s * row));
  for (const TokenSpan& span : rank_tokens(layout, shape.seq, shape.ranks, shape.rank))
    for (std::int64_t i = 0; i < span.count * row; ++i)
      v[std::size_t(span.local * row + i)] =
          deterministic_value(seed, std::uint64_t(stream), std::uint64_t(span.global * row + i));
  from_host(be, t, v);
  return t;
}

RankRun run_rank(const MlaConfig& cfg, const BlockOptions& opts, const BlockShape& shape, Backend& be,
                 Communicator& comm, std::uint64_t seed, const MlaWeights* weights, const Tensor* x_in,
                 const Tensor* dy_in) {
  CountingCommunicator counted(comm);
  MlaBlock block(cfg, opts, shape, be, counted);
  MlaWeights own_weights;
  if (!weights) {
    own_weights = make_weights(cfg, opts.dtype, be, seed);
    weights = &own_weights;
  }
  Tensor x = x_in ? *x_in : make_shard(cfg, shape, opts.dtype, be, seed, DataStream::X, opts.layout);
  Tensor dy = dy_in ? *dy_in : make_shard(cfg, shape, opts.dtype, be, seed, DataStream::Dy, opts.layout);

  RankRun run;
  run.layout = opts.layout;
  SavedContext ctx;
  run.y = block.forward(ctx, x, *weights);
  run.saved = be.allocator().saved_tensors();
  run.saved_bytes = be.allocator().saved_bytes();
  run.grads = allocate_grads(cfg, opts, be.allocator());
  run.dx = block.backward(run.grads, ctx, dy, x, *weights);
  run.fwd = block.forward_stats();
  run.bwd = block.backward_stats();
  run.traffic = counted.records();
  return run;
}

GlobalResult gather_result(Backend& be, Communicator& comm, const RankRun& run) {
  // One rank needs no collective (so any communicator will do, also one that serves device buffers only).
  const int P = comm.size();
  auto gather = [&](const Tensor& t) {
    std::vector<double> local = to_host(be, t);
    if (P == 1) return local;
    std::vector<double> full(local.size() * P);
    comm.all_gather(local.data(), full.data(), local.size(), DType::F64);
    const std::int64_t s = t.dim(0);
    return assemble_sequence(run.layout, full, s * P, P, t.numel() / s);
  };
  GlobalResult g;
  g.y = gather(run.y);
  g.dx = gather(run.dx);
  for (const auto& [name, t] : run.grads.named()) {
    std::vector<double> v = to_host(be, *t);
    if (P > 1) comm.all_reduce(v.data(), v.size(), DType::F64);
    g.grads.emplace_back(name.substr(0), std::move(v));
  }
  return g;
}

GlobalResult reference_result(const MlaConfig& cfg, DType dtype, AttentionKernel kernel, std::int64_t batch,
                              std::int64_t seq, Backend& be, std::uint64_t seed, const MlaWeights* weights,
                              const Tensor* x, const Tensor* dy) {
  BlockOptions opts;
  opts.form = Form::Explicit;
  opts.layout = Layout::A2A;
  opts.kernel = kernel;
  opts.dtype = dtype;
  BlockShape shape{.batch = batch, .seq = seq, .ranks = 1, .rank = 0};
  auto single = make_single_rank_communicator(be);
  RankRun run = run_rank(cfg, opts, shape, be, *single, seed, weights, x, dy);
  return gather_result(be, *single, run);
}

std::vector<Comparison> compare(const GlobalResult& got, const GlobalResult& ref) {
  std::vector<Comparison> out{{"y", relative_error(got.y, ref.y)}, {"dx", relative_error(got.dx, ref.dx)}};
  LAGA_CHECK(got.grads.size() == ref.grads.size(), "compare: ", got.grads.size(), " vs ", ref.grads.size(), " gradients");
  for (std::size_t i = 0; i < got.grads.size(); ++i)
    out.push_back({"grad_" + got.grads[i].first, relative_error(got.grads[i].second, ref.grads[i].second)});
  return out;
}

double max_error(const std::vector<Comparison>& c) {
  double m = 0;
  for (const auto& e : c) m = std::isnan(e.rel_error) || std::isnan(m) ? NAN : std::max(m, e.rel_error);
  return m;
}

GroupRun run_thread_group(const MlaConfig& cfg, const BlockOptions& opts, std::int64_t batch, std::int64_t seq,
                          int ranks, std::uint64_t seed) {
  validate(cfg, opts, BlockShape{.batch = batch, .seq = seq, .ranks = ranks, .rank = 0});
  GroupRun g;
  auto comms = make_thread_group(ranks);
  g.ranks.resize(ranks);
  std::vector<GlobalResult> results(ranks);
  for (int r = 0; r < ranks; ++r) g.backends.push_back(make_cpu_backend());
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(ranks);
  const int blas_threads = set_cpu_blas_threads(1);
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      try {
        BlockShape shape{.batch = batch, .seq = seq, .ranks = ranks, .rank = r};
        g.ranks[r] = run_rank(cfg, opts, shape, *g.backends[r], *comms[r], seed);
        results[r] = gather_result(*g.backends[r], *comms[r], g.ranks[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  set_cpu_blas_threads(blas_threads);
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  g.result = std::move(results[0]);
  return g;
}

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  LAGA_CHECK(a.size() == b.size(), "relative_error of sizes ", a.size(), " and ", b.size());
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den == 0) return num == 0 ? 0.0 : INFINITY;
  return std::sqrt(num / den);
}

}  // namespace laga
