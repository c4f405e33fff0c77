// Emulated run of the tensor-core attention kernels (src/cuda/flash_kernels.cuh) on the CPU, against a float64
// reference: the kernels compile with g++ against include/cuda/flash_mma.cuh, a host emulation of the GPU
// primitives (mma.sync, ldmatrix, cp.async, wgmma), so CI without a GPU still checks their indexing,
// masking, strides and reductions. Exit code = number of failed cases != 0.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/flash_kernels.cuh"

using namespace laga::cuda::flash;
using laga::AttentionBwdParams;
using laga::AttentionFwdParams;

struct Case {
  const char* name;
  i64 batch, q_len, kv_len, q_heads, kv_heads, dqk, dv, q_offset;
  bool wide, v_in_k;
  int splits;
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

template <class K, bool kA>
void run_fwd(const AttentionFwdParams& p) {
  using Tr = typename K::Fwd;
  const i64 rows = p.q_len * (p.q_heads / p.kv_heads);
  emu::launch(&flash_fwd_kernel<Tr, kA>, EmuDim3{unsigned(grid_blocks(ceil_div(rows, Tr::kBlockM), p.kv_heads, p.batch)), 1, 1},
              Tr::kThreads, std::size_t(Tr::kSmemBytes), p);
}
template <class K, bool kA>
void run_bwd(const AttentionBwdParams& p, int splits, bool fused_dq) {
  constexpr TileConfig c = K::c;
  const i64 rows = p.q_len * (p.q_heads / p.kv_heads);
  std::vector<float> delta(std::size_t(p.batch * p.q_heads * p.q_len));
  emu::launch(&flash_bwd_delta_kernel<kA>, EmuDim3{unsigned(ceil_div(i64(delta.size()), 8)), 1, 1}, 256, 0, p, delta.data());
  const float* cd = delta.data();
  if (getenv("EMU_DEBUG")) {
    for (int r = 0; r < 4; ++r) std::printf("delta[%d] = %g\n", r, delta[r]);
    const bf16* o = static_cast<const bf16*>(p.o); const bf16* d = static_cast<const bf16*>(p.dout);
    double acc = 0; for (int c = 0; c < p.d_v; ++c) acc += double(bf16_to_float(o[c])) * bf16_to_float(d[c]);
    std::printf("host D[0] from buffers = %g (o0 %g d0 %g) ots %ld\n", acc, bf16_to_float(o[0]), bf16_to_float(d[0]), long(p.o_token_stride));
  }
  if constexpr (c.dq_fused) {
    if (fused_dq) {
      using Tr = typename K::DkdvRegsFusedDq;
      const i64 tiles = p.batch * p.kv_heads * dq_row_tiles(rows);
      std::vector<float> accum(std::size_t(tiles * kDqTileRows * Tr::kDqk), NAN);  // block 0 stores: no zero fill
      std::vector<unsigned> count(std::size_t(tiles), 0u);
      emu::launch(&flash_bwd_dkdv_regs_kernel<Tr, kA>,
                  EmuDim3{unsigned(grid_blocks(ceil_div(p.kv_len, Tr::kBlockN), p.kv_heads, p.batch)), 1, 1},
                  Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cd, accum.data(), count.data());
      emu::launch(&flash_bwd_dq_convert_kernel<Tr::kDqk, kA>, EmuDim3{unsigned(tiles), 1, 1}, 256,
                  sizeof(float) * kDqTileRows * Tr::kDqk, p, static_cast<const float*>(accum.data()),
                  static_cast<const unsigned*>(count.data()));
      return;
    }
  }
  if constexpr (c.dkdv_regs) {
    using Tr = typename K::DkdvRegs;
    emu::launch(&flash_bwd_dkdv_regs_kernel<Tr, kA>,
                EmuDim3{unsigned(grid_blocks(ceil_div(p.kv_len, Tr::kBlockN), p.kv_heads, p.batch)), 1, 1}, Tr::kThreads,
                std::size_t(Tr::kSmemBytes), p, cd, static_cast<float*>(nullptr), static_cast<unsigned*>(nullptr));
  } else {
    using Tr = typename K::DkdvSmem;
    const i64 kb = ceil_div(p.kv_len, Tr::kBlockN);
    std::vector<float> partial(splits > 1 ? std::size_t(splits * p.batch * p.kv_heads * p.kv_len * (Tr::kDqk + Tr::kDv)) : 1, NAN);
    emu::launch(&flash_bwd_dkdv_smem_kernel<Tr, kA>, EmuDim3{unsigned(grid_blocks(kb * splits, p.kv_heads, p.batch)), 1, 1},
                Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cd, splits, partial.data());
    if (splits > 1) {
      const i64 pairs = p.batch * p.kv_heads * p.kv_len * (Tr::kDqk + Tr::kDv) / 2;
      emu::launch(&flash_bwd_dkdv_reduce_kernel<Tr::kDqk, Tr::kDv, kA>, EmuDim3{unsigned(ceil_div(pairs, 256)), 1, 1}, 256, 0, p,
                  splits, static_cast<const float*>(partial.data()));
    }
  }
  using Tq = typename K::Dq;
  emu::launch(&flash_bwd_dq_kernel<Tq, kA>, EmuDim3{unsigned(grid_blocks(ceil_div(rows, Tq::kBlockM), p.kv_heads, p.batch)), 1, 1},
              Tq::kThreads, std::size_t(Tq::kSmemBytes), p, cd);
}

template <bool kA>
void dispatch(const Case& c, AttentionBwdParams& p, bool bwd, bool fused_dq = true) {
  auto go = [&](auto k) {
    using K = decltype(k);
    if (bwd)
      run_bwd<K, kA>(p, c.splits, fused_dq);
    else
      run_fwd<K, kA>(p);
  };
  if (c.dqk == 192)
    go(Kernels<192, 128, false>{});
  else if (c.v_in_k)
    go(Kernels<576, 512, true>{});
  else
    go(Kernels<576, 512, false>{});
}

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
  p.dtype = laga::DType::bf16;
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
  const bool aligned = !c.wide;
  if (aligned) dispatch<true>(c, p, false); else dispatch<false>(c, p, false);
  // 192/128: the separate dQ kernel first (its dq kept), then the fused dQ into poisoned outputs; dK and dV
  // must be the same bits both ways.
  const bool both = tile_config(int(c.dqk), int(c.dv), c.v_in_k).dq_fused;
  std::vector<bf16> dq_sep, dk_sep, dv_sep;
  if (both) {
    if (aligned) dispatch<true>(c, p, true, false); else dispatch<false>(c, p, true, false);
    dq_sep = dq, dk_sep = dk, dv_sep = dv;
    const bf16 nan = float_to_bf16(kNan);
    std::fill(dq.begin(), dq.end(), nan), std::fill(dk.begin(), dk.end(), nan), std::fill(dv.begin(), dv.end(), nan);
  }
  if (aligned) dispatch<true>(c, p, true); else dispatch<false>(c, p, true);
  long dkdv_bits_differ = 0;
  if (both)
    for (std::size_t i = 0; i < dk.size(); ++i) dkdv_bits_differ += std::memcmp(&dk[i], &dk_sep[i], sizeof(bf16)) != 0;
  if (both)
    for (std::size_t i = 0; i < dv.size(); ++i) dkdv_bits_differ += std::memcmp(&dv[i], &dv_sep[i], sizeof(bf16)) != 0;

  // float64 reference (from the bf16 inputs; o for D from the GPU's rounded o like FlashAttention? no: exact)
  Err eo, else_, edq, edk, edv, edq_sep;
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
        std::vector<double> ro(static_cast<std::size_t>(c.dv), 0.0);
        for (i64 d = 0; d < c.dv; ++d) {
          double acc = 0;
          for (i64 j = 0; j < vis; ++j) acc += pr[j] * (c.v_in_k ? get(k, kv, j, b, g, d) : get(v, vv, j, b, g, d));
          ro[d] = acc;
          eo.add(bf16_to_float(o[ov.idx(i, b, h, d)]), acc);
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
        for (i64 d = 0; d < c.dqk; ++d) edk.add(bf16_to_float(dk[kv.idx(j, b, g, d)]), rdk[std::size_t(((b * c.kv_heads + g) * c.kv_len + j) * c.dqk + d)]);
        for (i64 d = 0; d < c.dv; ++d) edv.add(bf16_to_float(dv[dvv.idx(j, b, g, d)]), rdv[std::size_t(((b * c.kv_heads + g) * c.kv_len + j) * c.dv + d)]);
      }
  const long out_o = count_outside_written(o, ov), out_dq = count_outside_written(dq, qv), out_dk = count_outside_written(dk, kv),
             out_dv = count_outside_written(dv, dvv);
  const double tol = 1e-2;
  const long out_sep = both ? count_outside_written(dq_sep, qv) : 0;
  const bool ok = eo.rel() <= tol && edq.rel() <= tol && edk.rel() <= tol && edv.rel() <= tol && (else_.den == 0 || else_.rel() <= 1e-5) &&
                  bad_empty == 0 && out_o + out_dq + out_dk + out_dv + out_sep == 0 && (!both || edq_sep.rel() <= tol) &&
                  dkdv_bits_differ == 0;
  std::printf("%-34s o %.2e lse %.2e dq %.2e dk %.2e dv %.2e | bad_empty %ld outside %ld %ld %ld %ld | %s\n", c.name, eo.rel(),
              else_.den ? else_.rel() : 0.0, edq.rel(), edk.rel(), edv.rel(), bad_empty, out_o, out_dq, out_dk, out_dv, ok ? "OK" : "FAIL");
  if (both)
    std::printf("%-34s separate dQ kernel: dq %.2e outside %ld; dK/dV elements whose bits differ from the fused run: %ld\n", "",
                edq_sep.rel(), out_sep, dkdv_bits_differ);
  std::fflush(stdout);
  return ok;
}

int main(int argc, char** argv) {
  const Case cases[] = {
      {"mha_192_128_dense", 1, 96, 96, 2, 2, 192, 128, 0, false, false, 1},
      {"mha_192_128_wide_offset", 1, 64, 160, 2, 2, 192, 128, 96, true, false, 1},
      {"mha_192_128_multi_tile", 1, 200, 200, 1, 1, 192, 128, 0, false, false, 1},
      // 3 key blocks x 3 row tiles, the last key block's first rows inside a row tile (fused dQ's counters).
      {"mha_192_128_three_key_blocks", 1, 130, 260, 1, 1, 192, 128, 180, false, false, 1},
      {"gqa_192_128_negative_offset", 2, 40, 45, 4, 2, 192, 128, -3, false, false, 1},
      // 17 kv heads x batch 2 = 34 (head, batch) pairs: three groups of the grid order, the last partial.
      {"mha_192_128_head_groups", 2, 24, 24, 17, 17, 192, 128, 0, false, false, 1},
      {"mqa_576_512_absorbed_wide", 1, 70, 70, 4, 1, 576, 512, 0, true, true, 1},
      {"mqa_576_512_absorbed_offset", 2, 40, 100, 3, 1, 576, 512, 60, false, true, 1},
      {"mqa_576_512_separate_v", 1, 50, 50, 2, 1, 576, 512, 0, false, false, 1},
      {"mqa_576_512_splits3", 1, 100, 100, 2, 1, 576, 512, 0, false, true, 3},
      {"mqa_576_512_sep_wide_splits2", 1, 45, 60, 3, 1, 576, 512, 15, true, false, 2},
  };
  int fails = 0;
  for (const auto& c : cases) {
    if (argc > 1 && std::string(c.name).find(argv[1]) == std::string::npos) continue;
    fails += !run_case(c);
  }
  std::printf("%d failed\n", fails);
  return fails != 0;
}
