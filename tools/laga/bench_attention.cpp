// `laga bench-attention`: each attention provider's fused forward and backward, timed on the GPU at the
// shapes a sequence-parallel rank of the model runs (bf16, causal, batch 1), written as the table that
// `--attention-provider auto` chooses from (laga/attention_provider.hpp; the repo keeps it as
// bench/attention-providers.json, compiled in at the next build).
//
// Shapes per (S, P), heads H the model's: a2a (H / P heads over the whole sequence, q_offset 0) and
// all_gather (H heads, the last rank's S / P queries over S keys, q_offset S - S / P).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "commands.hpp"
#include "format.hpp"
#include "laga/attention_provider.hpp"
#include "laga/config.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"
#include "laga_build_commit.hpp"
#include "laga/measure.hpp"
#include "provider.hpp"

namespace laga::cli {
namespace {

using nlohmann::json;
using i64 = std::int64_t;

struct BenchAttentionOptions {
  std::string model = "deepseek-v3";
  std::vector<i64> seq{4096, 16384, 32768};
  std::vector<int> sp{8};
  std::vector<std::string> layout{"a2a", "all_gather"};
  int repeat = 5, warmup = 2, gpu = 0;
  // After the warm-up runs, more until this much wall time has passed since the first: every measurement then
  // starts from the clock and power its own load holds the GPU at (a short call's 10 warm-ups take milliseconds,
  // a long one's a second).
  double warmup_seconds = 0;
  std::string out;
};

struct Shape {
  std::string layout;
  i64 heads, q_len, kv_len, q_offset, S;
  int P;
};

// A [rows, cols] bf16 tensor: 256 random rows uploaded once, repeated down by the backend's broadcast copy.
Tensor random_rows(Backend& be, i64 rows, i64 cols, std::mt19937_64& rng) {
  const i64 block = std::min<i64>(rows, 256);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<std::uint16_t> host(std::size_t(block * cols));
  for (auto& h : host) {
    const float f = u(rng);
    std::uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h = std::uint16_t(bits >> 16);
  }
  Tensor src(be.allocator(), DType::BF16, {block, cols}, "rows", MemoryKind::External);
  be.copy_from_host(src, host.data());
  Tensor t(be.allocator(), DType::BF16, {rows, cols}, "t", MemoryKind::External);
  const i64 full = rows / block, tail = rows - full * block;
  be.copy(CopyArgs{.dtype = DType::BF16, .batch = full, .rows = block, .cols = cols, .src = src.data(),
                   .src_ld = cols, .src_batch_stride = 0, .dst = t.data(), .dst_ld = cols,
                   .dst_batch_stride = block * cols});
  if (tail > 0)
    be.copy(CopyArgs{.dtype = DType::BF16, .rows = tail, .cols = cols, .src = src.data(), .src_ld = cols,
                     .dst = static_cast<char*>(t.data()) + full * block * cols * 2, .dst_ld = cols});
  be.synchronize();
  return t;
}

template <typename F>
double median_ms(Backend& be, F&& f, const BenchAttentionOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < o.warmup; ++i) f();
  if (o.warmup_seconds > 0) {
    be.synchronize();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < o.warmup_seconds) {
      f();
      be.synchronize();
    }
  }
  const int reps = o.repeat;
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    be.reset_marks();
    const int a = be.mark();
    f();
    const int b = be.mark();
    be.synchronize();
    ms.push_back(be.elapsed(a, b) * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// The shapes of every (S, P, layout) asked for, validated before any runs.
std::vector<Shape> shapes_of(const BenchAttentionOptions& o, i64 H) {
  std::vector<Shape> shapes;
  for (i64 S : o.seq)
    for (int P : o.sp) {
      LAGA_REQUIRE(S > 0 && P > 0 && S % P == 0, "seq = ", S, ", sp = ", P, ": S must be a positive multiple of P");
      for (const auto& l : o.layout) {
        LAGA_REQUIRE(l == "a2a" || l == "all_gather", "layout = '", l, "': must be a2a or all_gather");
        if (l == "a2a") {
          LAGA_REQUIRE(H % P == 0, "sp = ", P, ": a2a needs the heads (", H, ") divisible by P");
          shapes.push_back({l, H / P, S, S, 0, S, P});
        } else {
          shapes.push_back({l, H, S / P, S, S - S / P, S, P});
        }
      }
    }
  return shapes;
}

// One shape's random inputs, outputs and gradients on the GPU, as the attention calls see them.
struct ShapeBuffers {
  Tensor q, k, v, dout, out, dq, dk, dv, lse;
  AttentionBwdParams p;

  ShapeBuffers(Backend& be, const Shape& s, i64 d_qk, i64 d_v, std::mt19937_64& rng)
      : q(random_rows(be, s.q_len, s.heads * d_qk, rng)), k(random_rows(be, s.kv_len, s.heads * d_qk, rng)),
        v(random_rows(be, s.kv_len, s.heads * d_v, rng)), dout(random_rows(be, s.q_len, s.heads * d_v, rng)),
        out(be.allocator(), DType::BF16, {s.q_len, s.heads * d_v}, "o", MemoryKind::External),
        dq(be.allocator(), DType::BF16, {s.q_len, s.heads * d_qk}, "dq", MemoryKind::External),
        dk(be.allocator(), DType::BF16, {s.kv_len, s.heads * d_qk}, "dk", MemoryKind::External),
        dv(be.allocator(), DType::BF16, {s.kv_len, s.heads * d_v}, "dv", MemoryKind::External),
        lse(be.allocator(), DType::F32, {s.heads, s.q_len}, "lse", MemoryKind::External) {
    p.dtype = DType::BF16, p.kernel = AttentionKernel::Fused, p.batch = 1, p.q_len = s.q_len, p.kv_len = s.kv_len;
    p.q_heads = p.kv_heads = s.heads, p.d_qk = d_qk, p.d_v = d_v, p.q_offset = s.q_offset;
    p.scale = 1.0 / std::sqrt(double(d_qk));
    auto view = [](const Tensor& t, i64 d, std::int64_t& ts, std::int64_t& bs, std::int64_t& hs) {
      ts = bs = t.dim(1), hs = d;
    };
    p.q = q.data(), view(q, d_qk, p.q_token_stride, p.q_batch_stride, p.q_head_stride);
    p.k = k.data(), view(k, d_qk, p.k_token_stride, p.k_batch_stride, p.k_head_stride);
    p.v = v.data(), view(v, d_v, p.v_token_stride, p.v_batch_stride, p.v_head_stride);
    p.o = out.data(), view(out, d_v, p.o_token_stride, p.o_batch_stride, p.o_head_stride);
    p.dout = dout.data(), view(dout, d_v, p.dout_token_stride, p.dout_batch_stride, p.dout_head_stride);
    p.dq = dq.data(), view(dq, d_qk, p.dq_token_stride, p.dq_batch_stride, p.dq_head_stride);
    p.dk = dk.data(), view(dk, d_qk, p.dk_token_stride, p.dk_batch_stride, p.dk_head_stride);
    p.dv = dv.data(), view(dv, d_v, p.dv_token_stride, p.dv_batch_stride, p.dv_head_stride);
    p.lse = lse.data();
  }
};

// Unmasked (query, key, head) triples: query i sees keys 0 .. min(kv_len - 1, i + q_offset).
double unmasked_pairs(const Shape& s) {
  double pairs = 0;
  for (i64 i = 0; i < s.q_len; ++i) pairs += double(std::min(s.kv_len, i + s.q_offset + 1));
  return pairs * double(s.heads);
}

// cuDNN's forward, deterministic and non-deterministic backward times (and their workspaces) into `t`, each 0
// where cuDNN cannot run it (no plan for the shape, or a workspace larger than the GPU has free); the reasons.
std::string time_cudnn(Backend& be, const CudnnInfo& cudnn, const AttentionBwdParams& p, AttentionTiming& t,
                       const BenchAttentionOptions& o) {
  if (!cudnn.loaded) return cudnn.error;
  cuda_set_attention_provider(be, AttentionProvider::Cudnn);
  auto workspace = [&] {
    for (const auto& slot : cuda_scratch_info(be).slots)
      if (slot.name == "cudnn_workspace") return std::int64_t(slot.peak_bytes);
    return std::int64_t(0);
  };
  std::string why;
  auto timed = [&](const char* what, auto&& call, double& ms, std::int64_t* ws) {
    cuda_reset_scratch_peak(be, /*release=*/true);
    try {
      ms = median_ms(be, call, o);
      if (ws) *ws = workspace();
    } catch (const InvalidArgument& e) {
      ms = 0;
      why += (why.empty() ? "" : "; ") + std::string(what) + ": " + e.what();
    }
  };
  timed("forward", [&] { be.attention_forward(p); }, t.cudnn_fwd_ms, nullptr);
  timed("backward", [&] { be.attention_backward(p); }, t.cudnn_bwd_ms, &t.cudnn_workspace_bytes);
  // Its non-deterministic backward (PyTorch's SDPA default), with its own workspace.
  cuda_set_attention_deterministic(be, false);
  timed("non-deterministic backward", [&] { be.attention_backward(p); }, t.cudnn_nondeterministic_bwd_ms,
        &t.cudnn_nondeterministic_workspace_bytes);
  cuda_set_attention_deterministic(be, true);
  cuda_reset_scratch_peak(be, /*release=*/true);
  return why;
}

// One shape timed with each provider: its point of the document, and its row of the table.
json time_shape(Backend& be, const CudnnInfo& cudnn, const Shape& s, i64 d_qk, i64 d_v, std::mt19937_64& rng,
                const BenchAttentionOptions& o, Table& table) {
  ShapeBuffers buf(be, s, d_qk, d_v, rng);
  const AttentionBwdParams& p = buf.p;
  const double pairs = unmasked_pairs(s);
  const double fwd_flops = 2.0 * double(d_qk + d_v) * pairs, bwd_flops = 2.0 * double(3 * d_qk + 2 * d_v) * pairs;

  AttentionTiming t{.dtype = "bfloat16", .d_qk = d_qk, .d_v = d_v, .heads = s.heads, .q_len = s.q_len,
                    .kv_len = s.kv_len};
  cuda_set_attention_provider(be, AttentionProvider::Laga);
  t.laga_fwd_ms = median_ms(be, [&] { be.attention_forward(p); }, o);
  t.laga_bwd_ms = median_ms(be, [&] { be.attention_backward(p); }, o);
  cuda_set_attention_deterministic(be, false);  // dQ added in any order
  t.laga_nondeterministic_bwd_ms = median_ms(be, [&] { be.attention_backward(p); }, o);
  cuda_set_attention_deterministic(be, true);
  const std::string cudnn_error = time_cudnn(be, cudnn, p, t, o);
  json j = {{"layout", s.layout},         {"S", s.S},
            {"P", s.P},                   {"q_offset", s.q_offset},
            {"dtype", t.dtype},           {"d_qk", t.d_qk},
            {"d_v", t.d_v},               {"heads", t.heads},
            {"q_len", t.q_len},           {"kv_len", t.kv_len},
            {"laga_fwd_ms", t.laga_fwd_ms}, {"laga_bwd_ms", t.laga_bwd_ms},
            {"laga_nondeterministic_bwd_ms", t.laga_nondeterministic_bwd_ms},
            {"cudnn_fwd_ms", t.cudnn_fwd_ms}, {"cudnn_bwd_ms", t.cudnn_bwd_ms},
            {"cudnn_workspace_bytes", t.cudnn_workspace_bytes},
            {"cudnn_nondeterministic_bwd_ms", t.cudnn_nondeterministic_bwd_ms},
            {"cudnn_nondeterministic_workspace_bytes", t.cudnn_nondeterministic_workspace_bytes},
            {"laga_fwd_tflops", fwd_flops / t.laga_fwd_ms * 1e-9}, {"laga_bwd_tflops", bwd_flops / t.laga_bwd_ms * 1e-9},
            {"laga_nondeterministic_bwd_tflops", bwd_flops / t.laga_nondeterministic_bwd_ms * 1e-9},
            {"auto_fwd", attention_provider_name(t.faster(AttentionPass::Forward))},
            {"auto_bwd", attention_provider_name(t.faster(AttentionPass::Backward))}};
  if (t.cudnn_fwd_ms > 0) j["cudnn_fwd_tflops"] = fwd_flops / t.cudnn_fwd_ms * 1e-9;
  if (t.cudnn_bwd_ms > 0) j["cudnn_bwd_tflops"] = bwd_flops / t.cudnn_bwd_ms * 1e-9;
  if (t.cudnn_nondeterministic_bwd_ms > 0)
    j["cudnn_nondeterministic_bwd_tflops"] = bwd_flops / t.cudnn_nondeterministic_bwd_ms * 1e-9;
  if (t.cudnn_bwd_ms > 0 || t.cudnn_nondeterministic_bwd_ms > 0)
    j["auto_bwd_nondeterministic"] = attention_provider_name(t.faster(AttentionPass::Backward, false));
  if (!cudnn_error.empty()) j["cudnn_error"] = cudnn_error;
  auto tf = [&](double f, double ms) { return ms > 0 ? fmt("%.0f", f / ms * 1e-9) : std::string("-"); };
  auto ms_text = [](double ms) { return ms > 0 ? fmt("%.3f", ms) : std::string("-"); };
  table.add({s.layout, std::to_string(s.S), std::to_string(s.P), std::to_string(s.heads), std::to_string(s.q_len),
             std::to_string(s.kv_len), fmt("%.3f", t.laga_fwd_ms), fmt("%.3f", t.laga_bwd_ms),
             fmt("%.3f", t.laga_nondeterministic_bwd_ms), ms_text(t.cudnn_fwd_ms), ms_text(t.cudnn_bwd_ms),
             ms_text(t.cudnn_nondeterministic_bwd_ms),
             tf(fwd_flops, t.laga_fwd_ms) + " / " + tf(bwd_flops, t.laga_bwd_ms) + " / " +
                 tf(bwd_flops, t.laga_nondeterministic_bwd_ms),
             tf(fwd_flops, t.cudnn_fwd_ms) + " / " + tf(bwd_flops, t.cudnn_bwd_ms) + " / " +
                 tf(bwd_flops, t.cudnn_nondeterministic_bwd_ms),
             std::string(attention_provider_name(t.faster(AttentionPass::Forward))) + " / " +
                 attention_provider_name(t.faster(AttentionPass::Backward)),
             attention_provider_name(t.faster(AttentionPass::Backward, false))});
  std::printf("done: %s S=%ld P=%d%s\n", s.layout.c_str(), long(s.S), s.P,
              cudnn_error.empty() ? "" : (" (cuDNN: " + cudnn_error + ")").c_str());
  std::fflush(stdout);
  return j;
}

template <typename T>
std::string joined(const std::vector<T>& values) {
  std::string text;
  for (const T& v : values) {
    if (!text.empty()) text += ",";
    if constexpr (std::is_same_v<T, std::string>) text += v; else text += std::to_string(v);
  }
  return text;
}

// The table `--attention-provider auto` chooses from, as the repo keeps it.
// backward_blocks: the warp-specialised backward's grid laga's times were measured on (0: one block per SM),
// as LAGA_CUDA_FLASH_BACKWARD_BLOCKS set it; the command names the variable where it was set.
void write_document(const BenchAttentionOptions& o, const json& points, int backward_blocks) {
  const char* grid_env = std::getenv("LAGA_CUDA_FLASH_BACKWARD_BLOCKS");
  const std::string env_prefix =
      grid_env && *grid_env ? "LAGA_CUDA_FLASH_BACKWARD_BLOCKS=" + std::string(grid_env) + " " : "";
  json doc = {{"about", "Median forward and backward milliseconds of each attention provider per shape (bf16, causal, "
                        "batch 1, FLOPs 2 (d_qk + d_v) forward and 2 (3 d_qk + 2 d_v) backward per unmasked (query, "
                        "key, head)): the table `--attention-provider auto` chooses from, each pass by the nearest "
                        "point's faster provider for it (auto_fwd, auto_bwd; *_nondeterministic_*: the non-deterministic "
                        "backwards, cuDNN's and laga's, which `auto` compares under --nondeterministic, "
                        "auto_bwd_nondeterministic). Regenerate on the GPU with the command below."},
              {"command", env_prefix + "laga bench-attention --model " + o.model + " --seq " + joined(o.seq) + " --sp " +
                              joined(o.sp) + " --layout " + joined(o.layout) + " --repeat " +
                              std::to_string(o.repeat) + " --warmup " + std::to_string(o.warmup) +
                              (o.warmup_seconds > 0 ? " --warmup-seconds " + fmt("%g", o.warmup_seconds) : "") +
                              " --out FILE"},
              {"machine", {{"device_name", cuda_device_name(o.gpu)}, {"cudnn", cudnn_report()}}},
              {"commit", LAGA_BUILD_COMMIT},
              {"dirty", LAGA_BUILD_DIRTY < 0 ? json(nullptr) : json(LAGA_BUILD_DIRTY == 1)},
              {"laga_backward_blocks", backward_blocks},
              {"points", points}};
  std::ofstream f(o.out);
  LAGA_REQUIRE(f.good(), "out = '", o.out, "': cannot open for writing");
  f << doc.dump(2) << "\n";
  f.close();
  LAGA_REQUIRE(f.good(), "out = '", o.out, "': the write failed");
  std::printf("wrote %s\n", o.out.c_str());
}

int run_bench_attention(const BenchAttentionOptions& o) {
  const MlaConfig cfg = resolve_model(o.model);
  LAGA_REQUIRE(o.repeat >= 1 && o.warmup >= 0, "repeat = ", o.repeat, ", warmup = ", o.warmup,
               ": repeat must be >= 1 and warmup >= 0");
  LAGA_REQUIRE(o.warmup_seconds >= 0 && o.warmup_seconds <= 600, "warmup-seconds = ", o.warmup_seconds,
               ": must be from 0 to 600");
  LAGA_REQUIRE(cuda_available(), "bench-attention: no usable GPU (or laga was built without CUDA)");
  const i64 d_qk = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim, d_v = cfg.v_head_dim;
  const std::vector<Shape> shapes = shapes_of(o, cfg.num_attention_heads);
  const CudnnInfo cudnn = cuda_cudnn_info();
  std::printf("laga bench-attention: %s, d_qk %ld, d_v %ld, bf16, causal, batch 1; cuDNN %s\n",
              cuda_device_name(o.gpu).c_str(), long(d_qk), long(d_v),
              cudnn.loaded ? std::to_string(cudnn.version).c_str() : cudnn.error.c_str());
  std::fflush(stdout);
  auto be = make_cuda_backend(o.gpu);
  std::mt19937_64 rng(1);
  json points = json::array();
  Table table({"layout", "S", "P", "heads", "q_len", "kv_len", "laga fwd ms", "laga bwd ms", "laga nondet bwd ms",
               "cudnn fwd ms", "cudnn bwd ms", "cudnn nondet bwd ms", "TFLOP/s laga f/b/nondet b",
               "TFLOP/s cudnn f/b/nondet b", "auto f/b", "auto nondet b"});
  for (const Shape& s : shapes) points.push_back(time_shape(*be, cudnn, s, d_qk, d_v, rng, o, table));
  table.print();
  if (!o.out.empty()) write_document(o, points, cuda_flash_backward_blocks(*be));
  return kExitOk;
}

}  // namespace

std::function<int()> add_bench_attention(CLI::App& app, CLI::App*& sub) {
  auto o = std::make_shared<BenchAttentionOptions>();
  sub = app.add_subcommand("bench-attention",
                           "Time laga's and cuDNN's fused attention at a model's per-rank shapes on the GPU; --out "
                           "writes the table --attention-provider auto chooses from (bench/attention-providers.json)");
  sub->add_option("--model", o->model, "Preset or path to a config.json (head dims and heads)")->capture_default_str();
  sub->add_option("--seq", o->seq, "Sequence lengths S, comma separated")->delimiter(',')->capture_default_str();
  sub->add_option("--sp", o->sp, "Sequence-parallel ranks P, comma separated")->delimiter(',')->capture_default_str();
  sub->add_option("--layout", o->layout, "a2a, all_gather (comma separated)")->delimiter(',')->capture_default_str();
  sub->add_option("--repeat", o->repeat, "Timed repeats (median)")->capture_default_str();
  sub->add_option("--warmup", o->warmup, "Untimed runs first")->capture_default_str();
  sub->add_option("--warmup-seconds", o->warmup_seconds,
                  "Then more untimed runs until this many seconds have passed, before each measurement (the GPU "
                  "at the clock its load holds it at, as in training)")
      ->capture_default_str();
  sub->add_option("--gpu", o->gpu, "CUDA device index")->capture_default_str();
  sub->add_option("--out", o->out, "The table as JSON");
  return [o] { return run_bench_attention(*o); };
}

}  // namespace laga::cli
