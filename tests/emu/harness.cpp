// Emulated run of the tensor-core attention kernels (src/cuda/flash_kernels.cuh) on the CPU, against a float64
// reference: the kernels compile with g++ against include/cuda/flash_mma.cuh, a host emulation of the GPU
// primitives (mma.sync, ldmatrix, cp.async, wgmma), and run through the launch sequence flash_tc.cu runs
// (src/cuda/flash_launch.cuh: grids, scratch, the backward's kernels and row splits, the head-dim and
// alignment switches), so CI without a GPU still checks their indexing, masking, strides and reductions and
// how they are launched. Exit code = number of failed cases != 0.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cuda/flash_launch.cuh"

using namespace laga::cuda::flash;
using laga::AttentionBwdParams;
using laga::AttentionFwdParams;

struct Case {
  const char* name;
  i64 batch, q_len, kv_len, q_heads, kv_heads, dqk, dv, q_offset;
  bool wide, v_in_k;
  int splits;  // 576/512: the dK/dV row splits the launch code must choose (or, fixed_splits, is told to use)
  bool dv_in_dk = false;  // V inside K: dk takes dK + [dV, 0] (flash_bwd_vk_kernel), dv is not written
  bool fixed_splits = false;  // the launcher fixes the row splits at `splits` (as cuda_set_flash_row_splits)
  bool vk_rows = false;  // dv_in_dk by flash_bwd_vkq_kernel (rows resident; as cuda_set_flash_vk_rows)
};

struct View {
  i64 tokens, batch, heads, dim, width, col0, ts, bs, hs, size;
  i64 idx(i64 t, i64 b, i64 h, i64 c) const { return col0 + t * ts + b * bs + h * hs + c; }
};
View make_view(bool wide, i64 tokens, i64 batch, i64 heads, i64 dim) {
  View v{tokens, batch, heads, dim, wide ? dim + 7 : dim, wide ? 3 : 0, 0, 0, 0, 0};
  v.hs = v.width;
  v.bs = heads * v.width;
  v.ts = batch * heads * v.width;
  v.size = std::max<i64>(tokens * v.ts + 8, 8);
  return v;
}

const float kNan = NAN;
std::mt19937_64 rng(42);

std::vector<bf16> buffer(const View& v, bool random) {
  std::vector<bf16> b(std::size_t(v.size), float_to_bf16(kNan));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  if (random)
    for (i64 t = 0; t < v.tokens; ++t)
      for (i64 bb = 0; bb < v.batch; ++bb)
        for (i64 h = 0; h < v.heads; ++h)
          for (i64 c = 0; c < v.dim; ++c) b[v.idx(t, bb, h, c)] = float_to_bf16(u(rng));
  return b;
}
double get(const std::vector<bf16>& b, const View& v, i64 t, i64 bb, i64 h, i64 c) {
  return bf16_to_float(b[v.idx(t, bb, h, c)]);
}

struct Err {
  double num = 0, den = 0;
  long bad = 0, outside = 0;
  void add(double got, double ref) {
    if (!std::isfinite(got)) ++bad;
    num += (got - ref) * (got - ref);
    den += ref * ref;
  }
  double rel() const { return bad ? NAN : std::sqrt(num / std::max(den, 1e-300)); }
};

long count_outside_written(const std::vector<bf16>& b, const View& v) {
  std::vector<char> m(b.size(), 0);
  for (i64 t = 0; t < v.tokens; ++t)
    for (i64 bb = 0; bb < v.batch; ++bb)
      for (i64 h = 0; h < v.heads; ++h)
        for (i64 c = 0; c < v.dim; ++c) m[v.idx(t, bb, h, c)] = 1;
  long n = 0;
  for (std::size_t i = 0; i < b.size(); ++i)
    if (!m[i] && !std::isnan(bf16_to_float(b[i]))) ++n;
  return n;
}

// The launch sequence of src/cuda/flash_launch.cuh, the one flash_tc.cu runs on a CUDA stream, on the
// emulation: each launch runs its blocks in grid order on the host; scratch comes back poisoned (NaN bytes),
// so a kernel that reads scratch nobody wrote fails.
class EmuLauncher {
 public:
  EmuLauncher(int multiprocessors, bool fused_dq, int row_splits, bool ws_forward = true, bool ws_backward = true,
              bool vk_rows = false)
      : sms_(multiprocessors), fused_dq_(fused_dq), row_splits_(row_splits), ws_forward_(ws_forward),
        ws_backward_(ws_backward), vk_rows_(vk_rows) {}
  template <class Kernel, class... Args>
  void launch(Kernel kernel, const char* name, i64 blocks, int threads, std::size_t smem, Args... args) {
    EMU_CHECK(blocks > 0 && blocks <= INT32_MAX, "%s: %ld blocks", name, long(blocks));
    EMU_CHECK(smem <= kSmemBudget, "%s: %zu bytes of shared memory", name, smem);
    launched.emplace_back(name, blocks);
    emu::resident_blocks = resident;
    emu::launch(kernel, EmuDim3{unsigned(blocks), 1, 1}, threads, smem, args...);
    emu::resident_blocks = 1;
  }
  void* scratch(LaunchScratch slot, std::size_t bytes) {
    std::vector<float>& b = scratch_[int(slot)];
    b.assign((bytes + sizeof(float) - 1) / sizeof(float), NAN);
    return b.data();
  }
  void zero(void* ptr, std::size_t bytes) { std::memset(ptr, 0, bytes); }
  int multiprocessors() const { return sms_; }
  bool fused_dq() const { return fused_dq_; }
  int row_splits() const { return row_splits_; }
  bool warp_specialized_forward() const { return ws_forward_; }
  bool warp_specialized_backward() const { return ws_backward_; }
  bool rows_resident_vk() const { return vk_rows_; }
  bool ordered_dq() const { return !any_order_dq; }
  int forward_blocks() const { return forward_blocks_; }
  int forward_head_group() const { return forward_head_group_; }
  int backward_blocks() const { return backward_blocks_; }
  int backward_head_group() const { return backward_head_group_; }
  bool any_order_dq = false;  // flash_bwd_ws_kernel's dQ added in any order
  int forward_blocks_ = 0;    // flash_fwd_ws_kernel's grid (as cuda_set_flash_forward_blocks)
  int forward_head_group_ = 0;  // its work order (as cuda_set_flash_forward_head_group)
  int backward_blocks_ = 0;   // flash_bwd_ws_kernel's grid (as cuda_set_flash_backward_blocks)
  int backward_head_group_ = 0;  // its work order (as cuda_set_flash_backward_head_group)
  int resident = 1;           // blocks running together (emu::resident_blocks): a persistent grid's size
  std::vector<std::pair<std::string, i64>> launched;  // kernel names and blocks, in launch order

 private:
  int sms_;
  bool fused_dq_;
  int row_splits_;
  bool ws_forward_;
  bool ws_backward_;
  bool vk_rows_;
  std::vector<float> scratch_[5];
};

// An H200's SM count: the dK/dV row splits of 576/512 are those the GPU would run.
constexpr int kMultiprocessors = 132;

// A persistent grid of n blocks (forward_blocks, backward_blocks n > 0) runs its n blocks together, as on n SMs.
std::vector<std::pair<std::string, i64>> run_fwd(const AttentionFwdParams& p, bool ws_forward, int forward_blocks = 0,
                                                 int head_group = 0) {
  EmuLauncher launcher(kMultiprocessors, true, 0, ws_forward);
  launcher.forward_blocks_ = forward_blocks;
  launcher.forward_head_group_ = head_group;
  launcher.resident = std::max(forward_blocks, 1);
  forward(launcher, p);
  return launcher.launched;
}
std::vector<std::pair<std::string, i64>> run_bwd(const AttentionBwdParams& p, bool fused_dq, int row_splits,
                                                 bool ws_backward = true, bool vk_rows = false, bool any_order = false,
                                                 int backward_blocks = 0, int head_group = 0) {
  EmuLauncher launcher(kMultiprocessors, fused_dq, row_splits, true, ws_backward, vk_rows);
  launcher.any_order_dq = any_order;
  launcher.backward_blocks_ = backward_blocks;
  launcher.backward_head_group_ = head_group;
  launcher.resident = std::max(backward_blocks, 1);
  backward(launcher, p);
  return launcher.launched;
}

// The warp-specialised backward's grids checked against its default (a block per key block, the launcher's heads at a time):
// persistent on `blocks` blocks running together (0: a block per key block), dQ in any order or not, the work
// order's heads at a time (0: the launcher's; with 20 blocks at work and one row tile a key block, as
// mha_192_128_head_groups has, it takes 32 heads at a time: its 34 (head, batch) pairs in a group of 32 and one of 2).
struct BwdGrid {
  int blocks;
  bool any;
  int head_group;
};
const std::vector<BwdGrid> kBwdGrids = {{1, false, 0}, {2, false, 0}, {3, false, 0}, {0, false, 1}, {3, false, 2},
                                        {2, true, 0}, {20, false, 0}};

bool run_case(const Case& c) {
  const i64 group = c.q_heads / c.kv_heads;
  View qv = make_view(c.wide, c.q_len, c.batch, c.q_heads, c.dqk), kv = make_view(c.wide, c.kv_len, c.batch, c.kv_heads, c.dqk);
  View vv = c.v_in_k ? kv : make_view(c.wide, c.kv_len, c.batch, c.kv_heads, c.dv);
  if (c.v_in_k) vv.dim = c.dv;
  View ov = make_view(c.wide, c.q_len, c.batch, c.q_heads, c.dv), dvv = make_view(c.wide, c.kv_len, c.batch, c.kv_heads, c.dv);
  auto q = buffer(qv, true), k = buffer(kv, true), dout = buffer(ov, true);
  std::vector<bf16> v = c.v_in_k ? std::vector<bf16>() : buffer(vv, true);
  auto o = buffer(ov, false), dq = buffer(qv, false), dk = buffer(kv, false), dv = buffer(dvv, false);
  std::vector<float> lse(std::size_t(c.batch * c.q_heads * c.q_len), NAN);
  AttentionBwdParams p;
  p.dtype = laga::DType::BF16;
  p.batch = c.batch, p.q_len = c.q_len, p.kv_len = c.kv_len, p.q_heads = c.q_heads, p.kv_heads = c.kv_heads;
  p.d_qk = c.dqk, p.d_v = c.dv, p.q_offset = c.q_offset, p.scale = 1.0 / std::sqrt(double(c.dqk));
  p.q = q.data() + qv.col0, p.q_token_stride = qv.ts, p.q_batch_stride = qv.bs, p.q_head_stride = qv.hs;
  p.k = k.data() + kv.col0, p.k_token_stride = kv.ts, p.k_batch_stride = kv.bs, p.k_head_stride = kv.hs;
  p.v = c.v_in_k ? p.k : v.data() + vv.col0, p.v_token_stride = vv.ts, p.v_batch_stride = vv.bs, p.v_head_stride = vv.hs;
  p.o = o.data() + ov.col0, p.o_token_stride = ov.ts, p.o_batch_stride = ov.bs, p.o_head_stride = ov.hs;
  p.lse = lse.data();
  p.dout = dout.data() + ov.col0, p.dout_token_stride = ov.ts, p.dout_batch_stride = ov.bs, p.dout_head_stride = ov.hs;
  p.dq = dq.data() + qv.col0, p.dq_token_stride = qv.ts, p.dq_batch_stride = qv.bs, p.dq_head_stride = qv.hs;
  p.dk = dk.data() + kv.col0, p.dk_token_stride = kv.ts, p.dk_batch_stride = kv.bs, p.dk_head_stride = kv.hs;
  p.dv = dv.data() + dvv.col0, p.dv_token_stride = dvv.ts, p.dv_batch_stride = dvv.bs, p.dv_head_stride = dvv.hs;
  p.dv_in_dk = c.dv_in_dk;
  // The launch code picks the 16-byte path from the pointers and strides: the padded, offset views take the
  // 2-byte loads.
  const bool aligned = bwd_aligned(p);
  EMU_CHECK(aligned == !c.wide, "%s: the launch code took the %s path", c.name, aligned ? "aligned" : "unaligned");
  // The forward kernel the tile table names: 576/512 with V inside K on two warpgroups, 192/128 the
  // warp-specialised one (and, first, the single-warpgroup one the launcher can ask for, its o and lse kept),
  // the rest flash_fwd_kernel.
  const TileConfig tc = tile_config(int(c.dqk), int(c.dv), c.v_in_k);
  std::vector<bf16> o_old;
  std::vector<float> lse_old;
  long wrong_fwd = 0;
  if (tc.fwd_ws) {
    const auto old_launched = run_fwd(p, false);
    wrong_fwd += old_launched.size() != 1 || old_launched[0].first != "flash_fwd_kernel";
    o_old = o, lse_old = lse;
    std::fill(o.begin(), o.end(), float_to_bf16(kNan)), std::fill(lse.begin(), lse.end(), kNan);
  }
  // The warp-specialised forward's persistent grid with fewer blocks than row tiles (each block walking several,
  // the stages' phases and the turns running on across them), in the default work order and in groups of one
  // and of two heads, first: every count and order the same bits as a block per row tile, which comes last.
  std::vector<std::vector<bf16>> o_blocks;
  std::vector<std::vector<float>> lse_blocks;
  if (tc.fwd_ws)
    for (const auto& [blocks, head_group] : std::vector<std::pair<int, int>>{{1, 0}, {2, 0}, {3, 0}, {2, 1}, {3, 2}}) {
      const auto launched_n = run_fwd(p, true, blocks, head_group);
      const i64 row_tiles = ceil_div(c.q_len * group, i64(FwdWsTraits<192, 128>::kBlockM)) * c.kv_heads * c.batch;
      wrong_fwd += launched_n.size() != 1 || launched_n[0].second != std::min<i64>(blocks, row_tiles);
      o_blocks.push_back(o), lse_blocks.push_back(lse);
      std::fill(o.begin(), o.end(), float_to_bf16(kNan)), std::fill(lse.begin(), lse.end(), kNan);
    }
  const std::vector<std::pair<std::string, i64>> fwd_launched = run_fwd(p, true);
  const char* fwd_kernel =
      tc.fwd_o_split ? "flash_fwd_split_kernel" : tc.fwd_ws ? "flash_fwd_ws_kernel" : "flash_fwd_kernel";
  wrong_fwd += fwd_launched.size() != 1 || fwd_launched[0].first != fwd_kernel;
  long fwd_blocks_bits_differ = 0;
  for (std::size_t i = 0; i < o_blocks.size(); ++i) {
    fwd_blocks_bits_differ += long(std::memcmp(o_blocks[i].data(), o.data(), o.size() * sizeof(bf16)) != 0);
    fwd_blocks_bits_differ += long(std::memcmp(lse_blocks[i].data(), lse.data(), lse.size() * sizeof(float)) != 0);
  }
  // 192/128: the separate dQ kernel first (its dq kept), then (MHA on aligned views) the fused dQ without warp
  // specialisation (its dq kept), then the default into poisoned outputs; dK and dV must be the same bits every
  // way.
  const bool both = tc.dq_fused;
  const bool ws_bwd = both && tc.dkdv_ws && aligned && group == 1;
  const int fixed = c.fixed_splits ? c.splits : 0;
  std::vector<bf16> dq_sep, dk_sep, dv_sep, dq_regs, dk_regs, dv_regs;
  const bf16 nan = float_to_bf16(kNan);
  auto poison = [&] {
    std::fill(dq.begin(), dq.end(), nan), std::fill(dk.begin(), dk.end(), nan), std::fill(dv.begin(), dv.end(), nan);
  };
  if (both) {
    run_bwd(p, false, fixed);
    dq_sep = dq, dk_sep = dk, dv_sep = dv;
    poison();
  }
  long wrong_bwd = 0;
  if (ws_bwd) {
    const auto regs_launched = run_bwd(p, true, fixed, false);
    for (const auto& kv : regs_launched) wrong_bwd += kv.first == "flash_bwd_ws_kernel";
    dq_regs = dq, dk_regs = dk, dv_regs = dv;
    poison();
  }
  // The non-deterministic mode (flash_bwd_ws_kernel's dQ, flash_bwd_vkq_kernel's dK + [dV, 0] added in any
  // order): blocks run here one after another in launch order, so the adds come in the fixed order and every
  // output must be the ordered run's bits; this checks that the mode's waits let every block through.
  const bool any_order = ws_bwd || (c.dv_in_dk && c.vk_rows);
  std::vector<bf16> dq_any, dk_any, dv_any;
  if (any_order) {
    run_bwd(p, true, fixed, true, c.vk_rows, /*any_order=*/true);
    dq_any = dq, dk_any = dk, dv_any = dv;
    poison();
  }
  // The warp-specialised backward's persistent grid on 1, 2, 3 and 20 blocks running together (each walking several
  // key blocks, the stages' and buffers' phases running on across them, the dQ counters waited for across
  // blocks) and the work order in groups of 1 and 2 heads (kBwdGrids): in the fixed order every grid must give the
  // default's bits; in any order (2 blocks) dK and dV the same bits and dQ within its rounding.
  std::vector<std::vector<bf16>> dq_blocks, dk_blocks, dv_blocks;
  long bwd_blocks_wrong = 0;
  const i64 key_blocks = ceil_div(c.kv_len, i64(BwdWsTraits<192, 128>::kBlockN)) * c.kv_heads * c.batch;
  if (ws_bwd)
    for (const auto& [blocks, any, head_group] : kBwdGrids) {
      const auto launched_n = run_bwd(p, true, fixed, true, c.vk_rows, any, blocks, head_group);
      for (const auto& kv : launched_n)
        if (kv.first == "flash_bwd_ws_kernel")
          bwd_blocks_wrong += kv.second != (blocks > 0 ? std::min<i64>(blocks, key_blocks) : key_blocks);
      dq_blocks.push_back(dq), dk_blocks.push_back(dk), dv_blocks.push_back(dv);
      poison();
    }
  const std::vector<std::pair<std::string, i64>> launched = run_bwd(p, true, fixed, true, c.vk_rows);
  if (both) {
    bool ws_ran = false;
    for (const auto& kv : launched) ws_ran = ws_ran || kv.first == "flash_bwd_ws_kernel";
    wrong_bwd += ws_ran != ws_bwd;
  }
  // 576/512: the dK/dV kernel over key blocks x the row splits the case expects, then their reduction.
  long wrong_splits = 0;
  if (c.dv_in_dk && c.vk_rows) {  // the rows-resident kernel over row tiles, then the copy of its key tiles
    long vkq = 0, other = 0;
    for (const auto& [name, blocks] : launched) {
      if (name == "flash_bwd_vkq_kernel") vkq += blocks == ceil_div(c.q_len * group, 64) * c.kv_heads * c.batch;
      other += name == "flash_bwd_vk_kernel" || name == "flash_bwd_dkdv_reduce_kernel" || name == "flash_bwd_dq_kernel";
    }
    const int splits = c.fixed_splits ? c.splits : vkq_splits(p, 64, 64, kMultiprocessors);
    wrong_splits = (vkq != 1) + other + (splits != c.splits);
  } else if (c.dv_in_dk) {  // the summed kernel (and its split reduction) between delta and the dQ copy
    long vk = 0, other = 0;
    bool reduced = false;
    for (const auto& [name, blocks] : launched) {
      if (name == "flash_bwd_vk_kernel") vk += blocks == ceil_div(c.kv_len, 64) * c.splits * c.kv_heads * c.batch;
      other += name == "flash_bwd_dkdv_smem_kernel" || name == "flash_bwd_dq_kernel";
      reduced = reduced || name == "flash_bwd_dkdv_reduce_kernel";
    }
    wrong_splits = (vk != 1) + other + (reduced != (c.splits > 1));
  } else if (!tc.dkdv_regs) {
    const i64 key_blocks = ceil_div(c.kv_len, tc.dkdv_n);
    bool reduced = false;
    for (const auto& [name, blocks] : launched) {
      if (name == "flash_bwd_dkdv_smem_kernel") wrong_splits += blocks != key_blocks * c.splits * c.kv_heads * c.batch;
      reduced = reduced || name == "flash_bwd_dkdv_reduce_kernel";
    }
    wrong_splits += reduced != (c.splits > 1);
  }
  auto bits_differ = [](const std::vector<bf16>& a, const std::vector<bf16>& b) {  // elements whose bits differ
    long n = 0;
    for (std::size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(bf16)) != 0;
    return n;
  };
  long dkdv_bits_differ = 0;
  if (both) dkdv_bits_differ += bits_differ(dk, dk_sep) + bits_differ(dv, dv_sep);
  if (ws_bwd) dkdv_bits_differ += bits_differ(dk, dk_regs) + bits_differ(dv, dv_regs);
  const long any_order_bits_differ =
      any_order ? bits_differ(dq, dq_any) + bits_differ(dk, dk_any) + bits_differ(dv, dv_any) : 0;
  long bwd_blocks_bits_differ = 0;
  Err edq_any_blocks;
  for (std::size_t i = 0; i < dq_blocks.size(); ++i) {
    const bool any = kBwdGrids[i].any;
    bwd_blocks_bits_differ += bits_differ(dk_blocks[i], dk) + bits_differ(dv_blocks[i], dv);
    if (!any) {
      bwd_blocks_bits_differ += bits_differ(dq_blocks[i], dq);
    } else {
      for (i64 t = 0; t < qv.tokens; ++t)
        for (i64 bb = 0; bb < qv.batch; ++bb)
          for (i64 h = 0; h < qv.heads; ++h)
            for (i64 d = 0; d < qv.dim; ++d) {
              const std::size_t at = std::size_t(qv.idx(t, bb, h, d));
              edq_any_blocks.add(bf16_to_float(dq_blocks[i][at]), bf16_to_float(dq[at]));
            }
    }
  }

  // float64 reference (from the bf16 inputs; o for D from the GPU's rounded o like FlashAttention? no: exact)
  Err eo, else_, edq, edk, edv, edq_sep, edq_regs, eo_old, else_old;
  long bad_empty = 0;
  std::vector<double> rdk(std::size_t(c.batch * c.kv_heads * c.kv_len * c.dqk), 0.0), rdv(std::size_t(c.batch * c.kv_heads * c.kv_len * c.dv), 0.0);
  for (i64 b = 0; b < c.batch; ++b)
    for (i64 h = 0; h < c.q_heads; ++h) {
      const i64 g = h / group;
      for (i64 i = 0; i < c.q_len; ++i) {
        const i64 vis = std::clamp<i64>(i + c.q_offset + 1, 0, c.kv_len);
        const float got_lse = lse[std::size_t((b * c.q_heads + h) * c.q_len + i)];
        std::vector<double> s(static_cast<std::size_t>(vis)), pr(static_cast<std::size_t>(vis)), dp(static_cast<std::size_t>(vis));
        double m = -INFINITY;
        for (i64 j = 0; j < vis; ++j) {
          double acc = 0;
          for (i64 d = 0; d < c.dqk; ++d) acc += get(q, qv, i, b, h, d) * get(k, kv, j, b, g, d);
          s[j] = acc * p.scale;
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (i64 j = 0; j < vis; ++j) sum += (pr[j] = std::exp(s[j] - m));
        for (i64 j = 0; j < vis; ++j) pr[j] /= sum;
        if (vis == 0) {
          bad_empty += !(std::isinf(got_lse) && got_lse < 0);
        } else {
          else_.add(got_lse, m + std::log(sum));
        }
        if (tc.fwd_ws) {
          const float old_lse = lse_old[std::size_t((b * c.q_heads + h) * c.q_len + i)];
          if (vis == 0)
            bad_empty += !(std::isinf(old_lse) && old_lse < 0);
          else
            else_old.add(old_lse, m + std::log(sum));
        }
        std::vector<double> ro(static_cast<std::size_t>(c.dv), 0.0);
        for (i64 d = 0; d < c.dv; ++d) {
          double acc = 0;
          for (i64 j = 0; j < vis; ++j) acc += pr[j] * (c.v_in_k ? get(k, kv, j, b, g, d) : get(v, vv, j, b, g, d));
          ro[d] = acc;
          eo.add(bf16_to_float(o[ov.idx(i, b, h, d)]), acc);
          if (tc.fwd_ws) eo_old.add(bf16_to_float(o_old[ov.idx(i, b, h, d)]), acc);
        }
        double D = 0;
        for (i64 d = 0; d < c.dv; ++d) D += get(dout, ov, i, b, h, d) * ro[d];
        if (getenv("EMU_DEBUG") && b == 0 && h == 0 && i < 4) std::printf("ref D[%ld] = %g\n", long(i), D);
        for (i64 j = 0; j < vis; ++j) {
          double acc = 0;
          for (i64 d = 0; d < c.dv; ++d) acc += get(dout, ov, i, b, h, d) * (c.v_in_k ? get(k, kv, j, b, g, d) : get(v, vv, j, b, g, d));
          dp[j] = pr[j] * (acc - D);  // dS
        }
        for (i64 d = 0; d < c.dqk; ++d) {
          double acc = 0;
          for (i64 j = 0; j < vis; ++j) acc += dp[j] * get(k, kv, j, b, g, d);
          edq.add(bf16_to_float(dq[qv.idx(i, b, h, d)]), acc * p.scale);
          if (both) edq_sep.add(bf16_to_float(dq_sep[qv.idx(i, b, h, d)]), acc * p.scale);
          if (ws_bwd) edq_regs.add(bf16_to_float(dq_regs[qv.idx(i, b, h, d)]), acc * p.scale);
        }
        for (i64 j = 0; j < vis; ++j) {
          for (i64 d = 0; d < c.dqk; ++d) rdk[std::size_t(((b * c.kv_heads + g) * c.kv_len + j) * c.dqk + d)] += p.scale * dp[j] * get(q, qv, i, b, h, d);
          for (i64 d = 0; d < c.dv; ++d) rdv[std::size_t(((b * c.kv_heads + g) * c.kv_len + j) * c.dv + d)] += pr[j] * get(dout, ov, i, b, h, d);
        }
      }
    }
  for (i64 b = 0; b < c.batch; ++b)
    for (i64 g = 0; g < c.kv_heads; ++g)
      for (i64 j = 0; j < c.kv_len; ++j) {
        const std::size_t kj = std::size_t((b * c.kv_heads + g) * c.kv_len + j);
        for (i64 d = 0; d < c.dqk; ++d)
          edk.add(bf16_to_float(dk[kv.idx(j, b, g, d)]), rdk[kj * c.dqk + d] + (c.dv_in_dk && d < c.dv ? rdv[kj * c.dv + d] : 0.0));
        if (!c.dv_in_dk)
          for (i64 d = 0; d < c.dv; ++d) edv.add(bf16_to_float(dv[dvv.idx(j, b, g, d)]), rdv[kj * c.dv + d]);
      }
  long untouched_dv = 0;  // dv_in_dk: every element of dv is still the poison
  if (c.dv_in_dk)
    for (const bf16& x : dv) untouched_dv += !std::isnan(bf16_to_float(x));
  const long out_o = count_outside_written(o, ov) + (tc.fwd_ws ? count_outside_written(o_old, ov) : 0), out_dq = count_outside_written(dq, qv), out_dk = count_outside_written(dk, kv),
             out_dv = count_outside_written(dv, dvv) + untouched_dv;
  const double tol = 1e-2;
  const long out_sep = (both ? count_outside_written(dq_sep, qv) : 0) + (ws_bwd ? count_outside_written(dq_regs, qv) : 0);
  const bool ok = eo.rel() <= tol && edq.rel() <= tol && edk.rel() <= tol && (c.dv_in_dk || edv.rel() <= tol) && (else_.den == 0 || else_.rel() <= 1e-5) &&
                  bad_empty == 0 && out_o + out_dq + out_dk + out_dv + out_sep == 0 && (!both || edq_sep.rel() <= tol) && (!ws_bwd || edq_regs.rel() <= tol) && wrong_bwd == 0 &&
                  dkdv_bits_differ == 0 && any_order_bits_differ == 0 && wrong_splits == 0 && wrong_fwd == 0 &&
                  fwd_blocks_bits_differ == 0 && bwd_blocks_bits_differ == 0 && bwd_blocks_wrong == 0 &&
                  (edq_any_blocks.den == 0 || edq_any_blocks.rel() <= 4e-3) &&
                  (!tc.fwd_ws || (eo_old.rel() <= tol && (else_old.den == 0 || else_old.rel() <= 1e-5)));
  std::printf("%-34s o %.2e lse %.2e dq %.2e dk %.2e dv %.2e | bad_empty %ld outside %ld %ld %ld %ld | %s\n", c.name, eo.rel(),
              else_.den ? else_.rel() : 0.0, edq.rel(), edk.rel(), edv.rel(), bad_empty, out_o, out_dq, out_dk, out_dv, ok ? "OK" : "FAIL");
  if (both)
    std::printf("%-34s separate dQ kernel: dq %.2e outside %ld; dK/dV elements whose bits differ from the fused run: %ld\n", "",
                edq_sep.rel(), out_sep, dkdv_bits_differ);
  if (ws_bwd)
    std::printf("%-34s warp-specialised backward (flash_bwd_ws_kernel) %s; without it: dq %.2e\n", "",
                wrong_bwd ? "NOT launched as expected" : "launched", edq_regs.rel());
  else if (wrong_bwd)
    std::printf("%-34s flash_bwd_ws_kernel launched where it does not apply\n", "");
  if (tc.fwd_ws)
    std::printf("%-34s single-warpgroup forward (flash_fwd_kernel): o %.2e lse %.2e\n", "", eo_old.rel(),
                else_old.den ? else_old.rel() : 0.0);
  if (wrong_fwd) std::printf("%-34s the forward did not launch %s alone (or not on the blocks asked)\n", "", fwd_kernel);
  if (tc.fwd_ws)
    std::printf("%-34s warp-specialised forward on 1, 2, 3 blocks, 1 and 2 heads at a time: %ld of o and lse differ "
                "from a block per row tile\n",
                "", fwd_blocks_bits_differ);
  if (any_order)
    std::printf("%-34s added in any order: %ld elements whose bits differ from the ordered run\n", "",
                any_order_bits_differ);
  if (ws_bwd)
    std::printf("%-34s warp-specialised backward on 1, 2, 3, 20 blocks, 1 and 2 heads at a time%s: %ld of dq, dk, dv "
                "differ from the default; "
                "in any order on 2: dq %.2e from the ordered run\n",
                "", bwd_blocks_wrong ? " (NOT the blocks asked)" : "", bwd_blocks_bits_differ, edq_any_blocks.rel());
  if (c.dv_in_dk && c.vk_rows)
    std::printf("%-34s dk = dK + [dV, 0] by flash_bwd_vkq_kernel (rows resident): %s\n", "",
                wrong_splits ? "NOT what was launched" : "launched");
  else if (c.dv_in_dk)
    std::printf("%-34s dk = dK + [dV, 0] by flash_bwd_vk_kernel, %d row split(s): %s\n", "", c.splits,
                wrong_splits ? "NOT what was launched" : "launched");
  else if (c.splits > 1 || wrong_splits)
    std::printf("%-34s dK/dV row splits: %d expected, %s\n", "", c.splits, wrong_splits ? "NOT what was launched" : "launched");
  std::fflush(stdout);
  return ok;
}

// The backward's work order chosen by the launch code (backward_head_group) at DeepSeek-V3's rank shapes on an
// H200's 132 SMs: 8 heads at a time wherever a head's blocks walk many row tiles or dQ is added in any order,
// 8 x 2^k in the fixed order where they walk few, the least with 132 / heads <= its row tiles (the all_gather
// rank's 128 heads x S / 8 queries; 1025 rows: 17 tiles of 64, 960: 15), the count the launcher is told always.
int check_backward_head_groups() {
  struct Want {
    bool ordered;
    i64 rows;
    int asked, heads;
  };
  const Want wants[] = {{true, 512, 0, 32},   {true, 1024, 0, 16}, {true, 2048, 0, 8},  {true, 4096, 0, 8},
                        {true, 16384, 0, 8},  {false, 512, 0, 8},  {true, 512, 4, 4},   {true, 64, 0, 256},
                        {true, 1, 0, 256},    {true, 1025, 0, 8},  {true, 960, 0, 16}, {false, 1, 0, 8}};
  int fails = 0;
  for (const Want& w : wants) {
    const i64 row_tiles = ceil_div(w.rows, i64(BwdWsTraits<192, 128>::kBlockM));
    const int got = backward_head_group(w.asked, w.ordered, kMultiprocessors, row_tiles);
    if (got != w.heads) {
      std::printf("backward_head_group(asked %d, %s, 132 SMs, %ld rows) = %d, want %d: FAIL\n", w.asked,
                  w.ordered ? "fixed order" : "any order", long(w.rows), got, w.heads);
      ++fails;
    }
  }
  std::printf("%-34s %s\n", "backward_head_group", fails ? "FAIL" : "OK");
  return fails;
}

// The forward's persistent grid chosen by the launch code (forward_grid_blocks) at DeepSeek-V3's rank shapes on an
// H200's 132 SMs, 4 heads a group: one block per SM where row tiles see many and few keys (the a2a rank, causal
// from key 0); at the all_gather rank (128 heads, the last S / 8 queries over S keys: every row tile sees 7/8 of
// the keys or more) the 128 blocks that 4 heads' 4 to 32 row tiles of 128 rows fill; what the launcher asks for
// always; never more blocks than row tiles.
int check_forward_grid_blocks() {
  struct Want {
    const char* shape;
    i64 heads, q_len, kv_len, q_offset;
    int asked;
    i64 blocks;
  };
  const Want wants[] = {{"a2a 4k", 16, 4096, 4096, 0, 0, 132},
                        {"a2a 32k", 16, 32768, 32768, 0, 0, 132},
                        {"a2a P = 1, 8k", 128, 8192, 8192, 0, 0, 132},
                        {"all_gather 4k", 128, 512, 4096, 3584, 0, 128},
                        {"all_gather 8k", 128, 1024, 8192, 7168, 0, 128},
                        {"all_gather 16k", 128, 2048, 16384, 14336, 0, 128},
                        {"all_gather 32k", 128, 4096, 32768, 28672, 0, 128},
                        {"all_gather 32k, 132 asked", 128, 4096, 32768, 28672, 132, 132},
                        {"all_gather 64k (64 a group)", 128, 8192, 65536, 57344, 0, 128},
                        {"all_gather, 3 heads (<= 7/8 SMs)", 3, 4096, 32768, 28672, 0, 96},
                        {"all_gather, 5 tiles a group", 5, 128, 8192, 8064, 0, 5},
                        {"half the keys seen by the first rows", 128, 2048, 4096, 2048, 0, 132}};
  using Tr = FwdWsTraits<192, 128>;
  int fails = 0;
  for (const Want& w : wants) {
    const i64 tiles = ceil_div(w.q_len, i64(Tr::kBlockM));
    const i64 group_items = tiles * std::min<i64>(kForwardHeadGroup, w.heads);
    const i64 got = forward_grid_blocks(w.asked, kMultiprocessors, tiles * w.heads, group_items,
                                        laga::visible_keys(std::min<i64>(Tr::kBlockM, w.q_len) - 1, w.q_offset, w.kv_len),
                                        laga::visible_keys(w.q_len - 1, w.q_offset, w.kv_len));
    if (got != w.blocks) {
      std::printf("forward_grid_blocks(%s) = %ld, want %ld: FAIL\n", w.shape, long(got), long(w.blocks));
      ++fails;
    }
  }
  std::printf("%-34s %s\n", "forward_grid_blocks", fails ? "FAIL" : "OK");
  return fails;
}

int main(int argc, char** argv) {
  const Case cases[] = {
      {"mha_192_128_dense", 1, 96, 96, 2, 2, 192, 128, 0, false, false, 1},
      {"mha_192_128_wide_offset", 1, 64, 160, 2, 2, 192, 128, 96, true, false, 1},
      {"mha_192_128_multi_tile", 1, 200, 200, 1, 1, 192, 128, 0, false, false, 1},
      // 3 key blocks x 3 row tiles, the last key block's first rows inside a row tile (fused dQ's counters).
      {"mha_192_128_three_key_blocks", 1, 130, 260, 1, 1, 192, 128, 180, false, false, 1},
      {"gqa_192_128_negative_offset", 2, 40, 45, 4, 2, 192, 128, -3, false, false, 1},
      // Five 128-key tiles (the warp-specialised forward reuses each K and V stage twice), aligned and unaligned.
      {"mha_192_128_five_key_tiles", 1, 70, 600, 2, 2, 192, 128, 530, false, false, 1},
      {"mha_192_128_five_key_tiles_wide", 1, 40, 590, 1, 1, 192, 128, 550, true, false, 1},
      // Keys past every row: key blocks 1-3 of each head see no row (dK = dV = 0), so a persistent block walks
      // several of them in a row after the seen ones.
      {"mha_192_128_keys_past_rows", 1, 64, 500, 2, 2, 192, 128, 0, false, false, 1},
      // 17 kv heads x batch 2 = 34 (head, batch) pairs: three groups of the grid order, the last partial.
      {"mha_192_128_head_groups", 2, 24, 24, 17, 17, 192, 128, 0, false, false, 1},
      // 3 heads x 2 row tiles: the forward's work orders in groups of 1 and 2 heads walk them otherwise.
      {"mha_192_128_head_groups_row_tiles", 1, 160, 160, 3, 3, 192, 128, 0, false, false, 1},
      {"mqa_576_512_absorbed_wide", 1, 70, 70, 4, 1, 576, 512, 0, true, true, 1},
      {"mqa_576_512_absorbed_offset", 2, 40, 100, 3, 1, 576, 512, 60, false, true, 1},
      {"mqa_576_512_separate_v", 1, 50, 50, 2, 1, 576, 512, 0, false, false, 1},
      // Four key tiles: both K stages reused, the second warpgroup's loads in the loop; unaligned views.
      {"mqa_576_512_absorbed_four_tiles", 1, 40, 230, 2, 1, 576, 512, 190, true, true, 1},
      // The dK/dV row splits come from the launch code's rule (at least 4 row tiles of 64 per split, enough
      // splits to fill 132 SMs twice, rounded down to a power of two): 12 heads x 64 queries = 768 rows over one
      // key block split 2 ways; 16 heads x 32 queries = 512 rows split 2 ways; 3 ways fixed by the launcher.
      {"mqa_576_512_splits2", 1, 64, 32, 12, 1, 576, 512, 0, false, true, 2},
      {"mqa_576_512_fixed_splits3", 1, 64, 32, 12, 1, 576, 512, 0, false, true, 3, false, true},
      {"mqa_576_512_sep_wide_splits2", 1, 32, 16, 16, 1, 576, 512, 7, true, false, 2},
      // dK + [dV, 0] in one accumulator (flash_bwd_vk_kernel, dQ added into fp32 row tiles in key-block order):
      // one key block; four key blocks x 3 row tiles with kv_len not a multiple of 64 and the last block's first
      // rows inside a row tile; a q_offset that is not a multiple of 64 and unaligned views; 16 heads (two queries
      // a row tile); batch 2 with a negative offset; a block whose keys no row sees.
      {"vk_576_512_one_block", 1, 20, 20, 3, 1, 576, 512, 0, false, true, 1, true},
      {"vk_576_512_four_key_blocks", 1, 48, 230, 4, 1, 576, 512, 182, false, true, 1, true},
      {"vk_576_512_wide_offset", 1, 30, 150, 5, 1, 576, 512, 101, true, true, 1, true},
      {"vk_576_512_h16", 1, 12, 100, 16, 1, 576, 512, 88, false, true, 1, true},
      {"vk_576_512_batch2_negative", 2, 40, 70, 2, 1, 576, 512, -5, false, true, 1, true},
      // Row splits (fp32 partials summed in split order): 16 heads x 40 queries = 640 rows, 10 row tiles in two
      // ranges of 5, two key blocks (the second's first row in tile 6: its block of the first range has no tile);
      // 3 ways (fixed) at 768 rows with unaligned views.
      {"vk_576_512_splits2", 1, 40, 70, 16, 1, 576, 512, 40, false, true, 2, true},
      {"vk_576_512_wide_splits3", 1, 64, 50, 12, 1, 576, 512, 0, true, true, 3, true, true},
      // 128 heads (a row tile is half a query's heads), 768 rows in 2 splits (the rule).
      {"vk_576_512_h128", 1, 6, 40, 128, 1, 576, 512, 34, false, true, 2, true},
      // The same sums by flash_bwd_vkq_kernel (a block per row tile, dK + [dV, 0] added into fp32 key tiles in
      // row-tile order, the row tiles dealt to `splits` copies summed in order; splits by the rule: the largest
      // power of two up to the row tiles, at most 16, where the work is this small): one key block; four key
      // blocks with a partial last one; unaligned views and an offset; 16 heads; batch 2 with a negative offset
      // (key blocks no row sees stay zero); 128 heads (12 row tiles in 8 copies); 3 fixed splits of 10 row
      // tiles; 16 fixed splits of 3 row tiles (copies no row tile adds to); two kv heads and batch 2, 3 fixed
      // splits each.
      {"vkq_576_512_one_block", 1, 20, 20, 3, 1, 576, 512, 0, false, true, 1, true, false, true},
      {"vkq_576_512_four_key_blocks", 1, 48, 230, 4, 1, 576, 512, 182, false, true, 2, true, false, true},
      {"vkq_576_512_wide_offset", 1, 30, 150, 5, 1, 576, 512, 101, true, true, 2, true, false, true},
      {"vkq_576_512_h16", 1, 12, 100, 16, 1, 576, 512, 88, false, true, 2, true, false, true},
      {"vkq_576_512_batch2_negative", 2, 40, 70, 2, 1, 576, 512, -5, false, true, 2, true, false, true},
      {"vkq_576_512_h128", 1, 6, 40, 128, 1, 576, 512, 34, false, true, 8, true, false, true},
      {"vkq_576_512_fixed_splits3", 1, 40, 100, 16, 1, 576, 512, 60, true, true, 3, true, true, true},
      {"vkq_576_512_fixed_splits16", 1, 12, 100, 16, 1, 576, 512, 88, false, true, 16, true, true, true},
      {"vkq_576_512_gqa_batch2_splits3", 2, 24, 90, 4, 2, 576, 512, 66, true, true, 3, true, true, true},
  };
  int fails = argc > 1 ? 0 : check_backward_head_groups() + check_forward_grid_blocks();
  for (const auto& c : cases) {
    if (argc > 1 && std::string(c.name).find(argv[1]) == std::string::npos) continue;
    fails += !run_case(c);
  }
  std::printf("%d failed\n", fails);
  return fails != 0;
}
