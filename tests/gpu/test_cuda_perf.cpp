// Timings of the CUDA backend's heavy ops at MLA sizes, for the notes of the speed work (not a correctness
// test: disabled by default; scripts/gpu_check.sh runs them with --gtest_also_run_disabled_tests). Each
// prints "GPUPERF <name> <median ms> <TFLOP/s>" over random inputs, after a warm-up, timed on the host
// around Backend::synchronize().
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "gpu_test_util.hpp"

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
}

Tensor random_tensor(Backend& be, DType dt, Shape shape, std::mt19937_64& rng) {
  Tensor t(be.allocator(), dt, shape, "t", MemoryKind::external);
  from_host(be, t, random_values(rng, t.numel()));
  return t;
}

TEST(CudaPerf, DISABLED_GemmBf16AndF32) {
  LAGA_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  auto rng = rng_for_test();
  const i64 n = 8192;
  for (DType dt : {DType::bf16, DType::f32}) {
    Tensor a = random_tensor(*be, dt, {n, n}, rng), b = random_tensor(*be, dt, {n, n}, rng);
    Tensor c(be->allocator(), dt, {n, n}, "c", MemoryKind::external);
    GemmArgs g{.dtype = dt, .m = n, .n = n, .k = n, .a = a.data(), .lda = n, .b = b.data(), .ldb = n, .c = c.data(), .ldc = n};
    const double ms = median_ms(*be, [&] { be->gemm(g); }, 5);
    print(dt == DType::bf16 ? "gemm_8192_bf16" : "gemm_8192_f32", ms, 2.0 * n * n * n);
  }
}

// Causal attention at MLA's dims: MHA 192/128 (16 heads) and the absorbed MQA 576/512 (16 heads), S = 4096.
TEST(CudaPerf, DISABLED_AttentionBf16) {
  LAGA_REQUIRE_GPU();
  auto be = make_cuda_backend(0);
  auto rng = rng_for_test();
  struct Dims {
    const char* name;
    i64 heads, kv_heads, dqk, dv;
  };
  const i64 S = 4096;
  for (const Dims s : {Dims{"mha_192_128_h16_s4096", 16, 16, 192, 128}, Dims{"mqa_576_512_h16_s4096", 16, 1, 576, 512}}) {
    for (AttentionKernel kernel : {AttentionKernel::fused, AttentionKernel::eager}) {
      const DType dt = DType::bf16;
      Tensor q = random_tensor(*be, dt, {S, s.heads * s.dqk}, rng);
      Tensor k = random_tensor(*be, dt, {S, s.kv_heads * s.dqk}, rng);
      Tensor v = random_tensor(*be, dt, {S, s.kv_heads * s.dv}, rng);
      Tensor dout = random_tensor(*be, dt, {S, s.heads * s.dv}, rng);
      Tensor o(be->allocator(), dt, {S, s.heads * s.dv}, "o", MemoryKind::external);
      Tensor dq(be->allocator(), dt, {S, s.heads * s.dqk}, "dq", MemoryKind::external);
      Tensor dk(be->allocator(), dt, {S, s.kv_heads * s.dqk}, "dk", MemoryKind::external);
      Tensor dv(be->allocator(), dt, {S, s.kv_heads * s.dv}, "dv", MemoryKind::external);
      Tensor lse(be->allocator(), DType::f32, {s.heads, S}, "lse", MemoryKind::external);
      Tensor probs;
      if (kernel == AttentionKernel::eager) probs = Tensor(be->allocator(), dt, {s.heads, S, S}, "probs", MemoryKind::external);
      AttentionBwdParams p;
      p.dtype = dt, p.kernel = kernel, p.batch = 1, p.q_len = S, p.kv_len = S, p.q_heads = s.heads;
      p.kv_heads = s.kv_heads, p.d_qk = s.dqk, p.d_v = s.dv, p.scale = 1.0 / std::sqrt(double(s.dqk));
      auto strides = [&](const Tensor& t, i64 heads, i64 d, const void* ptr, const void** out, std::int64_t& ts,
                         std::int64_t& bs, std::int64_t& hs) {
        *out = ptr;
        ts = t.dim(1), bs = t.dim(1), hs = heads == 1 ? 0 : d;
      };
      strides(q, s.heads, s.dqk, q.data(), &p.q, p.q_token_stride, p.q_batch_stride, p.q_head_stride);
      strides(k, s.kv_heads, s.dqk, k.data(), &p.k, p.k_token_stride, p.k_batch_stride, p.k_head_stride);
      strides(v, s.kv_heads, s.dv, v.data(), &p.v, p.v_token_stride, p.v_batch_stride, p.v_head_stride);
      p.o = o.data(), p.o_token_stride = o.dim(1), p.o_batch_stride = o.dim(1), p.o_head_stride = s.dv;
      p.dout = dout.data(), p.dout_token_stride = dout.dim(1), p.dout_batch_stride = dout.dim(1), p.dout_head_stride = s.dv;
      p.dq = dq.data(), p.dq_token_stride = dq.dim(1), p.dq_batch_stride = dq.dim(1), p.dq_head_stride = s.dqk;
      p.dk = dk.data(), p.dk_token_stride = dk.dim(1), p.dk_batch_stride = dk.dim(1), p.dk_head_stride = s.kv_heads == 1 ? 0 : s.dqk;
      p.dv = dv.data(), p.dv_token_stride = dv.dim(1), p.dv_batch_stride = dv.dim(1), p.dv_head_stride = s.kv_heads == 1 ? 0 : s.dv;
      p.lse = lse.data();
      p.probs = probs.defined() ? probs.data() : nullptr;
      const double pairs = double(S) * double(S + 1) / 2.0 * double(s.heads);
      const double fwd_flops = 2.0 * double(s.dqk + s.dv) * pairs;
      const double bwd_flops = 2.0 * double(2 * s.dqk + 2 * s.dv) * pairs;  // useful work (no recompute)
      const double fwd = median_ms(*be, [&] { be->attention_forward(p); }, 3);
      const double bwd = median_ms(*be, [&] { be->attention_backward(p); }, 3);
      char name[96];
      std::snprintf(name, sizeof(name), "%s_%s_fwd", s.name, kernel == AttentionKernel::fused ? "fused" : "eager");
      print(name, fwd, fwd_flops);
      std::snprintf(name, sizeof(name), "%s_%s_bwd", s.name, kernel == AttentionKernel::fused ? "fused" : "eager");
      print(name, bwd, bwd_flops);
    }
  }
}

}  // namespace
}  // namespace laga::gpu_test
