// Every non-attention op of the CUDA backend (GEMM, copy, fill, RMSNorm, RoPE) against the CPU backend in
// float64, in bf16 and f32, on strided views; plus the backend's own behaviour (allocator accounting, host
// transfers, input checks). Method and tolerances: gpu_test_util.hpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gpu_test_util.hpp"
#include "laga/config.hpp"
#include "laga/errors.hpp"

namespace laga::gpu_test {
namespace {

const DType kDtypes[] = {DType::F32, DType::BF16};

// One case of an op's table in one dtype: a TEST_P's parameter, named "<case>_<dtype>".
template <class Case>
struct InDtype {
  Case c;
  DType dtype;
};
template <class Case>
std::string in_dtype_name(const InDtype<Case>& p) {
  return std::string(p.c.name) + "_" + dtype_tag(p.dtype);
}
template <class Case>
void PrintTo(const InDtype<Case>& p, std::ostream* os) {
  *os << in_dtype_name(p);
}
template <class Case>
std::string in_dtype_test_name(const ::testing::TestParamInfo<InDtype<Case>>& i) {
  return in_dtype_name(i.param);
}
// Every case in every dtype.
template <class Case, std::size_t N, std::size_t M>
std::vector<InDtype<Case>> in_dtypes(const Case (&cases)[N], const DType (&dtypes)[M]) {
  std::vector<InDtype<Case>> out;
  for (const Case& c : cases)
    for (DType t : dtypes) out.push_back({c, t});
  return out;
}

// ================================================================ GEMM

enum class BatchMode { normal, broadcast_a, broadcast_b, interleaved };

struct GemmCase {
  const char* name;
  Trans ta, tb;
  i64 m, n, k, batch;
  i64 pad;  // extra columns of every operand's rows (misaligned leading dimensions when odd)
  BatchMode mode;
  double alpha, beta;
};
void PrintTo(const GemmCase& c, std::ostream* os) { *os << c.name; }

const GemmCase kGemmCases[] = {
    {"nn_square", Trans::No, Trans::No, 64, 64, 64, 1, 0, BatchMode::normal, 1.0, 0.0},
    {"nt_odd_sizes_odd_ld", Trans::No, Trans::Yes, 37, 45, 29, 1, 3, BatchMode::normal, 1.0, 0.0},
    {"tn_alpha_beta", Trans::Yes, Trans::No, 40, 24, 56, 1, 8, BatchMode::normal, 0.5, 1.0},
    {"tt_batched", Trans::Yes, Trans::Yes, 33, 17, 21, 3, 1, BatchMode::normal, 1.0, 0.0},
    {"broadcast_a_batched", Trans::No, Trans::No, 48, 16, 32, 4, 0, BatchMode::broadcast_a, 1.0, 0.0},
    {"broadcast_b_batched_beta", Trans::No, Trans::Yes, 24, 40, 16, 3, 2, BatchMode::broadcast_b, 1.0, 1.0},
    // As the block's per-head up-projection: A broadcast, B and C batches interleaved inside one row.
    {"interleaved_heads", Trans::No, Trans::No, 50, 8, 16, 4, 0, BatchMode::interleaved, 1.0, 0.0},
    {"interleaved_heads_ta_beta", Trans::Yes, Trans::No, 16, 8, 50, 4, 0, BatchMode::interleaved, 1.0, 1.0},
    {"large_k", Trans::No, Trans::No, 32, 48, 1000, 1, 0, BatchMode::normal, 1.0, 0.0},
    {"k_zero_scales_c", Trans::No, Trans::No, 5, 7, 0, 2, 1, BatchMode::normal, 1.0, 0.5},
};

using GemmParam = InDtype<GemmCase>;

class CudaGemm : public ::testing::TestWithParam<GemmParam> {};

TEST_P(CudaGemm, MatchesCpuFloat64) {
  LAGA_REQUIRE_GPU();
  const GemmCase& c = GetParam().c;
  const DType dt = GetParam().dtype;
  Backends be;
  auto rng = rng_for_test();
  const bool ta = c.ta == Trans::Yes, tb = c.tb == Trans::Yes;
  const i64 a_rows = ta ? c.k : c.m, a_cols = ta ? c.m : c.k;
  const i64 b_rows = tb ? c.n : c.k, b_cols = tb ? c.k : c.n;
  GemmArgs g{.trans_a = c.ta, .trans_b = c.tb, .m = c.m, .n = c.n, .k = c.k, .batch = c.batch, .alpha = c.alpha,
             .beta = c.beta};
  i64 a_size = 0, b_size = 0, c_size = 0;
  if (c.mode == BatchMode::interleaved) {
    // A shared; B [b_rows, batch * b_cols] with batch b in columns b*b_cols..; C likewise.
    g.lda = a_cols + c.pad, g.stride_a = 0, a_size = a_rows * g.lda;
    g.ldb = c.batch * b_cols + c.pad, g.stride_b = b_cols, b_size = b_rows * g.ldb;
    g.ldc = c.batch * c.n + c.pad, g.stride_c = c.n, c_size = c.m * g.ldc;
  } else {
    g.lda = std::max<i64>(a_cols + c.pad, 1), g.ldb = std::max<i64>(b_cols + c.pad, 1), g.ldc = c.n + c.pad;
    g.stride_a = c.mode == BatchMode::broadcast_a ? 0 : a_rows * g.lda + 5;
    g.stride_b = c.mode == BatchMode::broadcast_b ? 0 : b_rows * g.ldb + 3;
    g.stride_c = c.m * g.ldc + 7;
    a_size = (c.batch - 1) * g.stride_a + a_rows * g.lda;
    b_size = (c.batch - 1) * g.stride_b + b_rows * g.ldb;
    c_size = (c.batch - 1) * g.stride_c + c.m * g.ldc;
  }
  Mirror a = random_mirror(*be.gpu, dt, std::max<i64>(a_size, 1), rng, "a");
  Mirror b = random_mirror(*be.gpu, dt, std::max<i64>(b_size, 1), rng, "b");
  std::vector<char> view(static_cast<std::size_t>(c_size), 0);
  for (i64 bi = 0; bi < c.batch; ++bi)
    for (i64 i = 0; i < c.m; ++i)
      for (i64 j = 0; j < c.n; ++j) view[bi * g.stride_c + i * g.ldc + j] = 1;
  // beta != 0: C holds random values inside the view (NaN around it); beta == 0: all NaN on the GPU,
  // zeros on the CPU (BLAS does not promise to ignore C there).
  Mirror out = poisoned_mirror(*be.gpu, dt, c_size, "c");
  std::vector<double> c_init(out.host.size(), kNaN);
  if (c.beta != 0.0) {
    const auto r = random_values(rng, c_size);
    for (std::size_t i = 0; i < c_init.size(); ++i) c_init[i] = view[i] ? r[i] : kNaN;
    out.upload(*be.gpu, c_init);
  }
  std::vector<double> ref = out.host;
  for (std::size_t i = 0; i < ref.size(); ++i)
    if (view[i] && c.beta == 0.0) ref[i] = 0.0;

  GemmArgs gg = g;
  gg.dtype = dt, gg.a = a.gpu(), gg.b = b.gpu(), gg.c = out.gpu();
  be.gpu->gemm(gg);
  GemmArgs gc = g;
  gc.dtype = DType::F64, gc.a = a.cpu(), gc.b = b.cpu(), gc.c = ref.data();
  if (c.k > 0) {
    be.cpu->gemm(gc);
  } else {
    for (std::size_t i = 0; i < ref.size(); ++i)
      if (view[i]) ref[i] = c.beta * out.host[i];
  }
  expect_output("c", dt, out.download(*be.gpu), ref, view, op_tolerance(dt));
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaGemm, ::testing::ValuesIn(in_dtypes(kGemmCases, kDtypes)),
                         in_dtype_test_name<GemmCase>);

TEST(CudaGemmChecks, RejectsFloat64AndBadLeadingDimension) {
  LAGA_REQUIRE_GPU();
  Backends be;
  Tensor t(be.gpu->allocator(), DType::F32, {64}, "t", MemoryKind::External);
  GemmArgs g{.dtype = DType::F64, .m = 4, .n = 4, .k = 4, .a = t.data(), .lda = 4, .b = t.data(), .ldb = 4,
             .c = t.data(), .ldc = 4};
  EXPECT_THROW(be.gpu->gemm(g), InvalidArgument);
  g.dtype = DType::F32;
  g.lda = 3;
  EXPECT_THROW(be.gpu->gemm(g), InvalidArgument);
}

// ================================================================ copy

struct CopyCase {
  const char* name;
  i64 batch, rows, cols;
  bool broadcast_src, reduce_dst;
  CopyMode mode;
  // Row and batch strides padded by odd counts (0), or by whole 16-byte vectors (the backend's vector path
  // for same-dtype assignment when every row starts on a 16-byte boundary).
  bool aligned = false;
};
void PrintTo(const CopyCase& c, std::ostream* os) { *os << c.name; }

const CopyCase kCopyCases[] = {
    {"assign_batched", 3, 17, 13, false, false, CopyMode::Assign},
    {"assign_broadcast_src", 4, 9, 24, true, false, CopyMode::Assign},
    {"accumulate_batched", 3, 11, 19, false, false, CopyMode::Accumulate},
    {"accumulate_reduce_over_batch", 6, 21, 16, false, true, CopyMode::Accumulate},
    {"assign_long_row", 1, 1, 10000, false, false, CopyMode::Assign},
    {"assign_batched_aligned", 5, 37, 192, false, false, CopyMode::Assign, true},
    {"assign_broadcast_src_aligned", 3, 19, 64, true, false, CopyMode::Assign, true},
    {"assign_long_row_aligned", 1, 1, 40000, false, false, CopyMode::Assign, true},
    {"accumulate_batched_aligned", 3, 11, 128, false, false, CopyMode::Accumulate, true},
    // More batch entries than one launch's grid.y (65535) takes, on either path.
    {"assign_many_batches_aligned", 70000, 1, 8, false, false, CopyMode::Assign, true},
    {"accumulate_many_batches", 70000, 2, 3, false, false, CopyMode::Accumulate},
    // The sum over the batch written without reading dst (it starts poisoned), and a batch of one.
    {"sum_over_batch", 6, 21, 16, false, true, CopyMode::Sum},
    {"sum_over_one", 1, 7, 9, false, true, CopyMode::Sum},
};

using CopyParam = InDtype<CopyCase>;
const DType kCopyDtypes[] = {DType::F32, DType::BF16, DType::F64};

class CudaCopy : public ::testing::TestWithParam<CopyParam> {};

TEST_P(CudaCopy, MatchesCpuFloat64) {
  LAGA_REQUIRE_GPU();
  const CopyCase& c = GetParam().c;
  const DType dt = GetParam().dtype;
  Backends be;
  auto rng = rng_for_test();
  CopyArgs a{.batch = c.batch, .rows = c.rows, .cols = c.cols, .mode = c.mode};
  const i64 pad = c.aligned ? 8 : 1;  // 8 elements: 16 bytes of bf16, a multiple of 16 for f32 and f64
  a.src_ld = c.cols + 3 * pad;
  a.src_batch_stride = c.broadcast_src ? 0 : c.rows * a.src_ld + 2 * pad;
  a.dst_ld = c.cols + 5 * pad;
  a.dst_batch_stride = c.reduce_dst ? 0 : c.rows * a.dst_ld + pad;
  const i64 src_size = (c.broadcast_src ? 0 : c.batch - 1) * a.src_batch_stride + c.rows * a.src_ld;
  const i64 dst_size = (c.reduce_dst ? 0 : c.batch - 1) * a.dst_batch_stride + c.rows * a.dst_ld;
  Mirror src = random_mirror(*be.gpu, dt, src_size, rng, "src");
  std::vector<char> view(static_cast<std::size_t>(dst_size), 0);
  for (i64 b = 0; b < c.batch; ++b)
    for (i64 r = 0; r < c.rows; ++r)
      for (i64 j = 0; j < c.cols; ++j) view[b * a.dst_batch_stride + r * a.dst_ld + j] = 1;
  Mirror dst = poisoned_mirror(*be.gpu, dt, dst_size, "dst");
  if (c.mode == CopyMode::Accumulate) {  // accumulate onto random values inside the view
    std::vector<double> init(dst.host.size(), kNaN);
    const auto r = random_values(rng, dst_size);
    for (std::size_t i = 0; i < init.size(); ++i) init[i] = view[i] ? r[i] : kNaN;
    dst.upload(*be.gpu, init);
  }
  std::vector<double> ref = dst.host;
  CopyArgs ag = a, ac = a;
  ag.dtype = dt, ag.src = src.gpu(), ag.dst = dst.gpu();
  ac.dtype = DType::F64, ac.src = src.cpu(), ac.dst = ref.data();
  be.gpu->copy(ag);
  be.cpu->copy(ac);
  // A reduction over the batch in bf16 rounds once on the GPU (fp32 sum) and never on the CPU.
  expect_output("dst", dt, dst.download(*be.gpu), ref, view, dt == DType::F64 ? 0.0 : op_tolerance(dt));
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaCopy, ::testing::ValuesIn(in_dtypes(kCopyCases, kCopyDtypes)),
                         in_dtype_test_name<CopyCase>);

// gather_result() hands host buffers to the single-rank communicator, which copies them with Backend::copy.
TEST(CudaCopyHost, AssignBetweenHostAndDeviceBuffers) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  const std::vector<double> values = random_values(rng, 1000);
  std::vector<double> back(values.size(), kNaN), host_to_host(values.size(), kNaN);
  Tensor dev(be.gpu->allocator(), DType::F64, {1000}, "dev", MemoryKind::External);
  auto copy = [&](const void* src, void* dst) {
    be.gpu->copy(CopyArgs{.dtype = DType::F64, .rows = 1, .cols = 1000, .src = src, .src_ld = 1000, .dst = dst,
                          .dst_ld = 1000});
  };
  copy(values.data(), dev.data());
  copy(dev.data(), back.data());
  copy(values.data(), host_to_host.data());
  EXPECT_EQ(back, values);
  EXPECT_EQ(host_to_host, values);
  std::vector<double> acc(1000, 0.0);
  EXPECT_THROW(be.gpu->copy(CopyArgs{.dtype = DType::F64, .rows = 1, .cols = 1000, .src = values.data(),
                                     .src_ld = 1000, .dst = acc.data(), .dst_ld = 1000, .mode = CopyMode::Accumulate}),
               InvalidArgument);
}

// ================================================================ fill, transfers, allocator

TEST(CudaFill, EveryDtypeWritesEveryElement) {
  LAGA_REQUIRE_GPU();
  Backends be;
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    Tensor t(be.gpu->allocator(), dt, {3, 1001}, "t", MemoryKind::External);
    be.gpu->fill(t, kNaN);
    be.gpu->fill(t, 0.375);  // exact in bf16
    for (double v : to_host(*be.gpu, t)) ASSERT_EQ(v, 0.375) << dtype_tag(dt);
  }
}

TEST(CudaAllocator, CountsActivationBytesAndFrees) {
  LAGA_REQUIRE_GPU();
  Backends be;
  Allocator& alloc = be.gpu->allocator();
  EXPECT_EQ(alloc.device(), Device::Cuda);
  const std::size_t live0 = alloc.live_bytes();
  {
    Tensor a(alloc, DType::BF16, {1000, 3}, "a");
    Tensor b(alloc, DType::F32, {7}, "b", MemoryKind::External);
    EXPECT_EQ(a.device(), Device::Cuda);
    EXPECT_EQ(alloc.live_bytes(), live0 + 6000);
    EXPECT_GE(alloc.peak_bytes(), live0 + 6000);
  }
  EXPECT_EQ(alloc.live_bytes(), live0);
}

TEST(CudaTransfers, RoundTripIsExact) {
  LAGA_REQUIRE_GPU();
  Backends be;
  auto rng = rng_for_test();
  for (DType dt : {DType::F32, DType::BF16, DType::F64}) {
    Tensor t(be.gpu->allocator(), dt, {4097}, "t", MemoryKind::External);
    const auto v = random_values(rng, 4097);
    from_host(*be.gpu, t, v);
    const auto once = to_host(*be.gpu, t);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double expected = dt == DType::F64 ? v[i] : dt == DType::F32 ? double(float(v[i])) : once[i];
      ASSERT_EQ(once[i], expected) << dtype_tag(dt) << " element " << i;
      if (dt == DType::BF16) ASSERT_LE(std::abs(once[i] - v[i]), std::abs(v[i]) * 0x1p-8) << "bf16 element " << i;
    }
    from_host(*be.gpu, t, once);
    EXPECT_EQ(to_host(*be.gpu, t), once) << dtype_tag(dt);
  }
}

TEST(CudaBackend, NameDeviceAndMissingDevice) {
  LAGA_REQUIRE_GPU();
  Backends be;
  EXPECT_STREQ(be.gpu->name(), "cuda");
  EXPECT_EQ(be.gpu->device(), Device::Cuda);
  EXPECT_GE(cuda_device_count(), 1);
  EXPECT_THROW(make_cuda_backend(cuda_device_count()), InvalidArgument);
  // The refusal touches no device: the next op on a good backend must not see a stale CUDA error.
  Tensor t(be.gpu->allocator(), DType::F32, {4}, "t", MemoryKind::External);
  be.gpu->fill(t, 1.0);
  EXPECT_EQ(to_host(*be.gpu, t), (std::vector<double>{1, 1, 1, 1}));
}

// ================================================================ RMSNorm

struct NormCase {
  const char* name;
  i64 rows, cols, x_pad, y_pad, dy_pad = 2, dx_pad = 1;
};
void PrintTo(const NormCase& c, std::ostream* os) { *os << c.name; }
// Rows of a multiple of 8 elements on 16-byte boundaries take the warp-per-row kernels (the last two cases, and
// the forward of the second), the others the block-per-row ones.
const NormCase kNormCases[] = {
    {"small_strided", 67, 200, 13, 7},
    {"many_rows_chunked_dgamma", 3000, 80, 16, 0},
    {"wide_row", 5, 1536, 0, 3},
    {"deepseek_rows_warp_per_row", 203, 1536, 8, 0, 16, 8},
    {"latent_rows_warp_per_row", 45, 512, 64, 8, 0, 0},
};
using NormParam = InDtype<NormCase>;

class CudaRmsNorm : public ::testing::TestWithParam<NormParam> {};

TEST_P(CudaRmsNorm, ForwardAndBackwardMatchCpuFloat64) {
  LAGA_REQUIRE_GPU();
  const NormCase& c = GetParam().c;
  const DType dt = GetParam().dtype;
  Backends be;
  auto rng = rng_for_test();
  const i64 x_ld = c.cols + c.x_pad, y_ld = c.cols + c.y_pad;
  Mirror x = random_mirror(*be.gpu, dt, c.rows * x_ld, rng, "x");
  Mirror gamma = random_mirror(*be.gpu, dt, c.cols, rng, "gamma", 0.5, 1.5);
  std::vector<char> y_view(static_cast<std::size_t>(c.rows * y_ld), 0), r_view(static_cast<std::size_t>(c.rows), 1);
  for (i64 r = 0; r < c.rows; ++r)
    for (i64 j = 0; j < c.cols; ++j) y_view[r * y_ld + j] = 1;

  // forward
  Mirror y = poisoned_mirror(*be.gpu, dt, c.rows * y_ld, "y");
  Mirror rstd = poisoned_mirror(*be.gpu, DType::F32, c.rows, "rstd");
  std::vector<double> y_ref(y.host.size(), kNaN), rstd_ref(static_cast<std::size_t>(c.rows), kNaN);
  RmsNormArgs a{.rows = c.rows, .cols = c.cols, .eps = 1e-6, .x_ld = x_ld, .y_ld = y_ld};
  RmsNormArgs ag = a, ac = a;
  ag.dtype = dt, ag.x = x.gpu(), ag.gamma = gamma.gpu(), ag.y = y.gpu(), ag.rstd = rstd.gpu();
  ac.dtype = DType::F64, ac.x = x.cpu(), ac.gamma = gamma.cpu(), ac.y = y_ref.data(), ac.rstd = rstd_ref.data();
  be.gpu->rmsnorm_forward(ag);
  be.cpu->rmsnorm_forward(ac);
  expect_output("y", dt, y.download(*be.gpu), y_ref, y_view, op_tolerance(dt));
  expect_output("rstd", DType::F32, rstd.download(*be.gpu), rstd_ref, r_view, 1e-5);

  // backward: fresh dy; dx overwritten (poisoned), dgamma accumulated onto random values
  const i64 dy_ld = c.cols + c.dy_pad, dx_ld = c.cols + c.dx_pad;
  Mirror dy = random_mirror(*be.gpu, dt, c.rows * dy_ld, rng, "dy");
  Mirror dx = poisoned_mirror(*be.gpu, dt, c.rows * dx_ld, "dx");
  Mirror dgamma = random_mirror(*be.gpu, accum_dtype(dt), c.cols, rng, "dgamma");  // gradients are accum_dtype
  std::vector<double> dx_ref(dx.host.size(), kNaN), dgamma_ref = dgamma.host;
  std::vector<char> dx_view(dx.host.size(), 0), g_view(static_cast<std::size_t>(c.cols), 1);
  for (i64 r = 0; r < c.rows; ++r)
    for (i64 j = 0; j < c.cols; ++j) dx_view[r * dx_ld + j] = 1;
  ag.dy = dy.gpu(), ag.dy_ld = dy_ld, ag.dx = dx.gpu(), ag.dx_ld = dx_ld, ag.dgamma = dgamma.gpu();
  ac.dy = dy.cpu(), ac.dy_ld = dy_ld, ac.dx = dx_ref.data(), ac.dx_ld = dx_ld, ac.dgamma = dgamma_ref.data();
  be.gpu->rmsnorm_backward(ag);
  be.cpu->rmsnorm_backward(ac);
  expect_output("dx", dt, dx.download(*be.gpu), dx_ref, dx_view, op_tolerance(dt));
  expect_output("dgamma", dt, dgamma.download(*be.gpu), dgamma_ref, g_view, op_tolerance(dt));
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaRmsNorm, ::testing::ValuesIn(in_dtypes(kNormCases, kDtypes)),
                         in_dtype_test_name<NormCase>);

// ================================================================ RoPE

struct RopeCase {
  const char* name;
  i64 tokens, batch, heads, dim, pos_offset;
  double mscale;
};
void PrintTo(const RopeCase& c, std::ostream* os) { *os << c.name; }
const RopeCase kRopeCases[] = {
    {"query_heads", 37, 2, 3, 16, 0, 1.0},
    {"latent_single_head_offset", 50, 3, 1, 64, 96, 1.2},
    {"far_positions", 20, 1, 2, 64, 100000, 0.9},
    {"wide_heads_many", 9, 1, 19, 192, 7, 1.0},
};
using RopeParam = InDtype<RopeCase>;

// RoPE's frequencies for a rotary dim at theta = 10000: 10000^(-2i/dim), i < dim/2.
std::vector<double> rope_inv_freq(i64 dim) {
  std::vector<double> f(static_cast<std::size_t>(dim / 2));
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = std::pow(10000.0, -2.0 * double(i) / double(dim));
  return f;
}

// The same RoPE call on the GPU (ag) and on the CPU in float64 (ac), forward or backward.
void rope_on_both(Backends& be, const RopeArgs& ag, const RopeArgs& ac, bool backward) {
  if (backward) {
    be.gpu->rope_backward(ag);
    be.cpu->rope_backward(ac);
  } else {
    be.gpu->rope_forward(ag);
    be.cpu->rope_forward(ac);
  }
}

class CudaRope : public ::testing::TestWithParam<RopeParam> {};

TEST_P(CudaRope, ForwardAndBackwardMatchCpuFloat64) {
  LAGA_REQUIRE_GPU();
  const RopeCase& c = GetParam().c;
  const DType dt = GetParam().dtype;
  Backends be;
  auto rng = rng_for_test();
  const std::vector<double> inv_freq = rope_inv_freq(c.dim);
  // x: [tokens, batch, heads, dim] inside wider rows; y: another layout (batch-major).
  const i64 xh = c.dim + 3, xb = c.heads * xh + 1, xt = c.batch * xb + 2;
  const i64 yh = c.dim + 1, yt = c.heads * yh, yb = c.tokens * yt + 4;
  const i64 x_size = c.tokens * xt, y_size = c.batch * yb;
  RopeArgs a{.tokens = c.tokens, .batch = c.batch, .heads = c.heads, .dim = c.dim, .pos_offset = c.pos_offset,
             .inv_freq = inv_freq.data(), .mscale = c.mscale, .x_token_stride = xt, .x_batch_stride = xb,
             .x_head_stride = xh, .y_token_stride = yt, .y_batch_stride = yb, .y_head_stride = yh};
  std::vector<char> x_view(static_cast<std::size_t>(x_size), 0), y_view(static_cast<std::size_t>(y_size), 0);
  for (i64 t = 0; t < c.tokens; ++t)
    for (i64 b = 0; b < c.batch; ++b)
      for (i64 h = 0; h < c.heads; ++h)
        for (i64 i = 0; i < c.dim; ++i) {
          x_view[t * xt + b * xb + h * xh + i] = 1;
          y_view[t * yt + b * yb + h * yh + i] = 1;
        }
  // forward: x -> y
  Mirror x = random_mirror(*be.gpu, dt, x_size, rng, "x");
  Mirror y = poisoned_mirror(*be.gpu, dt, y_size, "y");
  std::vector<double> y_ref(y.host.size(), kNaN);
  RopeArgs ag = a, ac = a;
  ag.dtype = dt, ag.x = x.gpu(), ag.y = y.gpu();
  ac.dtype = DType::F64, ac.x = x.cpu(), ac.y = y_ref.data();
  be.gpu->rope_forward(ag);
  be.cpu->rope_forward(ac);
  expect_output("y", dt, y.download(*be.gpu), y_ref, y_view, op_tolerance(dt));
  // backward: dy (x's layout) -> dx (y's layout), fresh data
  Mirror dy = random_mirror(*be.gpu, dt, x_size, rng, "dy");
  Mirror dx = poisoned_mirror(*be.gpu, dt, y_size, "dx");
  std::vector<double> dx_ref(dx.host.size(), kNaN);
  ag.x = dy.gpu(), ag.y = dx.gpu();
  ac.x = dy.cpu(), ac.y = dx_ref.data();
  be.gpu->rope_backward(ag);
  be.cpu->rope_backward(ac);
  expect_output("dx", dt, dx.download(*be.gpu), dx_ref, y_view, op_tolerance(dt));
}

// In place (y = x, the block's query path): forward then backward on the same rows, against the CPU doing the
// same in float64; the columns around each row stay as they were.
TEST_P(CudaRope, InPlaceMatchesCpuFloat64) {
  LAGA_REQUIRE_GPU();
  const RopeCase& c = GetParam().c;
  const DType dt = GetParam().dtype;
  Backends be;
  auto rng = rng_for_test();
  const std::vector<double> inv_freq = rope_inv_freq(c.dim);
  const i64 xh = c.dim + 8, xb = c.heads * xh, xt = c.batch * xb;
  const i64 size = c.tokens * xt;
  Mirror x = random_mirror(*be.gpu, dt, size, rng, "x");
  std::vector<double> ref(x.host.begin(), x.host.end());
  std::vector<char> view(static_cast<std::size_t>(size), 1);
  for (bool backward : {false, true}) {
    RopeArgs ag{.dtype = dt, .tokens = c.tokens, .batch = c.batch, .heads = c.heads, .dim = c.dim,
                .pos_offset = c.pos_offset, .inv_freq = inv_freq.data(), .mscale = c.mscale, .x = x.gpu(),
                .x_token_stride = xt, .x_batch_stride = xb, .x_head_stride = xh, .y = x.gpu(), .y_token_stride = xt,
                .y_batch_stride = xb, .y_head_stride = xh};
    RopeArgs ac = ag;
    ac.dtype = DType::F64, ac.x = ref.data(), ac.y = ref.data();
    rope_on_both(be, ag, ac, backward);
  }
  expect_output("x", dt, x.download(*be.gpu), ref, view, 2 * op_tolerance(dt));
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaRope, ::testing::ValuesIn(in_dtypes(kRopeCases, kDtypes)),
                         in_dtype_test_name<RopeCase>);

// RoPE with the all-to-all's buffer of one chunk per group of heads on one side (the block's queries under a2a):
// rows of `heads` heads of width w = 24 + dim in the local layout, the last dim columns of each rotated. With
// copy_cols > 0 the copy_cols columns before them are copied too: forward local -> chunks, backward chunks ->
// local; with copy_cols = 0 forward and backward in place on the chunks (every element compared: the columns
// before the rotated ones must keep their values). Against the CPU in float64. dim 64 in bfloat16 takes
// the vectorised kernel where every row starts on 16 bytes (copy_cols 24 and 0), the other cases rope_kernel.
class CudaRopeChunked : public ::testing::TestWithParam<std::tuple<DType, i64>> {};

TEST_P(CudaRopeChunked, CopiesAndRotatesLikeCpuFloat64) {
  LAGA_REQUIRE_GPU();
  const auto [dt, copy_cols] = GetParam();
  Backends be;
  auto rng = rng_for_test();
  const i64 tokens = 37, batch = 2, heads = 6, group = 2, dim = 64, pos_offset = 40, w = 24 + dim;
  const std::vector<double> inv_freq = rope_inv_freq(dim);
  const i64 rows = tokens * batch, chunk = rows * group * w, size = rows * heads * w, first = w - dim - copy_cols;
  const RopeArgs local{.tokens = tokens, .batch = batch, .heads = heads, .dim = dim, .pos_offset = pos_offset,
                       .inv_freq = inv_freq.data(), .mscale = 1.1, .x_token_stride = batch * heads * w,
                       .x_batch_stride = heads * w, .x_head_stride = w, .y_token_stride = batch * group * w,
                       .y_batch_stride = group * w, .y_head_stride = w, .copy_cols = copy_cols, .head_group = group,
                       .x_group_stride = group * w, .y_group_stride = chunk};
  RopeArgs chunks = local;  // chunks -> local: the strides of x and y swapped
  std::swap(chunks.x_token_stride, chunks.y_token_stride);
  std::swap(chunks.x_batch_stride, chunks.y_batch_stride);
  std::swap(chunks.x_group_stride, chunks.y_group_stride);
  if (copy_cols == 0) {  // in place on the chunks
    chunks.y_token_stride = chunks.x_token_stride;
    chunks.y_batch_stride = chunks.x_batch_stride;
    chunks.y_group_stride = chunks.x_group_stride;
  }
  // What the op writes: each head's columns from `first` on (both layouts hold whole heads of width w).
  std::vector<char> view(static_cast<std::size_t>(size), 0);
  for (i64 i = 0; i < size; ++i) view[static_cast<std::size_t>(i)] = i % w >= first || copy_cols == 0;
  for (bool backward : {false, true}) {
    Mirror x = random_mirror(*be.gpu, dt, size, rng, "x");
    Mirror y = copy_cols == 0 ? x : poisoned_mirror(*be.gpu, dt, size, "y");
    std::vector<double> x_ref(x.host.begin(), x.host.end());
    std::vector<double> y_ref = copy_cols == 0 ? x_ref : std::vector<double>(y.host.size(), kNaN);
    RopeArgs ag = copy_cols == 0 || backward ? chunks : local, ac = ag;
    ag.dtype = dt, ag.x = static_cast<char*>(x.gpu()) + first * i64(dtype_size(dt));
    ag.y = static_cast<char*>(y.gpu()) + first * i64(dtype_size(dt));
    ac.dtype = DType::F64, ac.x = x_ref.data() + first, ac.y = (copy_cols == 0 ? x_ref.data() : y_ref.data()) + first;
    rope_on_both(be, ag, ac, backward);
    expect_output(backward ? "dx" : "y", dt, y.download(*be.gpu), copy_cols == 0 ? x_ref : y_ref, view,
                  op_tolerance(dt));
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaRopeChunked,
                         ::testing::Combine(::testing::ValuesIn(kDtypes), ::testing::Values(i64{24}, i64{5}, i64{0})),
                         [](const ::testing::TestParamInfo<std::tuple<DType, i64>>& i) {
                           return std::string(dtype_tag(std::get<0>(i.param))) + "_copy" +
                                  std::to_string(std::get<1>(i.param));
                         });

// The frequencies are cached by content: a second call with other frequencies must use them.
TEST(CudaRopeCache, NewFrequenciesAreUploaded) {
  LAGA_REQUIRE_GPU();
  Backends be;
  std::vector<double> f1{1.0, 0.5}, f2{0.25, 2.0};
  Tensor x(be.gpu->allocator(), DType::F32, {4}, "x", MemoryKind::External);
  Tensor y(be.gpu->allocator(), DType::F32, {4}, "y", MemoryKind::External);
  from_host(*be.gpu, x, {1.0, 0.0, 1.0, 0.0});
  RopeArgs a{.dtype = DType::F32, .tokens = 1, .batch = 1, .heads = 1, .dim = 4, .pos_offset = 1, .inv_freq = f1.data(),
             .x = x.data(), .x_token_stride = 4, .x_batch_stride = 4, .x_head_stride = 4, .y = y.data(),
             .y_token_stride = 4, .y_batch_stride = 4, .y_head_stride = 4};
  be.gpu->rope_forward(a);
  const auto y1 = to_host(*be.gpu, y);
  a.inv_freq = f2.data();
  be.gpu->rope_forward(a);
  const auto y2 = to_host(*be.gpu, y);
  EXPECT_NEAR(y1[0], std::cos(1.0), 1e-6);
  EXPECT_NEAR(y2[0], std::cos(0.25), 1e-6);
  EXPECT_NEAR(y2[1], std::cos(2.0), 1e-6);
}


// The ring's merge of a partial attention result (Backend::attention_merge) against the CPU in float64: a
// float32 running output with a bfloat16 or float32 partial, d_v not a multiple of the warp, one row with no
// key yet (running lse -inf) and one partial with none (partial lse -inf).
class CudaAttentionMerge : public ::testing::TestWithParam<DType> {};

TEST_P(CudaAttentionMerge, MatchesCpuFloat64) {
  LAGA_REQUIRE_GPU();
  const DType part_dt = GetParam();
  Backends be;
  auto rng = rng_for_test();
  const i64 B = 2, Q = 5, H = 3, D = 40, rows = Q * B * H;
  Mirror o = random_mirror(*be.gpu, DType::F32, rows * D, rng, "o");
  Mirror part = random_mirror(*be.gpu, part_dt, rows * D, rng, "o_part");
  std::vector<double> lse_v = random_values(rng, rows, -3, 3), part_v = random_values(rng, rows, -3, 3);
  lse_v[1] = -INFINITY;  // (batch 0, head 0, query 1): no key seen yet
  part_v[7] = -INFINITY;  // a partial with no visible key
  Mirror lse(*be.gpu, DType::F32, rows, "lse"), lse_part(*be.gpu, DType::F32, rows, "lse_part");
  lse.upload(*be.gpu, lse_v);
  lse_part.upload(*be.gpu, part_v);
  AttentionMergeArgs a{.batch = B, .q_len = Q, .heads = H, .d_v = D, .o_token_stride = B * H * D,
                       .o_batch_stride = H * D, .o_head_stride = D, .part_token_stride = B * H * D,
                       .part_batch_stride = H * D, .part_head_stride = D};
  AttentionMergeArgs ag = a, ac = a;
  ag.dtype = part_dt, ag.o = o.gpu(), ag.lse = lse.gpu(), ag.o_part = part.gpu(), ag.lse_part = lse_part.gpu();
  if (part_dt != DType::F32) ag.o_dtype = DType::F32;
  std::vector<double> o_ref = o.host, lse_ref = lse.host;
  ac.dtype = DType::F64, ac.o = o_ref.data(), ac.lse = lse_ref.data(), ac.o_part = part.cpu(), ac.lse_part = lse_part.cpu();
  be.gpu->attention_merge(ag);
  be.cpu->attention_merge(ac);
  const std::vector<char> all_o(o_ref.size(), 1), all_lse(lse_ref.size(), 1);
  expect_output("o", DType::F32, o.download(*be.gpu), o_ref, all_o, op_tolerance(DType::F32), false);
  expect_output("lse", DType::F32, lse.download(*be.gpu), lse_ref, all_lse, op_tolerance(DType::F32), false);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAttentionMerge, ::testing::Values(DType::BF16, DType::F32),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_tag(i.param)); });

}  // namespace
}  // namespace laga::gpu_test
