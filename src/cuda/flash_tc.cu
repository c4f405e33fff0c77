// Launches of the tensor-core attention kernels: the table of tile configurations per (d_qk, d_v) pair (one
// constexpr function), the runtime-to-compile-time switches (head dims, V inside K, 16-byte alignment), and
// the backward's scratch (D = rowsum(dO * O), the MQA dK/dV partials).
#include "cuda/flash_tc.cuh"

#include <algorithm>

#include "cuda/flash_kernels.cuh"

namespace laga::cuda {
namespace {

using flash::Kernels;
using flash::TileConfig;
using flash::tile_config;

template <typename Kernel, typename... Args>
void launch(Context& ctx, Kernel kernel, const char* name, dim3 grid, int threads, std::size_t smem, Args... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  LAGA_REQUIRE(smem <= std::size_t(ctx.max_smem_per_block), name, " needs ", smem,
               " bytes of shared memory; the device allows ", ctx.max_smem_per_block);
  LAGA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<grid, threads, smem, ctx.stream>>>(args...);
  LAGA_CUDA_CHECK_LAUNCH(name);
}

unsigned blocks(i64 n, int tile) { return static_cast<unsigned>((n + tile - 1) / tile); }

bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }
bool strides8(i64 a, i64 b, i64 c) { return a % 8 == 0 && b % 8 == 0 && c % 8 == 0; }

bool v_in_k(const AttentionFwdParams& p) {
  return p.v == p.k && p.v_token_stride == p.k_token_stride && p.v_batch_stride == p.k_batch_stride &&
         p.v_head_stride == p.k_head_stride;
}

bool fwd_aligned(const AttentionFwdParams& p) {
  return aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.o) &&
         strides8(p.q_token_stride, p.q_batch_stride, p.q_head_stride) &&
         strides8(p.k_token_stride, p.k_batch_stride, p.k_head_stride) &&
         strides8(p.v_token_stride, p.v_batch_stride, p.v_head_stride) &&
         strides8(p.o_token_stride, p.o_batch_stride, p.o_head_stride);
}

bool bwd_aligned(const AttentionBwdParams& p) {
  return fwd_aligned(p) && aligned16(p.dout) && aligned16(p.dq) && aligned16(p.dk) && aligned16(p.dv) &&
         strides8(p.dout_token_stride, p.dout_batch_stride, p.dout_head_stride) &&
         strides8(p.dq_token_stride, p.dq_batch_stride, p.dq_head_stride) &&
         strides8(p.dk_token_stride, p.dk_batch_stride, p.dk_head_stride) &&
         strides8(p.dv_token_stride, p.dv_batch_stride, p.dv_head_stride);
}

// One block per (tile, kv head, batch entry), tile slowest (flash::tile_work). The kernels map rows to
// (query, head) in 32 bits (flash::RowMap).
dim3 flash_grid(i64 tiles, const AttentionFwdParams& p) {
  const i64 rows = p.q_len * (p.q_heads / p.kv_heads);
  LAGA_REQUIRE(rows <= INT32_MAX, "attention: q_len ", p.q_len, " x ", p.q_heads / p.kv_heads,
               " query heads per kv head = ", rows, " rows; the kernels take at most 2^31 - 1");
  const i64 n = flash::grid_blocks(tiles, p.kv_heads, p.batch);
  LAGA_REQUIRE(n <= INT32_MAX, "attention: ", n, " blocks exceed the grid limit (", tiles, " tiles x ", p.kv_heads,
               " kv heads x batch ", p.batch, ")");
  return dim3(unsigned(n));
}

int multiprocessors(const Context& ctx) {
  int sms = 0;
  LAGA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx.device));
  return sms;
}

template <class K, bool kAligned>
void forward_impl(Context& ctx, const AttentionFwdParams& p) {
  using Tr = typename K::Fwd;
  const i64 rows = p.q_len * (p.q_heads / p.kv_heads);
  launch(ctx, flash::flash_fwd_kernel<Tr, kAligned>, "flash_fwd_kernel",
         flash_grid(blocks(rows, Tr::kBlockM), p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p);
}

template <class K, bool kAligned>
void backward_impl(Context& ctx, const AttentionBwdParams& p) {
  constexpr TileConfig c = K::c;
  const i64 group = p.q_heads / p.kv_heads, rows = p.q_len * group;
  const i64 bh_rows = p.batch * p.q_heads * p.q_len;
  float* delta = static_cast<float*>(ctx.scratch.get(ScratchSlot::delta, sizeof(float) * bh_rows, ctx.stream));
  if (bh_rows > 0) {
    flash::flash_bwd_delta_kernel<kAligned><<<blocks(bh_rows, 8), 256, 0, ctx.stream>>>(p, delta);
    LAGA_CUDA_CHECK_LAUNCH("flash_bwd_delta_kernel");
  }
  const float* cdelta = delta;
  if constexpr (c.dq_fused) {
    if (ctx.flash_fused_dq) {
      // dQ added up by the dK/dV kernel into fp32 tiles (their counters zeroed first), then scaled into dq.
      using Tr = typename K::DkdvRegsFusedDq;
      const i64 tiles = p.batch * p.kv_heads * flash::dq_row_tiles(rows);
      constexpr std::size_t kTileFloats = std::size_t(flash::kDqTileRows) * Tr::kDqk;
      float* dq_accum = static_cast<float*>(
          ctx.scratch.get(ScratchSlot::dq_accum, sizeof(float) * kTileFloats * std::size_t(tiles), ctx.stream));
      auto* dq_count = static_cast<unsigned*>(
          ctx.scratch.get(ScratchSlot::dq_count, sizeof(unsigned) * std::size_t(tiles), ctx.stream));
      if (tiles > 0) LAGA_CUDA_CHECK(cudaMemsetAsync(dq_count, 0, sizeof(unsigned) * std::size_t(tiles), ctx.stream));
      launch(ctx, flash::flash_bwd_dkdv_regs_kernel<Tr, kAligned>, "flash_bwd_dkdv_regs_kernel (fused dQ)",
             flash_grid(blocks(p.kv_len, Tr::kBlockN), p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cdelta,
             dq_accum, dq_count);
      LAGA_REQUIRE(tiles <= INT32_MAX, "attention: ", tiles, " dQ tiles exceed the grid limit");
      launch(ctx, flash::flash_bwd_dq_convert_kernel<Tr::kDqk, kAligned>, "flash_bwd_dq_convert_kernel",
             dim3(unsigned(tiles)), 256, sizeof(float) * kTileFloats, p, static_cast<const float*>(dq_accum),
             static_cast<const unsigned*>(dq_count));
      return;
    }
  }
  if constexpr (c.dkdv_regs) {
    using Tr = typename K::DkdvRegs;
    launch(ctx, flash::flash_bwd_dkdv_regs_kernel<Tr, kAligned>, "flash_bwd_dkdv_regs_kernel",
           flash_grid(blocks(p.kv_len, Tr::kBlockN), p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cdelta,
           static_cast<float*>(nullptr), static_cast<unsigned*>(nullptr));
  } else {
    using Tr = typename K::DkdvSmem;
    // Split the rows of each key block over enough blocks to fill the GPU twice (causal work is heaviest for
    // the first key blocks, which launch first); each split keeps at least 4 row tiles.
    const i64 key_blocks = blocks(p.kv_len, Tr::kBlockN);
    const i64 per_split = key_blocks * p.kv_heads * p.batch;
    const i64 want = (2 * i64(multiprocessors(ctx)) + per_split - 1) / per_split;
    const int splits = int(std::clamp<i64>(std::min<i64>(want, rows / (4 * Tr::kBlockM)), 1, 16));
    float* partial = nullptr;
    if (splits > 1)
      partial = static_cast<float*>(ctx.scratch.get(
          ScratchSlot::split_partial, sizeof(float) * splits * p.batch * p.kv_heads * p.kv_len * (Tr::kDqk + Tr::kDv),
          ctx.stream));
    launch(ctx, flash::flash_bwd_dkdv_smem_kernel<Tr, kAligned>, "flash_bwd_dkdv_smem_kernel",
           flash_grid(key_blocks * splits, p), Tr::kThreads, std::size_t(Tr::kSmemBytes), p, cdelta, splits, partial);
    if (splits > 1) {
      const i64 pairs = p.batch * p.kv_heads * p.kv_len * (Tr::kDqk + Tr::kDv) / 2;
      if (pairs > 0) {
        flash::flash_bwd_dkdv_reduce_kernel<Tr::kDqk, Tr::kDv, kAligned>
            <<<blocks(pairs, 256), 256, 0, ctx.stream>>>(p, splits, static_cast<const float*>(partial));
        LAGA_CUDA_CHECK_LAUNCH("flash_bwd_dkdv_reduce_kernel");
      }
    }
  }
  using Tq = typename K::Dq;
  launch(ctx, flash::flash_bwd_dq_kernel<Tq, kAligned>, "flash_bwd_dq_kernel",
         flash_grid(blocks(rows, Tq::kBlockM), p), Tq::kThreads, std::size_t(Tq::kSmemBytes), p, cdelta);
}

// Runtime (d_qk, d_v), V inside K and alignment to template arguments; f(Kernels<...>{}, bool_constant).
template <typename F>
void dispatch(const AttentionFwdParams& p, bool aligned, F&& f) {
  auto with_alignment = [&](auto kernels) {
    if (aligned)
      f(kernels, std::true_type{});
    else
      f(kernels, std::false_type{});
  };
  if (p.d_qk == 192 && p.d_v == 128) {
    with_alignment(Kernels<192, 128, false>{});
  } else if (p.d_qk == 576 && p.d_v == 512) {
    if (v_in_k(p))
      with_alignment(Kernels<576, 512, true>{});
    else
      with_alignment(Kernels<576, 512, false>{});
  } else {
    LAGA_REQUIRE(false, "no tensor-core attention kernel for d_qk ", p.d_qk, " and d_v ", p.d_v);
  }
}

}  // namespace

bool flash_tc_supported(const AttentionFwdParams& p) {
  return p.dtype == DType::bf16 && tile_config(int(p.d_qk), int(p.d_v), v_in_k(p)).supported;
}

void flash_tc_forward(Context& ctx, const AttentionFwdParams& p) {
  dispatch(p, fwd_aligned(p), [&](auto kernels, auto aligned) {
    forward_impl<decltype(kernels), decltype(aligned)::value>(ctx, p);
  });
}

void flash_tc_backward(Context& ctx, const AttentionBwdParams& p) {
  dispatch(p, bwd_aligned(p), [&](auto kernels, auto aligned) {
    backward_impl<decltype(kernels), decltype(aligned)::value>(ctx, p);
  });
}

}  // namespace laga::cuda
