// The CUDA backend: bf16 (storage; fp32 accumulation) and f32 on one NVIDIA GPU. No CUDA header is
// included here, so any translation unit may ask whether a GPU is there and make the backend.
// Built without CUDA (no nvcc at configure time), cuda_available() is false and make_cuda_backend throws.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "laga/attention_provider.hpp"
#include "laga/backend.hpp"

namespace laga {

// True when laga was built with CUDA and at least one device can be used.
bool cuda_available();

// Number of usable devices (0 without CUDA, driver or device).
int cuda_device_count();

// A backend on device `device`: its own stream, cuBLASLt handle and workspace, and an allocator that counts
// device bytes. Throws InvalidArgument when built without CUDA or when the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);

// ---- what other components need from a CUDA backend (the NCCL communicator, the CLI's reports) ----
// Each throws InvalidArgument when `backend` is not a CUDA backend (or laga was built without CUDA).

// The backend's stream (a cudaStream_t): every op of the backend is queued on it, so collectives queued
// on it are ordered with the ops.
void* cuda_stream(Backend& backend);
// The device the backend runs on.
int cuda_device_of(Backend& backend);

// Device memory as the driver sees it (cudaMemGetInfo): used = total - free, all processes and contexts on
// the device included (ranks sharing one GPU see each other's memory).
struct CudaMemInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  std::size_t used_bytes() const { return total_bytes - free_bytes; }
};
CudaMemInfo cuda_mem_info(int device);

// The device's name ("NVIDIA H200"); throws InvalidArgument for a device that does not exist.
std::string cuda_device_name(int device);
// Its streaming multiprocessors (132 on an H200); throws InvalidArgument for a device that does not exist.
int cuda_multiprocessor_count(int device);

// High-water mark of cudaMemGetInfo's used bytes on the backend's device, sampled after every allocation
// the backend's allocator makes and every growth of its kernel scratch (below); device memory only grows at
// an allocation, so this is the peak of what the backend allocates (the cuBLASLt workspace is allocated with
// the backend). reset sets it to the current used bytes.
std::size_t cuda_peak_used_bytes(Backend& backend);
void cuda_reset_peak_used(Backend& backend);

// ---- kernel scratch: device buffers the backend keeps outside its accounting allocator ----
// One buffer per purpose ("slot"), grown on demand and kept: eager attention's fp32 scores (and dP, dS in
// its backward), the eager backward's gathered Q / dO and split dK sum, the fused backward's D and 576/512
// split partials, RMSNorm's dgamma partials. Not in the allocator's figures nor in `laga plan`'s; in the
// device's (cuda_peak_used_bytes). Eager attention processes its heads (or one head's query rows) in chunks
// so that the "scores" slot stays at or under the backend's eager scratch cap (at least one query row:
// 4 * kv_len bytes forward, 4 * kv_len rounded up to 256 plus kv_len elements backward).
struct CudaScratchSlot {
  std::string name;
  std::size_t held_bytes = 0;  // allocated now
  std::size_t peak_bytes = 0;  // largest allocation since the backend was made or the last reset
};
struct CudaScratchInfo {
  std::size_t held_bytes = 0;  // sum over slots, now
  std::size_t peak_bytes = 0;  // high-water mark of that sum since the backend was made or the last reset
  std::vector<CudaScratchSlot> slots;
};
CudaScratchInfo cuda_scratch_info(Backend& backend);
std::size_t cuda_scratch_peak_bytes(Backend& backend);  // cuda_scratch_info(backend).peak_bytes
// Sets the high-water marks to the bytes held now; with `release`, first frees every scratch buffer (after
// the backend's queued work), so the marks restart from 0 and the next op allocates what it needs.
void cuda_reset_scratch_peak(Backend& backend, bool release = false);

// The cap on eager attention's score scratch, in bytes. A new backend takes cuda_default_eager_scratch_cap():
// the environment variable LAGA_CUDA_SCRATCH_CAP (bytes, or with a K, M or G suffix, powers of 1024), read
// once per process, or 1 GiB when it is unset (an invalid value makes backend creation throw
// InvalidArgument). Chunking can change which cuBLASLt algorithm runs a GEMM, so results can differ in the
// last bits between caps (within the usual tolerances); a given cap always gives the same bits.
std::size_t cuda_default_eager_scratch_cap();
std::size_t cuda_eager_scratch_cap(Backend& backend);
void cuda_set_eager_scratch_cap(Backend& backend, std::size_t bytes);

// How the tensor-core backward of the 192/128 attention (explicit MLA, LAGA) forms dQ: `true` (the default)
// adds it up inside the dK/dV kernel, the key blocks of each row tile in a fixed order (reproducible; no dQ
// kernel recomputing S and dP); `false` runs the separate dQ kernel. dK and dV are the same bits either way;
// dQ agrees within bf16 rounding. A new backend takes cuda_default_flash_fused_dq(): the environment variable
// LAGA_CUDA_FLASH_DQ ("fused" or "separate"), read once per process, else fused (another value makes backend
// creation throw InvalidArgument).
bool cuda_default_flash_fused_dq();
bool cuda_flash_fused_dq(Backend& backend);
void cuda_set_flash_fused_dq(Backend& backend, bool fused);

// How many blocks share each key block's rows in the 576/512 (absorbed MLA) tensor-core backward, their fp32
// dK/dV partials summed in split order afterwards; with the rows resident (cuda_set_flash_vk_rows), how many
// copies of the fp32 key tiles the row tiles add into, round robin, summed in copy order afterwards. 0 (the
// default) chooses per shape, 1 to 16 fixes it (for timing the choice; another value throws InvalidArgument).
// Every count gives results within bf16 rounding of the others, and a given count always the same bits.
int cuda_flash_row_splits(Backend& backend);
void cuda_set_flash_row_splits(Backend& backend, int splits);

// Which tensor-core kernel runs the 192/128 attention forward: `true` (the default) the warp-specialised one
// (a loading warpgroup and two computing warpgroups taking turns at the tensor cores, 128 x 128 tiles; 1.5-1.6x
// the other on an H200), `false` the single-warpgroup one (128 x 64 tiles, two blocks per SM). Both write the same
// O within bf16 rounding and the same log-sum-exp within float rounding; each is deterministic.
bool cuda_flash_ws_forward(Backend& backend);
void cuda_set_flash_ws_forward(Backend& backend, bool warp_specialized);

// How many blocks the warp-specialised 192/128 forward launches: its grid is persistent, each block taking the
// next untaken row tile when it finishes one (a row tile's loads overlap the previous one's last products and
// output). 0 (the default) one block per SM; n > 0 at most n, and n at least the row tiles gives one block per row
// tile, as a grid that is not persistent (for timing the two). Every count gives the same bits; a negative one
// throws InvalidArgument.
int cuda_flash_forward_blocks(Backend& backend);
void cuda_set_flash_forward_blocks(Backend& backend, int blocks);

// The order in which the warp-specialised 192/128 forward's blocks take row tiles: the (kv head, batch entry)
// pairs in groups of n, each group's row tiles longest first (the tile slowest, the head fastest) before the
// next group's, so the blocks at work at a time read the K and V of about n heads from L2. 0 (the default) 4
// (on an H200 1-4% faster than 16 at S = 8k-32k with 16 or 128 heads, 8-13% at 128 heads x 4k queries over 32k
// keys); n > 0 for timing another order (1: one head's row tiles after another's). Every order gives the same
// bits; a negative n throws InvalidArgument.
int cuda_flash_forward_head_group(Backend& backend);
void cuda_set_flash_forward_head_group(Backend& backend, int heads);

// Which kernel runs the 192/128 tensor-core backward with dQ fused, for MHA on 16-byte aligned views: `true` (the
// default) the warp-specialised one (a loading warpgroup whose loads run a step ahead, dQ added by bulk reductions
// from shared memory), `false` flash_bwd_dkdv_regs_kernel. The same dK and dV bits either way, dQ within float
// rounding; each is deterministic.
bool cuda_flash_ws_backward(Backend& backend);
void cuda_set_flash_ws_backward(Backend& backend, bool warp_specialized);

// How many blocks the warp-specialised 192/128 backward launches. Its grid is persistent: each block takes the next
// untaken key block (128 keys), in the order a grid of a block per key block would issue them, once it has issued
// the loads of the one it walks (a key block's first rows load under the previous one's last steps, its V after
// their last dP^T, its K after their last dQ^T). 0 (the default) one block per SM; n > 0 at most n, and n at least
// the key blocks gives a block per key block, on the kernel's instantiation that is not persistent (for timing
// the two; 1-4% slower on an H200 at S = 8k-32k). Every count gives the same bits (dQ's in the deterministic
// mode); a negative one throws InvalidArgument. A new backend takes cuda_default_flash_backward_blocks(device):
// the environment variable LAGA_CUDA_FLASH_BACKWARD_BLOCKS (a count, or "sm" for the device's SM count), read
// once per process, else 0 (another value makes backend creation throw InvalidArgument). Measurement documents
// record the count (attention_calls.backward_blocks).
int cuda_default_flash_backward_blocks(int device);
int cuda_flash_backward_blocks(Backend& backend);
void cuda_set_flash_backward_blocks(Backend& backend, int blocks);

// The order in which the warp-specialised 192/128 backward takes key blocks, as the forward's head group: the
// (kv head, batch entry) pairs in groups of n, each group's key blocks first to last (the key block slowest, the
// head fastest) before the next group's. Fewer heads at a time share each head's Q and dO in L2 among more
// blocks; more heads put fewer of a head's key blocks at work together, so fewer wait for the one before them to
// add its dQ (the deterministic mode). 0 (the default) chooses: 8 (on an H200 a third of 16's HBM bytes at S = 32k
// and 1-4% faster under sustained load; 4 lost 16% at 128 heads x 2k queries over 16k keys in the fixed order),
// more in the fixed order where a head's rows are few (8 x 2^k, the least with SMs / heads <= its 64-row tiles: 32
// at 128 heads x 512 queries); n > 0 for timing another order. Every order gives the same bits; a negative n throws
// InvalidArgument.
int cuda_flash_backward_head_group(Backend& backend);
void cuda_set_flash_backward_head_group(Backend& backend, int heads);

// Which kernel runs the 576/512 tensor-core backward that sums dK + [dV, 0] (absorbed MLA, V inside K): `true`
// (the default) flash_bwd_vkq_kernel (a block per row tile, dQ in registers, dK + dV added up in fp32 key tiles;
// it loads K once a step where the other loads Q and dO; 1.3-1.6x the other on an H200), `false`
// flash_bwd_vk_kernel (a block per key block, dK + dV in registers, dQ added up in fp32 row tiles). dK + [dV, 0]
// and dQ agree within bf16 rounding; each is deterministic.
bool cuda_flash_vk_rows(Backend& backend);
void cuda_set_flash_vk_rows(Backend& backend, bool rows_resident);

// ---- attention providers (laga/attention_provider.hpp) ----
// Who runs the backend's fused attention calls: laga's kernels, cuDNN, or `auto` (per call, by the built-in
// table of measured times; laga where cuDNN cannot run the shape or is not available, and where cuDNN's
// workspace would exceed the scratch cap (cuda_eager_scratch_cap): its deterministic backward keeps 2 bytes per
// (head, query, key), 8 GiB at DeepSeek-V3 S = 16k, P = 8). A new backend takes
// laga; the CLI's --attention-provider defaults to auto. The eager kernel is laga's under every provider.
// With `cudnn`, a call cuDNN cannot run throws InvalidArgument naming the shape and the reason.
void cuda_set_attention_provider(Backend& backend, AttentionProvider provider);
AttentionProvider cuda_attention_provider(Backend& backend);
// Whether attention runs deterministically (the default: reruns bitwise identical). false lets the backward sum
// dQ in any order (reruns differ in its last bits): cuDNN runs its default backward, as PyTorch's SDPA does (dQ
// summed with float32 atomics, faster, a workspace of O(heads x queries) instead of O(heads x queries x keys),
// so `auto` can take cuDNN at long sequences, within the scratch cap), and laga's own backwards add their
// float32 sums across blocks without waiting for the blocks before them: the warp-specialised 192/128 kernel's
// dQ (its dK and dV, each written by one block, keep their bits), the rows-resident 576/512 kernel's dK + [dV,
// 0] (its dQ keeps its bits).
void cuda_set_attention_deterministic(Backend& backend, bool deterministic);
bool cuda_attention_deterministic(Backend& backend);

// cuDNN as this process sees it (the library is opened at the first question): built in, loaded, the
// version loaded (cudnnGetVersion, 91400 = 9.14.0) and the one built against; `error` says why not.
struct CudnnInfo {
  bool compiled = false, loaded = false;
  long version = 0, compiled_version = 0;
  std::string error;
};
CudnnInfo cuda_cudnn_info();

// Attention calls (forward and backward counted apart) each provider ran on this backend since it was made
// or last reset; `fallbacks`: calls `auto` would have given cuDNN but cuDNN had no plan for (the last reason
// in `last_fallback`). cudnn_graphs: cuDNN graphs built (one per shape and direction, cached).
struct AttentionProviderCounts {
  std::size_t laga_forward = 0, laga_backward = 0, cudnn_forward = 0, cudnn_backward = 0, fallbacks = 0;
  std::size_t cudnn_graphs = 0;
  std::string last_fallback;
};
AttentionProviderCounts cuda_attention_provider_counts(Backend& backend);
void cuda_reset_attention_provider_counts(Backend& backend);

}  // namespace laga
