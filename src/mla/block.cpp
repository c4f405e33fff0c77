// The MLA block under sequence parallelism: every form and layout, forward and backward, as one
// orchestration of Backend ops and Communicator collectives. Each step is a named pair, its backward next
// to its forward: the query path (query_forward/query_backward), the latent path (latent_*), the attention
// step of each form (explicit_*, laga_*, absorbed_*) and the output projection (output_*). forward() calls
// them top to bottom; backward() calls their backwards in reverse. The ring (p2p) has its own pair.
//
// Shapes (per rank): s = S/P local tokens, B batch, rows are tokens-major ([s, B, ...] = Megatron's sbhd).
// The "attention layout" is where attention runs:
//   a2a:        S tokens x H = n_h/P heads (heads h0 = rank*H ...), q_offset 0
//   all_gather: s tokens x n_h heads, keys over all S tokens, q_offset = rank*s

#include <functional>

#include "laga/block.hpp"
#include "laga/errors.hpp"
#include "laga/token_map.hpp"

#include <algorithm>

namespace laga {

struct BlockImpl {
  MlaBlock& blk;
  const MlaConfig& cfg;
  const BlockOptions& opts;
  Backend& be;
  CountingCommunicator& comm;
  PassStats* stats = nullptr;
  Phase phase = Phase::Forward;

  // Sizes.
  const std::int64_t B, S, s, d, nh, dn, dr, dqk, dv, rkv, dl, rq_in;
  const int P, r;
  const std::int64_t H, h0;    // heads in the attention layout, first head
  const std::int64_t Sq;       // query tokens in the attention layout
  const std::int64_t q_offset;
  const std::int64_t T, Tq, Tk;  // rows: local, attention-layout queries, keys (tokens x batch)
  const DType dt;

  explicit BlockImpl(MlaBlock& b)
      : blk(b), cfg(b.cfg_), opts(b.opts_), be(b.backend_), comm(b.comm_),
        B(b.shape_.batch), S(b.shape_.seq), s(b.shape_.local_seq()), d(cfg.hidden_size),
        nh(cfg.num_attention_heads), dn(cfg.qk_nope_head_dim), dr(cfg.qk_rope_head_dim), dqk(cfg.qk_head_dim()),
        dv(cfg.v_head_dim), rkv(cfg.kv_lora_rank), dl(cfg.latent_dim()), rq_in(cfg.q_up_input_dim()),
        P(b.shape_.ranks), r(b.shape_.rank),
        H(opts.layout == Layout::A2A ? nh / P : nh), h0(opts.layout == Layout::A2A ? r * H : 0),
        Sq(opts.layout == Layout::A2A ? S : s), q_offset(opts.layout == Layout::A2A ? 0 : r * s),
        T(s * B), Tq(Sq * B), Tk(S * B), dt(opts.dtype) {}

  bool a2a() const { return opts.layout == Layout::A2A; }
  bool ring() const { return opts.layout == Layout::P2P; }
  // Collectives started under compute (the ring's shifts always are, in its own way).
  bool overlapped() const { return opts.overlap && !ring(); }

  // ---------------------------------------------------------------- op wrappers: count, time, run
  // Times one op on the backend's queue; the marks are read once per pass (finish_timing), so timing a
  // device backend does not synchronize after every op.
  // A collective's timer also charges its time to the communicator's record of the call.
  // `record` >= 0 charges the time to that record (a wait for a collective started earlier).
  struct Timer {
    BlockImpl& self;
    OpPhase ph;
    bool collective = false;
    int record = -1;
    int start = self.blk.timing_ ? self.be.mark() : -1;
    ~Timer() {
      if (start < 0) return;
      self.marks.push_back({ph, start, self.be.mark(), record >= 0 ? record : collective ? self.comm.last_record() : -1});
    }
  };
  struct Mark {
    OpPhase ph;
    int start, end;
    int record;  // the communicator's record, or -1
  };
  std::vector<Mark> marks;
  void finish_timing() {
    if (!blk.timing_) return;  // nothing marked: the pass ends without waiting for the queue
    be.synchronize();
    if (!marks.empty()) {
      int first = marks.front().start, last = marks.front().end;
      for (const Mark& m : marks) first = std::min(first, m.start), last = std::max(last, m.end);
      stats->span_seconds = be.elapsed(first, last);
    }
    for (const Mark& m : marks) {
      const double t = be.elapsed(m.start, m.end);
      stats->seconds[int(m.ph)] += t;
      if (m.record >= 0) comm.add_seconds(m.record, t);
    }
    marks.clear();
    be.reset_marks();
  }

  Tensor empty(Shape shape, const std::string& name) { return Tensor(be.allocator(), dt, std::move(shape), name); }
  Tensor zeros(Shape shape, const std::string& name) { return zeros_of(dt, std::move(shape), name); }
  Tensor zeros_of(DType dtype, Shape shape, const std::string& name) {
    Tensor t(be.allocator(), dtype, std::move(shape), name);
    be.fill(t, 0.0);
    return t;
  }
  // The latent gradient is a sum over heads and, under SP, over ranks: it is kept in the accumulation dtype
  // (float32 for a bf16 run) until the RMSNorm backward, so that LAGA's per-rank partials, reduce-scattered
  // in float32, sum to what explicit's single GEMM over all heads gives (one bf16 rounding of each would
  // differ by ~1e-3 relative, the paper's whole margin).
  Tensor latent_grad(std::int64_t rows, const std::string& name) { return zeros_of(accum_dtype(dt), {rows, dl}, name); }
  // The same, for up_project_backward's `fresh` (which writes it whole): no zero fill.
  Tensor latent_grad_unset(std::int64_t rows, const std::string& name) {
    return Tensor(be.allocator(), accum_dtype(dt), {rows, dl}, name);
  }

  void gemm(OpPhase ph, GemmArgs g, std::optional<DType> dtype = std::nullopt) {
    g.dtype = dtype.value_or(dt);
    if (g.c_dtype == g.dtype) g.c_dtype.reset();
    stats->flops[int(ph)] += 2.0 * double(g.m) * double(g.n) * double(g.k) * double(g.batch);
    Timer timer{*this, ph};
    be.gemm(g);
  }
  // src in `dtype` (default: the block's), dst in c.dst_dtype (default: the same).
  void copy(OpPhase ph, CopyArgs c, std::optional<DType> dtype = std::nullopt) {
    c.dtype = dtype.value_or(dt);
    if (c.dst_dtype == c.dtype) c.dst_dtype.reset();
    Timer timer{*this, ph};
    be.copy(c);
  }
  // [rows, cols] of `src` (row stride ld, the block's dtype) as a new tensor in `dtype`.
  Tensor converted(OpPhase ph, const void* src, std::int64_t rows, std::int64_t cols, std::int64_t ld, DType dtype,
                   const std::string& name) {
    Tensor t(be.allocator(), dtype, {rows, cols}, name);
    copy(ph, CopyArgs{.rows = rows, .cols = cols, .src = src, .src_ld = ld, .dst = t.data(), .dst_ld = cols,
                      .dst_dtype = dtype});
    return t;
  }

  // A product with an nn.Linear weight W [out, in] (include/laga/block.hpp), each operand with its row stride:
  // x [rows, in] (forward's input), dy [rows, out] (the output's gradient), and what the product writes:
  // y [rows, out] (linear), dx [rows, in] (linear_dx) or dW [out, in] (linear_dw). C (y, dx or dW) in out_dtype
  // and the operands in dtype, both by default the block's.
  struct LinearArgs {
    OpPhase phase = OpPhase::Projections;
    std::int64_t rows = 0, in = 0, out = 0;
    const void* x = nullptr;
    std::int64_t ldx = 0;
    const void* w = nullptr;
    std::int64_t ldw = 0;
    const void* dy = nullptr;
    std::int64_t lddy = 0;
    void* y = nullptr;
    std::int64_t ldy = 0;
    void* dx = nullptr;
    std::int64_t lddx = 0;
    void* dw = nullptr;
    std::int64_t lddw = 0;
    double beta = 0.0;  // linear, linear_dx: C = product + beta C (linear_dw always adds)
    std::optional<DType> out_dtype;
    std::optional<DType> dtype;
  };
  // y (+)= x W^T
  void linear(const LinearArgs& a) {
    gemm(a.phase, GemmArgs{.trans_b = Trans::Yes, .m = a.rows, .n = a.out, .k = a.in, .a = a.x, .lda = a.ldx, .b = a.w,
                           .ldb = a.ldw, .c = a.y, .ldc = a.ldy, .beta = a.beta, .c_dtype = a.out_dtype},
         a.dtype);
  }
  // dx (+)= dy W
  void linear_dx(const LinearArgs& a) {
    gemm(a.phase, GemmArgs{.m = a.rows, .n = a.in, .k = a.out, .a = a.dy, .lda = a.lddy, .b = a.w, .ldb = a.ldw,
                           .c = a.dx, .ldc = a.lddx, .beta = a.beta, .c_dtype = a.out_dtype},
         a.dtype);
  }
  // dW += dy^T x
  void linear_dw(const LinearArgs& a) {
    gemm(a.phase, GemmArgs{.trans_a = Trans::Yes, .m = a.out, .n = a.in, .k = a.rows, .a = a.dy, .lda = a.lddy,
                           .b = a.x, .ldb = a.ldx, .c = a.dw, .ldc = a.lddw, .beta = 1.0, .c_dtype = a.out_dtype},
         a.dtype);
  }
  // dw = dy^T x: a weight gradient that this one GEMM writes whole (no zero fill first, and C is not read), or
  // adds to with accumulate_grads; in dw's dtype.
  void linear_dw_first(Tensor& dw, LinearArgs a) {
    a.dw = dw.data();
    a.out_dtype = dw.dtype();
    gemm(a.phase, GemmArgs{.trans_a = Trans::Yes, .m = a.out, .n = a.in, .k = a.rows, .a = a.dy, .lda = a.lddy,
                           .b = a.x, .ldb = a.ldx, .c = a.dw, .ldc = a.lddw, .beta = opts.accumulate_grads ? 1.0 : 0.0,
                           .c_dtype = a.out_dtype});
  }
  // The weight gradients backward writes whole with linear_dw_first, once each; the others (the norms' scales,
  // summed into by the RMSNorm backward, and kv_b_proj, written head slice by head slice or summed over ring
  // steps) start from zero.
  static bool written_whole(const MlaGrads& g, const Tensor& t) {
    return &t == &g.o_proj || &t == &g.q_a_proj || &t == &g.q_up() || &t == &g.kv_a_proj_with_mqa;
  }
  // Gradients summed into in the accumulation dtype whatever their own: the norms' scales (the RMSNorm
  // backward's contract) and kv_b_proj where the ring sums it over steps or explicit's float32 K/V gradient
  // sums feed its GEMM. Below that dtype, they are summed in a float32 scratch and rounded once at the end.
  bool summed_in_accum_dtype(const MlaGrads& g, const Tensor& t) const {
    if (&t == &g.q_a_layernorm || &t == &g.kv_a_layernorm) return true;
    return &t == &g.kv_b_proj && (opts.layout == Layout::P2P || kv_grads_reduced_in_fp32(opts, P));
  }
  // kv_b_proj's rows of head h: W_UK[h]^T [d_n, r_kv], then W_UV[h]^T [d_v, r_kv]; heads kv_head_stride apart.
  std::int64_t kv_head_stride() const { return (dn + dv) * rkv; }
  void* uk(const Tensor& kv_b, std::int64_t h) const { return kv_b.at(h * (dn + dv) * rkv); }
  void* uv(const Tensor& kv_b, std::int64_t h) const { return kv_b.at((h * (dn + dv) + dn) * rkv); }

  // ---------------------------------------------------------------- collectives
  // a2a, forward direction: [s*B rows, n_h * w] (all heads, local tokens) -> [S*B rows, H * w] (own heads).
  Tensor scatter_heads(const Tensor& local, std::int64_t w, const std::string& what) {
    if (!a2a()) return local;
    Tensor send = send_buffer(w, what);
    pack_heads(local, w, send);
    return exchange_heads(send, w, what);
  }
  // The all-to-all's send buffer, one chunk per rank: chunk p = this rank's tokens x rank p's heads [s*B, H * w].
  Tensor send_buffer(std::int64_t w, const std::string& what) { return empty({P, T * H * w}, what + ".a2a_send"); }
  // A product whose output is n_h heads of width w, written chunk by chunk into the send buffer (one batched
  // GEMM, a chunk per batch entry: the packing done by the GEMM's stores). b_chunk: B's offset between chunks.
  void gemm_into_chunks(OpPhase ph, GemmArgs g, std::int64_t b_chunk, Tensor& send, std::int64_t w) {
    g.batch = P;
    g.n = H * w;
    g.stride_a = 0;
    g.stride_b = b_chunk;
    g.c = send.data();
    g.ldc = H * w;
    g.stride_c = T * H * w;
    gemm(ph, g);
  }
  // a2a of a packed send buffer (send_buffer) -> [S*B rows, H * w]; without a2a, `send` is the attention layout.
  Tensor exchange_heads(const Tensor& send, std::int64_t w, const std::string& what) {
    if (!a2a()) return send;
    Tensor recv = empty({Tk, H * w}, what + ".a2a");
    comm.label(phase, what);
    Timer timer{*this, OpPhase::Communication, true};
    comm.all_to_all(send.data(), recv.data(), T * H * w, dt);
    return recv;
  }
  // a2a, the inverse: [S*B rows, H * w] -> [s*B rows, n_h * w]. With `rope` (the queries' gradient), RoPE's
  // backward runs on the way out of the receive buffer (query_backward leaves it to this).
  Tensor gather_heads(const Tensor& att, std::int64_t w, const std::string& what, bool rope = false) {
    if (!a2a()) return att;
    const std::int64_t chunk = T * H * w;
    Tensor recv = empty({P, chunk}, what + ".a2a_recv");
    {
      comm.label(phase, what);
      Timer timer{*this, OpPhase::Communication, true};
      comm.all_to_all(att.data(), recv.data(), chunk, dt);
    }
    return unpack_heads(recv, w, what, rope);
  }
  // The all-to-all's buffers, chunk p = this rank's tokens x rank p's heads [s*B, H * w], to and from the local
  // layout [s*B, n_h * w]: a copy, or unpacking the queries' gradient with `rope`, RoPE's backward that copies
  // each head's nope columns as it rotates its rope ones (one pass instead of two).
  void pack_heads(const Tensor& local, std::int64_t w, Tensor& send) {
    const std::int64_t chunk = T * H * w;
    copy(OpPhase::Communication, CopyArgs{.batch = P, .rows = T, .cols = H * w, .src = local.data(), .src_ld = nh * w,
                                          .src_batch_stride = H * w, .dst = send.data(), .dst_ld = H * w,
                                          .dst_batch_stride = chunk});
  }
  Tensor unpack_heads(const Tensor& recv, std::int64_t w, const std::string& what, bool rope) {
    const std::int64_t chunk = T * H * w;
    Tensor local = empty({T, nh * w}, what + ".local");
    if (rope) {
      Timer timer{*this, OpPhase::Projections};
      apply_rope(chunked_rope_args(recv.data(), H * w, chunk, local.data(), nh * w, H * w, w, w - dr), true);
      return local;
    }
    copy(OpPhase::Communication, CopyArgs{.batch = P, .rows = T, .cols = H * w, .src = recv.data(), .src_ld = H * w,
                                          .src_batch_stride = chunk, .dst = local.data(), .dst_ld = nh * w,
                                          .dst_batch_stride = H * w});
    return local;
  }
  // [s*B, w] on every rank -> [S*B, w] (token-major, so rank chunks are contiguous).
  Tensor all_gather(const Tensor& local, std::int64_t w, const std::string& what) {
    Tensor full = empty({Tk, w}, what + ".gathered");
    comm.label(phase, what);
    Timer timer{*this, OpPhase::Communication, true};
    comm.all_gather(local.data(), full.data(), T * w, dt);
    return full;
  }
  // The transpose of all_gather: sum over ranks of their [S*B, w], rank r keeps its [s*B, w] slice.
  Tensor reduce_scatter(const Tensor& full, std::int64_t w, const std::string& what) {
    Tensor local(be.allocator(), full.dtype(), {T, w}, what + ".scattered");
    comm.label(phase, what);
    Timer timer{*this, OpPhase::Communication, true};
    comm.reduce_scatter(full.data(), local.data(), T * w, full.dtype());
    return local;
  }

  // ---------------------------------------------------------------- collectives under compute (opts.overlap)
  // A collective started before compute that does not need it. `out` may be read only after finish(), which
  // also releases `keep` (its input, which must not change while it runs). Starting and waiting are both
  // timed as communication (on a device, the wait is the time the queue stood still: the exposed part).
  struct InFlight {
    CollectiveRequest req;
    Tensor keep;
    Tensor out;
    int record = -1;
  };
  Tensor finish(InFlight& f) {
    if (f.req.pending()) {
      Timer timer{*this, OpPhase::Communication, false, f.record};
      f.req.wait();
    }
    f.keep = Tensor();
    return std::move(f.out);
  }
  // Starts comm's collective `start` (a member such as &Communicator::start_all_gather), labelled `what`.
  template <typename Start>
  void start(InFlight& f, Start start, const std::string& what, const void* send, void* recv, std::int64_t count,
             DType dtype) {
    comm.label(phase, what);
    Timer timer{*this, OpPhase::Communication, true};
    f.req = (comm.*start)(send, recv, std::size_t(count), dtype);
    f.record = comm.last_record();
  }
  // As scatter_heads; the packed send buffer lives until finish().
  InFlight start_scatter_heads(const Tensor& local, std::int64_t w, const std::string& what) {
    if (!a2a()) return InFlight{.out = local};
    Tensor send = send_buffer(w, what);
    pack_heads(local, w, send);
    return start_exchange_heads(std::move(send), w, what);
  }
  // As exchange_heads.
  InFlight start_exchange_heads(Tensor send, std::int64_t w, const std::string& what) {
    if (!a2a()) return InFlight{.out = std::move(send)};
    InFlight f;
    f.keep = std::move(send);
    f.out = empty({Tk, H * w}, what + ".a2a");
    start(f, &Communicator::start_all_to_all, what, f.keep.data(), f.out.data(), T * H * w, dt);
    return f;
  }
  // As gather_heads: finish_gather_heads unpacks the received chunks.
  InFlight start_gather_heads(const Tensor& att, std::int64_t w, const std::string& what) {
    InFlight f;
    f.keep = att;
    if (!a2a()) {
      f.out = att;
      return f;
    }
    const std::int64_t chunk = T * H * w;
    f.out = empty({P, chunk}, what + ".a2a_recv");
    start(f, &Communicator::start_all_to_all, what, att.data(), f.out.data(), chunk, dt);
    return f;
  }
  Tensor finish_gather_heads(InFlight& f, std::int64_t w, const std::string& what, bool rope = false) {
    Tensor recv = finish(f);
    if (!a2a()) return recv;
    return unpack_heads(recv, w, what, rope);
  }
  InFlight start_all_gather(const Tensor& local, std::int64_t w, const std::string& what) {
    InFlight f;
    f.keep = local;
    f.out = empty({Tk, w}, what + ".gathered");
    start(f, &Communicator::start_all_gather, what, local.data(), f.out.data(), T * w, dt);
    return f;
  }
  InFlight start_reduce_scatter(const Tensor& full, std::int64_t w, const std::string& what) {
    InFlight f;
    f.keep = full;
    f.out = Tensor(be.allocator(), full.dtype(), {T, w}, what + ".scattered");
    start(f, &Communicator::start_reduce_scatter, what, full.data(), f.out.data(), T * w, full.dtype());
    return f;
  }
  // Explicit's K or V to the attention layout: an all-to-all of heads (a2a) or an all-gather of all heads.
  InFlight start_kv_exchange(const Tensor& local, std::int64_t w, const std::string& what) {
    return a2a() ? start_scatter_heads(local, w, what) : start_all_gather(local, nh * w, what);
  }

  // ---------------------------------------------------------------- RoPE
  RopeArgs rope_args(std::int64_t heads, const void* x, std::int64_t x_row, const void* y, std::int64_t y_row,
                     std::int64_t head_stride) {
    return RopeArgs{.dtype = dt, .tokens = s, .batch = B, .heads = heads, .dim = dr, .pos_offset = r * s,
                    .inv_freq = blk.rope_.inv_freq.data(), .mscale = blk.rope_.cos_sin_mscale, .x = x,
                    .x_token_stride = B * x_row, .x_batch_stride = x_row, .x_head_stride = head_stride,
                    .y = const_cast<void*>(y), .y_token_stride = B * y_row, .y_batch_stride = y_row,
                    .y_head_stride = head_stride};
  }

  // RoPE of the queries with the all-to-all's chunks on either side: rows of n_h heads of width w whose last dr
  // columns rotate, in groups of H heads a group x_group / y_group elements from the next in x / y (a chunk in
  // the buffer, H * w in local rows); x and y point at the rows' starts. copy_cols > 0 copies the columns before
  // the rotated ones (x and y apart).
  RopeArgs chunked_rope_args(const void* x, std::int64_t x_row, std::int64_t x_group, void* y, std::int64_t y_row,
                             std::int64_t y_group, std::int64_t w, std::int64_t copy_cols) {
    const std::int64_t first = w - dr - copy_cols;  // the first column each head's row is read from
    RopeArgs a = rope_args(nh, offset(x, first, dt), x_row, offset(y, first, dt), y_row, w);
    a.copy_cols = copy_cols;
    a.head_group = H;
    a.x_group_stride = x_group;
    a.y_group_stride = y_group;
    return a;
  }

  // RoPE at the global positions of this rank's tokens (include/laga/token_map.hpp): one call per span of
  // consecutive positions (one span, or p2p's two chunks).
  const std::vector<TokenSpan> spans = rank_tokens(opts.layout, S, P, r);
  static const void* offset(const void* p, std::int64_t elements, DType dtype) {
    return p ? static_cast<const char*>(p) + elements * std::int64_t(dtype_size(dtype)) : nullptr;
  }
  void apply_rope(const RopeArgs& a, bool backward) {
    for (const TokenSpan& t : spans) {
      RopeArgs b = a;
      b.tokens = t.count;
      b.pos_offset = t.global;
      b.x = offset(a.x, t.local * a.x_token_stride, a.x_dtype.value_or(a.dtype));
      b.y = const_cast<void*>(offset(a.y, t.local * a.y_token_stride, a.dtype));
      if (backward)
        be.rope_backward(b);
      else
        be.rope_forward(b);
    }
  }

  // ---------------------------------------------------------------- attention
  AttentionFwdParams attention_params(std::int64_t kv_heads, std::int64_t d_qk, std::int64_t d_v) {
    AttentionFwdParams p;
    p.dtype = dt;
    p.kernel = opts.kernel;
    p.batch = B;
    p.q_len = Sq;
    p.kv_len = S;
    p.q_heads = H;
    p.kv_heads = kv_heads;
    p.d_qk = d_qk;
    p.d_v = d_v;
    p.q_offset = q_offset;
    p.scale = softmax_scale(cfg);
    return p;
  }
  static void set_strides(std::int64_t heads, std::int64_t width, std::int64_t batch, std::int64_t& token,
                          std::int64_t& b, std::int64_t& head) {
    head = width;
    b = heads * width;
    token = batch * heads * width;
  }
  // Unmasked (query, key) pairs of the causal attention on this rank.
  // Query i (global position q_offset + i) sees min(S, q_offset + i + 1) keys: an arithmetic series while
  // that is below S, then S each. Summed exactly in 128 bits (the same value as adding the terms one by one).
  double causal_pairs() const {
    using i128 = __int128;
    const i128 first = i128(q_offset) + 1;                                // keys seen by the first query
    const i128 rising = std::clamp<i128>(i128(S) - first + 1, 0, i128(Sq));  // queries with first + i <= S
    const i128 pairs = rising * first + rising * (rising - 1) / 2 + (i128(Sq) - rising) * i128(S);
    return double(pairs) * double(B) * double(H);
  }

  struct Attn {
    Tensor o, lse, probs;
  };
  // Attention's inputs: q [Tq, H, d_qk]; k [Tk, kv_heads, d_qk] with row width k_row; v [Tk, kv_heads, d_v] with
  // row width v_row, or k itself when v is null (MQA over the latent).
  struct AttnInputs {
    const Tensor& q;
    const Tensor& k;
    std::int64_t k_row = 0;
    const Tensor* v = nullptr;
    std::int64_t v_row = 0;
    std::int64_t kv_heads = 0, d_qk = 0, d_v = 0;
  };
  // The per-head K/V of explicit and LAGA: H heads of d_qk, d_v.
  AttnInputs per_head(const Tensor& q, const Tensor& k, const Tensor& v) const {
    return {.q = q, .k = k, .k_row = H * dqk, .v = &v, .v_row = H * dv, .kv_heads = H, .d_qk = dqk, .d_v = dv};
  }
  Attn attention_forward(const AttnInputs& in, const std::string& oname) {
    AttentionFwdParams p = attention_params(in.kv_heads, in.d_qk, in.d_v);
    Attn a;
    a.o = empty({Tq, H * in.d_v}, oname);
    if (opts.kernel == AttentionKernel::Fused)
      a.lse = Tensor(be.allocator(), accum_dtype(dt), {B, H, Sq}, "lse");
    else
      a.probs = empty({B, H, Sq, S}, "probs");
    fill_attention_pointers(p, in, a);
    stats->flops[int(OpPhase::Attention)] += 2.0 * double(in.d_qk + in.d_v) * causal_pairs();
    Timer timer{*this, OpPhase::Attention};
    be.attention_forward(p);
    return a;
  }
  void fill_attention_pointers(AttentionFwdParams& p, const AttnInputs& in, const Attn& a) {
    p.q = in.q.data();
    set_strides(H, p.d_qk, B, p.q_token_stride, p.q_batch_stride, p.q_head_stride);
    p.k = in.k.data();
    p.k_head_stride = in.kv_heads == 1 ? 0 : p.d_qk;
    p.k_batch_stride = in.k_row;
    p.k_token_stride = B * in.k_row;
    p.v = in.v ? in.v->data() : in.k.data();
    p.v_head_stride = in.kv_heads == 1 ? 0 : p.d_v;
    p.v_batch_stride = in.v_row;
    p.v_token_stride = B * in.v_row;
    p.o = a.o.data();
    set_strides(H, p.d_v, B, p.o_token_stride, p.o_batch_stride, p.o_head_stride);
    p.lse = a.lse.defined() ? a.lse.data() : nullptr;
    p.probs = a.probs.defined() ? a.probs.data() : nullptr;
  }
  struct AttnGrads {
    Tensor dq, dk, dv;
  };
  // dout [Tq, H, d_v]; `a` what the forward saved. dv_in_dk (V inside K): dk = dK + [dV, 0], no dv.
  AttnGrads attention_backward(const Tensor& dout, const AttnInputs& in, const Attn& a, bool dv_in_dk = false) {
    const std::int64_t kv_heads = in.kv_heads, d_qk = in.d_qk, d_v = in.d_v;
    AttentionBwdParams p;
    static_cast<AttentionFwdParams&>(p) = attention_params(kv_heads, d_qk, d_v);
    fill_attention_pointers(p, in, a);
    AttnGrads g;
    g.dq = empty({Tq, H * d_qk}, "attn.dq");
    g.dk = empty({Tk, kv_heads * d_qk}, "attn.dk");
    if (!dv_in_dk) g.dv = empty({Tk, kv_heads * d_v}, "attn.dv");
    p.dout = dout.data();
    set_strides(H, d_v, B, p.dout_token_stride, p.dout_batch_stride, p.dout_head_stride);
    p.dq = g.dq.data();
    set_strides(H, d_qk, B, p.dq_token_stride, p.dq_batch_stride, p.dq_head_stride);
    p.dk = g.dk.data();
    set_strides(kv_heads, d_qk, B, p.dk_token_stride, p.dk_batch_stride, p.dk_head_stride);
    if (dv_in_dk) {
      p.dv_in_dk = true;
    } else {
      p.dv = g.dv.data();
      set_strides(kv_heads, d_v, B, p.dv_token_stride, p.dv_batch_stride, p.dv_head_stride);
    }
    const double per_pair = opts.kernel == AttentionKernel::Fused ? 3.0 * d_qk + 2.0 * d_v : 2.0 * d_qk + 2.0 * d_v;
    stats->flops[int(OpPhase::Attention)] += 2.0 * per_pair * causal_pairs();
    Timer timer{*this, OpPhase::Attention};
    be.attention_backward(p);
    return g;
  }

  // ---------------------------------------------------------------- K/V up-projection
  // From latent rows [rows, dl] build k [rows, heads, dqk] = [c_kv W_UK[h] | k_pe] and v [rows, heads * dv]
  // for heads first .. first+heads.
  void up_project(const Tensor& latent, std::int64_t rows, std::int64_t first, std::int64_t heads, const MlaWeights& w,
                  Tensor& k, Tensor& v) {
    k = empty({rows, heads * dqk}, "k");
    v = empty({rows, heads * dv}, "v");
    // k_nope[h] = c_kv W_UK[h], v[h] = c_kv W_UV[h]: per-head GEMMs over kv_b_proj's rows of each head.
    gemm(OpPhase::UpProjections,
         GemmArgs{.trans_b = Trans::Yes, .m = rows, .n = dn, .k = rkv, .batch = heads, .a = latent.data(), .lda = dl,
                  .stride_a = 0, .b = uk(w.kv_b_proj, first), .ldb = rkv, .stride_b = kv_head_stride(), .c = k.data(),
                  .ldc = heads * dqk, .stride_c = dqk});
    copy(OpPhase::UpProjections, CopyArgs{.batch = heads, .rows = rows, .cols = dr, .src = latent.at(rkv), .src_ld = dl,
                                           .src_batch_stride = 0, .dst = k.at(dn), .dst_ld = heads * dqk,
                                           .dst_batch_stride = dqk});
    gemm(OpPhase::UpProjections,
         GemmArgs{.trans_b = Trans::Yes, .m = rows, .n = dv, .k = rkv, .batch = heads, .a = latent.data(), .lda = dl,
                  .stride_a = 0, .b = uv(w.kv_b_proj, first), .ldb = rkv, .stride_b = kv_head_stride(), .c = v.data(),
                  .ldc = heads * dv, .stride_c = dv});
  }
  // The transpose's operands: dk [rows, heads * d_qk] and dv [rows, heads * d_v] of heads first .. first+heads,
  // the latent [rows, dl] they were built from, and dlatent [rows, dl] that it adds into, or with `fresh` writes
  // whole (not read: it may be uninitialised). `between` (may be empty) runs once dlatent is complete, before the
  // weight-gradient GEMMs.
  struct UpProjectGrads {
    const Tensor& dk;
    const Tensor& dv;
    const Tensor& latent;
    std::int64_t rows = 0, first = 0, heads = 0;
    Tensor& dlatent;
    bool fresh = false;
    std::function<void()> between = {};
  };
  // The transpose: accumulates into dlatent and the weight gradients of those heads.
  void up_project_backward(const UpProjectGrads& a, const MlaWeights& w, MlaGrads& g) {
    const Tensor &dk = a.dk, &dvv = a.dv, &latent = a.latent;
    const std::int64_t rows = a.rows, first = a.first, heads = a.heads;
    Tensor& dlatent = a.dlatent;
    const std::function<void()>& between = a.between;
    // dK/dV in the block's dtype, or in float32 (explicit's sums under kv_grad_reduce_fp32): then the GEMMs run
    // in float32 on float32 copies of the weights' slices and of the latent, so that the summed gradient is
    // never rounded to the storage dtype (LAGA never forms it: it applies the up-projection to each rank's
    // partial and sums the latent gradients in float32). The copies cost 4 * r_kv * heads * (d_nope + d_v) bytes.
    const DType op = dk.dtype();
    constexpr OpPhase ph = OpPhase::UpProjections;
    // dk's nope columns and dv side by side per head, [rows, heads, d_n + d_v]: kv_b_proj's row order, so that
    // each product with the heads' rows of kv_b_proj is one GEMM over all heads (one rounding of the sum in
    // low precision, one launch) instead of a GEMM per head and weight.
    const std::int64_t dkv_w = dn + dv;
    Tensor dkv(be.allocator(), op, {rows, heads * dkv_w}, "d_kv_up");
    copy(ph, CopyArgs{.batch = heads, .rows = rows, .cols = dn, .src = dk.data(), .src_ld = heads * dqk,
                      .src_batch_stride = dqk, .dst = dkv.data(), .dst_ld = heads * dkv_w, .dst_batch_stride = dkv_w},
         op);
    copy(ph, CopyArgs{.batch = heads, .rows = rows, .cols = dv, .src = dvv.data(), .src_ld = heads * dv,
                      .src_batch_stride = dv, .dst = dkv.at(dn), .dst_ld = heads * dkv_w, .dst_batch_stride = dkv_w},
         op);
    const void *w_kv = uk(w.kv_b_proj, first), *lat = latent.data();
    Tensor w_kv_op, lat_op;
    if (op != dt) {
      w_kv_op = converted(ph, w_kv, heads * dkv_w, rkv, rkv, op, "kv_b_proj.f32");
      lat_op = converted(ph, lat, rows, dl, dl, op, "latent.f32");
      w_kv = w_kv_op.data(), lat = lat_op.data();
    }
    // d c_kv = sum over heads of dk_nope[h] W_UK[h]^T + dv[h] W_UV[h]^T
    linear_dx({.phase = ph, .rows = rows, .in = rkv, .out = heads * dkv_w, .w = w_kv, .ldw = rkv, .dy = dkv.data(),
               .lddy = heads * dkv_w, .dx = dlatent.data(), .lddx = dl, .beta = a.fresh ? 0.0 : 1.0,
               .out_dtype = dlatent.dtype(), .dtype = op});
    // d k_pe = sum over heads of the rope part of dk
    copy(ph, CopyArgs{.batch = heads, .rows = rows, .cols = dr, .src = dk.at(dn), .src_ld = heads * dqk,
                      .src_batch_stride = dqk, .dst = dlatent.at(rkv), .dst_ld = dl, .dst_batch_stride = 0,
                      .mode = a.fresh ? CopyMode::Sum : CopyMode::Accumulate, .dst_dtype = dlatent.dtype()},
         op);
    if (between) between();
    linear_dw({.phase = ph, .rows = rows, .in = rkv, .out = heads * dkv_w, .x = lat, .ldx = dl, .dy = dkv.data(),
               .lddy = heads * dkv_w, .dw = uk(g.kv_b_proj, first), .lddw = rkv, .out_dtype = g.kv_b_proj.dtype(),
               .dtype = op});
  }

  // Saved outputs of the attention kernel: probabilities (eager) or output and log-sum-exp (fused).
  // `o_key`: the output's name (Saved::OAtt, or Saved::OLat for the absorbed form's latent output).
  void save_attention(SavedContext& ctx, const Attn& a, Saved o_key) {
    if (a.probs.defined()) ctx.save(Saved::Probs, a.probs);
    if (a.lse.defined()) {
      ctx.save(Saved::Lse, a.lse);
      ctx.save(o_key, a.o);
    }
  }
  Attn saved_attention(const SavedContext& ctx, Saved oname) const {
    Attn a;
    if (opts.kernel == AttentionKernel::Eager) {
      a.probs = ctx.get(Saved::Probs);
    } else {
      a.lse = ctx.get(Saved::Lse);
      a.o = ctx.get(oname);
    }
    return a;
  }

  // q_abs [Tq, H, dl] = [q_nope_h W_UK[h]^T | q_pe_h]
  Tensor absorb_query(const Tensor& q_att, const MlaWeights& w) {
    Tensor q_abs = empty({Tq, H * dl}, "q_abs");
    gemm(OpPhase::UpProjections,
         GemmArgs{.m = Tq, .n = rkv, .k = dn, .batch = H, .a = q_att.data(), .lda = H * dqk, .stride_a = dqk,
                  .b = uk(w.kv_b_proj, h0), .ldb = rkv, .stride_b = kv_head_stride(), .c = q_abs.data(), .ldc = H * dl,
                  .stride_c = dl});
    copy(OpPhase::UpProjections, CopyArgs{.batch = H, .rows = Tq, .cols = dr, .src = q_att.at(dn), .src_ld = H * dqk,
                                           .src_batch_stride = dqk, .dst = q_abs.at(rkv), .dst_ld = H * dl,
                                           .dst_batch_stride = dl});
    return q_abs;
  }

  // ---------------------------------------------------------------- the query path
  // Queries: q = RMSNorm(x W_DQ) W_UQ (or x W_Q), RoPE on the rope part, at global positions. [T, n_h * d_qk], or
  // under a2a the all-to-all's send buffer (send_buffer): the up-projection writes each rank's chunk itself.
  Tensor query_forward(SavedContext& ctx, const Tensor& x, const MlaWeights& w) {
    const void* q_in = x.data();
    std::int64_t in = d;
    Tensor c_q;  // the up-projection's input, alive until it has run (forward may keep nothing: SavedContext::keep)
    if (cfg.q_lora_rank) {
      Tensor q_down = empty({T, rq_in}, "q_down");
      linear({.rows = T, .in = d, .out = rq_in, .x = x.data(), .ldx = d, .w = w.q_a_proj.data(), .ldw = d,
              .y = q_down.data(), .ldy = rq_in});
      Tensor q_rstd = Tensor(be.allocator(), accum_dtype(dt), {T}, "q_rstd");
      c_q = empty({T, rq_in}, "c_q");
      {
        Timer timer{*this, OpPhase::Projections};
        be.rmsnorm_forward(RmsNormArgs{.dtype = dt, .rows = T, .cols = rq_in, .eps = cfg.rms_norm_eps, .x = q_down.data(),
                                       .x_ld = rq_in, .gamma = w.q_a_layernorm.data(), .y = c_q.data(), .y_ld = rq_in,
                                       .rstd = q_rstd.data()});
      }
      ctx.save(Saved::QDown, q_down);
      ctx.save(Saved::QRstd, q_rstd);
      ctx.save(Saved::CQ, c_q);
      q_in = c_q.data();
      in = rq_in;
    }
    const GemmArgs up{.trans_b = Trans::Yes, .m = T, .n = nh * dqk, .k = in, .a = q_in, .lda = in,
                      .b = w.q_up().data(), .ldb = in};
    Tensor q;
    if (a2a()) {
      q = send_buffer(dqk, "q");
      gemm_into_chunks(OpPhase::Projections, up, H * dqk * in, q, dqk);
      // RoPE in place on each head's rope columns, chunk by chunk.
      Timer timer{*this, OpPhase::Projections};
      const std::int64_t chunk = T * H * dqk;
      apply_rope(chunked_rope_args(q.data(), H * dqk, chunk, q.data(), H * dqk, chunk, dqk, 0), false);
    } else {
      q = empty({T, nh * dqk}, "q");
      GemmArgs g = up;
      g.c = q.data();
      g.ldc = nh * dqk;
      gemm(OpPhase::Projections, g);
      // RoPE in place on each head's rope columns: the nope columns are q's already.
      Timer timer{*this, OpPhase::Projections};
      apply_rope(rope_args(nh, q.at(dn), nh * dqk, q.at(dn), nh * dqk, dqk), false);
    }
    return q;
  }
  // dq [T, n_h * d_qk] (consumed): RoPE^T in place on the rope part (under a2a the all-to-all's unpacking ran it:
  // gather_heads with rope), then the up- and down-projections; adds the queries' share of the input gradient
  // to dx.
  void query_backward(SavedContext& ctx, Tensor dq_pre, const Tensor& x, const MlaWeights& w, MlaGrads& g, Tensor& dx) {
    if (!a2a()) {
      Timer timer{*this, OpPhase::Projections};
      apply_rope(rope_args(nh, dq_pre.at(dn), nh * dqk, dq_pre.at(dn), nh * dqk, dqk), true);
    }
    if (cfg.q_lora_rank) {
      const Tensor c_q = ctx.get(Saved::CQ);
      linear_dw_first(g.q_up(), {.rows = T, .in = rq_in, .out = nh * dqk, .x = c_q.data(), .ldx = rq_in,
                                 .dy = dq_pre.data(), .lddy = nh * dqk, .lddw = rq_in});
      Tensor dc_q = empty({T, rq_in}, "d_c_q");
      linear_dx({.rows = T, .in = rq_in, .out = nh * dqk, .w = w.q_up().data(), .ldw = rq_in, .dy = dq_pre.data(),
                 .lddy = nh * dqk, .dx = dc_q.data(), .lddx = rq_in});
      dq_pre = Tensor();
      ctx.release({Saved::CQ});
      Tensor dq_down = empty({T, rq_in}, "d_q_down");
      {
        Timer timer{*this, OpPhase::Projections};
        be.rmsnorm_backward(RmsNormArgs{.dtype = dt, .rows = T, .cols = rq_in, .eps = cfg.rms_norm_eps,
                                        .x = ctx.get(Saved::QDown).data(), .x_ld = rq_in,
                                        .gamma = w.q_a_layernorm.data(),
                                        .rstd = ctx.get(Saved::QRstd).data(), .dy = dc_q.data(), .dy_ld = rq_in,
                                        .dx = dq_down.data(), .dx_ld = rq_in, .dgamma = g.q_a_layernorm.data()});
      }
      dc_q = Tensor();
      ctx.release({Saved::QDown, Saved::QRstd});
      linear_dw_first(g.q_a_proj, {.rows = T, .in = d, .out = rq_in, .x = x.data(), .ldx = d, .dy = dq_down.data(),
                                   .lddy = rq_in, .lddw = d});
      linear_dx({.rows = T, .in = d, .out = rq_in, .w = w.q_a_proj.data(), .ldw = d, .dy = dq_down.data(),
                 .lddy = rq_in, .dx = dx.data(), .lddx = d, .beta = 1.0});
    } else {
      linear_dw_first(g.q_up(), {.rows = T, .in = d, .out = nh * dqk, .x = x.data(), .ldx = d, .dy = dq_pre.data(),
                                 .lddy = nh * dqk, .lddw = d});
      linear_dx({.rows = T, .in = d, .out = nh * dqk, .w = w.q_up().data(), .ldw = d, .dy = dq_pre.data(),
                 .lddy = nh * dqk, .dx = dx.data(), .lddx = d, .beta = 1.0});
    }
  }

  // ---------------------------------------------------------------- the latent path
  // Latent: [c_kv | k_pe] = x W_DKV; c_kv = RMSNorm(c_kv); RoPE on k_pe. [T, dl]
  Tensor latent_forward(SavedContext& ctx, const Tensor& x, const MlaWeights& w) {
    Tensor kv_down = empty({T, dl}, "kv_down");
    linear({.rows = T, .in = d, .out = dl, .x = x.data(), .ldx = d, .w = w.kv_a_proj_with_mqa.data(), .ldw = d,
            .y = kv_down.data(), .ldy = dl});
    Tensor kv_rstd = Tensor(be.allocator(), accum_dtype(dt), {T}, "kv_rstd");
    Tensor latent = empty({T, dl}, "latent");
    {
      Timer timer{*this, OpPhase::Projections};
      be.rmsnorm_forward(RmsNormArgs{.dtype = dt, .rows = T, .cols = rkv, .eps = cfg.rms_norm_eps, .x = kv_down.data(),
                                     .x_ld = dl, .gamma = w.kv_a_layernorm.data(), .y = latent.data(), .y_ld = dl,
                                     .rstd = kv_rstd.data()});
      apply_rope(rope_args(1, kv_down.at(rkv), dl, latent.at(rkv), dl, 0), false);
    }
    ctx.save(Saved::KvDown, kv_down);
    ctx.save(Saved::KvRstd, kv_rstd);
    return latent;
  }
  // dlatent [T, dl] (consumed): RoPE^T on k_pe, RMSNorm backward on c_kv, then x W_DKV; writes dx.
  void latent_backward(SavedContext& ctx, Tensor dlatent, const Tensor& x, const MlaWeights& w, MlaGrads& g,
                       Tensor& dx) {
    Tensor dkv_down = empty({T, dl}, "d_kv_down");
    {
      const Tensor& kv_down = ctx.get(Saved::KvDown);
      Timer timer{*this, OpPhase::Projections};
      RopeArgs rope = rope_args(1, dlatent.at(rkv), dl, dkv_down.at(rkv), dl, 0);
      rope.x_dtype = dlatent.dtype();
      apply_rope(rope, true);
      be.rmsnorm_backward(RmsNormArgs{.dtype = dt, .rows = T, .cols = rkv, .eps = cfg.rms_norm_eps, .x = kv_down.data(),
                                      .x_ld = dl, .gamma = w.kv_a_layernorm.data(),
                                      .rstd = ctx.get(Saved::KvRstd).data(),
                                      .dy = dlatent.data(), .dy_ld = dl, .dx = dkv_down.data(), .dx_ld = dl,
                                      .dgamma = g.kv_a_layernorm.data(), .dy_dtype = dlatent.dtype()});
    }
    dlatent = Tensor();
    ctx.release({Saved::KvDown, Saved::KvRstd});
    linear_dw_first(g.kv_a_proj_with_mqa, {.rows = T, .in = d, .out = dl, .x = x.data(), .ldx = d,
                                           .dy = dkv_down.data(), .lddy = dl, .lddw = d});
    linear_dx({.rows = T, .in = d, .out = dl, .w = w.kv_a_proj_with_mqa.data(), .ldw = d, .dy = dkv_down.data(),
               .lddy = dl, .dx = dx.data(), .lddx = d});
  }

  // ---------------------------------------------------------------- forward
  Tensor forward(SavedContext& ctx, const Tensor& x, const MlaWeights& w) {
    if (ring()) return forward_ring(ctx, x, w);
    if (opts.overlap) return forward_overlapped(ctx, x, w);
    Tensor q = query_forward(ctx, x, w);
    Tensor latent = latent_forward(ctx, x, w);

    // Queries to the attention layout.
    Tensor q_att = exchange_heads(q, dqk, "q");
    q = Tensor();
    ctx.save(Saved::QAtt, q_att);

    Tensor o_att;
    switch (opts.form) {
      case Form::Explicit: {
        Tensor k_loc, v_loc;
        up_project(latent, T, 0, nh, w, k_loc, v_loc);
        ctx.save(Saved::Latent, latent);
        Tensor k_att = a2a() ? scatter_heads(k_loc, dqk, "k") : all_gather(k_loc, nh * dqk, "k");
        k_loc = Tensor();
        Tensor v_att = a2a() ? scatter_heads(v_loc, dv, "v") : all_gather(v_loc, nh * dv, "v");
        v_loc = Tensor();
        o_att = explicit_forward(ctx, q_att, k_att, v_att);
        break;
      }
      case Form::Laga: {
        Tensor lat_full = all_gather(latent, dl, "kv_latent");
        latent = Tensor();
        ctx.save(Saved::LatentGathered, lat_full);
        Tensor k_att, v_att;
        up_project(lat_full, Tk, h0, H, w, k_att, v_att);
        o_att = laga_forward(ctx, q_att, k_att, v_att);
        break;
      }
      case Form::Absorbed: {
        Tensor lat_full = all_gather(latent, dl, "kv_latent");
        latent = Tensor();
        o_att = absorbed_forward(ctx, q_att, std::move(lat_full), w);
        break;
      }
    }
    return output_forward(ctx, std::move(o_att), w);
  }

  // The same steps with each collective started as soon as its input exists (BlockOptions::overlap).
  Tensor forward_overlapped(SavedContext& ctx, const Tensor& x, const MlaWeights& w) {
    Tensor latent = latent_forward(ctx, x, w);
    Tensor o_att;
    switch (opts.form) {
      case Form::Explicit: {
        Tensor k_loc, v_loc;
        up_project(latent, T, 0, nh, w, k_loc, v_loc);
        ctx.save(Saved::Latent, latent);
        latent = Tensor();
        InFlight k = start_kv_exchange(k_loc, dqk, "k");
        k_loc = Tensor();
        InFlight v = start_kv_exchange(v_loc, dv, "v");
        v_loc = Tensor();
        // the query path under K and V's exchange
        InFlight q = start_exchange_heads(query_forward(ctx, x, w), dqk, "q");
        Tensor k_att = finish(k), v_att = finish(v), q_att = finish(q);
        ctx.save(Saved::QAtt, q_att);
        o_att = explicit_forward(ctx, q_att, k_att, v_att);
        break;
      }
      case Form::Laga: {
        InFlight lat = start_all_gather(latent, dl, "kv_latent");
        latent = Tensor();
        InFlight q = start_exchange_heads(query_forward(ctx, x, w), dqk, "q");  // the query path under the all-gather
        Tensor lat_full = finish(lat);
        ctx.save(Saved::LatentGathered, lat_full);
        Tensor k_att, v_att;
        up_project(lat_full, Tk, h0, H, w, k_att, v_att);  // K/V under the queries' all-to-all
        Tensor q_att = finish(q);
        ctx.save(Saved::QAtt, q_att);
        o_att = laga_forward(ctx, q_att, k_att, v_att);
        break;
      }
      case Form::Absorbed: {
        InFlight lat = start_all_gather(latent, dl, "kv_latent");
        latent = Tensor();
        InFlight q = start_exchange_heads(query_forward(ctx, x, w), dqk, "q");  // the query path under the all-gather
        Tensor lat_full = finish(lat);
        Tensor q_att = finish(q);
        ctx.save(Saved::QAtt, q_att);
        o_att = absorbed_forward(ctx, q_att, std::move(lat_full), w);
        break;
      }
    }
    return output_forward(ctx, std::move(o_att), w);
  }

  // ---------------------------------------------------------------- the attention step, per form
  // What an attention step's backward hands on: the queries' gradient in the attention layout, or (overlap)
  // its all-to-all back to the local tokens already started; and this rank's latent gradient [T, dl].
  struct PathGrads {
    Tensor dq_att;
    InFlight dq_flight;
    Tensor dlatent;
  };

  Tensor explicit_forward(SavedContext& ctx, const Tensor& q_att, const Tensor& k_att, const Tensor& v_att) {
    Attn a = attention_forward(per_head(q_att, k_att, v_att), "o_att");
    save_attention(ctx, a, Saved::OAtt);
    ctx.save(Saved::KAtt, k_att);
    ctx.save(Saved::VAtt, v_att);
    return a.o;
  }
  // Attention's backward, K/V's gradients back to the local tokens (all-to-all, or reduce-scatter of the
  // per-rank partials), then the up-projection's backward on the saved local latent.
  PathGrads explicit_backward(SavedContext& ctx, Tensor do_att, const MlaWeights& w, MlaGrads& g) {
    PathGrads out;
    Attn a = saved_attention(ctx, Saved::OAtt);
    Tensor k_att = ctx.get(Saved::KAtt), v_att = ctx.get(Saved::VAtt);
    AttnGrads ag = attention_backward(do_att, per_head(ctx.get(Saved::QAtt), k_att, v_att), a);
    // Attention's saved tensors die with its backward, as in an autograd engine.
    a = Attn();
    k_att = v_att = do_att = Tensor();
    ctx.release({Saved::Probs, Saved::Lse, Saved::OAtt, Saved::KAtt, Saved::VAtt});
    out.dq_att = ag.dq;
    if (kv_grads_reduced_in_fp32(opts, P)) {  // the partials widened to float32 before they are summed
      ag.dk = converted(OpPhase::Communication, ag.dk.data(), Tk, nh * dqk, nh * dqk, accum_dtype(dt), "d_k_att.f32");
      ag.dv = converted(OpPhase::Communication, ag.dv.data(), Tk, nh * dv, nh * dv, accum_dtype(dt), "d_v_att.f32");
    }
    Tensor dk_loc, dv_loc;
    if (opts.overlap) {  // the query gradient's all-to-all under the up-projection's backward
      InFlight dk_flight = a2a() ? start_gather_heads(ag.dk, dqk, "k") : start_reduce_scatter(ag.dk, nh * dqk, "k");
      ag.dk = Tensor();
      InFlight dv_flight = a2a() ? start_gather_heads(ag.dv, dv, "v") : start_reduce_scatter(ag.dv, nh * dv, "v");
      ag.dv = Tensor();
      out.dq_flight = start_gather_heads(out.dq_att, dqk, "q");
      out.dq_att = ag.dq = Tensor();
      dk_loc = a2a() ? finish_gather_heads(dk_flight, dqk, "k") : finish(dk_flight);
      dv_loc = a2a() ? finish_gather_heads(dv_flight, dv, "v") : finish(dv_flight);
    } else {
      dk_loc = a2a() ? gather_heads(ag.dk, dqk, "k") : reduce_scatter(ag.dk, nh * dqk, "k");
      ag.dk = Tensor();
      dv_loc = a2a() ? gather_heads(ag.dv, dv, "v") : reduce_scatter(ag.dv, nh * dv, "v");
      ag.dv = Tensor();
    }
    out.dlatent = latent_grad_unset(T, "d_latent");
    up_project_backward({.dk = dk_loc, .dv = dv_loc, .latent = ctx.get(Saved::Latent), .rows = T, .first = 0,
                         .heads = nh, .dlatent = out.dlatent, .fresh = true},
                        w, g);
    ctx.release({Saved::Latent});
    return out;
  }

  Tensor laga_forward(SavedContext& ctx, const Tensor& q_att, const Tensor& k_att, const Tensor& v_att) {
    Attn a = attention_forward(per_head(q_att, k_att, v_att), "o_att");
    save_attention(ctx, a, Saved::OAtt);
    if (opts.recompute == Recompute::None) {
      ctx.save(Saved::KAtt, k_att);
      ctx.save(Saved::VAtt, v_att);
    }
    return a.o;
  }
  // Attention's backward (K/V rebuilt from the gathered latent with recompute), the up-projection's backward
  // into the gathered latent's gradient, reduce-scattered back to the local tokens.
  PathGrads laga_backward(SavedContext& ctx, Tensor do_att, const MlaWeights& w, MlaGrads& g) {
    PathGrads out;
    Tensor lat_full = ctx.get(Saved::LatentGathered);
    Attn a = saved_attention(ctx, Saved::OAtt);
    Tensor k_att, v_att;
    if (opts.recompute == Recompute::KV) {
      up_project(lat_full, Tk, h0, H, w, k_att, v_att);
    } else {
      k_att = ctx.get(Saved::KAtt);
      v_att = ctx.get(Saved::VAtt);
    }
    AttnGrads ag = attention_backward(do_att, per_head(ctx.get(Saved::QAtt), k_att, v_att), a);
    a = Attn();
    k_att = v_att = do_att = Tensor();
    ctx.release({Saved::Probs, Saved::Lse, Saved::OAtt, Saved::KAtt, Saved::VAtt});
    out.dq_att = ag.dq;
    Tensor dlat_full = latent_grad_unset(Tk, "d_latent_gathered");
    InFlight rs;
    std::function<void()> between;
    if (opts.overlap)  // the latent gradient's reduce-scatter and the query gradient's all-to-all under dW_UV, dW_UK
      between = [&] {
        rs = start_reduce_scatter(dlat_full, dl, "kv_latent");
        out.dq_flight = start_gather_heads(out.dq_att, dqk, "q");
        out.dq_att = Tensor();
      };
    up_project_backward({.dk = ag.dk, .dv = ag.dv, .latent = lat_full, .rows = Tk, .first = h0, .heads = H,
                         .dlatent = dlat_full, .fresh = true, .between = between},
                        w, g);
    ag = AttnGrads();
    lat_full = Tensor();
    ctx.release({Saved::LatentGathered});
    if (opts.overlap) {
      dlat_full = Tensor();
      out.dlatent = finish(rs);
    } else {
      out.dlatent = reduce_scatter(dlat_full, dl, "kv_latent");
    }
    return out;
  }

  Tensor absorbed_forward(SavedContext& ctx, const Tensor& q_att, Tensor lat_full, const MlaWeights& w) {
    Tensor q_abs = absorb_query(q_att, w);
    Tensor o_lat;
    if (opts.absorbed_attention == AbsorbedAttention::Mqa) {
      Attn a = attention_forward({.q = q_abs, .k = lat_full, .k_row = dl, .v_row = dl, .kv_heads = 1, .d_qk = dl,
                                  .d_v = rkv}, "o_lat");
      save_attention(ctx, a, Saved::OLat);
      ctx.save(Saved::LatentGathered, lat_full);
      o_lat = a.o;
    } else {
      Tensor k_exp = empty({Tk, H * dl}, "k_expanded");
      Tensor v_exp = empty({Tk, H * rkv}, "v_expanded");
      copy(OpPhase::UpProjections, CopyArgs{.batch = H, .rows = Tk, .cols = dl, .src = lat_full.data(), .src_ld = dl,
                                             .src_batch_stride = 0, .dst = k_exp.data(), .dst_ld = H * dl,
                                             .dst_batch_stride = dl});
      copy(OpPhase::UpProjections, CopyArgs{.batch = H, .rows = Tk, .cols = rkv, .src = lat_full.data(), .src_ld = dl,
                                             .src_batch_stride = 0, .dst = v_exp.data(), .dst_ld = H * rkv,
                                             .dst_batch_stride = rkv});
      lat_full = Tensor();
      Attn a = attention_forward({.q = q_abs, .k = k_exp, .k_row = H * dl, .v = &v_exp, .v_row = H * rkv, .kv_heads = H,
                                  .d_qk = dl, .d_v = rkv},
                                 "o_lat");
      save_attention(ctx, a, Saved::OLat);
      ctx.save(Saved::KExpanded, k_exp);
      ctx.save(Saved::VExpanded, v_exp);
      o_lat = a.o;
    }
    ctx.save(Saved::QAbs, q_abs);
    // eager keeps probs: W_UV's backward needs o_lat too
    if (!ctx.tensors.count(Saved::OLat)) ctx.save(Saved::OLat, o_lat);
    // o_h = o_lat_h W_UV[h]
    Tensor o_att = empty({Tq, H * dv}, "o_att");
    gemm(OpPhase::UpProjections,
         GemmArgs{.trans_b = Trans::Yes, .m = Tq, .n = dv, .k = rkv, .batch = H, .a = o_lat.data(), .lda = H * rkv,
                  .stride_a = rkv, .b = uv(w.kv_b_proj, h0), .ldb = rkv, .stride_b = kv_head_stride(),
                  .c = o_att.data(), .ldc = H * dv, .stride_c = dv});
    return o_att;
  }
  // W_UV's backward, attention's backward over the latent (MQA) or its per-head copies (expanded), summed into
  // the gathered latent's gradient, then W_UK's backward on the absorbed query's gradient.
  PathGrads absorbed_backward(SavedContext& ctx, Tensor do_att, const MlaWeights& w, MlaGrads& g) {
    PathGrads out;
    const Tensor q_att = ctx.get(Saved::QAtt);
    // o_att = o_lat W_UV[h]:  d o_lat = do_att W_UV[h]^T;  dW_UV[h] += o_lat^T do_att
    Attn a = saved_attention(ctx, Saved::OLat);
    Tensor q_abs = ctx.get(Saved::QAbs);
    Tensor o_lat = ctx.get(Saved::OLat);
    Tensor do_lat = empty({Tq, H * rkv}, "d_o_lat");
    gemm(OpPhase::UpProjections,
         GemmArgs{.m = Tq, .n = rkv, .k = dv, .batch = H, .a = do_att.data(), .lda = H * dv, .stride_a = dv,
                  .b = uv(w.kv_b_proj, h0), .ldb = rkv, .stride_b = kv_head_stride(), .c = do_lat.data(),
                  .ldc = H * rkv, .stride_c = rkv});
    gemm(OpPhase::UpProjections,
         GemmArgs{.trans_a = Trans::Yes, .m = dv, .n = rkv, .k = Tq, .batch = H, .a = do_att.data(), .lda = H * dv,
                  .stride_a = dv, .b = o_lat.data(), .ldb = H * rkv, .stride_b = rkv, .c = uv(g.kv_b_proj, h0),
                  .ldc = rkv, .stride_c = kv_head_stride(), .beta = 1.0, .c_dtype = g.kv_b_proj.dtype()});
    do_att = Tensor();
    Tensor dlat_full = latent_grad(Tk, "d_latent_gathered");
    Tensor dq_abs = absorbed_attention_backward(ctx, do_lat, q_abs, a, dlat_full);
    do_lat = o_lat = q_abs = Tensor();
    a = Attn();
    ctx.release({Saved::Probs, Saved::Lse, Saved::OLat, Saved::LatentGathered, Saved::KExpanded, Saved::VExpanded});
    InFlight rs;
    if (opts.overlap) {  // the latent gradient's reduce-scatter under the query's up-projection backward
      rs = start_reduce_scatter(dlat_full, dl, "kv_latent");
      dlat_full = Tensor();
    }
    // q_abs = [q_nope W_UK[h]^T | q_pe]
    out.dq_att = empty({Tq, H * dqk}, "d_q_att");
    gemm(OpPhase::UpProjections,
         GemmArgs{.trans_b = Trans::Yes, .m = Tq, .n = dn, .k = rkv, .batch = H, .a = dq_abs.data(), .lda = H * dl,
                  .stride_a = dl, .b = uk(w.kv_b_proj, h0), .ldb = rkv, .stride_b = kv_head_stride(),
                  .c = out.dq_att.data(), .ldc = H * dqk, .stride_c = dqk});
    copy(OpPhase::UpProjections, CopyArgs{.batch = H, .rows = Tq, .cols = dr, .src = dq_abs.at(rkv), .src_ld = H * dl,
                                           .src_batch_stride = dl, .dst = out.dq_att.at(dn), .dst_ld = H * dqk,
                                           .dst_batch_stride = dqk});
    if (opts.overlap) {  // the query gradient's all-to-all under dW_UK
      out.dq_flight = start_gather_heads(out.dq_att, dqk, "q");
      out.dq_att = Tensor();
    }
    gemm(OpPhase::UpProjections,
         GemmArgs{.trans_a = Trans::Yes, .m = dn, .n = rkv, .k = Tq, .batch = H, .a = q_att.data(), .lda = H * dqk,
                  .stride_a = dqk, .b = dq_abs.data(), .ldb = H * dl, .stride_b = dl, .c = uk(g.kv_b_proj, h0),
                  .ldc = rkv, .stride_c = kv_head_stride(), .beta = 1.0, .c_dtype = g.kv_b_proj.dtype()});
    dq_abs = Tensor();
    ctx.release({Saved::QAbs});
    out.dlatent = opts.overlap ? finish(rs) : reduce_scatter(dlat_full, dl, "kv_latent");
    return out;
  }
  // Attention's backward in the absorbed form: its K and V gradients summed into the gathered latent's
  // gradient dlat_full (MQA: K is the latent and V its first r_kv columns; expanded: summed over the heads'
  // copies). Returns the absorbed query's gradient.
  Tensor absorbed_attention_backward(SavedContext& ctx, const Tensor& do_lat, const Tensor& q_abs, const Attn& a,
                                     Tensor& dlat_full) {
    if (opts.absorbed_attention == AbsorbedAttention::Mqa) {
      const Tensor lat_full = ctx.get(Saved::LatentGathered);
      // V is the latent's first r_kv columns: the backend returns dK + [dV, 0] in dk (dv_in_dk).
      AttnGrads ag = attention_backward(
          do_lat, {.q = q_abs, .k = lat_full, .k_row = dl, .v_row = dl, .kv_heads = 1, .d_qk = dl, .d_v = rkv}, a,
          /*dv_in_dk=*/true);
      copy(OpPhase::Attention, CopyArgs{.rows = Tk, .cols = dl, .src = ag.dk.data(), .src_ld = dl, .dst = dlat_full.data(),
                                        .dst_ld = dl, .mode = CopyMode::Accumulate, .dst_dtype = dlat_full.dtype()});
      return ag.dq;
    }
    const Tensor k_exp = ctx.get(Saved::KExpanded), v_exp = ctx.get(Saved::VExpanded);
    AttnGrads ag = attention_backward(do_lat,
                                      {.q = q_abs, .k = k_exp, .k_row = H * dl, .v = &v_exp, .v_row = H * rkv,
                                       .kv_heads = H, .d_qk = dl, .d_v = rkv},
                                      a);
    copy(OpPhase::UpProjections, CopyArgs{.batch = H, .rows = Tk, .cols = dl, .src = ag.dk.data(), .src_ld = H * dl,
                                           .src_batch_stride = dl, .dst = dlat_full.data(), .dst_ld = dl,
                                           .dst_batch_stride = 0, .mode = CopyMode::Accumulate,
                                           .dst_dtype = dlat_full.dtype()});
    copy(OpPhase::UpProjections, CopyArgs{.batch = H, .rows = Tk, .cols = rkv, .src = ag.dv.data(),
                                           .src_ld = H * rkv, .src_batch_stride = rkv, .dst = dlat_full.data(),
                                           .dst_ld = dl, .dst_batch_stride = 0, .mode = CopyMode::Accumulate,
                                           .dst_dtype = dlat_full.dtype()});
    return ag.dq;
  }

  // ---------------------------------------------------------------- the output projection
  // o [T, n_h * d_v] back to the local tokens (a2a), saved for backward; y = o W_O.
  Tensor output_forward(SavedContext& ctx, Tensor o_att, const MlaWeights& w) {
    Tensor o = gather_heads(o_att, dv, "o");
    o_att = Tensor();
    ctx.save(Saved::O, o);
    Tensor y = Tensor(be.allocator(), dt, {s, B, d}, "y", MemoryKind::External);
    linear({.rows = T, .in = nh * dv, .out = d, .x = o.data(), .ldx = nh * dv, .w = w.o_proj.data(), .ldw = nh * dv,
            .y = y.data(), .ldy = d});
    return y;
  }
  // y = o W_O: dW_O and d o, the latter to the attention layout (its all-to-all under dW_O with overlap).
  Tensor output_backward(SavedContext& ctx, const Tensor& dy, const MlaWeights& w, MlaGrads& g) {
    if (opts.overlap) {  // the output gradient's all-to-all under W_O's weight gradient
      InFlight dof = start_exchange_heads(output_dx(dy, w), dv, "o");
      linear_dw_first(g.o_proj, {.rows = T, .in = nh * dv, .out = d, .x = ctx.get(Saved::O).data(), .ldx = nh * dv,
                                 .dy = dy.data(), .lddy = d, .lddw = nh * dv});
      ctx.release({Saved::O});
      return finish(dof);
    }
    linear_dw_first(g.o_proj, {.rows = T, .in = nh * dv, .out = d, .x = ctx.get(Saved::O).data(), .ldx = nh * dv,
                               .dy = dy.data(), .lddy = d, .lddw = nh * dv});
    ctx.release({Saved::O});
    return exchange_heads(output_dx(dy, w), dv, "o");
  }
  // d o = dy W_O [T, n_h * d_v], or under a2a the all-to-all's send buffer, each rank's chunk written by the GEMM.
  Tensor output_dx(const Tensor& dy, const MlaWeights& w) {
    const GemmArgs g{.m = T, .n = nh * dv, .k = d, .a = dy.data(), .lda = d, .b = w.o_proj.data(), .ldb = nh * dv};
    if (a2a()) {
      Tensor send = send_buffer(dv, "o");
      gemm_into_chunks(OpPhase::Projections, g, H * dv, send, dv);
      return send;
    }
    Tensor d_o = empty({T, nh * dv}, "d_o");
    GemmArgs one = g;
    one.c = d_o.data();
    one.ldc = nh * dv;
    gemm(OpPhase::Projections, one);
    return d_o;
  }
  // ---------------------------------------------------------------- the ring (p2p)
  // Each rank holds chunks r and 2P-1-r of c = S/(2P) tokens (the query halves 0 and 1, local rows
  // [0, cB) and [cB, 2cB)). K/V (explicit) or the latent they are rebuilt from (LAGA) of rank j's two chunks
  // reach rank r after (r - j) mod P ring shifts; step t works on j = (r - t) mod P while the next shift runs.
  // Per (query chunk, key chunk) of global indices (gq, gk): gk < gq fully visible, gk == gq causal
  // (diagonal), gk > gq skipped. So j's second chunk is seen only by this rank's second query chunk, and:
  //   j == r: half 0 x j's first chunk (diagonal); half 1 x both of j's chunks (the second diagonal)
  //   j <  r: both halves x j's first chunk (fully visible): one call over all local queries
  //   j >  r: half 1 x both of j's chunks (fully visible)
  // so the keys of a step see one call, except j's first chunk at step 0 (two calls, its gradient summed).
  struct RingCall {
    int half;                // query half 0 or 1 (rows [half * cB, (half + 1) * cB)), or -1: all local queries
    std::int64_t kv_tokens;  // keys: the first kv_tokens tokens of j's chunk pair (c or 2c)
    std::int64_t q_offset;   // query i sees key t iff t <= i + q_offset
  };
  std::int64_t chunk() const { return s / 2; }
  std::vector<RingCall> ring_calls(int j) const {
    const std::int64_t c = chunk();
    if (j == r) return {{0, c, 0}, {1, 2 * c, c}};
    if (j < r) return {{-1, c, c}};
    return {{1, 2 * c, 2 * c}};
  }
  std::int64_t call_queries(const RingCall& call) const { return call.half < 0 ? s : chunk(); }
  std::int64_t call_first_row(const RingCall& call) const { return call.half < 0 ? 0 : call.half * chunk() * B; }
  // Unmasked (query, key) pairs of one call (its FLOPs), exactly as causal_pairs counts them.
  double ring_pairs(const RingCall& call) const {
    using i128 = __int128;
    i128 pairs = 0;
    for (std::int64_t i = 0; i < call_queries(call); ++i)
      pairs += std::clamp<i128>(i128(i) + call.q_offset + 1, 0, call.kv_tokens);
    return double(pairs) * double(B) * double(nh);
  }
  AttentionBwdParams ring_params(const RingCall& call, const Tensor& q, const Tensor& k, const Tensor& v) {
    AttentionBwdParams p;
    p.dtype = dt;
    p.kernel = opts.kernel;
    p.batch = B;
    p.q_len = call_queries(call);
    p.kv_len = call.kv_tokens;
    p.q_heads = p.kv_heads = nh;
    p.d_qk = dqk;
    p.d_v = dv;
    p.q_offset = call.q_offset;
    p.scale = softmax_scale(cfg);
    p.q = q.at(call_first_row(call) * nh * dqk);
    set_strides(nh, dqk, B, p.q_token_stride, p.q_batch_stride, p.q_head_stride);
    p.k = k.data();
    set_strides(nh, dqk, B, p.k_token_stride, p.k_batch_stride, p.k_head_stride);
    p.v = v.data();
    set_strides(nh, dv, B, p.v_token_stride, p.v_batch_stride, p.v_head_stride);
    set_strides(nh, dv, B, p.o_token_stride, p.o_batch_stride, p.o_head_stride);
    return p;
  }
  // dst rows [row0, row0 + rows) += src [rows, cols] (src in the block's dtype, dst in its own).
  void accumulate(OpPhase ph, const Tensor& dst, std::int64_t row0, const Tensor& src, std::int64_t rows,
                  std::int64_t cols) {
    copy(ph, CopyArgs{.rows = rows, .cols = cols, .src = src.data(), .src_ld = cols, .dst = dst.at(row0 * cols),
                      .dst_ld = cols, .mode = CopyMode::Accumulate, .dst_dtype = dst.dtype()},
         src.dtype());
  }
  // `t` in the block's dtype (itself when it already is).
  Tensor in_block_dtype(const Tensor& t, const std::string& name) {
    if (t.dtype() == dt) return t;
    const std::int64_t cols = t.numel() / t.dim(0);
    Tensor out = empty(t.shape(), name);
    copy(OpPhase::Other, CopyArgs{.rows = t.dim(0), .cols = cols, .src = t.data(), .src_ld = cols, .dst = out.data(),
                                  .dst_ld = cols, .dst_dtype = dt},
         t.dtype());
    return out;
  }
  // The log-sum-exp of all local queries between its two layouts: per half [2, B, n_h, c] (what a call on one
  // query half reads and writes) and per query [B, n_h, 2c] (a call on all of them).
  void lse_layout(const Tensor& src, bool src_halves, const Tensor& dst) {
    const std::int64_t c = chunk();
    for (int half = 0; half < 2; ++half) {
      const std::int64_t by_half = half * B * nh * c, by_query = half * c;
      copy(OpPhase::Attention, CopyArgs{.rows = B * nh, .cols = c, .src = src.at(src_halves ? by_half : by_query),
                                        .src_ld = src_halves ? c : 2 * c, .dst = dst.at(src_halves ? by_query : by_half),
                                        .dst_ld = src_halves ? 2 * c : c},
           src.dtype());
    }
  }
  // The next ring step of `send` (this rank's chunk to r+1, r-1's into a new buffer), started.
  InFlight start_ring(const Tensor& send, const std::string& what) {
    InFlight f;
    f.keep = send;
    f.out = Tensor(be.allocator(), send.dtype(), send.shape(), what + ".ring");
    start(f, &Communicator::start_ring_shift, what, send.data(), f.out.data(), send.numel(), send.dtype());
    return f;
  }

  // What travels round the ring, by name: the latent (LAGA) or K and V (explicit).
  using RingCarry = std::vector<std::pair<std::string, Tensor>>;
  // Step t, forward and backward alike: the next shift of what travels started (all but the last step), and the
  // K/V of the pair in hand (LAGA rebuilds them from the latent, explicit has them).
  struct RingStep {
    std::vector<InFlight> next;
    Tensor k, v;
  };
  RingStep ring_step(RingCarry& cur, int t, const MlaWeights& w) {
    RingStep step;
    if (t + 1 < P)
      for (auto& [what, tensor] : cur) step.next.push_back(start_ring(tensor, what));
    if (opts.form == Form::Laga)
      up_project(cur[0].second, T, 0, nh, w, step.k, step.v);
    else
      step.k = cur[0].second, step.v = cur[1].second;
    return step;
  }
  // The step's K/V dropped, what travels replaced by what the shift brought.
  void ring_advance(RingCarry& cur, RingStep& step) {
    step.k = step.v = Tensor();
    for (std::size_t i = 0; i < step.next.size(); ++i) cur[i].second = finish(step.next[i]);
  }

  // Forward: queries stay local; P steps over the chunk pairs, partial outputs merged by log-sum-exp into a
  // running output kept in the accumulation dtype, its log-sum-exp per query half.
  Tensor forward_ring(SavedContext& ctx, const Tensor& x, const MlaWeights& w) {
    const bool laga = opts.form == Form::Laga;
    const std::int64_t cB = chunk() * B;
    Tensor q = query_forward(ctx, x, w);
    Tensor latent = latent_forward(ctx, x, w);
    ctx.save(Saved::QAtt, q);
    ctx.save(Saved::Latent, latent);
    RingCarry cur;  // what travels: the latent, or K and V
    if (laga) {
      cur.emplace_back("kv_latent", latent);
    } else {
      Tensor k, v;
      up_project(latent, T, 0, nh, w, k, v);
      ctx.save(Saved::KLocal, k);
      ctx.save(Saved::VLocal, v);
      cur.emplace_back("k", k);
      cur.emplace_back("v", v);
    }
    latent = Tensor();
    Tensor o_run = Tensor(be.allocator(), accum_dtype(dt), {T, nh * dv}, "o_ring");
    Tensor lse = Tensor(be.allocator(), accum_dtype(dt), {2, B, nh, chunk()}, "lse");
    for (int t = 0; t < P; ++t) {
      RingStep step = ring_step(cur, t, w);
      const Tensor &k = step.k, &v = step.v;
      for (const RingCall& call : ring_calls((r - t + P) % P)) {
        AttentionBwdParams p = ring_params(call, q, k, v);
        Tensor o_part = empty({call_queries(call) * B, nh * dv}, "o_part");
        Tensor lse_part = Tensor(be.allocator(), accum_dtype(dt), {B, nh, call_queries(call)}, "lse_part");
        p.o = o_part.data();
        p.lse = lse_part.data();
        stats->flops[int(OpPhase::Attention)] += 2.0 * double(dqk + dv) * ring_pairs(call);
        {
          Timer timer{*this, OpPhase::Attention};
          be.attention_forward(p);
        }
        if (t == 0) {  // the local pair's calls, one per half: the first partial of each half is the running result
          copy(OpPhase::Attention, CopyArgs{.rows = cB, .cols = nh * dv, .src = o_part.data(), .src_ld = nh * dv,
                                            .dst = o_run.at(call.half * cB * nh * dv), .dst_ld = nh * dv,
                                            .dst_dtype = o_run.dtype()});
          copy(OpPhase::Attention, CopyArgs{.rows = 1, .cols = B * nh * chunk(), .src = lse_part.data(),
                                            .src_ld = B * nh * chunk(), .dst = lse.at(call.half * B * nh * chunk()),
                                            .dst_ld = B * nh * chunk()},
               lse.dtype());
          continue;
        }
        if (call.half < 0) {  // all local queries: their log-sum-exp per half, to merge half by half
          Tensor by_half = Tensor(be.allocator(), lse_part.dtype(), {2, B, nh, chunk()}, "lse_part.halves");
          lse_layout(lse_part, false, by_half);
          lse_part = by_half;
        }
        for (int half : call.half < 0 ? std::vector<int>{0, 1} : std::vector<int>{call.half}) {
          const std::int64_t part_row = call.half < 0 ? half * cB : 0, part_lse = call.half < 0 ? half * B * nh * chunk() : 0;
          AttentionMergeArgs m{.dtype = dt, .batch = B, .q_len = chunk(), .heads = nh, .d_v = dv,
                               .o = o_run.at(half * cB * nh * dv), .lse = lse.at(half * B * nh * chunk()),
                               .o_part = o_part.at(part_row * nh * dv), .lse_part = lse_part.at(part_lse),
                               .o_dtype = o_run.dtype()};
          set_strides(nh, dv, B, m.o_token_stride, m.o_batch_stride, m.o_head_stride);
          set_strides(nh, dv, B, m.part_token_stride, m.part_batch_stride, m.part_head_stride);
          if (m.o_dtype == m.dtype) m.o_dtype.reset();
          Timer timer{*this, OpPhase::Attention};
          be.attention_merge(m);
        }
      }
      ring_advance(cur, step);
    }
    cur.clear();
    Tensor o = in_block_dtype(o_run, "o_att");
    o_run = Tensor();
    ctx.save(Saved::Lse, lse);
    ctx.save(Saved::OAtt, o);
    return output_forward(ctx, std::move(o), w);
  }

  // One step's attention backward: every call on the pair in hand, its dQ added to the running one; the keys'
  // gradient of the pair's first key_tokens tokens (the last call's keys cover the first call's at step 0,
  // whose gradient is added to them). lse_all (the log-sum-exp per query) is built on first use.
  struct StepGrads {
    Tensor dk, dv;
    std::int64_t key_tokens = 0;
  };
  // What every step of the ring's backward reads: the local queries, the final output and its log-sum-exp per
  // query half (lse_all: per query), the output's gradient, and the running dQ it adds to.
  struct RingBackward {
    const Tensor& q;
    const Tensor& o;
    const Tensor& lse;
    Tensor& lse_all;
    const Tensor& do_att;
    const Tensor& dq_run;
  };
  StepGrads ring_step_backward(const std::vector<RingCall>& calls, const Tensor& k, const Tensor& v,
                               const RingBackward& rb) {
    const Tensor &q = rb.q, &o = rb.o, &lse = rb.lse, &do_att = rb.do_att, &dq_run = rb.dq_run;
    Tensor& lse_all = rb.lse_all;
    const std::int64_t c = chunk();
    StepGrads out;
    for (const RingCall& call : calls) {
      if (call.half < 0 && !lse_all.defined()) {
        lse_all = Tensor(be.allocator(), lse.dtype(), {B, nh, s}, "lse.per_query");
        lse_layout(lse, true, lse_all);
      }
      AttentionBwdParams p = ring_params(call, q, k, v);
      const std::int64_t rows = call_queries(call) * B, first = call_first_row(call);
      p.o = o.at(first * nh * dv);
      p.lse = call.half < 0 ? lse_all.data() : lse.at(call.half * B * nh * c);
      p.dout = do_att.at(first * nh * dv);
      set_strides(nh, dv, B, p.dout_token_stride, p.dout_batch_stride, p.dout_head_stride);
      Tensor dq_part = empty({rows, nh * dqk}, "attn.dq");
      Tensor dk_part = empty({call.kv_tokens * B, nh * dqk}, "attn.dk");
      Tensor dv_part = empty({call.kv_tokens * B, nh * dv}, "attn.dv");
      p.dq = dq_part.data();
      set_strides(nh, dqk, B, p.dq_token_stride, p.dq_batch_stride, p.dq_head_stride);
      p.dk = dk_part.data();
      set_strides(nh, dqk, B, p.dk_token_stride, p.dk_batch_stride, p.dk_head_stride);
      p.dv = dv_part.data();
      set_strides(nh, dv, B, p.dv_token_stride, p.dv_batch_stride, p.dv_head_stride);
      stats->flops[int(OpPhase::Attention)] += 2.0 * (3.0 * dqk + 2.0 * dv) * ring_pairs(call);
      {
        Timer timer{*this, OpPhase::Attention};
        be.attention_backward(p);
      }
      accumulate(OpPhase::Attention, dq_run, first, dq_part, rows, nh * dqk);
      if (out.dk.defined()) {
        accumulate(OpPhase::Attention, dk_part, 0, out.dk, out.key_tokens * B, nh * dqk);
        accumulate(OpPhase::Attention, dv_part, 0, out.dv, out.key_tokens * B, nh * dv);
      }
      out.dk = dk_part, out.dv = dv_part, out.key_tokens = call.kv_tokens;
    }
    return out;
  }

  // Backward: the same steps; K/V (or the latent) travel round again, and their gradient's accumulator travels
  // with them back to its owner (P shifts): LAGA's latent gradient in the accumulation dtype, explicit's
  // K/V gradients in the block's dtype (float32 with kv_grad_reduce_fp32). Each chunk's attention backward
  // runs with the final output and log-sum-exp, which makes it exact per chunk (FlashAttention's ring backward).
  void backward_ring(SavedContext& ctx, const MlaWeights& w, MlaGrads& g, Tensor do_att, Tensor& dq_att,
                     Tensor& dlatent) {
    const bool laga = opts.form == Form::Laga;
    const Tensor q = ctx.get(Saved::QAtt), o = ctx.get(Saved::OAtt), lse = ctx.get(Saved::Lse);
    Tensor lse_all;  // per query, for the calls on all local queries (built once)
    Tensor latent = ctx.get(Saved::Latent);  // explicit's, for the up-projection's backward at the end
    RingCarry cur;
    if (laga) {
      cur.emplace_back("kv_latent_resend", latent);
      latent = Tensor();
      ctx.release({Saved::Latent});
    } else {
      cur.emplace_back("k_resend", ctx.get(Saved::KLocal));
      cur.emplace_back("v_resend", ctx.get(Saved::VLocal));
      ctx.release({Saved::KLocal, Saved::VLocal});
    }
    // The accumulators that travel: LAGA's latent gradient; explicit's dK and dV.
    const DType kv_grad = kv_grads_reduced_in_fp32(opts, P) ? accum_dtype(dt) : dt;
    std::vector<std::pair<std::string, Tensor>> acc;
    if (laga) {
      acc.emplace_back("kv_latent", latent_grad(T, "d_latent"));
    } else {
      acc.emplace_back("k", zeros_of(kv_grad, {T, nh * dqk}, "d_k"));
      acc.emplace_back("v", zeros_of(kv_grad, {T, nh * dv}, "d_v"));
    }
    Tensor dq_run = zeros_of(accum_dtype(dt), {T, nh * dqk}, "d_q_ring");
    std::vector<InFlight> acc_flight;
    const RingBackward saved{.q = q, .o = o, .lse = lse, .lse_all = lse_all, .do_att = do_att, .dq_run = dq_run};
    for (int t = 0; t < P; ++t) {
      RingStep step = ring_step(cur, t, w);
      StepGrads sg = ring_step_backward(ring_calls((r - t + P) % P), step.k, step.v, saved);
      Tensor dk = std::move(sg.dk), dv_ = std::move(sg.dv);
      const std::int64_t key_tokens = sg.key_tokens;
      step.k = step.v = Tensor();
      const std::int64_t key_rows = key_tokens * B;
      // The accumulator of this pair, from the previous rank (this rank's own at the first step).
      for (std::size_t i = 0; i < acc_flight.size(); ++i) acc[i].second = finish(acc_flight[i]);
      acc_flight.clear();
      if (laga) {  // the keys are the pair's first key_tokens tokens: the latent's and its gradient's first rows
        up_project_backward({.dk = dk, .dv = dv_, .latent = cur[0].second, .rows = key_rows, .first = 0, .heads = nh,
                             .dlatent = acc[0].second},
                            w, g);
      } else {
        accumulate(OpPhase::Attention, acc[0].second, 0, dk, key_rows, nh * dqk);
        accumulate(OpPhase::Attention, acc[1].second, 0, dv_, key_rows, nh * dv);
      }
      dk = dv_ = Tensor();
      if (P > 1)  // on to the next rank, which works on this pair next (after the last step: back to its owner)
        for (auto& [what, tensor] : acc) {
          acc_flight.push_back(start_ring(tensor, what));
          tensor = Tensor();
        }
      ring_advance(cur, step);
    }
    for (std::size_t i = 0; i < acc_flight.size(); ++i) acc[i].second = finish(acc_flight[i]);
    cur.clear();
    do_att = lse_all = Tensor();
    ctx.release({Saved::OAtt, Saved::Lse});
    dq_att = in_block_dtype(dq_run, "d_q_att");
    dq_run = Tensor();
    if (laga) {
      dlatent = std::move(acc[0].second);
    } else {
      dlatent = latent_grad(T, "d_latent");
      up_project_backward({.dk = acc[0].second, .dv = acc[1].second, .latent = latent, .rows = T, .first = 0,
                           .heads = nh, .dlatent = dlatent},
                          w, g);
    }
    acc.clear();
    latent = Tensor();
    ctx.release({Saved::Latent});
  }

  // ---------------------------------------------------------------- backward
  Tensor backward(MlaGrads& out, SavedContext& ctx, const Tensor& dy, const Tensor& x, const MlaWeights& w) {
    // g: where backward writes each gradient; `out`'s own tensor, or a float32 scratch for those summed in the
    // accumulation dtype below it, rounded into `out` at the end.
    MlaGrads g = out;
    std::vector<std::pair<Tensor*, Tensor*>> rounded;  // (scratch in g, its tensor in out)
    {
      auto gn = g.named(), on = out.named();
      for (std::size_t i = 0; i < gn.size(); ++i) {
        Tensor& t = *gn[i].second;
        LAGA_REQUIRE(t.dtype() == dt || t.dtype() == accum_dtype(dt), "gradient ", gn[i].first, " is ",
                     dtype_name(t.dtype()), " for a ", dtype_name(dt), " block: it must be ", dtype_name(dt),
                     dt == accum_dtype(dt) ? "" : " or ", dt == accum_dtype(dt) ? "" : dtype_name(accum_dtype(dt)));
        if (t.dtype() != accum_dtype(dt) && summed_in_accum_dtype(g, t)) {
          t = zeros_of(accum_dtype(dt), t.shape(), "grad." + gn[i].first + ".sum");
          rounded.emplace_back(&t, on[i].second);
        } else if (!opts.accumulate_grads && !written_whole(g, t)) {
          be.fill(t, 0.0);
        }
      }
    }
    Tensor dx = backward_into(g, ctx, dy, x, w);
    for (auto [sum, dst] : rounded)
      copy(OpPhase::Other, CopyArgs{.rows = 1, .cols = sum->numel(), .src = sum->data(), .src_ld = sum->numel(),
                                    .dst = dst->data(), .dst_ld = dst->numel(),
                                    .mode = opts.accumulate_grads ? CopyMode::Accumulate : CopyMode::Assign,
                                    .dst_dtype = dst->dtype()},
           accum_dtype(dt));
    return dx;
  }

  // forward's steps in reverse: the output projection, the form's attention step, then the latent and query
  // paths, each step's backward next to its forward above.
  Tensor backward_into(MlaGrads& g, SavedContext& ctx, const Tensor& dy, const Tensor& x, const MlaWeights& w) {
    Tensor do_att = output_backward(ctx, dy, w, g);
    PathGrads pg;
    if (ring()) {
      backward_ring(ctx, w, g, std::move(do_att), pg.dq_att, pg.dlatent);
    } else {
      switch (opts.form) {
        case Form::Explicit: pg = explicit_backward(ctx, std::move(do_att), w, g); break;
        case Form::Laga: pg = laga_backward(ctx, std::move(do_att), w, g); break;
        case Form::Absorbed: pg = absorbed_backward(ctx, std::move(do_att), w, g); break;
      }
    }
    ctx.release({Saved::QAtt});
    Tensor dq = overlapped() ? finish_gather_heads(pg.dq_flight, dqk, "q", true)
                             : gather_heads(pg.dq_att, dqk, "q", true);
    pg.dq_att = Tensor();

    Tensor dx = Tensor(be.allocator(), dt, {s, B, d}, "dx", MemoryKind::External);
    latent_backward(ctx, std::move(pg.dlatent), x, w, g, dx);
    query_backward(ctx, std::move(dq), x, w, g, dx);
    LAGA_CHECK(ctx.tensors.empty(), "saved tensors left after backward, first: '",
               saved_name(ctx.tensors.begin()->first), "'");
    return dx;
  }
};

MlaBlock::MlaBlock(const MlaConfig& cfg, const BlockOptions& opts, const BlockShape& shape, Backend& backend,
                   CountingCommunicator& comm)
    : cfg_(cfg), opts_(opts), shape_(shape), backend_(backend), comm_(comm), rope_(rope_tables(cfg)) {
  validate(cfg_, opts_, shape_);
  LAGA_REQUIRE(comm.size() == shape.ranks && comm.rank() == shape.rank, "communicator has rank ", comm.rank(), " of ",
               comm.size(), " but the block was set up for rank ", shape.rank, " of ", shape.ranks);
}

Tensor MlaBlock::forward(SavedContext& ctx, const Tensor& x, const MlaWeights& w) {
  LAGA_REQUIRE(x.shape() == Shape({shape_.local_seq(), shape_.batch, cfg_.hidden_size}), "input x has shape ",
               shape_string(x.shape()), ": expected [s, batch, hidden_size] = ",
               shape_string({shape_.local_seq(), shape_.batch, cfg_.hidden_size}));
  fwd_ = PassStats{};
  Allocator& alloc = backend_.allocator();
  const std::size_t base = alloc.live_bytes();
  alloc.reset_peak();
  BlockImpl impl(*this);
  impl.stats = &fwd_;
  impl.phase = Phase::Forward;
  Tensor y = impl.forward(ctx, x, w);
  impl.finish_timing();
  fwd_.peak_bytes = alloc.peak_bytes() - base;
  return y;
}

Tensor MlaBlock::backward(MlaGrads& grads, SavedContext& ctx, const Tensor& dy, const Tensor& x, const MlaWeights& w) {
  bwd_ = PassStats{};
  Allocator& alloc = backend_.allocator();
  const std::size_t base = alloc.live_bytes() - alloc.saved_bytes();
  alloc.reset_peak();
  BlockImpl impl(*this);
  impl.stats = &bwd_;
  impl.phase = Phase::Backward;
  Tensor dx = impl.backward(grads, ctx, dy, x, w);
  impl.finish_timing();
  bwd_.peak_bytes = alloc.peak_bytes() - base;
  return dx;
}

}  // namespace laga
