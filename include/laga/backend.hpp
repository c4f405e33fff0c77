// The backend interface: the few ops every MLA form is written against. Each form is an orchestration of
// these calls (src/mla), so CPU, CUDA and the shape-only meta backend run exactly the same sequence.
//
// Conventions: row-major; all strides and leading dimensions are in elements; pointers are device
// pointers of the backend's device and hold `dtype` elements unless a field says otherwise.
// Activations use Megatron-Core's token-major layout [tokens, batch, ...] ("sbhd").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "laga/tensor.hpp"

namespace laga {

enum class Trans { No, Yes };

// Strided-batched GEMM: for b < batch, C_b = alpha * op(A_b) * op(B_b) + beta * C_b, with op(A_b) [m, k],
// op(B_b) [k, n], C_b [m, n]. A_b = a + b * stride_a (stride 0 broadcasts one matrix to every batch).
struct GemmArgs {
  DType dtype = DType::F32;
  Trans trans_a = Trans::No, trans_b = Trans::No;
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;  // [m, k] (or [k, m] when trans_a)
  std::int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;  // [k, n] (or [n, k] when trans_b)
  std::int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;  // [m, n]
  std::int64_t ldc = 0, stride_c = 0;
  double alpha = 1.0, beta = 0.0;
  // C's dtype when it differs from A's and B's: float32 weight gradients of a bfloat16 run. Unset: dtype.
  std::optional<DType> c_dtype;
};

enum class CopyMode { Assign, Accumulate, Sum };

// dst[b][r][c] (+)= src[b][r][c] for b < batch, r < rows, c < cols. A src batch stride of 0 broadcasts;
// with CopyMode::Accumulate a dst batch stride of 0 sums over the batch (a reduction). CopyMode::Sum writes
// that sum without reading dst (a dst batch stride of 0; the same values as a zero fill then Accumulate).
struct CopyArgs {
  DType dtype = DType::F32;
  std::int64_t batch = 1, rows = 0, cols = 0;
  const void* src = nullptr;
  std::int64_t src_ld = 0, src_batch_stride = 0;
  void* dst = nullptr;
  std::int64_t dst_ld = 0, dst_batch_stride = 0;
  CopyMode mode = CopyMode::Assign;
  // dst's dtype when it differs from src's (`dtype`): a bfloat16 gradient accumulated into a float32 one.
  std::optional<DType> dst_dtype;
};

// RMSNorm over rows: y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps).
struct RmsNormArgs {
  DType dtype = DType::F32;
  std::int64_t rows = 0, cols = 0;
  double eps = 1e-6;
  const void* x = nullptr;  // [rows, cols], row stride x_ld
  std::int64_t x_ld = 0;
  const void* gamma = nullptr;  // [cols]
  void* y = nullptr;  // [rows, cols], row stride y_ld (forward output)
  std::int64_t y_ld = 0;
  void* rstd = nullptr;  // [rows], accum_dtype(dtype); written by forward, read by backward
  // Backward only:
  const void* dy = nullptr;  // [rows, cols], row stride dy_ld
  std::int64_t dy_ld = 0;
  void* dx = nullptr;  // [rows, cols], row stride dx_ld; overwritten
  std::int64_t dx_ld = 0;
  void* dgamma = nullptr;  // [cols], accum_dtype(dtype) (weight gradients are kept in it); accumulated into
  // dy's dtype when it differs from `dtype`: the float32 latent gradient of a bfloat16 run.
  std::optional<DType> dy_dtype;
};

// Rotary embedding with DeepSeek's interleaved pairing (Hugging Face DeepseekV3 apply_rotary_pos_emb):
// the pair (x[2i], x[2i+1]) is rotated by angle pos * inv_freq[i] and written to (y[i], y[i + dim/2]);
// cos and sin are multiplied by `mscale` (YaRN). Position of token t is pos_offset + t.
// Backward applies the transpose: dx from dy (same strides, x->dy, y->dx). y may be x (in place) when both
// have the same strides and dtype.
// With copy_cols > 0, x and y point at the start of each head's row: its first copy_cols columns are copied
// unchanged and the `dim` after them rotated (a query's nope and rope columns in one pass, into another layout);
// y is then x itself or apart from it.
// With head_group > 0, head h sits at (h / head_group) * group stride + (h % head_group) * head stride: the
// all-to-all's buffer of one chunk per rank.
struct RopeArgs {
  DType dtype = DType::F32;
  std::int64_t tokens = 0, batch = 0, heads = 0, dim = 0;
  std::int64_t pos_offset = 0;
  const double* inv_freq = nullptr;  // [dim / 2], host memory
  double mscale = 1.0;
  const void* x = nullptr;  // [tokens, batch, heads, dim] with the strides below
  std::int64_t x_token_stride = 0, x_batch_stride = 0, x_head_stride = 0;
  void* y = nullptr;
  std::int64_t y_token_stride = 0, y_batch_stride = 0, y_head_stride = 0;
  // x's dtype when it differs from y's (`dtype`): backward reads a float32 gradient, writes bfloat16.
  std::optional<DType> x_dtype;
  std::int64_t copy_cols = 0;
  std::int64_t head_group = 0, x_group_stride = 0, y_group_stride = 0;
  // Offsets of head h's row in x and y, in elements.
  std::int64_t x_head_offset(std::int64_t h) const {
    return head_group > 0 ? (h / head_group) * x_group_stride + (h % head_group) * x_head_stride : h * x_head_stride;
  }
  std::int64_t y_head_offset(std::int64_t h) const {
    return head_group > 0 ? (h / head_group) * y_group_stride + (h % head_group) * y_head_stride : h * y_head_stride;
  }
};

enum class AttentionKernel {
  Eager,  // scores materialised; softmax output [batch, heads, q_len, kv_len] kept for backward
  Fused,  // flash-style online softmax; only the output and the log-sum-exp kept
};

// Causal attention. Query i (0-based in this call) sees key j iff j <= i + q_offset: in the all_gather
// layout rank r's queries sit at global positions r*s.. while keys cover the whole sequence.
// kv_heads is q_heads (MHA) or 1 (MQA: every query head attends to the one shared key/value).
struct AttentionFwdParams {
  DType dtype = DType::F32;
  AttentionKernel kernel = AttentionKernel::Fused;
  std::int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, d_qk = 0, d_v = 0;
  std::int64_t q_offset = 0;
  double scale = 1.0;
  const void* q = nullptr;  // [q_len, batch, q_heads, d_qk]
  std::int64_t q_token_stride = 0, q_batch_stride = 0, q_head_stride = 0;
  const void* k = nullptr;  // [kv_len, batch, kv_heads, d_qk]
  std::int64_t k_token_stride = 0, k_batch_stride = 0, k_head_stride = 0;
  const void* v = nullptr;  // [kv_len, batch, kv_heads, d_v]; may alias k (absorbed: v = k[..., :d_v])
  std::int64_t v_token_stride = 0, v_batch_stride = 0, v_head_stride = 0;
  void* o = nullptr;  // [q_len, batch, q_heads, d_v]
  std::int64_t o_token_stride = 0, o_batch_stride = 0, o_head_stride = 0;
  void* lse = nullptr;    // [batch, q_heads, q_len], accum_dtype; fused only (may be null for eager)
  void* probs = nullptr;  // [batch, q_heads, q_len, kv_len], dtype; eager only (may be null for fused)
};

struct AttentionBwdParams : AttentionFwdParams {
  const void* dout = nullptr;  // [q_len, batch, q_heads, d_v]
  std::int64_t dout_token_stride = 0, dout_batch_stride = 0, dout_head_stride = 0;
  void* dq = nullptr;  // like q; overwritten
  std::int64_t dq_token_stride = 0, dq_batch_stride = 0, dq_head_stride = 0;
  void* dk = nullptr;  // like k; overwritten (MQA: summed over query heads)
  std::int64_t dk_token_stride = 0, dk_batch_stride = 0, dk_head_stride = 0;
  void* dv = nullptr;  // like v; overwritten; must not alias dk
  std::int64_t dv_token_stride = 0, dv_batch_stride = 0, dv_head_stride = 0;
  // V inside K (v is k, with k's strides, d_v <= d_qk: absorbed MLA): dk receives dK + [dV, 0], the gradient of
  // the tensor both are read from, and dv is not used (may be null). The CUDA backend's 576/512 tensor-core
  // backward then keeps one accumulator per key and column instead of two.
  bool dv_in_dk = false;
};

// Whether v is k's first d_v columns: the same pointer and strides, d_v <= d_qk (what dv_in_dk needs).
inline bool attention_v_in_k(const AttentionFwdParams& p) {
  return p.v == p.k && p.v_token_stride == p.k_token_stride && p.v_batch_stride == p.k_batch_stride &&
         p.v_head_stride == p.k_head_stride && p.d_v <= p.d_qk;
}

// Ring attention's merge of a partial result into the running one: the same queries attended over another
// block of keys. Per (query, batch, head) row, with m = max(lse, lse_part):
//   lse' = m + log(exp(lse - m) + exp(lse_part - m)),  o' = o exp(lse - lse') + o_part exp(lse_part - lse').
// o and lse are updated in place. A row whose partial lse is -inf (no visible key) is left as it is; a row
// whose running lse is -inf takes the partial's values. lse and lse_part are [batch, heads, q_len] in
// accum_dtype(dtype), as the fused attention kernel writes them.
struct AttentionMergeArgs {
  DType dtype = DType::F32;  // o_part's dtype
  std::int64_t batch = 0, q_len = 0, heads = 0, d_v = 0;
  void* o = nullptr;  // [q_len, batch, heads, d_v] with the strides below
  std::int64_t o_token_stride = 0, o_batch_stride = 0, o_head_stride = 0;
  void* lse = nullptr;
  const void* o_part = nullptr;  // like o
  std::int64_t part_token_stride = 0, part_batch_stride = 0, part_head_stride = 0;
  const void* lse_part = nullptr;
  // o's dtype when it differs from o_part's: a float32 running output of a bfloat16 run. Unset: dtype.
  std::optional<DType> o_dtype;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
  virtual Allocator& allocator() = 0;

  virtual void gemm(const GemmArgs&) = 0;
  virtual void copy(const CopyArgs&) = 0;
  virtual void fill(const Tensor& t, double value) = 0;
  virtual void rmsnorm_forward(const RmsNormArgs&) = 0;
  virtual void rmsnorm_backward(const RmsNormArgs&) = 0;
  virtual void rope_forward(const RopeArgs&) = 0;
  virtual void rope_backward(const RopeArgs&) = 0;
  virtual void attention_forward(const AttentionFwdParams&) = 0;
  virtual void attention_backward(const AttentionBwdParams&) = 0;
  virtual void attention_merge(const AttentionMergeArgs&) = 0;
  // Raw transfers of t.bytes() between host memory and a tensor of this backend (memcpy for host backends,
  // nothing on the meta device).
  virtual void copy_from_host(const Tensor& dst, const void* host);
  virtual void copy_to_host(void* host, const Tensor& src);
  // Waits for queued work (device backends).
  virtual void synchronize() {}
  // Timing on the backend's own queue: mark() enqueues a timestamp and returns its index; after
  // synchronize(), elapsed(a, b) is the seconds between marks a and b; reset_marks() forgets them. The
  // default reads the host clock, right for backends that run ops synchronously (CPU, meta).
  virtual int mark();
  virtual double elapsed(int a, int b);
  virtual void reset_marks();

 private:
  std::vector<double> host_marks_;
};

std::unique_ptr<Backend> make_cpu_backend();
// Threads of the CPU backend's BLAS (process-wide). Returns the previous value. Ranks run as threads of one
// process set it to 1, so P ranks do not each spawn a full set of BLAS threads.
int set_cpu_blas_threads(int threads);
std::unique_ptr<Backend> make_meta_backend();

}  // namespace laga
