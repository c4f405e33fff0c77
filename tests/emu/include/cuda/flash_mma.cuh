// Host emulation of src/cuda/flash_mma.cuh: one fiber per CUDA thread (a block's fibers take turns on one OS
// thread, switching at barriers), warp collectives through per-warp barriers, cp.async landing at once in even
// blocks (so a copy into a buffer still in use overwrites it) and at the wait for it in odd ones (so a missing
// wait reads stale shared memory), wgmma and bulk operations from shared memory likewise (at once, or at their
// group's wait), named barriers that fail a thread arriving twice in one generation, setmaxnreg through the block's
// register pool, strict alignment and bounds checks on every shared access of ldmatrix and cp.async.
#pragma once

#include <ucontext.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __maxnreg__(n)
#define __align__(n) alignas(n)

struct EmuDim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local EmuDim3 threadIdx, blockIdx, gridDim, blockDim;

struct uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct float2 {
  float x, y;
};
inline float2 make_float2(float a, float b) { return {a, b}; }
struct float4 {
  float x, y, z, w;
};

#define EMU_CHECK(cond, ...)                                                 \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "EMU CHECK FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fprintf(stderr, "\n");                                            \
      std::abort();                                                          \
    }                                                                        \
  } while (0)

namespace emu {
// The CUDA threads of a block are fibers (ucontext) that one OS thread runs in turn: each runs until it waits
// at a barrier (__syncthreads, or a warp collective's exchange) and the next one resumes. The thread-local
// state below is the running fiber's, set by the scheduler before each resumption.
struct Copy {
  void* dst;
  const void* src;
  int bytes;
};
// A bulk copy or reduction from shared to global memory (cp.async.bulk / cp.reduce.async.bulk), fp32.
struct Bulk {
  float* dst;
  const float* src;
  unsigned bytes;
  bool add;
};
struct Fiber {
  ucontext_t ctx;
  int thread = 0;
  bool done = false;
  std::deque<std::vector<Copy>> groups;  // committed cp.async groups, oldest first
  std::vector<Copy> open;                // cp.async not yet committed
  std::deque<std::vector<Bulk>> bulk_groups;  // committed bulk groups not yet performed (odd blocks), oldest first
  std::vector<Bulk> bulk_open;                // bulk operations not yet committed
  std::deque<std::vector<std::function<void()>>> wgmma_groups;  // committed wgmma groups not yet run (odd blocks)
  std::vector<std::function<void()>> wgmma_open;                // wgmma not yet committed
};
inline thread_local ucontext_t tl_scheduler;
inline thread_local Fiber* tl_fiber = nullptr;
// Arrivals at barriers and fibers finished: a round of the scheduler in which this does not move is a deadlock.
inline thread_local unsigned long tl_progress = 0;

inline void yield() { swapcontext(&tl_fiber->ctx, &tl_scheduler); }

// n fibers meet; the last to arrive releases the others.
class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void arrive_and_wait() {
    ++tl_progress;
    const unsigned long gen = gen_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++gen_;
      return;
    }
    while (gen_ == gen) yield();
  }

 private:
  int n_, arrived_ = 0;
  unsigned long gen_ = 0;
};

struct Warp {
  Barrier bar{32};
  std::uint32_t slot[32][8];
  float fslot[32];
};
// A named barrier (bar.sync / bar.arrive id, count): the count is given at each use.
struct NamedBarrier {
  int arrived = 0;
  int threads = 0;  // the count of the generation under way (every use of it must give the same)
  unsigned long gen = 0;
  std::vector<char> in;  // which threads have arrived in the generation under way
};
// Copies announced to an mbarrier by cp.async.mbarrier.arrive, not landed yet, and the barrier they arrive at.
struct PendingArrival {
  std::uint64_t* bar;
  std::vector<Copy> copies;
};
struct Block {
  Barrier* bar;
  char* smem;
  std::size_t smem_bytes;
  Warp* warps;
  NamedBarrier named[16];
  std::vector<PendingArrival> pending;
  long reg_pool = 0;  // registers the block's threads gave back (setmaxnreg.dec) that no thread has taken (.inc)
};
inline thread_local Block* tl_block = nullptr;
inline thread_local Warp* tl_warp = nullptr;
inline thread_local int tl_lane = 0;
inline thread_local std::deque<std::vector<Copy>>* tl_groups = nullptr;
inline thread_local std::vector<Copy>* tl_open = nullptr;

inline void check_smem(const void* p, int bytes, int align) {
  const char* c = static_cast<const char*>(p);
  EMU_CHECK(c >= tl_block->smem && c + bytes <= tl_block->smem + tl_block->smem_bytes, "smem access out of range: off %ld (block smem %zu)",
            long(c - tl_block->smem), tl_block->smem_bytes);
  EMU_CHECK((c - tl_block->smem) % align == 0, "smem misaligned: off %ld align %d", long(c - tl_block->smem), align);
}
}  // namespace emu

inline void __syncthreads() { emu::tl_block->bar->arrive_and_wait(); }
inline void __syncwarp() { emu::tl_warp->bar.arrive_and_wait(); }

namespace laga::cuda::flash {

using i64 = std::int64_t;
using u32 = std::uint32_t;
struct bf16 {
  std::uint16_t bits;
};

inline float bf16_to_float(bf16 v) {
  const u32 u = u32(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline bf16 float_to_bf16(float f) {
  u32 u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return bf16{0x7fc0};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{std::uint16_t(u >> 16)};
}
inline u32 pack_bf16(float lo, float hi) { return u32(float_to_bf16(lo).bits) | (u32(float_to_bf16(hi).bits) << 16); }

inline char* dynamic_smem() { return emu::tl_block->smem; }
inline u32 smem_u32(const void* p) {
  // Only the addresses an instruction uses are checked (ldmatrix.x2 ignores lanes 16-31's).
  return u32(static_cast<const char*>(p) - emu::tl_block->smem);
}

inline std::uint16_t smem_b16(u32 addr) {
  std::uint16_t v;
  std::memcpy(&v, emu::tl_block->smem + addr, 2);
  return v;
}

// ldmatrix: kMats 8x8 matrices, row addresses from lanes 8j..8j+7.
template <int kMats, bool kTrans>
inline void ldsm(u32* r, u32 addr) {
  emu::Warp& w = *emu::tl_warp;
  const int lane = emu::tl_lane;
  w.slot[lane][0] = addr;
  w.bar.arrive_and_wait();
  for (int j = 0; j < kMats; ++j) {
    for (int i = 0; i < 8; ++i) {
      const u32 a = w.slot[8 * j + i][0];
      emu::check_smem(emu::tl_block->smem + a, 16, 16);
    }
    std::uint16_t lo, hi;
    if (!kTrans) {
      const u32 row = w.slot[8 * j + lane / 4][0];
      lo = smem_b16(row + 2 * (2 * (lane % 4)));
      hi = smem_b16(row + 2 * (2 * (lane % 4) + 1));
    } else {
      const u32 row0 = w.slot[8 * j + 2 * (lane % 4)][0], row1 = w.slot[8 * j + 2 * (lane % 4) + 1][0];
      lo = smem_b16(row0 + 2 * (lane / 4));
      hi = smem_b16(row1 + 2 * (lane / 4));
    }
    r[j] = u32(lo) | (u32(hi) << 16);
  }
  w.bar.arrive_and_wait();
}
inline void ldsm_x4(u32 (&r)[4], u32 addr) { ldsm<4, false>(r, addr); }
inline void ldsm_x4_t(u32 (&r)[4], u32 addr) { ldsm<4, true>(r, addr); }
inline void ldsm_x2(u32 (&r)[2], u32 addr) { ldsm<2, false>(r, addr); }
// stmatrix .x4: lane l's r[j] is row l / 4, columns 2 (l % 4)..+1 of matrix j, whose row i lane 8j + i addresses.
inline void stsm_x4(u32 addr, const u32 (&r)[4]) {
  emu::Warp& w = *emu::tl_warp;
  const int lane = emu::tl_lane;
  w.slot[lane][0] = addr;
  w.bar.arrive_and_wait();
  for (int j = 0; j < 4; ++j) {
    const u32 row = w.slot[8 * j + lane / 4][0];
    emu::check_smem(emu::tl_block->smem + row, 16, 16);
    const std::uint16_t lo = std::uint16_t(r[j] & 0xffffu), hi = std::uint16_t(r[j] >> 16);
    std::memcpy(emu::tl_block->smem + row + 4 * (lane % 4), &lo, 2);
    std::memcpy(emu::tl_block->smem + row + 4 * (lane % 4) + 2, &hi, 2);
  }
  w.bar.arrive_and_wait();
}
inline void ldsm_x2_t(u32 (&r)[2], u32 addr) { ldsm<2, true>(r, addr); }

inline float lo_f(u32 v) { return bf16_to_float(bf16{std::uint16_t(v & 0xffff)}); }
inline float hi_f(u32 v) { return bf16_to_float(bf16{std::uint16_t(v >> 16)}); }

inline void mma_bf16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  emu::Warp& w = *emu::tl_warp;
  const int lane = emu::tl_lane;
  for (int i = 0; i < 4; ++i) w.slot[lane][i] = a[i];
  w.slot[lane][4] = b0;
  w.slot[lane][5] = b1;
  w.bar.arrive_and_wait();
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    const u32* s = w.slot[l];
    A[g][2 * t] = lo_f(s[0]), A[g][2 * t + 1] = hi_f(s[0]);
    A[g + 8][2 * t] = lo_f(s[1]), A[g + 8][2 * t + 1] = hi_f(s[1]);
    A[g][2 * t + 8] = lo_f(s[2]), A[g][2 * t + 9] = hi_f(s[2]);
    A[g + 8][2 * t + 8] = lo_f(s[3]), A[g + 8][2 * t + 9] = hi_f(s[3]);
    B[2 * t][g] = lo_f(s[4]), B[2 * t + 1][g] = hi_f(s[4]);
    B[2 * t + 8][g] = lo_f(s[5]), B[2 * t + 9][g] = hi_f(s[5]);
  }
  w.bar.arrive_and_wait();
  const int g = lane >> 2, t = lane & 3;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
    double acc = 0;
    for (int k = 0; k < 16; ++k) acc += double(A[row][k]) * double(B[k][col]);
    d[e] = float(double(d[e]) + acc);
  }
}

// A cp.async lands at once in even blocks (the earliest the hardware may land it, so that a copy into a buffer
// still being read, a missing wait for its release, overwrites it), and in odd blocks only at the wait for it
// (its group's wait_group, its mbarrier's wait: the latest, so that a read without that wait sees the old
// contents).
inline void cp_async_issue(void* dst, const void* src, int bytes) {
  if ((blockIdx.x & 1u) == 0)
    std::memcpy(dst, src, std::size_t(bytes));
  else
    emu::tl_open->push_back({dst, src, bytes});
}
inline void cp_async16(void* dst, const void* src) {
  emu::check_smem(dst, 16, 16);
  EMU_CHECK(reinterpret_cast<std::uintptr_t>(src) % 16 == 0, "cp.async 16 from misaligned global %p", src);
  cp_async_issue(dst, src, 16);
}
inline void cp_async4(void* dst, const void* src) {
  emu::check_smem(dst, 4, 4);
  EMU_CHECK(reinterpret_cast<std::uintptr_t>(src) % 4 == 0, "cp.async 4 from misaligned global %p", src);
  cp_async_issue(dst, src, 4);
}
inline void cp_async_commit() {
  emu::tl_groups->push_back(std::move(*emu::tl_open));
  emu::tl_open->clear();
}
template <int kPending>
inline void cp_async_wait() {
  while (int(emu::tl_groups->size()) > kPending) {
    for (const auto& c : emu::tl_groups->front()) std::memcpy(c.dst, c.src, std::size_t(c.bytes));
    emu::tl_groups->pop_front();
  }
}
inline void cp_async16_zero(void* dst, const void*) {
  emu::check_smem(dst, 16, 16);
  static const char kZero[16] = {};
  cp_async_issue(dst, kZero, 16);
}
inline void cp_async16_fill(void* dst, const void* src, bool valid) {
  if (valid)
    cp_async16(dst, src);
  else
    cp_async16_zero(dst, src);
}
inline void cp_async4_fill(void* dst, const void* src, bool valid) {
  if (valid) {
    cp_async4(dst, src);
  } else {
    emu::check_smem(dst, 4, 4);
    static const char kZero[4] = {};
    cp_async_issue(dst, kZero, 4);
  }
}
// Bulk copies and reductions from shared memory: done at once in even blocks, and in odd ones only at the wait
// for their group (bulk_wait_read / bulk_wait, as late as the hardware may read the source), so that reusing a
// source buffer before its wait sends the new contents; a thread may not exit with any left. The checks are the
// hardware's rules.
inline void bulk_check(const float* dst, const float* src, u32 bytes) {
  emu::check_smem(src, int(bytes), 16);
  EMU_CHECK(bytes % 16 == 0 && reinterpret_cast<std::uintptr_t>(dst) % 16 == 0, "bulk copy of %u bytes to %p", bytes,
            static_cast<const void*>(dst));
}
inline void bulk_perform(const emu::Bulk& op) {
  if (op.add)
    for (u32 i = 0; i < op.bytes / 4; ++i) op.dst[i] += op.src[i];
  else
    std::memcpy(op.dst, op.src, op.bytes);
}
inline void bulk_issue(float* dst, const float* src, u32 bytes, bool add) {
  bulk_check(dst, src, bytes);
  const emu::Bulk op{dst, src, bytes, add};
  if ((blockIdx.x & 1u) == 0)
    bulk_perform(op);
  else
    emu::tl_fiber->bulk_open.push_back(op);
}
inline void bulk_store(float* dst, const float* src, u32 bytes) { bulk_issue(dst, src, bytes, false); }
inline void bulk_reduce_add(float* dst, const float* src, u32 bytes) { bulk_issue(dst, src, bytes, true); }
inline void st_shared_v4(float* p, float a, float b, float c, float d) {
  emu::check_smem(p, 16, 16);
  p[0] = a, p[1] = b, p[2] = c, p[3] = d;
}
inline void lds_f2(float& a, float& b, const float* p) {
  emu::check_smem(p, 8, 8);
  a = p[0], b = p[1];
}
inline void bulk_commit() {
  emu::tl_fiber->bulk_groups.push_back(std::move(emu::tl_fiber->bulk_open));
  emu::tl_fiber->bulk_open.clear();
}
// Performs the oldest groups until at most kPending are left (reads and writes at once).
template <int kPending>
inline void bulk_wait_read() {
  auto& g = emu::tl_fiber->bulk_groups;
  while (int(g.size()) > kPending) {
    for (const auto& op : g.front()) bulk_perform(op);
    g.pop_front();
  }
}
template <int kPending>
inline void bulk_wait() {
  bulk_wait_read<kPending>();
}
inline void fence_proxy_async_global() {}
// ---------------------------------------------------------------- mbarriers and named barriers
// The mbarrier's state lives in its 8 bytes of shared memory: arrivals still due, the count, the phase.
struct EmuMbar {
  std::int32_t pending;
  std::uint16_t count;
  std::uint16_t phase;
};
static_assert(sizeof(EmuMbar) == 8);
inline EmuMbar mbar_load(std::uint64_t* bar) {
  emu::check_smem(bar, 8, 8);
  EmuMbar m;
  std::memcpy(&m, bar, 8);
  return m;
}
inline void mbar_init(std::uint64_t* bar, u32 count) {
  emu::check_smem(bar, 8, 8);
  EMU_CHECK(count > 0 && count < 65536, "mbarrier count %u", count);
  const EmuMbar m{std::int32_t(count), std::uint16_t(count), 0};
  std::memcpy(bar, &m, 8);
}
inline void mbar_arrive(std::uint64_t* bar) {
  EmuMbar m = mbar_load(bar);
  EMU_CHECK(m.count > 0, "arrival at an mbarrier that was not initialised");
  ++emu::tl_progress;
  if (--m.pending == 0) m.pending = m.count, ++m.phase;
  std::memcpy(bar, &m, 8);
}
// The copies this thread issued, then its arrival. In even blocks they have landed (cp_async_issue); in odd blocks
// they land only when some thread waits on the barrier (as late as the hardware may land them), so that a read of
// a tile without the wait sees the stage's old contents in one half of the blocks, and a copy into a stage still
// in use (a missing wait for its release) overwrites it in the other.
inline void land(const std::vector<emu::Copy>& copies) {
  for (const auto& c : copies) std::memcpy(c.dst, c.src, std::size_t(c.bytes));
}
inline void cp_async_mbar_arrive(std::uint64_t* bar) {
  std::vector<emu::Copy> copies;
  for (auto& g : *emu::tl_groups) copies.insert(copies.end(), g.begin(), g.end());
  emu::tl_groups->clear();
  copies.insert(copies.end(), emu::tl_open->begin(), emu::tl_open->end());
  emu::tl_open->clear();
  if ((blockIdx.x & 1u) == 0) {
    land(copies);
    mbar_arrive(bar);
  } else {
    emu::tl_block->pending.push_back({bar, std::move(copies)});
  }
}
inline void mbar_wait(std::uint64_t* bar, u32 parity) {
  while ((mbar_load(bar).phase & 1u) == (parity & 1u)) {
    auto& pending = emu::tl_block->pending;
    bool landed = false;
    for (std::size_t i = 0; i < pending.size();)
      if (pending[i].bar == bar) {
        land(pending[i].copies);
        mbar_arrive(bar);
        pending.erase(pending.begin() + std::ptrdiff_t(i));
        landed = true;
      } else {
        ++i;
      }
    if (!landed) emu::yield();
  }
}
// setmaxnreg moves registers between a block's warpgroups through the block's pool: a thread starts with the
// registers its launch gave it (65536 over the block's threads, down to a multiple of 8, at most 255 -> 248; what
// ptxas gives a kernel whose __launch_bounds__ allow one block per SM), .dec gives the difference back and .inc
// waits until the pool holds what it takes, so a split that takes more than the others gave back never finishes.
inline long launch_regs() {
  const long r = 65536 / long(blockDim.x) / 8 * 8;
  return r < 248 ? r : 248;
}
template <int kRegs>
inline void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in 24..256");
  EMU_CHECK(kRegs <= launch_regs(), "setmaxnreg.dec to %d registers from %ld", kRegs, launch_regs());
  emu::tl_block->reg_pool += launch_regs() - kRegs;
  ++emu::tl_progress;
}
template <int kRegs>
inline void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes a multiple of 8 in 24..256");
  EMU_CHECK(kRegs >= launch_regs(), "setmaxnreg.inc to %d registers from %ld", kRegs, launch_regs());
  while (emu::tl_block->reg_pool < kRegs - launch_regs()) emu::yield();
  emu::tl_block->reg_pool -= kRegs - launch_regs();
}
// A thread arriving twice before the barrier completes, or two counts in one generation, would miscount on the
// GPU: both are failures here.
inline void named_bar_arrive(int id, int threads) {
  EMU_CHECK(id > 0 && id < 16 && threads % 32 == 0, "named barrier %d over %d threads", id, threads);
  emu::NamedBarrier& b = emu::tl_block->named[id];
  ++emu::tl_progress;
  if (b.arrived == 0) b.threads = threads, b.in.assign(blockDim.x, 0);
  EMU_CHECK(b.threads == threads, "named barrier %d used over %d and %d threads at once", id, b.threads, threads);
  EMU_CHECK(!b.in[threadIdx.x], "thread %u arrives twice at named barrier %d before it completes", threadIdx.x, id);
  b.in[threadIdx.x] = 1;
  if (++b.arrived == threads) b.arrived = 0, ++b.gen;
}
inline void named_bar_sync(int id, int threads) {
  const unsigned long gen = emu::tl_block->named[id].gen;
  named_bar_arrive(id, threads);
  while (emu::tl_block->named[id].gen == gen) emu::yield();
}
inline void store_zero16(void* dst) {
  emu::check_smem(dst, 16, 16);
  std::memset(dst, 0, 16);
}
inline void copy8_unaligned(void* dst, const bf16* src) {
  emu::check_smem(dst, 16, 16);
  std::memcpy(dst, src, 16);
}
inline bool warp_any(bool p) {
  emu::Warp& w = *emu::tl_warp;
  w.fslot[emu::tl_lane] = p ? 1.f : 0.f;
  w.bar.arrive_and_wait();
  bool any = false;
  for (int l = 0; l < 32; ++l) any = any || w.fslot[l] != 0.f;
  w.bar.arrive_and_wait();
  return any;
}
inline float shfl_xor(float v, int mask) {
  emu::Warp& w = *emu::tl_warp;
  w.fslot[emu::tl_lane] = v;
  w.bar.arrive_and_wait();
  const float r = w.fslot[emu::tl_lane ^ mask];
  w.bar.arrive_and_wait();
  return r;
}

}  // namespace laga::cuda::flash

namespace emu {
inline thread_local const std::function<void()>* tl_body = nullptr;
inline void fiber_main() {
  (*tl_body)();
  EMU_CHECK(tl_fiber->bulk_groups.empty() && tl_fiber->bulk_open.empty(),
            "thread %u exits before its bulk operations have read shared memory (no bulk wait)", threadIdx.x);
  EMU_CHECK(tl_fiber->wgmma_groups.empty() && tl_fiber->wgmma_open.empty(),
            "thread %u exits with wgmma groups not waited for", threadIdx.x);
  tl_fiber->done = true;
  ++tl_progress;
  swapcontext(&tl_fiber->ctx, &tl_scheduler);  // never resumed
}

// How many blocks of a grid are resident at once: 1 runs them one after another in grid order (a block that
// waits for a later one then waits forever, as it could on the GPU); n > 1 admits them in grid order as
// resident ones finish, their fibers taking turns together, as a persistent grid of n blocks runs on n SMs.
inline int resident_blocks = 1;

// Runs kernel(args...) over the grid (blockIdx.x fastest), one fiber per CUDA thread, resident_blocks blocks at a
// time.
template <class K, class... Args>
void launch(K kernel, EmuDim3 grid, int threads, std::size_t smem_bytes, Args... args) {
  constexpr std::size_t kStack = std::size_t(256) << 10;
  struct Run {  // a resident block
    EmuDim3 idx;
    std::vector<char> smem;
    std::unique_ptr<char[]> stacks;  // pages touched as used
    std::unique_ptr<Barrier> bar;
    std::vector<Warp> warps;
    std::unique_ptr<Block> blk;
    std::vector<Fiber> fibers;
    int live = 0;
  };
  const std::function<void()> body = [&] { kernel(args...); };
  std::vector<EmuDim3> order;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) order.push_back({bx, by, bz});
  const std::size_t resident = std::size_t(resident_blocks > 1 ? resident_blocks : 1);
  std::vector<std::unique_ptr<Run>> runs;
  std::vector<std::unique_ptr<char[]>> spare;  // finished blocks' stacks, for the next ones
  std::size_t next = 0;
  auto admit = [&] {
    auto r = std::make_unique<Run>();
    r->idx = order[next++];
    // Poison: bf16 NaN pairs (also a float NaN).
    r->smem.assign(smem_bytes + 16, 0);
    for (std::size_t i = 0; i + 1 < r->smem.size(); i += 2) r->smem[i] = char(0xc0), r->smem[i + 1] = char(0x7f);
    if (spare.empty()) {
      r->stacks.reset(new char[kStack * std::size_t(threads)]);
    } else {
      r->stacks = std::move(spare.back());
      spare.pop_back();
    }
    r->bar = std::make_unique<Barrier>(threads);
    r->warps = std::vector<Warp>(std::size_t(threads / 32));
    r->blk = std::make_unique<Block>(Block{r->bar.get(), r->smem.data(), smem_bytes, r->warps.data()});
    r->fibers = std::vector<Fiber>(static_cast<std::size_t>(threads));
    for (int t = 0; t < threads; ++t) {
      Fiber& f = r->fibers[std::size_t(t)];
      f.thread = t;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = r->stacks.get() + kStack * std::size_t(t);
      f.ctx.uc_stack.ss_size = kStack;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, fiber_main, 0);
    }
    r->live = threads;
    runs.push_back(std::move(r));
  };
  auto finish = [&](const Run& r) {
    const unsigned bx = r.idx.x;
    EMU_CHECK(r.blk->pending.empty(), "block %u: %zu cp.async arrivals at mbarriers nobody waited on", bx,
              r.blk->pending.size());
    for (int id = 1; id < 16; ++id)
      EMU_CHECK(r.blk->named[id].arrived == 0, "block %u: named barrier %d left with %d arrivals nobody synced on", bx,
                id, r.blk->named[id].arrived);
  };
  tl_body = &body;
  gridDim = grid;
  blockDim = {unsigned(threads), 1, 1};
  // Each round resumes every live fiber of every resident block once, in thread order or in reverse (alternating
  // with the round and the block), so a read that a missing barrier leaves racing with another thread's write sees
  // the value before the write in half of the blocks.
  for (unsigned long round = 0;; ++round) {
    while (runs.size() < resident && next < order.size()) admit();
    if (runs.empty()) break;
    const unsigned long before = tl_progress;
    for (auto& r : runs) {
      tl_block = r->blk.get();
      blockIdx = r->idx;
      const bool reverse = ((round + r->idx.x) & 1) != 0;
      r->live = 0;
      for (int i = 0; i < threads; ++i) {
        Fiber& f = r->fibers[std::size_t(reverse ? threads - 1 - i : i)];
        if (f.done) continue;
        tl_fiber = &f;
        tl_warp = &r->warps[std::size_t(f.thread / 32)];
        tl_lane = f.thread % 32;
        tl_groups = &f.groups;
        tl_open = &f.open;
        threadIdx = {unsigned(f.thread), 0, 0};
        swapcontext(&tl_scheduler, &f.ctx);
        r->live += !f.done;
      }
    }
    int live = 0;
    for (const auto& r : runs) live += r->live;
    EMU_CHECK(live == 0 || tl_progress != before, "block %u: %d threads wait at barriers that the others never reach",
              runs.front()->idx.x, live);
    for (std::size_t i = 0; i < runs.size();)
      if (runs[i]->live == 0) {
        finish(*runs[i]);
        spare.push_back(std::move(runs[i]->stacks));
        runs.erase(runs.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
  }
}
}  // namespace emu

// ---------------------------------------------------------------- wgmma emulation
namespace laga::cuda::flash {
inline std::uint64_t wgmma_desc_sw128(u32 addr) {
  return std::uint64_t((addr & 0x3FFFF) >> 4) | (std::uint64_t(1) << 16) | (std::uint64_t(1024 >> 4) << 32) |
         (std::uint64_t(1) << 62);
}
// wgmma runs at once in even blocks, and in odd ones only at the wait for its group (as late as the hardware may
// read its operands and write its accumulator), so that an accumulator read before the wait, or a shared operand
// replaced before it, gives wrong results. A register operand (RS) is read at issue.
inline void wgmma_fence() {}
template <class F>
inline void wgmma_issue(F&& f) {
  if ((blockIdx.x & 1u) == 0)
    f();
  else
    emu::tl_fiber->wgmma_open.emplace_back(std::forward<F>(f));
}
inline void wgmma_commit() {
  emu::tl_fiber->wgmma_groups.push_back(std::move(emu::tl_fiber->wgmma_open));
  emu::tl_fiber->wgmma_open.clear();
}
template <int kPending>
inline void wgmma_wait() {
  auto& g = emu::tl_fiber->wgmma_groups;
  while (int(g.size()) > kPending) {
    auto group = std::move(g.front());
    g.pop_front();
    for (auto& op : group) op();
  }
}
inline void fence_proxy_async() {}
inline float exp2_approx(float x) {  // ex2.approx.ftz.f32: subnormal results flushed to zero
  const float y = std::exp2(x);
  return std::fpclassify(y) == FP_SUBNORMAL ? 0.f : y;
}
inline void sched_sink(float* slot, float a, float b) { slot[0] = a, slot[1] = b; }
inline void reg_fence(float&) {}
// Element (row, k) of a K-major operand in the 128-byte swizzle: address bits 4-6 XOR bits 7-9.
inline float wgmma_elem(std::uint64_t desc, int row, int k) {
  EMU_CHECK((desc >> 62) == 1, "only the 128-byte swizzle is emulated");
  const u32 start = u32(desc & 0x3FFF) << 4, sbo = u32((desc >> 32) & 0x3FFF) << 4;
  const u32 addr = start + u32(row / 8) * sbo + u32(row % 8) * 128 + u32(k) * 2;
  const u32 phys = addr ^ (((addr >> 7) & 7u) << 4);
  emu::check_smem(emu::tl_block->smem + phys, 2, 2);
  return bf16_to_float(bf16{smem_b16(phys)});
}
// Element (row, k) of an operand's K-major tile, or (kTrans) element (k, row) of its MN-major one.
template <int kTrans>
inline float wgmma_operand(std::uint64_t desc, int row, int k);
template <int kTransA, int kTransB, int N>
inline void emu_wgmma_ss(float (&d)[N / 8][4], std::uint64_t desc_a, std::uint64_t desc_b, int accumulate, int scale_b) {
  const int t = int(threadIdx.x) % 128, w = t / 32, lane = t % 32;
  for (int n = 0; n < N / 8; ++n)
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + lane / 4 + 8 * (e >> 1), col = 8 * n + 2 * (lane % 4) + (e & 1);
      double acc = 0;
      for (int k = 0; k < 16; ++k)
        acc += double(wgmma_operand<kTransA>(desc_a, row, k)) * double(wgmma_operand<kTransB>(desc_b, col, k));
      d[n][e] = float((accumulate ? double(d[n][e]) : 0.0) + scale_b * acc);
    }
}
// SS with each operand K-major (0) or MN-major (1), and RS with B transposed, at any N (flash_mma.cuh's names).
template <int N, int kTransA, int kTransB, int kScaleB = 1>
inline void wgmma_ss(float (&d)[N / 8][4], std::uint64_t a, std::uint64_t b, int acc) {
  static_assert((kTransA == 0 || kTransA == 1) && (kTransB == 0 || kTransB == 1), "K-major (0) or MN-major (1)");
  static_assert(kScaleB == 1 || kScaleB == -1, "wgmma's B scale is 1 or -1");
  wgmma_issue([&d, a, b, acc] { emu_wgmma_ss<kTransA, kTransB, N>(d, a, b, acc, kScaleB); });
}
}  // namespace laga::cuda::flash

namespace laga::cuda::flash {
inline std::uint64_t wgmma_desc_sw128_mn(u32 addr, u32 slab_bytes) {
  return std::uint64_t((addr & 0x3FFFF) >> 4) | (std::uint64_t((slab_bytes >> 4) & 0x3FFF) << 16) |
         (std::uint64_t(1024 >> 4) << 32) | (std::uint64_t(1) << 62);
}
// Element (k, n) of an MN-major operand in the 128-byte swizzle.
inline float wgmma_elem_mn(std::uint64_t desc, int k, int n) {
  EMU_CHECK((desc >> 62) == 1, "only the 128-byte swizzle is emulated");
  const u32 start = u32(desc & 0x3FFF) << 4, lbo = u32((desc >> 16) & 0x3FFF) << 4, sbo = u32((desc >> 32) & 0x3FFF) << 4;
  const u32 addr = start + u32(n / 64) * lbo + u32(k / 8) * sbo + u32(k % 8) * 128 + u32(n % 64) * 2;
  const u32 phys = addr ^ (((addr >> 7) & 7u) << 4);
  emu::check_smem(emu::tl_block->smem + phys, 2, 2);
  return bf16_to_float(bf16{smem_b16(phys)});
}
template <int kTrans>
inline float wgmma_operand(std::uint64_t desc, int row, int k) {
  return kTrans ? wgmma_elem_mn(desc, k, row) : wgmma_elem(desc, row, k);
}
template <int N>
inline void emu_wgmma_rs_tb(float (&d)[N / 8][4], const u32 (&a)[4], std::uint64_t desc_b, int accumulate) {
  emu::Warp& w = *emu::tl_warp;
  const int lane = emu::tl_lane;
  for (int i = 0; i < 4; ++i) w.slot[lane][i] = a[i];
  w.bar.arrive_and_wait();
  float A[16][16];  // the warp's 16 rows
  for (int l = 0; l < 32; ++l) {
    const int g = l >> 2, t = l & 3;
    const u32* s = w.slot[l];
    A[g][2 * t] = lo_f(s[0]), A[g][2 * t + 1] = hi_f(s[0]);
    A[g + 8][2 * t] = lo_f(s[1]), A[g + 8][2 * t + 1] = hi_f(s[1]);
    A[g][2 * t + 8] = lo_f(s[2]), A[g][2 * t + 9] = hi_f(s[2]);
    A[g + 8][2 * t + 8] = lo_f(s[3]), A[g + 8][2 * t + 9] = hi_f(s[3]);
  }
  w.bar.arrive_and_wait();
  for (int n = 0; n < N / 8; ++n)
    for (int e = 0; e < 4; ++e) {
      const int row = lane / 4 + 8 * (e >> 1), col = 8 * n + 2 * (lane % 4) + (e & 1);
      double acc = 0;
      for (int k = 0; k < 16; ++k) acc += double(A[row][k]) * double(wgmma_elem_mn(desc_b, k, col));
      d[n][e] = float((accumulate ? double(d[n][e]) : 0.0) + acc);
    }
}
template <int N>
inline void wgmma_rs_tb(float (&d)[N / 8][4], const u32 (&a)[4], std::uint64_t b, int acc) {
  wgmma_issue([&d, a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], b, acc] {
    const u32 a[4] = {a0, a1, a2, a3};
    emu_wgmma_rs_tb<N>(d, a, b, acc);
  });
}
}  // namespace laga::cuda::flash

namespace laga::cuda::flash {
inline float lo_bf16(u32 v) { return lo_f(v); }
inline float hi_bf16(u32 v) { return hi_f(v); }
}  // namespace laga::cuda::flash

// ---------------------------------------------------------------- ordered accumulation in global memory
// Blocks run one after another in grid order (emu::resident_blocks = 1), so a block that would wait for a counter
// that only a later block advances would wait forever on the GPU too (its predecessors launch first): the
// scheduler fails the run when no fiber moves. A persistent grid's blocks run together (resident_blocks = its
// size) and wait for each other's counters; a block's warps may also wait for the counts of its other warps.
namespace laga::cuda::flash {
inline void st_global_v4(float* p, float a, float b, float c, float d) {
  EMU_CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "st.global.v4 misaligned");
  p[0] = a, p[1] = b, p[2] = c, p[3] = d;
}
inline long long opaque(long long v) { return v; }
inline void ld_global_cg_v4(const float* p, float (&v)[4]) {
  EMU_CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "ld.global.v4 misaligned");
  v[0] = p[0], v[1] = p[1], v[2] = p[2], v[3] = p[3];
}
inline void red_add_v4(float* p, float a, float b, float c, float d) {
  EMU_CHECK(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, "red.global.v4 misaligned");
  p[0] += a, p[1] += b, p[2] += c, p[3] += d;
}
inline void store_or_add_v4(float* p, bool store, float a, float b, float c, float d) {
  if (store)
    st_global_v4(p, a, b, c, d);
  else
    red_add_v4(p, a, b, c, d);
}
template <bool kBounded = true>
inline void wait_counter(const unsigned* counter, unsigned value, bool at_least = false) {
  auto load = [&] { return std::atomic_ref<unsigned>(*const_cast<unsigned*>(counter)).load(std::memory_order_acquire); };
  // Other fibers (of this block, or of the other resident ones) may still advance it: wait, the scheduler failing
  // the run if no fiber moves.
  while (!(at_least ? load() >= value : load() == value)) emu::yield();
}
inline unsigned take_ticket(unsigned* counter) {
  return std::atomic_ref<unsigned>(*counter).fetch_add(1, std::memory_order_relaxed);
}
inline void release_counter(unsigned* counter) {
  ++emu::tl_progress;
  std::atomic_ref<unsigned>(*counter).fetch_add(1, std::memory_order_release);
}
inline void release_counter_if(bool on, unsigned* counter) {
  if (on) release_counter(counter);
}
}  // namespace laga::cuda::flash
