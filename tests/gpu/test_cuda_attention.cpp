// CUDA attention (eager and fused, bf16 and f32) against the CPU backend in float64: forward (o, lse,
// probs) and backward (dq, dk, dv), on strided views of wider buffers, for MLA's head dims (192/128 MHA,
// 576/512 MQA with v aliasing k), small dims, GQA, causal offsets (0, positive, negative) and tiles cut
// short. bf16 at 192/128 and 576/512 runs the tensor-core kernels (flash_kernels.cuh): dense views take
// their 16-byte cp.async path, wide and batch-major views (odd strides) their 2-byte-load path. Every output
// is poisoned before the run; elements around each view stay NaN, so a kernel that writes outside its
// outputs is caught, and one that reads outside its inputs produces NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/attention_views.hpp"
#include "cuda/cudnn_attention.hpp"
#include "gpu_test_util.hpp"
#include "laga/errors.hpp"

namespace laga::gpu_test {
namespace {

using Layout = test::ViewLayout;
using Case = test::AttentionCase;

const Case kCases[] = {
    // MLA head dims: MHA (DeepSeek-V3 explicit / LAGA), all_gather-style offsets.
    {"mha_192_128", 2, 96, 96, 3, 3, 192, 128, 0, Layout::dense, false},
    {"mha_192_128_offset", 1, 64, 160, 2, 2, 192, 128, 96, Layout::wide, false},
    // Absorbed MLA: MQA over the latent, v = k[..., :512].
    {"mqa_576_512_absorbed", 1, 70, 70, 4, 1, 576, 512, 0, Layout::wide, true},
    {"mqa_576_512_absorbed_offset", 2, 40, 100, 3, 1, 576, 512, 60, Layout::batch_major, true},
    // The bf16 tensor-core kernels' 16-byte-aligned path (dense views): many row tiles of query x head, the
    // MQA dK/dV rows split over blocks (fp32 partials), separate V, GQA, offsets on both sides of zero.
    {"mqa_576_512_absorbed_dense_h16", 1, 96, 96, 16, 1, 576, 512, 0, Layout::dense, true},
    // 5 key blocks x 75 row tiles: the summed dK/dV kernel's key blocks run concurrently (dQ in key-block order).
    {"mqa_576_512_absorbed_dense_long", 1, 300, 290, 16, 1, 576, 512, 10, Layout::dense, true},
    {"mqa_576_512_separate_v_dense", 2, 50, 80, 4, 1, 576, 512, 30, Layout::dense, false},
    {"gqa_192_128_dense_multi_tile", 1, 200, 230, 4, 2, 192, 128, 30, Layout::dense, false},
    {"mha_192_128_dense_negative_offset", 2, 70, 70, 2, 2, 192, 128, -5, Layout::dense, false},
    // 9 key blocks x 18 row tiles per head: the fused dQ's key blocks run concurrently and wait on each other.
    {"mha_192_128_dense_long", 1, 1100, 1100, 3, 3, 192, 128, 0, Layout::dense, false},
    // Small dims, odd lengths (tiles cut short), GQA, negative offset, a single query, tile-config edges.
    {"tiny_mha", 1, 5, 5, 2, 2, 8, 8, 0, Layout::dense, false},
    {"mha_multi_tile", 2, 130, 130, 3, 3, 40, 24, 0, Layout::dense, false},
    {"mha_offset_unseen_keys", 2, 33, 150, 2, 2, 24, 16, 100, Layout::batch_major, false},
    {"gqa_offset", 1, 50, 90, 4, 2, 32, 16, 40, Layout::wide, false},
    {"mqa_separate_v", 1, 64, 128, 4, 1, 32, 24, 64, Layout::wide, false},
    {"single_query_mqa_absorbed", 2, 1, 70, 2, 1, 16, 8, 69, Layout::wide, true},
    {"negative_offset", 1, 20, 20, 2, 2, 8, 8, -3, Layout::dense, false},
    {"dims_256_small_tiles", 1, 40, 40, 2, 2, 256, 256, 0, Layout::dense, false},
    {"dims_264_large_tiles", 1, 40, 40, 2, 1, 264, 128, 0, Layout::wide, false},
};

// A [tokens, batch, heads, dim] view into a buffer of `size` elements.
struct View {
  i64 tokens = 0, batch = 0, heads = 0, dim = 0;
  i64 token_stride = 0, batch_stride = 0, head_stride = 0, col0 = 0, size = 0;
  i64 index(i64 t, i64 b, i64 h, i64 c) const { return col0 + t * token_stride + b * batch_stride + h * head_stride + c; }
  std::vector<char> mask() const {
    std::vector<char> m(static_cast<std::size_t>(size), 0);
    for (i64 t = 0; t < tokens; ++t)
      for (i64 b = 0; b < batch; ++b)
        for (i64 h = 0; h < heads; ++h)
          for (i64 c = 0; c < dim; ++c) m[index(t, b, h, c)] = 1;
    return m;
  }
};

View make_view(Layout layout, i64 tokens, i64 batch, i64 heads, i64 dim) {
  const test::ViewStrides st = test::view_strides(layout, tokens, batch, heads, dim);
  return View{.tokens = tokens, .batch = batch, .heads = heads, .dim = dim, .token_stride = st.token,
              .batch_stride = st.batch, .head_stride = st.head, .col0 = st.col0, .size = st.size};
}

View prefix(View v, i64 dim) {
  v.dim = dim;
  return v;
}

i64 visible(const Case& c, i64 i) { return std::clamp<i64>(i + c.q_offset + 1, 0, c.kv_len); }

// One problem on both backends: GPU buffers in the test dtype, CPU float64 twins with the same values.
struct Problem {
  Case c;
  AttentionKernel kernel;
  DType dt;
  Backend& gpu;
  Backend& cpu;
  View qv, kv, vv, ov, dqv, dkv, dvv;
  Mirror q, k, v, o, lse, probs, dout, dq, dk, dv;
  std::vector<double> o_ref, lse_ref, probs_ref, dq_ref, dk_ref, dv_ref;

  Problem(const Case& cs, AttentionKernel kn, DType d, Backends& be, std::mt19937_64& rng)
      : c(cs), kernel(kn), dt(d), gpu(*be.gpu), cpu(*be.cpu) {
    qv = make_view(c.layout, c.q_len, c.batch, c.q_heads, c.d_qk);
    kv = make_view(c.layout, c.kv_len, c.batch, c.kv_heads, c.d_qk);
    vv = c.v_aliases_k ? prefix(kv, c.d_v) : make_view(c.layout, c.kv_len, c.batch, c.kv_heads, c.d_v);
    ov = make_view(c.layout, c.q_len, c.batch, c.q_heads, c.d_v);
    dqv = qv;
    dkv = kv;
    dvv = make_view(c.layout, c.kv_len, c.batch, c.kv_heads, c.d_v);
    q = with_nan_padding(qv, rng, "q");
    k = with_nan_padding(kv, rng, "k");
    if (!c.v_aliases_k) v = with_nan_padding(vv, rng, "v");
    const i64 rows = c.batch * c.q_heads * c.q_len;
    o = poisoned_mirror(gpu, dt, ov.size, "o");
    lse = poisoned_mirror(gpu, DType::F32, std::max<i64>(rows, 1), "lse");
    probs = poisoned_mirror(gpu, dt, std::max<i64>(rows * c.kv_len, 1), "probs");
    o_ref.assign(o.host.size(), kNaN);
    lse_ref.assign(lse.host.size(), kNaN);
    probs_ref.assign(probs.host.size(), kNaN);
  }

  // Random values inside the view, NaN around it.
  Mirror with_nan_padding(const View& view, std::mt19937_64& rng, const std::string& name) {
    Mirror m(gpu, dt, view.size, name);
    const auto mask = view.mask();
    auto values = random_values(rng, view.size);
    for (std::size_t i = 0; i < values.size(); ++i)
      if (!mask[i]) values[i] = kNaN;
    m.upload(gpu, values);
    return m;
  }

  static void set(const View& v, std::int64_t& token, std::int64_t& batch, std::int64_t& head) {
    token = v.token_stride, batch = v.batch_stride, head = v.head_stride;
  }

  // The parameters for one side: `on_gpu` picks the buffers (device, test dtype) or the twins (host, f64).
  AttentionBwdParams params(bool on_gpu) {
    AttentionBwdParams p;
    p.dtype = on_gpu ? dt : DType::F64;
    p.kernel = kernel;
    p.batch = c.batch, p.q_len = c.q_len, p.kv_len = c.kv_len, p.q_heads = c.q_heads, p.kv_heads = c.kv_heads;
    p.d_qk = c.d_qk, p.d_v = c.d_v, p.q_offset = c.q_offset;
    p.scale = 1.0 / std::sqrt(double(c.d_qk));
    auto ptr = [&](Mirror& m, const View& view, std::vector<double>* ref) -> void* {
      if (on_gpu) return static_cast<char*>(m.gpu()) + view.col0 * i64(dtype_size(dt));
      return (ref ? ref->data() : m.cpu()) + view.col0;
    };
    p.q = ptr(q, qv, nullptr);
    set(qv, p.q_token_stride, p.q_batch_stride, p.q_head_stride);
    p.k = ptr(k, kv, nullptr);
    set(kv, p.k_token_stride, p.k_batch_stride, p.k_head_stride);
    p.v = c.v_aliases_k ? p.k : ptr(v, vv, nullptr);
    set(vv, p.v_token_stride, p.v_batch_stride, p.v_head_stride);
    p.o = ptr(o, ov, &o_ref);
    set(ov, p.o_token_stride, p.o_batch_stride, p.o_head_stride);
    p.lse = on_gpu ? lse.gpu() : lse_ref.data();
    if (kernel == AttentionKernel::Eager) p.probs = on_gpu ? probs.gpu() : probs_ref.data();
    if (dout.dev.defined()) {
      p.dout = ptr(dout, ov, nullptr);
      set(ov, p.dout_token_stride, p.dout_batch_stride, p.dout_head_stride);
      p.dq = ptr(dq, dqv, &dq_ref);
      set(dqv, p.dq_token_stride, p.dq_batch_stride, p.dq_head_stride);
      p.dk = ptr(dk, dkv, &dk_ref);
      set(dkv, p.dk_token_stride, p.dk_batch_stride, p.dk_head_stride);
      p.dv = ptr(dv, dvv, &dv_ref);
      set(dvv, p.dv_token_stride, p.dv_batch_stride, p.dv_head_stride);
    }
    return p;
  }

  void forward() {
    gpu.attention_forward(params(true));
    cpu.attention_forward(params(false));
  }

  // Fresh dout; dq, dk, dv poisoned. Runs after forward() (the saved o, lse, probs of each side).
  void backward(std::mt19937_64& rng) {
    dout = with_nan_padding(ov, rng, "dout");
    dq = poisoned_mirror(gpu, dt, dqv.size, "dq");
    dk = poisoned_mirror(gpu, dt, dkv.size, "dk");
    dv = poisoned_mirror(gpu, dt, dvv.size, "dv");
    dq_ref.assign(dq.host.size(), kNaN);
    dk_ref.assign(dk.host.size(), kNaN);
    dv_ref.assign(dv.host.size(), kNaN);
    gpu.attention_backward(params(true));
    cpu.attention_backward(params(false));
  }

  void check_forward() {
    const double tol = op_tolerance(dt);
    expect_output("o", dt, o.download(gpu), o_ref, ov.mask(), tol);
    // lse: compared on rows that see a key; rows that see none must hold -inf.
    const auto got = lse.download(gpu);
    std::vector<char> rows(got.size(), 0);
    i64 bad_empty_rows = 0;
    for (i64 bh = 0; bh < c.batch * c.q_heads; ++bh)
      for (i64 i = 0; i < c.q_len; ++i) {
        const std::size_t r = std::size_t(bh * c.q_len + i);
        if (visible(c, i) > 0)
          rows[r] = 1;
        else
          bad_empty_rows += !(std::isinf(got[r]) && got[r] < 0);
      }
    EXPECT_EQ(bad_empty_rows, 0) << "lse of rows without visible keys must be -inf";
    if (std::count(rows.begin(), rows.end(), 1) > 0) expect_output("lse", DType::F32, got, lse_ref, rows, 1e-5, false);
    if (kernel == AttentionKernel::Eager) {
      std::vector<char> all(probs.host.size(), 1);
      if (c.batch * c.q_heads * c.q_len * c.kv_len == 0) all.assign(all.size(), 0);
      if (std::count(all.begin(), all.end(), 1) > 0) expect_output("probs", dt, probs.download(gpu), probs_ref, all, tol);
    }
  }

  void check_backward() {
    const double tol = op_tolerance(dt);
    expect_output("dq", dt, dq.download(gpu), dq_ref, dqv.mask(), tol);
    expect_output("dk", dt, dk.download(gpu), dk_ref, dkv.mask(), tol);
    expect_output("dv", dt, dv.download(gpu), dv_ref, dvv.mask(), tol);
  }
};

const char* kernel_tag(AttentionKernel k) { return k == AttentionKernel::Eager ? "eager" : "fused"; }

struct Param {
  Case c;
  AttentionKernel kernel;
  DType dtype;
};
std::string param_string(const Param& p) {
  return std::string(p.c.name) + "_" + kernel_tag(p.kernel) + "_" + dtype_tag(p.dtype);
}
void PrintTo(const Param& p, std::ostream* os) { *os << param_string(p); }
std::string param_name(const ::testing::TestParamInfo<Param>& i) { return param_string(i.param); }
std::vector<Param> params() {
  std::vector<Param> out;
  for (const auto& c : kCases)
    for (AttentionKernel k : {AttentionKernel::Eager, AttentionKernel::Fused})
      for (DType t : {DType::F32, DType::BF16}) out.push_back({c, k, t});
  return out;
}

class CudaAttention : public ::testing::TestWithParam<Param> {};

TEST_P(CudaAttention, ForwardMatchesCpuFloat64) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  Problem pr(GetParam().c, GetParam().kernel, GetParam().dtype, be, rng);
  pr.forward();
  pr.check_forward();
}

TEST_P(CudaAttention, BackwardMatchesCpuFloat64) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  Problem pr(GetParam().c, GetParam().kernel, GetParam().dtype, be, rng);
  pr.forward();
  pr.backward(rng);
  pr.check_backward();
}

// Same inputs, same bits: no atomics, fixed reduction orders (also across MQA heads).
TEST_P(CudaAttention, BitwiseDeterministicOnRerun) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  Problem pr(GetParam().c, GetParam().kernel, GetParam().dtype, be, rng);
  pr.forward();
  pr.backward(rng);
  auto raw = [&](const Mirror& m) { return raw_bytes(*be.gpu, m.dev); };
  const auto o1 = raw(pr.o), dq1 = raw(pr.dq), dk1 = raw(pr.dk), dv1 = raw(pr.dv);
  AttentionBwdParams p = pr.params(true);
  be.gpu->attention_forward(p);
  be.gpu->attention_backward(p);
  EXPECT_EQ(raw(pr.o), o1);
  EXPECT_EQ(raw(pr.dq), dq1);
  EXPECT_EQ(raw(pr.dk), dk1);
  EXPECT_EQ(raw(pr.dv), dv1);
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaAttention, ::testing::ValuesIn(params()), param_name);


TEST(CudaAttentionChecks, RejectsUnsupportedInputs) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  const Case& tiny = *std::find_if(std::begin(kCases), std::end(kCases),
                                   [](const Case& c) { return std::string(c.name) == "tiny_mha"; });
  Problem pr(tiny, AttentionKernel::Fused, DType::F32, be, rng);
  AttentionBwdParams p = pr.params(true);
  p.dtype = DType::F64;
  EXPECT_THROW(be.gpu->attention_forward(p), InvalidArgument);
  p = pr.params(true);
  p.kv_heads = 3;  // does not divide 2 query heads
  EXPECT_THROW(be.gpu->attention_forward(p), InvalidArgument);
  p = pr.params(true);
  p.lse = nullptr;
  EXPECT_THROW(be.gpu->attention_forward(p), InvalidArgument);
  p = pr.params(true);
  p.d_qk = 584;  // past the fused kernel's largest head dim
  EXPECT_THROW(be.gpu->attention_forward(p), InvalidArgument);
}

// ---------------------------------------------------------------- eager attention's score scratch cap
// Eager attention cuts its [heads, q_len, kv_len] score scratch into chunks of heads (or of one head's query
// rows) under the backend's cap (cuda_set_eager_scratch_cap). A capped run must give every output within the
// float64 tolerance, like the uncapped one. Not bitwise in general: chunking changes the GEMMs' batch counts
// and operand addresses, and cuBLASLt's heuristic may pick another algorithm for them (cuda_attention.cu);
// whether the bits matched is printed (GPUCHECK ... bitwise_equal_to_uncapped). The scores slot's high-water
// mark stays at or under the cap (at least one query row).
enum class Cap { two_heads, one_head, rows, one_row };
const char* cap_tag(Cap c) {
  switch (c) {
    case Cap::two_heads: return "two_heads";
    case Cap::one_head: return "one_head";
    case Cap::rows: return "rows";
    case Cap::one_row: return "one_row";
  }
  return "?";
}

// Bytes of the backward's scores slot for e score elements (fp32 dP, then dS at a 256-byte boundary).
std::size_t backward_scratch(i64 e, DType dt) {
  return std::size_t((4 * e + 255) / 256 * 256 + i64(dtype_size(dt)) * e);
}

std::size_t cap_bytes(Cap cap, const Case& c, DType dt) {
  const i64 per_head = c.q_len * c.kv_len;
  switch (cap) {
    case Cap::two_heads: return backward_scratch(2 * per_head, dt);
    case Cap::one_head: return backward_scratch(per_head, dt);
    case Cap::rows: return backward_scratch(std::max<i64>(c.q_len / 3, 1) * c.kv_len, dt);
    case Cap::one_row: return 1;
  }
  return 0;
}

struct CapParam {
  const char* case_name;
  DType dtype;
  Cap cap;
};
std::string cap_param_string(const CapParam& p) {
  return std::string(p.case_name) + "_" + dtype_tag(p.dtype) + "_" + cap_tag(p.cap);
}
void PrintTo(const CapParam& p, std::ostream* os) { *os << cap_param_string(p); }
const Case& case_named(const char* name) {
  const Case* c = std::find_if(std::begin(kCases), std::end(kCases),
                               [&](const Case& x) { return std::string(x.name) == name; });
  if (c == std::end(kCases)) throw std::logic_error(std::string("no attention case ") + name);
  return *c;
}

// MHA, GQA (chunks of whole groups, and of part of a group), MQA (v in k, and separate), causal offsets
// positive (keys no query sees) and negative (rows that see no key).
std::vector<CapParam> cap_params() {
  std::vector<CapParam> out;
  for (const char* name : {"mha_192_128", "gqa_offset", "mqa_576_512_absorbed", "mqa_separate_v",
                           "mha_offset_unseen_keys", "negative_offset"})
    for (DType t : {DType::F32, DType::BF16})
      for (Cap c : {Cap::two_heads, Cap::one_head, Cap::rows, Cap::one_row})
        if (c != Cap::two_heads || case_named(name).q_heads > 2) out.push_back({name, t, c});
  return out;
}

std::size_t slot_peak(Backend& gpu, const std::string& name) {
  for (const auto& s : cuda_scratch_info(gpu).slots)
    if (s.name == name) return s.peak_bytes;
  ADD_FAILURE() << "no scratch slot '" << name << "'";
  return 0;
}

class CudaEagerScratchCap : public ::testing::TestWithParam<CapParam> {};

TEST_P(CudaEagerScratchCap, ChunkedMatchesFloat64) {
  LAGA_REQUIRE_GPU();
  const CapParam& cp = GetParam();
  const Case& c = case_named(cp.case_name);
  Backends be;
  Backend& gpu = *be.gpu;
  auto rng = rng_for_test();
  Problem pr(c, AttentionKernel::Eager, cp.dtype, be, rng);
  // Uncapped: one chunk, the calls eager attention made before chunking existed.
  cuda_set_eager_scratch_cap(gpu, std::numeric_limits<std::size_t>::max());
  pr.forward();
  pr.backward(rng);  // also computes the float64 references
  pr.check_forward();
  pr.check_backward();
  auto raw = [&](const Mirror& m) {
    std::vector<unsigned char> b(m.dev.bytes());
    gpu.copy_to_host(b.data(), m.dev);
    return b;
  };
  const std::vector<const Mirror*> outs{&pr.o, &pr.lse, &pr.probs, &pr.dq, &pr.dk, &pr.dv};
  const char* names[] = {"o", "lse", "probs", "dq", "dk", "dv"};
  std::vector<std::vector<unsigned char>> uncapped;
  for (const Mirror* m : outs) uncapped.push_back(raw(*m));

  // Capped, on the same inputs, from fresh scratch; outputs poisoned.
  const std::size_t cap = cap_bytes(cp.cap, c, cp.dtype);
  const std::size_t full = backward_scratch(c.q_heads * c.q_len * c.kv_len, cp.dtype);
  ASSERT_LT(cap, full) << "the cap must force chunks";
  cuda_set_eager_scratch_cap(gpu, cap);
  EXPECT_EQ(cuda_eager_scratch_cap(gpu), cap);
  cuda_reset_scratch_peak(gpu, /*release=*/true);
  EXPECT_EQ(cuda_scratch_info(gpu).held_bytes, 0u);
  EXPECT_EQ(cuda_scratch_peak_bytes(gpu), 0u);
  for (Mirror* m : {&pr.o, &pr.lse, &pr.probs, &pr.dq, &pr.dk, &pr.dv}) gpu.fill(m->dev, kNaN);
  const AttentionBwdParams p = pr.params(true);
  gpu.attention_forward(p);
  gpu.attention_backward(p);
  gpu.synchronize();
  pr.check_forward();
  pr.check_backward();
  for (std::size_t i = 0; i < outs.size(); ++i)
    std::printf("GPUCHECK %s %s bitwise_equal_to_uncapped=%s\n", cap_param_string(cp).c_str(), names[i],
                raw(*outs[i]) == uncapped[i] ? "yes" : "no");

  // The scores slot: at or under the cap, or one query row (plus the 256-byte minimum) when the cap is less.
  const std::size_t one_row = std::max<std::size_t>(256, backward_scratch(c.kv_len, cp.dtype));
  const std::size_t scores = slot_peak(gpu, "scores");
  EXPECT_GT(scores, 0u);
  EXPECT_LE(scores, std::max(cap, one_row)) << "cap " << cap << ", one row " << one_row;
  const CudaScratchInfo info = cuda_scratch_info(gpu);
  EXPECT_GE(info.peak_bytes, scores);
  EXPECT_GE(info.peak_bytes, info.held_bytes);
  std::printf("GPUCHECK %s scratch cap=%zu scores_peak=%zu total_peak=%zu\n", cap_param_string(cp).c_str(), cap,
              scores, info.peak_bytes);

  // Same cap again: same bits (the chunking and each GEMM's algorithm are fixed for a problem).
  std::vector<std::vector<unsigned char>> first;
  for (const Mirror* m : outs) first.push_back(raw(*m));
  gpu.attention_forward(p);
  gpu.attention_backward(p);
  for (std::size_t i = 0; i < outs.size(); ++i) EXPECT_EQ(raw(*outs[i]), first[i]) << names[i] << " on rerun";
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaEagerScratchCap, ::testing::ValuesIn(cap_params()),
                         [](const ::testing::TestParamInfo<CapParam>& i) { return cap_param_string(i.param); });

// The fused kernels never touch the eager scores slot: the 576/512 backward's row-split partials have their own.
TEST(CudaScratch, FusedBackwardUsesItsOwnSlots) {
  LAGA_REQUIRE_GPU();
  Backends be;
  Backend& gpu = *be.gpu;
  auto rng = rng_for_test();
  Problem pr(case_named("mqa_576_512_absorbed_dense_h16"), AttentionKernel::Fused, DType::BF16, be, rng);
  pr.forward();
  pr.backward(rng);
  pr.check_backward();
  const CudaScratchInfo info = cuda_scratch_info(gpu);
  std::size_t sum = 0;
  for (const auto& s : info.slots) {
    std::printf("GPUCHECK scratch slot %s held=%zu peak=%zu\n", s.name.c_str(), s.held_bytes, s.peak_bytes);
    sum += s.held_bytes;
    if (s.name == "scores") EXPECT_EQ(s.peak_bytes, 0u) << "fused attention used the eager scores slot";
  }
  EXPECT_EQ(info.held_bytes, sum);
  EXPECT_GE(info.peak_bytes, info.held_bytes);
  EXPECT_GT(slot_peak(gpu, "delta"), 0u);
  cuda_reset_scratch_peak(gpu);  // without release: the marks restart from what is held
  EXPECT_EQ(cuda_scratch_peak_bytes(gpu), info.held_bytes);
  cuda_reset_scratch_peak(gpu, /*release=*/true);
  EXPECT_EQ(cuda_scratch_info(gpu).held_bytes, 0u);
  EXPECT_EQ(cuda_scratch_peak_bytes(gpu), 0u);
}

// The relative L2 difference of `got` from `ref` over the elements `mask` marks (a view's own elements).
double masked_rel_diff(const std::vector<double>& got, const std::vector<double>& ref, const std::vector<char>& mask) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < mask.size(); ++i)
    if (mask[i]) num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
  return std::sqrt(num / std::max(den, 1e-300));
}

// The tensor-core 192/128 backward with dQ added up inside the dK/dV kernel (the default) and with the separate
// dQ kernel, on the same inputs: dK and dV the same bits, dQ within the float64 tolerance both ways, and the
// fused dQ tiles in their own scratch slot only when used.
class CudaAttentionFusedDq : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttentionFusedDq, SameDkDvBitsAndDqWithinTolerance) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  Problem pr(GetParam(), AttentionKernel::Fused, DType::BF16, be, rng);
  pr.forward();
  cuda_set_flash_fused_dq(*be.gpu, false);
  cuda_reset_scratch_peak(*be.gpu, /*release=*/true);
  pr.backward(rng);
  pr.check_backward();
  EXPECT_EQ(slot_peak(*be.gpu, "dq_accum"), 0u) << "the separate dQ kernel used the fused dQ tiles";
  auto raw = [&](const Mirror& m) { return raw_bytes(*be.gpu, m.dev); };
  const auto dq_sep = pr.dq.download(*be.gpu);
  const auto dk_sep = raw(pr.dk), dv_sep = raw(pr.dv);
  cuda_set_flash_fused_dq(*be.gpu, true);
  for (Mirror* m : {&pr.dq, &pr.dk, &pr.dv}) m->poison(*be.gpu);
  be.gpu->attention_backward(pr.params(true));
  pr.check_backward();
  EXPECT_EQ(raw(pr.dk), dk_sep) << "dK differs between the fused and the separate dQ";
  EXPECT_EQ(raw(pr.dv), dv_sep) << "dV differs between the fused and the separate dQ";
  EXPECT_GT(slot_peak(*be.gpu, "dq_accum"), 0u);
  const auto dq_fused = pr.dq.download(*be.gpu);
  std::printf("GPUCHECK fused_dq %s dq_fused_vs_separate_rel=%.3e\n", GetParam().name,
              masked_rel_diff(dq_fused, dq_sep, pr.dqv.mask()));
}

std::vector<Case> cases_192_128() {
  std::vector<Case> out;
  for (const auto& c : kCases)
    if (c.d_qk == 192 && c.d_v == 128) out.push_back(c);
  return out;
}
INSTANTIATE_TEST_SUITE_P(Ops, CudaAttentionFusedDq, ::testing::ValuesIn(cases_192_128()),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// The 192/128 tensor-core forward on both kernels (cuda_set_flash_ws_forward): the warp-specialised one (the
// default) and the single-warpgroup one, each against float64 and bitwise on rerun; O of the two within bf16
// rounding of each other (reported).
class CudaAttentionWsForward : public ::testing::TestWithParam<Case> {};

TEST_P(CudaAttentionWsForward, BothKernelsMatchFloat64AndRepeatBitwise) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  Problem pr(GetParam(), AttentionKernel::Fused, DType::BF16, be, rng);
  std::vector<double> o_of[2];
  for (const bool ws : {false, true}) {
    SCOPED_TRACE(ws ? "warp-specialised forward" : "single-warpgroup forward");
    cuda_set_flash_ws_forward(*be.gpu, ws);
    pr.o.poison(*be.gpu), pr.lse.poison(*be.gpu);
    pr.forward();
    pr.check_forward();
    const auto o_bytes = raw_bytes(*be.gpu, pr.o.dev), lse_bytes = raw_bytes(*be.gpu, pr.lse.dev);
    be.gpu->attention_forward(pr.params(true));
    EXPECT_EQ(raw_bytes(*be.gpu, pr.o.dev), o_bytes) << "o differs on rerun";
    EXPECT_EQ(raw_bytes(*be.gpu, pr.lse.dev), lse_bytes) << "lse differs on rerun";
    o_of[ws] = pr.o.download(*be.gpu);
  }
  std::printf("GPUCHECK ws_forward %s o_ws_vs_single_rel=%.3e\n", GetParam().name,
              masked_rel_diff(o_of[1], o_of[0], pr.ov.mask()));
}
// Its persistent grid (cuda_set_flash_forward_blocks): on 1, 2, 3 and 7 blocks every block walks several row
// tiles (the loads' phases and the turns running on across them), on a block per row tile none does; every count,
// and every work order (cuda_set_flash_forward_head_group: 1, 2 and 5 heads at a time, on the default grid and on
// 3 blocks), writes the default's bits, which match float64.
TEST_P(CudaAttentionWsForward, AnyBlockCountGivesTheSameBits) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  Problem pr(GetParam(), AttentionKernel::Fused, DType::BF16, be, rng);
  ASSERT_EQ(cuda_flash_forward_blocks(*be.gpu), 0);
  pr.forward();
  pr.check_forward();
  const auto o_bytes = raw_bytes(*be.gpu, pr.o.dev), lse_bytes = raw_bytes(*be.gpu, pr.lse.dev);
  for (const int blocks : {1, 2, 3, 7, 1 << 20}) {
    SCOPED_TRACE("forward blocks " + std::to_string(blocks));
    cuda_set_flash_forward_blocks(*be.gpu, blocks);
    pr.o.poison(*be.gpu), pr.lse.poison(*be.gpu);
    be.gpu->attention_forward(pr.params(true));
    EXPECT_EQ(raw_bytes(*be.gpu, pr.o.dev), o_bytes) << "o differs from the default grid's";
    EXPECT_EQ(raw_bytes(*be.gpu, pr.lse.dev), lse_bytes) << "lse differs from the default grid's";
  }
  ASSERT_EQ(cuda_flash_forward_head_group(*be.gpu), 0);
  for (const int blocks : {0, 3})
    for (const int heads : {1, 2, 5}) {
      SCOPED_TRACE("forward blocks " + std::to_string(blocks) + ", heads at a time " + std::to_string(heads));
      cuda_set_flash_forward_blocks(*be.gpu, blocks);
      cuda_set_flash_forward_head_group(*be.gpu, heads);
      pr.o.poison(*be.gpu), pr.lse.poison(*be.gpu);
      be.gpu->attention_forward(pr.params(true));
      EXPECT_EQ(raw_bytes(*be.gpu, pr.o.dev), o_bytes) << "o differs from the default order's";
      EXPECT_EQ(raw_bytes(*be.gpu, pr.lse.dev), lse_bytes) << "lse differs from the default order's";
    }
  EXPECT_THROW(cuda_set_flash_forward_blocks(*be.gpu, -1), InvalidArgument);
  EXPECT_THROW(cuda_set_flash_forward_head_group(*be.gpu, -1), InvalidArgument);
  cuda_set_flash_forward_blocks(*be.gpu, 0);
  cuda_set_flash_forward_head_group(*be.gpu, 0);
}
INSTANTIATE_TEST_SUITE_P(Ops, CudaAttentionWsForward, ::testing::ValuesIn(cases_192_128()),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// The 192/128 tensor-core backward with fused dQ on both kernels (cuda_set_flash_ws_backward): the warp-specialised
// one (the default; MHA on aligned views) and flash_bwd_dkdv_regs_kernel, each against float64 and bitwise on
// rerun (dQ's bulk additions keep the key blocks' order); dK and dV the same bits both ways, dQ of the two within
// float rounding of each other (reported).
class CudaAttentionWsBackward : public ::testing::TestWithParam<Case> {};

// The 192/128 fused backward of case c run two ways (set_way(gpu, way) before each; the first way's run computes
// the float64 reference too), each against float64, a way that `reruns` marks again and bitwise the same; dK and
// dV must be the same bits both ways. Returns dQ's relative difference between the two.
double backward_two_ways(const Case& c, const std::function<void(Backend&, bool)>& set_way, const bool (&ways)[2],
                         const bool (&reruns)[2], const char* const (&names)[2]) {
  Backends be;
  auto rng = rng_for_test();
  Problem pr(c, AttentionKernel::Fused, DType::BF16, be, rng);
  pr.forward();
  auto raw = [&](const Mirror& m) { return raw_bytes(*be.gpu, m.dev); };
  std::vector<std::uint8_t> dk[2], dv[2];
  std::vector<double> dq[2];
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(names[i]);
    set_way(*be.gpu, ways[i]);
    if (i == 0) {
      pr.backward(rng);
    } else {
      for (Mirror* m : {&pr.dq, &pr.dk, &pr.dv}) m->poison(*be.gpu);
      be.gpu->attention_backward(pr.params(true));
    }
    pr.check_backward();
    dk[i] = raw(pr.dk), dv[i] = raw(pr.dv);
    if (reruns[i]) {
      const auto dq_bytes = raw(pr.dq);
      be.gpu->attention_backward(pr.params(true));
      EXPECT_EQ(raw(pr.dq), dq_bytes) << "dq differs on rerun";
      EXPECT_EQ(raw(pr.dk), dk[i]) << "dk differs on rerun";
      EXPECT_EQ(raw(pr.dv), dv[i]) << "dv differs on rerun";
    }
    dq[i] = pr.dq.download(*be.gpu);
  }
  EXPECT_EQ(dk[0], dk[1]) << "dK differs between the two ways";
  EXPECT_EQ(dv[0], dv[1]) << "dV differs between the two ways";
  return masked_rel_diff(dq[1], dq[0], pr.dqv.mask());
}

TEST_P(CudaAttentionWsBackward, BothKernelsMatchFloat64AndRepeatBitwise) {
  LAGA_REQUIRE_GPU();
  const double rel = backward_two_ways(
      GetParam(), [](Backend& gpu, bool ws) { cuda_set_flash_ws_backward(gpu, ws); }, {false, true}, {true, true},
      {"flash_bwd_dkdv_regs_kernel", "warp-specialised backward"});
  std::printf("GPUCHECK ws_backward %s dq_ws_vs_regs_rel=%.3e\n", GetParam().name, rel);
}
// Non-deterministic (cuda_set_attention_deterministic(false)): the warp-specialised kernel adds dQ into its row
// tiles in whichever order the key blocks come; dQ against float64 as before, dK and dV the deterministic run's
// bits (they are not summed across blocks), dQ within float rounding of the deterministic run's (reported).
TEST_P(CudaAttentionWsBackward, AnyOrderDqMatchesFloat64WithTheSameDkDv) {
  LAGA_REQUIRE_GPU();
  auto set = [](Backend& gpu, bool deterministic) {
    cuda_set_attention_deterministic(gpu, deterministic);
    EXPECT_EQ(cuda_attention_deterministic(gpu), deterministic);
  };
  const double rel = backward_two_ways(GetParam(), set, {true, false}, {true, false}, {"deterministic", "any order"});
  std::printf("GPUCHECK any_order_dq %s dq_vs_ordered_rel=%.3e\n", GetParam().name, rel);
}
// Its persistent grid (cuda_set_flash_backward_blocks): on 1, 2, 3 and 7 blocks every block walks several key
// blocks (the stages' and dS^T buffers' phases running on across them, dQ's counters waited for across blocks), on
// a block per key block none does; in the fixed order every count, and every work order
// (cuda_set_flash_backward_head_group: 1, 2 and 5 heads at a time, on the default grid and on 3 blocks), writes
// the default's bits, which match float64; in any order on 3 blocks dK and dV are those bits and dQ matches
// float64.
TEST_P(CudaAttentionWsBackward, AnyBlockCountGivesTheSameBits) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  Problem pr(GetParam(), AttentionKernel::Fused, DType::BF16, be, rng);
  ASSERT_EQ(cuda_flash_backward_blocks(*be.gpu), 0);
  pr.forward();
  pr.backward(rng);
  pr.check_backward();
  auto raw = [&](const Mirror& m) { return raw_bytes(*be.gpu, m.dev); };
  const auto dq = raw(pr.dq), dk = raw(pr.dk), dv = raw(pr.dv);
  auto run = [&] {
    for (Mirror* m : {&pr.dq, &pr.dk, &pr.dv}) m->poison(*be.gpu);
    be.gpu->attention_backward(pr.params(true));
  };
  for (const int blocks : {1, 2, 3, 7, 1 << 20}) {
    SCOPED_TRACE("backward blocks " + std::to_string(blocks));
    cuda_set_flash_backward_blocks(*be.gpu, blocks);
    run();
    EXPECT_EQ(raw(pr.dq), dq) << "dq differs from the default grid's";
    EXPECT_EQ(raw(pr.dk), dk) << "dk differs from the default grid's";
    EXPECT_EQ(raw(pr.dv), dv) << "dv differs from the default grid's";
  }
  ASSERT_EQ(cuda_flash_backward_head_group(*be.gpu), 0);
  for (const int blocks : {0, 3})
    for (const int heads : {1, 2, 5}) {
      SCOPED_TRACE("backward blocks " + std::to_string(blocks) + ", heads at a time " + std::to_string(heads));
      cuda_set_flash_backward_blocks(*be.gpu, blocks);
      cuda_set_flash_backward_head_group(*be.gpu, heads);
      run();
      EXPECT_EQ(raw(pr.dq), dq) << "dq differs from the default order's";
      EXPECT_EQ(raw(pr.dk), dk) << "dk differs from the default order's";
      EXPECT_EQ(raw(pr.dv), dv) << "dv differs from the default order's";
    }
  EXPECT_THROW(cuda_set_flash_backward_head_group(*be.gpu, -1), InvalidArgument);
  cuda_set_flash_backward_head_group(*be.gpu, 0);
  cuda_set_flash_backward_blocks(*be.gpu, 3);
  cuda_set_attention_deterministic(*be.gpu, false);
  run();
  pr.check_backward();
  EXPECT_EQ(raw(pr.dk), dk) << "dk differs in any order";
  EXPECT_EQ(raw(pr.dv), dv) << "dv differs in any order";
  cuda_set_attention_deterministic(*be.gpu, true);
  EXPECT_THROW(cuda_set_flash_backward_blocks(*be.gpu, -1), InvalidArgument);
  cuda_set_flash_backward_blocks(*be.gpu, 0);
}
INSTANTIATE_TEST_SUITE_P(Ops, CudaAttentionWsBackward, ::testing::ValuesIn(cases_192_128()),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// V inside K with dv_in_dk: dk = dK + [dV, 0] (bf16 fused 576/512: flash_bwd_vk_kernel, one accumulator per key
// and column; other paths: dV apart, then added), against the float64 dK and dV of the same inputs; dv is not
// written, dq as without the flag; bitwise on rerun. With LAGA_CUDA_FLASH_DQ=separate semantics
// (cuda_set_flash_fused_dq false) the 576/512 case takes the old kernels and the add.
struct DvInDkParam {
  Case c;
  AttentionKernel kernel;
  DType dtype;
  bool fused_dq;
};
std::string dv_in_dk_string(const DvInDkParam& p) {
  return std::string(p.c.name) + "_" + kernel_tag(p.kernel) + "_" + dtype_tag(p.dtype) + (p.fused_dq ? "" : "_separate_dq");
}
void PrintTo(const DvInDkParam& p, std::ostream* os) { *os << dv_in_dk_string(p); }
class CudaAttentionDvInDk : public ::testing::TestWithParam<DvInDkParam> {};

TEST_P(CudaAttentionDvInDk, SumMatchesFloat64AndRerunsBitwise) {
  LAGA_REQUIRE_GPU();
  const DvInDkParam& dp = GetParam();
  Backends be;
  Backend& gpu = *be.gpu;
  cuda_set_flash_fused_dq(gpu, dp.fused_dq);
  auto rng = rng_for_test();
  Problem pr(dp.c, dp.kernel, dp.dtype, be, rng);
  pr.forward();
  pr.backward(rng);  // dK and dV apart, and their float64 references
  pr.check_backward();
  std::vector<double> sum_ref = pr.dk_ref;
  const Case& c = pr.c;
  for (i64 t = 0; t < c.kv_len; ++t)
    for (i64 b = 0; b < c.batch; ++b)
      for (i64 h = 0; h < c.kv_heads; ++h)
        for (i64 d = 0; d < c.d_v; ++d)
          sum_ref[std::size_t(pr.dkv.index(t, b, h, d))] += pr.dv_ref[std::size_t(pr.dvv.index(t, b, h, d))];
  for (Mirror* m : {&pr.dq, &pr.dk, &pr.dv}) m->poison(gpu);
  AttentionBwdParams p = pr.params(true);
  p.dv_in_dk = true;
  p.dv = nullptr, p.dv_token_stride = p.dv_batch_stride = p.dv_head_stride = 0;
  cuda_reset_scratch_peak(gpu, /*release=*/true);
  gpu.attention_backward(p);
  gpu.synchronize();
  const double tol = op_tolerance(dp.dtype);
  expect_output("dq", dp.dtype, pr.dq.download(gpu), pr.dq_ref, pr.dqv.mask(), tol);
  expect_output("dk + dv", dp.dtype, pr.dk.download(gpu), sum_ref, pr.dkv.mask(), tol);
  const auto dv_after = pr.dv.download(gpu);
  EXPECT_EQ(std::count_if(dv_after.begin(), dv_after.end(), [](double x) { return !std::isnan(x); }), 0)
      << "dv written with dv_in_dk";
  const bool summed_kernel = dp.kernel == AttentionKernel::Fused && dp.dtype == DType::BF16 && c.d_qk == 576 &&
                             c.d_v == 512 && dp.fused_dq;
  EXPECT_EQ(slot_peak(gpu, "dv_sum") > 0, !summed_kernel) << "dV apart exactly when the summed kernel does not run";
  auto raw = [&](const Mirror& m) { return raw_bytes(gpu, m.dev); };
  const auto dq1 = raw(pr.dq), dk1 = raw(pr.dk);
  gpu.attention_backward(p);
  EXPECT_EQ(raw(pr.dq), dq1) << "dq on rerun";
  EXPECT_EQ(raw(pr.dk), dk1) << "dk on rerun";
  // The 576/512 tensor-core kernels: with the fused dQ, both summed kernels (cuda_set_flash_vk_rows: key blocks
  // resident, rows resident), each with its chosen splits (bitwise on rerun) and with fixed ones
  // (cuda_set_flash_row_splits: one, and more than some cases have row tiles or key blocks have row tiles).
  if (dp.kernel == AttentionKernel::Fused && dp.dtype == DType::BF16 && c.d_qk == 576 && c.d_v == 512) {
    const bool rows_default = cuda_flash_vk_rows(gpu);
    for (const bool rows : dp.fused_dq ? std::vector<bool>{false, true} : std::vector<bool>{rows_default}) {
      cuda_set_flash_vk_rows(gpu, rows);
      for (const int splits : {0, 1, 5}) {
        cuda_set_flash_row_splits(gpu, splits);
        for (Mirror* m : {&pr.dq, &pr.dk}) m->poison(gpu);
        gpu.attention_backward(p);
        gpu.synchronize();
        SCOPED_TRACE(std::string(rows ? "rows" : "key blocks") + " resident, splits " + std::to_string(splits));
        expect_output("dq", dp.dtype, pr.dq.download(gpu), pr.dq_ref, pr.dqv.mask(), tol);
        expect_output("dk + dv", dp.dtype, pr.dk.download(gpu), sum_ref, pr.dkv.mask(), tol);
        if (splits == 0) {
          const auto dq_a = raw(pr.dq), dk_a = raw(pr.dk);
          gpu.attention_backward(p);
          EXPECT_EQ(raw(pr.dq), dq_a) << "dq on rerun";
          EXPECT_EQ(raw(pr.dk), dk_a) << "dk on rerun";
        }
        if (rows && dp.fused_dq) {  // non-deterministic: dK + [dV, 0] added in any order, dQ the same bits
          const auto dq_a = raw(pr.dq);
          cuda_set_attention_deterministic(gpu, false);
          for (Mirror* m : {&pr.dq, &pr.dk}) m->poison(gpu);
          gpu.attention_backward(p);
          gpu.synchronize();
          cuda_set_attention_deterministic(gpu, true);
          SCOPED_TRACE("any order");
          expect_output("dq", dp.dtype, pr.dq.download(gpu), pr.dq_ref, pr.dqv.mask(), tol);
          expect_output("dk + dv", dp.dtype, pr.dk.download(gpu), sum_ref, pr.dkv.mask(), tol);
          EXPECT_EQ(raw(pr.dq), dq_a) << "dq differs between the orders";
        }
      }
    }
    cuda_set_flash_vk_rows(gpu, rows_default);
    cuda_set_flash_row_splits(gpu, 0);
    EXPECT_THROW(cuda_set_flash_row_splits(gpu, 17), InvalidArgument);
    EXPECT_THROW(cuda_set_flash_row_splits(gpu, -1), InvalidArgument);
    EXPECT_EQ(cuda_flash_row_splits(gpu), 0) << "a refused count leaves the setting as it was";
  }
  std::printf("GPUCHECK dv_in_dk %s summed_kernel=%d\n", dv_in_dk_string(dp).c_str(), int(summed_kernel));
}

std::vector<DvInDkParam> dv_in_dk_params() {
  std::vector<DvInDkParam> out;
  for (const auto& c : kCases) {
    if (!c.v_aliases_k) continue;
    for (AttentionKernel k : {AttentionKernel::Eager, AttentionKernel::Fused})
      for (DType t : {DType::F32, DType::BF16}) out.push_back({c, k, t, true});
    if (c.d_qk == 576) out.push_back({c, AttentionKernel::Fused, DType::BF16, false});
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Ops, CudaAttentionDvInDk, ::testing::ValuesIn(dv_in_dk_params()),
                         [](const ::testing::TestParamInfo<DvInDkParam>& i) { return dv_in_dk_string(i.param); });

// ---------------------------------------------------------------- the cuDNN provider
// Every case above plus all_gather-style offsets, bf16 fused, with --attention-provider cudnn: the cases the
// provider takes (cudnn_attention_rejects empty) against the CPU in float64 like laga's kernels (o, lse, dq,
// dk, dv, NaN around every view) and bitwise on rerun (cuDNN's deterministic backward); the others must be
// refused with an InvalidArgument naming the shape (under auto they run laga's kernels). Skipped where
// cuDNN cannot be loaded (built without the provider, or no libcudnn.so.9 on the library path).
const Case kCudnnCases[] = {
    {"mha_192_128_dense_last_rank_offset", 1, 64, 160, 2, 2, 192, 128, 96, Layout::dense, false},
    {"mha_192_128_dense_middle_rank_offset", 2, 64, 256, 2, 2, 192, 128, 64, Layout::dense, false},
    {"mha_128_128_dense_offset", 1, 48, 96, 2, 2, 128, 128, 48, Layout::dense, false},
};

std::vector<Case> cudnn_cases() {
  std::vector<Case> out(std::begin(kCases), std::end(kCases));
  out.insert(out.end(), std::begin(kCudnnCases), std::end(kCudnnCases));
  return out;
}
std::string cudnn_case_name(const ::testing::TestParamInfo<Case>& i) { return i.param.name; }

class CudaAttentionCudnn : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    LAGA_REQUIRE_GPU();
    const CudnnInfo info = cuda_cudnn_info();
    if (!info.loaded) GTEST_SKIP() << "cuDNN not available: " << info.error;
    std::printf("GPUCHECK cudnn version %ld (built against %ld)\n", info.version, info.compiled_version);
  }
};

TEST_P(CudaAttentionCudnn, MatchesCpuFloat64AndRerunsBitwise) {
  Backends be;
  cuda_set_attention_provider(*be.gpu, AttentionProvider::Cudnn);
  auto rng = rng_for_test();
  Problem pr(GetParam(), AttentionKernel::Fused, DType::BF16, be, rng);
  const AttentionBwdParams p0 = pr.params(true);
  const std::string why = cuda::cudnn_attention_rejects(static_cast<const AttentionFwdParams&>(p0));
  if (!why.empty()) {
    try {
      pr.forward();
      ADD_FAILURE() << "cudnn ran a call its rules reject (" << why << ")";
    } catch (const InvalidArgument& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("attention provider cudnn cannot run"), std::string::npos) << msg;
      EXPECT_NE(msg.find("d_qk " + std::to_string(GetParam().d_qk)), std::string::npos) << msg;
    }
    return;
  }
  // The rules take the call; cuDNN's own support surface decides the rest. MLA's head dims must run; for
  // others a missing plan is reported (the provider then refuses them, as it did here).
  try {
    pr.forward();
    pr.backward(rng);
  } catch (const InvalidArgument& e) {
    const bool mla = GetParam().d_qk == 192 && GetParam().d_v == 128;
    if (mla) FAIL() << "cuDNN has no plan for an MLA shape: " << e.what();
    GTEST_SKIP() << "cuDNN has no plan: " << e.what();
  }
  pr.check_forward();
  pr.check_backward();
  const AttentionProviderCounts n = cuda_attention_provider_counts(*be.gpu);
  EXPECT_EQ(n.cudnn_forward, 1u);
  EXPECT_EQ(n.cudnn_backward, 1u);
  EXPECT_EQ(n.laga_forward + n.laga_backward, 0u);
  auto raw = [&](const Mirror& m) { return raw_bytes(*be.gpu, m.dev); };
  const auto o1 = raw(pr.o), lse1 = raw(pr.lse), dq1 = raw(pr.dq), dk1 = raw(pr.dk), dv1 = raw(pr.dv);
  AttentionBwdParams p = pr.params(true);
  be.gpu->attention_forward(p);
  be.gpu->attention_backward(p);
  EXPECT_EQ(raw(pr.o), o1);
  EXPECT_EQ(raw(pr.lse), lse1);
  EXPECT_EQ(raw(pr.dq), dq1);
  EXPECT_EQ(raw(pr.dk), dk1);
  EXPECT_EQ(raw(pr.dv), dv1);
  EXPECT_EQ(cuda_attention_provider_counts(*be.gpu).cudnn_graphs, 2u) << "one graph per direction, built once";
  // Its workspace is kernel scratch (its own slot).
  const CudaScratchInfo info = cuda_scratch_info(*be.gpu);
  const auto slot = std::find_if(info.slots.begin(), info.slots.end(),
                                 [](const CudaScratchSlot& s) { return s.name == "cudnn_workspace"; });
  ASSERT_NE(slot, info.slots.end());
  std::printf("GPUCHECK %s cudnn_workspace %zu bytes\n", GetParam().name, slot->peak_bytes);
}

// The passes mixed, as `auto` may run them: laga's forward, then cuDNN's backward from its O and log-sum-exp,
// and the other way round; the gradients against float64 either way.
TEST_P(CudaAttentionCudnn, EitherProvidersBackwardFollowsTheOthersForward) {
  auto rng = rng_for_test();
  for (const bool laga_first : {true, false}) {
    SCOPED_TRACE(laga_first ? "laga forward, cuDNN backward" : "cuDNN forward, laga backward");
    Backends be;
    Problem pr(GetParam(), AttentionKernel::Fused, DType::BF16, be, rng);
    const AttentionBwdParams p0 = pr.params(true);
    if (!cuda::cudnn_attention_rejects(static_cast<const AttentionFwdParams&>(p0)).empty() ||
        GetParam().d_qk != 192 || GetParam().d_v != 128)
      GTEST_SKIP() << "MLA's 192/128 shapes that cuDNN takes";
    const AttentionProvider first = laga_first ? AttentionProvider::Laga : AttentionProvider::Cudnn;
    const AttentionProvider second = laga_first ? AttentionProvider::Cudnn : AttentionProvider::Laga;
    cuda_set_attention_provider(*be.gpu, first);
    pr.forward();
    pr.check_forward();
    cuda_set_attention_provider(*be.gpu, second);
    pr.backward(rng);
    pr.check_backward();
    const AttentionProviderCounts n = cuda_attention_provider_counts(*be.gpu);
    EXPECT_EQ(laga_first ? n.laga_forward : n.cudnn_forward, 1u);
    EXPECT_EQ(laga_first ? n.cudnn_backward : n.laga_backward, 1u);
    EXPECT_EQ(laga_first ? n.cudnn_forward + n.laga_backward : n.laga_forward + n.cudnn_backward, 0u);
  }
}

// cuDNN's non-deterministic backward (cuda_set_attention_deterministic false, --nondeterministic): the same
// float64 bars as the deterministic one; its own graph (the forward's is shared).
TEST_P(CudaAttentionCudnn, NondeterministicBackwardMatchesCpuFloat64) {
  Backends be;
  cuda_set_attention_provider(*be.gpu, AttentionProvider::Cudnn);
  EXPECT_TRUE(cuda_attention_deterministic(*be.gpu)) << "a new backend runs deterministically";
  cuda_set_attention_deterministic(*be.gpu, false);
  auto rng = rng_for_test();
  Problem pr(GetParam(), AttentionKernel::Fused, DType::BF16, be, rng);
  const AttentionBwdParams p0 = pr.params(true);
  if (!cuda::cudnn_attention_rejects(static_cast<const AttentionFwdParams&>(p0)).empty())
    GTEST_SKIP() << "a shape the provider refuses (the test above checks the refusal)";
  try {
    pr.forward();
    pr.backward(rng);
  } catch (const InvalidArgument& e) {
    const bool mla = GetParam().d_qk == 192 && GetParam().d_v == 128;
    if (mla) FAIL() << "cuDNN has no non-deterministic plan for an MLA shape: " << e.what();
    GTEST_SKIP() << "cuDNN has no plan: " << e.what();
  }
  pr.check_forward();
  pr.check_backward();
  const AttentionProviderCounts n = cuda_attention_provider_counts(*be.gpu);
  EXPECT_EQ(n.cudnn_forward, 1u);
  EXPECT_EQ(n.cudnn_backward, 1u);
  EXPECT_EQ(n.cudnn_graphs, 2u);
  const CudaScratchInfo info = cuda_scratch_info(*be.gpu);
  const auto slot = std::find_if(info.slots.begin(), info.slots.end(),
                                 [](const CudaScratchSlot& s) { return s.name == "cudnn_workspace"; });
  ASSERT_NE(slot, info.slots.end());
  std::printf("GPUCHECK %s cudnn_nondeterministic_workspace %zu bytes\n", GetParam().name, slot->peak_bytes);
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaAttentionCudnn, ::testing::ValuesIn(cudnn_cases()), cudnn_case_name);

// A backward graph bakes in the gradients' strides: the same call again with dq, dk and dv at a wider token
// stride (another graph) writes the same values at the new places and nothing between them.
TEST(CudaAttentionCudnnGraphs, GradientStridesGetTheirOwnGraph) {
  LAGA_REQUIRE_GPU();
  const CudnnInfo info = cuda_cudnn_info();
  if (!info.loaded) GTEST_SKIP() << "cuDNN not available: " << info.error;
  Backends be;
  cuda_set_attention_provider(*be.gpu, AttentionProvider::Cudnn);
  auto rng = rng_for_test();
  Problem pr(kCudnnCases[0], AttentionKernel::Fused, DType::BF16, be, rng);
  pr.forward();
  pr.backward(rng);
  pr.check_backward();
  const i64 pad = 64;  // elements added to each token's row
  auto widen = [&](const View& v) {
    View w = v;
    w.token_stride = v.token_stride + pad;
    w.size = v.tokens * w.token_stride + v.col0;
    return w;
  };
  const View qv = pr.dqv, kv = pr.dkv, vv = pr.dvv;
  const View wq = widen(qv), wk = widen(kv), wv = widen(vv);
  Mirror dq(*be.gpu, DType::BF16, wq.size, "dq_wide"), dk(*be.gpu, DType::BF16, wk.size, "dk_wide"),
      dv(*be.gpu, DType::BF16, wv.size, "dv_wide");
  for (Mirror* m : {&dq, &dk, &dv}) m->poison(*be.gpu);
  AttentionBwdParams p = pr.params(true);
  auto at = [](Mirror& m, const View& w) { return static_cast<char*>(m.gpu()) + w.col0 * i64(dtype_size(DType::BF16)); };
  p.dq = at(dq, wq), Problem::set(wq, p.dq_token_stride, p.dq_batch_stride, p.dq_head_stride);
  p.dk = at(dk, wk), Problem::set(wk, p.dk_token_stride, p.dk_batch_stride, p.dk_head_stride);
  p.dv = at(dv, wv), Problem::set(wv, p.dv_token_stride, p.dv_batch_stride, p.dv_head_stride);
  be.gpu->attention_backward(p);
  be.gpu->synchronize();
  EXPECT_EQ(cuda_attention_provider_counts(*be.gpu).cudnn_graphs, 3u) << "forward, backward, backward (wide)";
  auto same_values = [&](const char* name, const Mirror& narrow, const View& nv, const Mirror& wide, const View& w) {
    const std::vector<double> a = narrow.download(*be.gpu), b = wide.download(*be.gpu);
    std::vector<char> inside(b.size(), 0);
    i64 differ = 0;
    for (i64 t = 0; t < nv.tokens; ++t)
      for (i64 bb = 0; bb < nv.batch; ++bb)
        for (i64 h = 0; h < nv.heads; ++h)
          for (i64 c = 0; c < nv.dim; ++c) {
            const double x = a[std::size_t(nv.index(t, bb, h, c))], y = b[std::size_t(w.index(t, bb, h, c))];
            inside[std::size_t(w.index(t, bb, h, c))] = 1;
            differ += !(std::abs(x - y) <= 1e-2 * (std::abs(x) + 1e-3));
          }
    i64 written_outside = 0;
    for (std::size_t i = 0; i < b.size(); ++i) written_outside += !inside[i] && !std::isnan(b[i]);
    EXPECT_EQ(differ, 0) << name << ": values that differ from the first graph's";
    EXPECT_EQ(written_outside, 0) << name << ": elements written outside the view";
  };
  same_values("dq", pr.dq, qv, dq, wq);
  same_values("dk", pr.dk, kv, dk, wk);
  same_values("dv", pr.dv, vv, dv, wv);
}

// cuDNN's deterministic backward keeps 2 bytes per (head, query, key): at 128 heads x 32k x 32k, ~275 GB, more
// than a GPU has. The forced provider refuses it by name (an InvalidArgument before any allocation), not by a
// failed cudaMalloc; the inputs are never read.
TEST(CudaAttentionCudnnGraphs, WorkspaceBeyondTheGpuIsRefusedByName) {
  LAGA_REQUIRE_GPU();
  const CudnnInfo info = cuda_cudnn_info();
  if (!info.loaded) GTEST_SKIP() << "cuDNN not available: " << info.error;
  auto be = make_cuda_backend(0);
  cuda_set_attention_provider(*be, AttentionProvider::Cudnn);
  const i64 S = 32768, H = 128, dqk = 192, dv = 128;
  auto tensor = [&](DType dt, i64 rows, i64 cols, const char* name) {
    return Tensor(be->allocator(), dt, {rows, cols}, name, MemoryKind::External);
  };
  Tensor q = tensor(DType::BF16, S, H * dqk, "q"), k = tensor(DType::BF16, S, H * dqk, "k"),
         v = tensor(DType::BF16, S, H * dv, "v"), o = tensor(DType::BF16, S, H * dv, "o"),
         dout = tensor(DType::BF16, S, H * dv, "dout"), dq = tensor(DType::BF16, S, H * dqk, "dq"),
         dk = tensor(DType::BF16, S, H * dqk, "dk"), dvt = tensor(DType::BF16, S, H * dv, "dv"),
         lse = tensor(DType::F32, H, S, "lse");
  AttentionBwdParams p;
  p.dtype = DType::BF16, p.kernel = AttentionKernel::Fused, p.batch = 1, p.q_len = S, p.kv_len = S;
  p.q_heads = p.kv_heads = H, p.d_qk = dqk, p.d_v = dv, p.scale = 1.0 / std::sqrt(double(dqk));
  // [S, H * d] row-major: the dense [tokens, batch 1, heads, d] view of the suites.
  auto strides = [&](i64 d, std::int64_t& ts, std::int64_t& bs, std::int64_t& hs) {
    const test::ViewStrides st = test::view_strides(test::ViewLayout::dense, S, 1, H, d);
    ts = st.token, bs = st.batch, hs = st.head;
  };
  p.q = q.data(), strides(dqk, p.q_token_stride, p.q_batch_stride, p.q_head_stride);
  p.k = k.data(), strides(dqk, p.k_token_stride, p.k_batch_stride, p.k_head_stride);
  p.v = v.data(), strides(dv, p.v_token_stride, p.v_batch_stride, p.v_head_stride);
  p.dout = dout.data(), strides(dv, p.dout_token_stride, p.dout_batch_stride, p.dout_head_stride);
  p.o = o.data(), strides(dv, p.o_token_stride, p.o_batch_stride, p.o_head_stride);
  p.dq = dq.data(), strides(dqk, p.dq_token_stride, p.dq_batch_stride, p.dq_head_stride);
  p.dk = dk.data(), strides(dqk, p.dk_token_stride, p.dk_batch_stride, p.dk_head_stride);
  p.dv = dvt.data(), strides(dv, p.dv_token_stride, p.dv_batch_stride, p.dv_head_stride);
  p.lse = lse.data();
  try {
    be->attention_backward(p);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("deterministic backward needs a workspace of"), std::string::npos) << m;
    EXPECT_NE(m.find("more than the GPU has"), std::string::npos) << m;
  }
}

// laga's provider never calls cuDNN, and float32 under auto runs laga's kernels.
TEST(CudaAttentionProvider, LagaAndAutoCountTheirCalls) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  EXPECT_EQ(cuda_attention_provider(*be.gpu), AttentionProvider::Laga) << "a new backend runs laga's kernels";
  Problem pr(kCases[0], AttentionKernel::Fused, DType::F32, be, rng);
  cuda_set_attention_provider(*be.gpu, AttentionProvider::Automatic);
  pr.forward();
  pr.backward(rng);
  pr.check_backward();
  const AttentionProviderCounts n = cuda_attention_provider_counts(*be.gpu);
  EXPECT_EQ(n.laga_forward, 1u);
  EXPECT_EQ(n.laga_backward, 1u);
  EXPECT_EQ(n.cudnn_forward + n.cudnn_backward + n.cudnn_graphs, 0u);
  cuda_reset_attention_provider_counts(*be.gpu);
  EXPECT_EQ(cuda_attention_provider_counts(*be.gpu).laga_forward, 0u);
}

}  // namespace
}  // namespace laga::gpu_test
