// Timings of the CUDA backend's heavy ops at MLA sizes, for the notes of the speed work (not a correctness
// test: disabled by default; scripts/gpu.sh check runs them with --gtest_also_run_disabled_tests). Each
// prints "GPUPERF <name> <median ms> <TFLOP/s>" over random inputs, after a warm-up, timed on the host
// around Backend::synchronize() (every timed call is a millisecond or more of device work).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "gpu_test_util.hpp"
#include "laga/errors.hpp"

namespace laga::gpu_test {
namespace {

double median_ms(Backend& be, const std::function<void()>& f, int reps) {
  f();
  be.synchronize();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    be.synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void print(const char* name, double ms, double flops) {
  std::printf("GPUPERF %-40s %9.3f ms %8.2f TFLOP/s\n", name, ms, flops / (ms * 1e-3) / 1e12);
  std::fflush(stdout);
}

Tensor random_tensor(Backend& be, DType dt, Shape shape, std::mt19937_64& rng) {
  Tensor t(be.allocator(), dt, shape, "t", MemoryKind::External);
  from_host(be, t, random_values(rng, t.numel()));
  return t;
}

TEST(CudaPerf, DISABLED_GemmBf16AndF32) {
  LAGA_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  auto rng = rng_for_test();
  const i64 n = 8192;
  for (DType dt : {DType::BF16, DType::F32}) {
    Tensor a = random_tensor(*be, dt, {n, n}, rng), b = random_tensor(*be, dt, {n, n}, rng);
    Tensor c(be->allocator(), dt, {n, n}, "c", MemoryKind::External);
    GemmArgs g{.dtype = dt, .m = n, .n = n, .k = n, .a = a.data(), .lda = n, .b = b.data(), .ldb = n, .c = c.data(), .ldc = n};
    const double ms = median_ms(*be, [&] { be->gemm(g); }, 5);
    print(dt == DType::BF16 ? "gemm_8192_bf16" : "gemm_8192_f32", ms, 2.0 * n * n * n);
  }
}

// One causal attention problem at MLA's dims, timed forward and backward (median of `reps` after a warm-up).
// FLOPs per unmasked (query, key, head), the convention of src/cuda/NOTES.md: forward 2 (d_qk + d_v), backward
// 2 (3 d_qk + 2 d_v) (the backward's recompute of Q K^T counted). v_in_k: absorbed MLA, V = K[..., :d_v].
// Inputs are random blocks uploaded once (at most 256 rows x 4096 columns) and repeated down the sequence and
// across the columns by the backend's broadcast copy, so that 32k-token or many-head problems need no host-side
// generation of gigabytes.
struct AttnShape {
  const char* name;
  i64 seq, heads, kv_heads, dqk, dv;
  bool v_in_k;
};

Tensor tiled_random(Backend& be, DType dt, i64 rows, i64 cols, std::mt19937_64& rng) {
  const i64 block = std::min<i64>(rows, 256), width = std::min<i64>(cols, 4096);
  Tensor src = random_tensor(be, dt, {block, width}, rng);
  Tensor t(be.allocator(), dt, {rows, cols}, "t", MemoryKind::External);
  const i64 esize = i64(dtype_size(dt));
  // Rows [r, r + n) from the block's first n rows: whole widths as one batched copy, then the columns left.
  for (i64 r = 0; r < rows; r += block) {
    const i64 n = std::min(block, rows - r), full = cols / width, rest = cols - full * width;
    char* dst = static_cast<char*>(t.data()) + r * cols * esize;
    be.copy(CopyArgs{.dtype = dt, .batch = full, .rows = n, .cols = width, .src = src.data(), .src_ld = width,
                     .src_batch_stride = 0, .dst = dst, .dst_ld = cols, .dst_batch_stride = width});
    if (rest > 0)
      be.copy(CopyArgs{.dtype = dt, .rows = n, .cols = rest, .src = src.data(), .src_ld = width,
                       .dst = dst + full * width * esize, .dst_ld = cols});
  }
  return t;
}

// A causal problem with random inputs (time_attention's rows) and its outputs, [tokens, heads * d] row-major:
// q_len queries, the last of kv_len keys (query i sees q_offset + i + 1 keys, q_offset = kv_len - q_len).
// v_in_k: V is K[..., :d_v] and the backward writes dK + [dV, 0]; eager: room for the [heads, q_len, kv_len]
// probabilities. `pairs`: the unmasked (query, key, head) triples.
struct AttnProblem {
  Tensor q, k, v, dout, o, dq, dk, dv, lse, probs;
  AttentionBwdParams p;
  double pairs = 0;
  AttnProblem(Backend& be, i64 heads, i64 kv_heads, i64 dqk, i64 dv_, bool v_in_k, i64 q_len, i64 kv_len,
              AttentionKernel kernel, std::mt19937_64& rng) {
    const DType dt = DType::BF16;
    q = tiled_random(be, dt, q_len, heads * dqk, rng);
    k = tiled_random(be, dt, kv_len, kv_heads * dqk, rng);
    if (!v_in_k) v = tiled_random(be, dt, kv_len, kv_heads * dv_, rng);
    dout = tiled_random(be, dt, q_len, heads * dv_, rng);
    o = Tensor(be.allocator(), dt, {q_len, heads * dv_}, "o", MemoryKind::External);
    dq = Tensor(be.allocator(), dt, {q_len, heads * dqk}, "dq", MemoryKind::External);
    dk = Tensor(be.allocator(), dt, {kv_len, kv_heads * dqk}, "dk", MemoryKind::External);
    dv = Tensor(be.allocator(), dt, {kv_len, kv_heads * dv_}, "dv", MemoryKind::External);
    lse = Tensor(be.allocator(), DType::F32, {heads, q_len}, "lse", MemoryKind::External);
    if (kernel == AttentionKernel::Eager)
      probs = Tensor(be.allocator(), dt, {heads, q_len, kv_len}, "probs", MemoryKind::External);
    p.dtype = dt, p.kernel = kernel, p.batch = 1, p.q_len = q_len, p.kv_len = kv_len, p.q_heads = heads;
    p.kv_heads = kv_heads, p.d_qk = dqk, p.d_v = dv_, p.q_offset = kv_len - q_len;
    p.scale = 1.0 / std::sqrt(double(dqk));
    // Token stride = the row, head stride = d (0 for a single kv head).
    auto view = [](const Tensor& t, i64 n_heads, i64 d, std::int64_t& ts, std::int64_t& bs, std::int64_t& hs) {
      ts = t.dim(1), bs = t.dim(1), hs = n_heads == 1 ? 0 : d;
    };
    p.q = q.data(), view(q, heads, dqk, p.q_token_stride, p.q_batch_stride, p.q_head_stride);
    p.k = k.data(), view(k, kv_heads, dqk, p.k_token_stride, p.k_batch_stride, p.k_head_stride);
    if (v_in_k) {
      p.v = p.k;
      p.v_token_stride = p.k_token_stride, p.v_batch_stride = p.k_batch_stride, p.v_head_stride = p.k_head_stride;
    } else {
      p.v = v.data(), view(v, kv_heads, dv_, p.v_token_stride, p.v_batch_stride, p.v_head_stride);
    }
    p.o = o.data(), view(o, heads, dv_, p.o_token_stride, p.o_batch_stride, p.o_head_stride);
    p.dout = dout.data(), view(dout, heads, dv_, p.dout_token_stride, p.dout_batch_stride, p.dout_head_stride);
    p.dq = dq.data(), view(dq, heads, dqk, p.dq_token_stride, p.dq_batch_stride, p.dq_head_stride);
    p.dk = dk.data(), view(dk, kv_heads, dqk, p.dk_token_stride, p.dk_batch_stride, p.dk_head_stride);
    p.dv = dv.data(), view(dv, kv_heads, dv_, p.dv_token_stride, p.dv_batch_stride, p.dv_head_stride);
    // V inside K: the gradient of the shared tensor, dK + [dV, 0] (what absorbed MLA's block takes).
    if (v_in_k) p.dv_in_dk = true, p.dv = nullptr, p.dv_token_stride = p.dv_batch_stride = p.dv_head_stride = 0;
    p.lse = lse.data();
    p.probs = probs.defined() ? probs.data() : nullptr;
    pairs = double(heads) * (double(q_len) * double(p.q_offset) + double(q_len) * double(q_len + 1) / 2);
  }
};

// row_splits: the backward again with each of these fixed 576/512 row splits (cuda_set_flash_row_splits).
void time_attention(Backend& be, const AttnShape& s, AttentionKernel kernel, int reps, std::mt19937_64& rng,
                    const std::vector<int>& row_splits = {}) {
  const AttnProblem problem(be, s.heads, s.kv_heads, s.dqk, s.dv, s.v_in_k, s.seq, s.seq, kernel, rng);
  const AttentionBwdParams& p = problem.p;
  const double pairs = problem.pairs;
  const double fwd_flops = 2.0 * double(s.dqk + s.dv) * pairs;
  const double bwd_flops = 2.0 * double(3 * s.dqk + 2 * s.dv) * pairs;
  const double fwd = median_ms(be, [&] { be.attention_forward(p); }, reps);
  const double bwd = median_ms(be, [&] { be.attention_backward(p); }, reps);
  const char* tag = kernel == AttentionKernel::Fused ? "fused" : "eager";
  char name[128];
  std::snprintf(name, sizeof(name), "%s_%s_fwd", s.name, tag);
  print(name, fwd, fwd_flops);
  std::snprintf(name, sizeof(name), "%s_%s_bwd", s.name, tag);
  print(name, bwd, bwd_flops);
  // The pass timed again with a kernel switch flipped (get, set), then restored; named by the kernel it ran.
  auto time_flipped = [&](bool (*get)(Backend&), void (*set)(Backend&, bool), auto pass, const char* what,
                          const char* when_on, const char* when_off, double flops) {
    const bool was = get(be);
    set(be, !was);
    const double other = median_ms(be, pass, reps);
    set(be, was);
    std::snprintf(name, sizeof(name), "%s_%s_%s_%s", s.name, tag, what, was ? when_off : when_on);
    print(name, other, flops);
  };
  // 192/128 tensor cores: the forward on the other kernel (single-warpgroup or warp-specialised), and (MHA) the
  // backward on the other fused-dQ kernel, in the same process, for comparison.
  if (kernel == AttentionKernel::Fused && s.dqk == 192 && s.dv == 128) {
    time_flipped(cuda_flash_ws_forward, cuda_set_flash_ws_forward, [&] { be.attention_forward(p); }, "fwd",
                 "warp_specialized", "single_warpgroup", fwd_flops);
    if (cuda_flash_ws_forward(be) && cuda_flash_forward_blocks(be) == 0) {  // its grid not persistent
      cuda_set_flash_forward_blocks(be, 1 << 30);
      const double tiles = median_ms(be, [&] { be.attention_forward(p); }, reps);
      cuda_set_flash_forward_blocks(be, 0);
      std::snprintf(name, sizeof(name), "%s_%s_fwd_block_per_tile", s.name, tag);
      print(name, tiles, fwd_flops);
    }
    if (s.kv_heads == s.heads) {
      time_flipped(cuda_flash_ws_backward, cuda_set_flash_ws_backward, [&] { be.attention_backward(p); }, "bwd",
                   "warp_specialized", "dkdv_regs", bwd_flops);
      // On a block per key block (the grid that is not persistent), in both orders of dQ's sums.
      if (cuda_flash_ws_backward(be) && cuda_flash_backward_blocks(be) == 0) {
        cuda_set_flash_backward_blocks(be, 1 << 30);
        const bool was = cuda_attention_deterministic(be);
        for (const bool deterministic : {true, false}) {
          cuda_set_attention_deterministic(be, deterministic);
          const double ms = median_ms(be, [&] { be.attention_backward(p); }, reps);
          std::snprintf(name, sizeof(name), "%s_%s_bwd_block_per_key_block%s", s.name, tag,
                        deterministic ? "" : "_any_order");
          print(name, ms, bwd_flops);
        }
        cuda_set_attention_deterministic(be, was);
        cuda_set_flash_backward_blocks(be, 0);
      }
    }
  }
  // 576/512 with V inside K: the summed backward on the other kernel (rows resident or key blocks resident).
  if (kernel == AttentionKernel::Fused && s.v_in_k)
    time_flipped(cuda_flash_vk_rows, cuda_set_flash_vk_rows, [&] { be.attention_backward(p); }, "bwd", "rows_resident",
                 "keys_resident", bwd_flops);
  // The backwards that add float32 sums across blocks (the warp-specialised 192/128 MHA kernel, the rows-resident
  // 576/512 one) with those sums in any order (non-deterministic).
  const bool sums_across_blocks = (s.dqk == 192 && s.dv == 128 && s.kv_heads == s.heads) ||
                                  (s.v_in_k && cuda_flash_vk_rows(be));
  if (kernel == AttentionKernel::Fused && sums_across_blocks)
    time_flipped(cuda_attention_deterministic, cuda_set_attention_deterministic, [&] { be.attention_backward(p); },
                 "bwd", "deterministic", "any_order", bwd_flops);
  // 192/128 tensor cores: the same backward with the separate dQ kernel, in the same process, for comparison;
  // 576/512 with V inside K: the row-split dK/dV kernel, the dQ kernel and dV added into dK.
  if (kernel == AttentionKernel::Fused && ((s.dqk == 192 && s.dv == 128) || s.v_in_k) && cuda_flash_fused_dq(be)) {
    cuda_set_flash_fused_dq(be, false);
    const double sep = median_ms(be, [&] { be.attention_backward(p); }, reps);
    cuda_set_flash_fused_dq(be, true);
    std::snprintf(name, sizeof(name), "%s_%s_bwd_separate_dq", s.name, tag);
    print(name, sep, bwd_flops);
  }
  for (const int splits : row_splits) {
    cuda_set_flash_row_splits(be, splits);
    const double ms = median_ms(be, [&] { be.attention_backward(p); }, reps);
    cuda_set_flash_row_splits(be, 0);
    std::snprintf(name, sizeof(name), "%s_%s_bwd_splits%d", s.name, tag, splits);
    print(name, ms, bwd_flops);
  }
}

// S = 4096, 16 heads (version 1's table; MQA with a separate V tensor).
TEST(CudaPerf, DISABLED_AttentionBf16) {
  LAGA_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  auto rng = rng_for_test();
  for (const AttnShape s : {AttnShape{"mha_192_128_h16_s4096", 4096, 16, 16, 192, 128, false},
                            AttnShape{"mqa_576_512_h16_s4096", 4096, 16, 1, 576, 512, false}})
    for (AttentionKernel kernel : {AttentionKernel::Fused, AttentionKernel::Eager})
      time_attention(*be, s, kernel, 3, rng);
}

// LAGA_PERF_REPS: the timed repeats of the long-sequence tests (default 3).
int perf_reps() {
  const char* env = std::getenv("LAGA_PERF_REPS");
  char* end = nullptr;
  const long reps = env ? std::strtol(env, &end, 10) : 3;
  LAGA_REQUIRE(!env || (*env != '\0' && *end == '\0' && reps >= 1 && reps <= 1000), "LAGA_PERF_REPS = '",
               env ? env : "", "': the timed repeats must be a whole number from 1 to 1000");
  return int(reps);
}

// The target shapes: S = 8k..32k, h = 16..128; MQA as absorbed MLA runs it (V inside K). Eager only where its
// [h, S, S] probabilities fit (h 16, S 8k). One test per head-dim pair, so that a run can time one of them;
// MQA means one kv head with V inside K (absorbed MLA). LAGA_PERF_REPS sets the timed repeats (default 3): many
// repeats keep the GPU loaded long enough to reach its power limit, as a training run does.
void time_long_sequences(i64 dqk, i64 dv, bool mqa, const char* prefix) {
  auto be = make_cuda_backend(0);
  auto rng = rng_for_test();
  const int reps = perf_reps();
  for (const i64 seq : {8192, 32768})
    for (const i64 heads : {16, 128}) {
      char name[64];
      std::snprintf(name, sizeof(name), "%s_h%lld_s%lldk", prefix, (long long)heads, (long long)(seq / 1024));
      const AttnShape s{name, seq, heads, mqa ? 1 : heads, dqk, dv, /*v_in_k=*/mqa};
      time_attention(*be, s, AttentionKernel::Fused, reps, rng);
      if (heads == 16 && seq == 8192) time_attention(*be, s, AttentionKernel::Eager, 3, rng);
    }
}

// The warp-specialised 192/128 kernels' work orders (cuda_set_flash_forward_head_group,
// cuda_set_flash_backward_head_group) timed at the perf shapes and at the all_gather rank's (DeepSeek-V3, P = 8:
// 128 heads, the last S/8 queries over S keys, S = 4k..32k), where every row tile walks about the same number
// of key tiles and a key block few row tiles: MHA 192/128, batch 1, random rows as time_attention's.
struct HeadGroupShape {
  const char* name;
  i64 heads, q_len, kv_len;
};
constexpr HeadGroupShape kHeadGroupShapes[] = {
    {"mha_192_128_h16_s8k", 16, 8192, 8192},           {"mha_192_128_h128_s8k", 128, 8192, 8192},
    {"mha_192_128_h16_s32k", 16, 32768, 32768},        {"mha_192_128_h128_s32k", 128, 32768, 32768},
    {"mha_192_128_h128_q2k_kv16k", 128, 2048, 16384}, {"mha_192_128_h128_q4k_kv32k", 128, 4096, 32768},
    {"mha_192_128_h128_q512_kv4k", 128, 512, 4096},   {"mha_192_128_h128_q1k_kv8k", 128, 1024, 8192}};

// LAGA_PERF_HEAD_GROUPS: the head groups the two tests below time, in this order, one round (a comma-separated
// list of counts >= 0, such as "16,8,4,0"; 0: the launcher's choice, named `heads0`; unset: each test's own
// rounds). LAGA_PERF_SHAPES: only the shapes whose name contains it (unset: all eight). Both lists, and the forward
// grid test's LAGA_PERF_FORWARD_BLOCKS, are read by counts_from_env: the counts in the variable `var`, else
// `fallback`.
std::vector<int> counts_from_env(const char* var, std::vector<int> fallback) {
  const char* env = std::getenv(var);
  if (env == nullptr) return fallback;
  std::vector<int> counts;
  const char* at = env;
  for (;;) {
    char* end = nullptr;
    const long n = std::strtol(at, &end, 10);
    LAGA_REQUIRE(end != at && n >= 0 && n <= 1 << 20 && (*end == ',' || *end == '\0'), var, " = '", env,
                 "': it must be a comma-separated list of counts >= 0 (0: the launcher's choice)");
    counts.push_back(int(n));
    if (*end == '\0') return counts;
    at = end + 1;
  }
}
std::vector<int> head_groups_or(std::vector<int> fallback) {
  return counts_from_env("LAGA_PERF_HEAD_GROUPS", std::move(fallback));
}

// f(backend, params, forward FLOPs, backward FLOPs, shape name) on each shape's problem (o and lse written once).
void for_head_group_shapes(const std::function<void(Backend&, const AttentionBwdParams&, double, double,
                                                    const char*)>& f) {
  auto be = make_cuda_backend(0);
  auto rng = rng_for_test();
  const char* only = std::getenv("LAGA_PERF_SHAPES");
  for (const HeadGroupShape& s : kHeadGroupShapes) {
    if (only != nullptr && std::string_view(s.name).find(only) == std::string_view::npos) continue;
    const AttnProblem problem(*be, s.heads, s.heads, 192, 128, false, s.q_len, s.kv_len, AttentionKernel::Fused, rng);
    const AttentionBwdParams& p = problem.p;
    const double pairs = problem.pairs;
    be->attention_forward(p);  // o and lse for the backward
    f(*be, p, 2.0 * (192 + 128) * pairs, 2.0 * (3 * 192 + 2 * 128) * pairs, s.name);
  }
}

// The forward in groups of 16, 1, 2 and 4 (the default) heads, three rounds in one process (the GPU's clock
// drifts under the load: compare within a round): `_fwd_heads<n>`.
TEST(CudaPerf, DISABLED_AttentionMha192ForwardHeadGroups) {
  LAGA_REQUIRE_GPU();
  for_head_group_shapes([](Backend& be, const AttentionBwdParams& p, double fwd_flops, double, const char* shape) {
    for (const int heads : head_groups_or({16, 1, 2, 4, 16, 1, 2, 4, 16, 1, 2, 4})) {
      cuda_set_flash_forward_head_group(be, heads);
      const double ms = median_ms(be, [&] { be.attention_forward(p); }, perf_reps());
      char name[96];
      std::snprintf(name, sizeof(name), "%s_fused_fwd_heads%d", shape, heads);
      print(name, ms, fwd_flops);
    }
    cuda_set_flash_forward_head_group(be, 0);
  });
}

// The forward's persistent grid (cuda_set_flash_forward_blocks) at the same shapes: the launcher's choice (0:
// forward_grid_blocks, fewer blocks than SMs where every row tile sees about as many keys, at the all_gather rank)
// against one block per SM, in turn: `_fwd_blocks<n>`. LAGA_PERF_FORWARD_BLOCKS: the grids to time, in this order
// (a comma-separated list of counts >= 0; unset: 0, SMs, 0, SMs, 0, SMs).
TEST(CudaPerf, DISABLED_AttentionMha192ForwardGrid) {
  LAGA_REQUIRE_GPU();
  const int sms = cuda_multiprocessor_count(0);
  std::vector<int> grids = counts_from_env("LAGA_PERF_FORWARD_BLOCKS", {0, sms, 0, sms, 0, sms});
  for_head_group_shapes([&](Backend& be, const AttentionBwdParams& p, double fwd_flops, double, const char* shape) {
    for (const int blocks : grids) {
      cuda_set_flash_forward_blocks(be, blocks);
      const double ms = median_ms(be, [&] { be.attention_forward(p); }, perf_reps());
      char name[96];
      std::snprintf(name, sizeof(name), "%s_fused_fwd_blocks%d", shape, blocks);
      print(name, ms, fwd_flops);
    }
    cuda_set_flash_forward_blocks(be, 0);
  });
}

// What a row tile costs the forward beyond its key tiles: heads of one 128-query row tile each (the last 128 of
// kv_len = 128 n keys), so that every row tile walks n key tiles (the last one the causal diagonal), and SMs x
// 1024 / n heads, the same work at every n and whole waves of the persistent grid. Every head reads the same K and
// V (head stride 0), which stay in L2: with a head's own K and V each tile would come once from HBM and the sweep
// would time HBM (80 KB per 10.5 MFLOP). Time per call t(n) = A + B / n gives F = B / (A - c) key tiles a row tile
// (c: the call's own overhead, small against ~2 ms). LAGA_PERF_ROW_TILES: the n to time (default 4, 8, 16, 32,
// 64, 128, 256), each in three rounds: `_fwd_rowtile_n<n>`.
TEST(CudaPerf, DISABLED_AttentionMha192ForwardRowTileCost) {
  LAGA_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  auto rng = rng_for_test();
  const int sms = cuda_multiprocessor_count(0);
  const std::vector<int> tiles = counts_from_env("LAGA_PERF_ROW_TILES", {4, 8, 16, 32, 64, 128, 256});
  for (const int n : tiles) LAGA_REQUIRE(n >= 1 && 1024 % n == 0, "LAGA_PERF_ROW_TILES: ", n, " must divide 1024");
  for (int round = 0; round < 3; ++round)
    for (const int n : tiles) {
      const i64 heads = i64(sms) * (1024 / n), kv_len = 128 * i64(n);
      AttnProblem problem(*be, heads, heads, 192, 128, false, 128, kv_len, AttentionKernel::Fused, rng);
      problem.p.k_head_stride = problem.p.v_head_stride = 0;  // one head's K and V for all
      const double ms = median_ms(*be, [&] { be->attention_forward(problem.p); }, perf_reps());
      char name[96];
      std::snprintf(name, sizeof(name), "mha_192_128_h%lld_q128_kv%lld_fwd_rowtile_n%d", (long long)heads,
                    (long long)kv_len, n);
      print(name, ms, 2.0 * (192 + 128) * problem.pairs);
    }
}

// The backward in groups of 16, 8, 32 heads and the launcher's choice (0: 8, or more in the fixed order where a
// head's rows are few), two rounds, dQ in the fixed order and in any order, in one process: `_bwd_heads<n>`,
// `_bwd_any_order_heads<n>` (64 and 128 heads at a time ran at 310-430 TFLOP/s against 450-500 at the 128-head
// shapes of 8k and 32k queries on an H200: Q and dO then come from HBM).
TEST(CudaPerf, DISABLED_AttentionMha192BackwardHeadGroups) {
  LAGA_REQUIRE_GPU();
  for_head_group_shapes([](Backend& be, const AttentionBwdParams& p, double, double bwd_flops, const char* shape) {
    for (const bool deterministic : {true, false}) {
      cuda_set_attention_deterministic(be, deterministic);
      for (const int heads : head_groups_or({16, 8, 32, 0, 16, 8, 32, 0})) {
        cuda_set_flash_backward_head_group(be, heads);
        const double ms = median_ms(be, [&] { be.attention_backward(p); }, perf_reps());
        char name[96];
        std::snprintf(name, sizeof(name), "%s_fused_bwd%s_heads%d", shape, deterministic ? "" : "_any_order", heads);
        print(name, ms, bwd_flops);
      }
    }
    cuda_set_attention_deterministic(be, true);
    cuda_set_flash_backward_head_group(be, 0);
  });
}

TEST(CudaPerf, DISABLED_AttentionMha192LongSequences) {
  LAGA_REQUIRE_GPU();
  time_long_sequences(192, 128, /*mqa=*/false, "mha_192_128");
}

TEST(CudaPerf, DISABLED_AttentionMqa576LongSequences) {
  LAGA_REQUIRE_GPU();
  time_long_sequences(576, 512, /*mqa=*/true, "mqa_576_512");
}

// The 576/512 backward as absorbed MLA's a2a rank runs it (16 heads, one kv head, V inside K, dK + dV summed) at
// S = 4k..32k on the key-blocks-resident kernel (flash_bwd_vk_kernel): the row splits chosen per shape (`_bwd`),
// then each fixed count.
TEST(CudaPerf, DISABLED_AttentionMqa576RowSplits) {
  LAGA_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  cuda_set_flash_vk_rows(*be, false);
  auto rng = rng_for_test();
  for (const i64 seq : {4096, 8192, 16384, 32768}) {
    char name[64];
    std::snprintf(name, sizeof(name), "mqa_576_512_h16_s%lldk", (long long)(seq / 1024));
    const AttnShape s{name, seq, 16, 1, 576, 512, /*v_in_k=*/true};
    time_attention(*be, s, AttentionKernel::Fused, 5, rng, {1, 2, 3, 4, 6, 8});
  }
}

// The same backward on the rows-resident kernel (cuda_set_flash_vk_rows) at S = 4k..32k with 16 heads and at 8k
// and 32k with 128: the splits chosen per shape (`_bwd`), then each fixed count (its copies of the key tiles).
TEST(CudaPerf, DISABLED_AttentionMqa576RowsResidentSplits) {
  LAGA_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  cuda_set_flash_vk_rows(*be, true);
  auto rng = rng_for_test();
  for (const auto& [heads, seq] : std::vector<std::pair<i64, i64>>{{16, 4096}, {16, 8192}, {16, 16384}, {16, 32768},
                                                                    {128, 8192}, {128, 32768}}) {
    char name[64];
    std::snprintf(name, sizeof(name), "mqa_576_512_h%lld_s%lldk_rows", (long long)heads, (long long)(seq / 1024));
    const AttnShape s{name, seq, heads, 1, 576, 512, /*v_in_k=*/true};
    time_attention(*be, s, AttentionKernel::Fused, 3, rng, {1, 2, 4, 8, 16});
  }
}

}  // namespace
}  // namespace laga::gpu_test
