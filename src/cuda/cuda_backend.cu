// The CUDA backend: allocator, stream, cuBLASLt runner, and the Backend ops (each a thin host function over
// the kernels of cuda_ops.cu, cuda_attention.cu and cuda_flash.cu). All work of one backend is queued on
// its own stream; synchronize() and the host transfers wait for it.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda_attention.cuh"
#include "cuda/cuda_common.cuh"
#include "cuda/cuda_gemm.cuh"
#include "cuda/cuda_ops.cuh"
#include "cuda/cudnn_attention.hpp"
#include "laga/cuda.hpp"
#include "laga/hosted.hpp"

namespace laga {
namespace cuda {

const char* scratch_slot_name(ScratchSlot s) {
  switch (s) {
    case ScratchSlot::scores: return "scores";
    case ScratchSlot::gather_q: return "gather_q";
    case ScratchSlot::gather_do: return "gather_do";
    case ScratchSlot::dk_accum: return "dk_accum";
    case ScratchSlot::delta: return "delta";
    case ScratchSlot::split_partial: return "split_partial";
    case ScratchSlot::dq_accum: return "dq_accum";
    case ScratchSlot::dq_count: return "dq_count";
    case ScratchSlot::taken: return "taken";
    case ScratchSlot::dv_sum: return "dv_sum";
    case ScratchSlot::norm_partial: return "norm_partial";
    case ScratchSlot::gemm_fallback: return "gemm_fallback";
    case ScratchSlot::cudnn_workspace: return "cudnn_workspace";
    case ScratchSlot::count: break;
  }
  return "?";
}

Scratch::Scratch() : bufs_(static_cast<std::size_t>(ScratchSlot::count)) {}

Scratch::~Scratch() {
  for (const auto* list : {&bufs_, &kept_})
    for (const auto& b : *list)
      if (b.ptr) (void)free_now(b);  // a destructor does not throw: a failed cudaFree is dropped
}

cudaError_t Scratch::free_now(const Buf& b) {
  if (!hosted) return cudaFree(b.ptr);
  hosted->free(b.id, b.ptr);
  return cudaSuccess;
}

void Scratch::free_buf(Buf& b) {
  if (b.captured) {
    kept_.push_back(b);
  } else {
    LAGA_CUDA_CHECK(free_now(b));
    held_ -= b.bytes;
  }
  b.ptr = nullptr;
  b.bytes = 0;
  b.id = 0;
  b.captured = false;
}

void* Scratch::get(ScratchSlot slot, std::size_t bytes, cudaStream_t stream) {
  Buf& b = bufs_.at(static_cast<std::size_t>(slot));
  bytes = std::max<std::size_t>(bytes, 256);  // never null: empty problems still get a valid pointer
  const bool capturing = stream_capturing(stream);
  if (b.bytes >= bytes) {
    b.captured = b.captured || capturing;
    return b.ptr;
  }
  LAGA_REQUIRE(!capturing, "kernel scratch '", scratch_slot_name(slot), "' must grow from ", b.bytes, " to ", bytes,
               " bytes while a CUDA graph is being captured, which cannot allocate: run the captured work once "
               "before capturing it (laga's buffers then have their size)");
  if (b.ptr) {
    LAGA_CUDA_CHECK(cudaStreamSynchronize(stream));
    free_buf(b);
  }
  if (hosted) {
    b.id = hosted->allocate(bytes, std::string("scratch.") + scratch_slot_name(slot), MemoryKind::External, &b.ptr);
  } else {
    LAGA_CUDA_CHECK(cudaMalloc(&b.ptr, bytes));
  }
  b.bytes = bytes;
  b.peak = std::max(b.peak, bytes);
  held_ += bytes;
  peak_ = std::max(peak_, held_);
  if (on_grow) on_grow(on_grow_user);
  return b.ptr;
}

void Scratch::release(cudaStream_t stream) {
  bool any = false;
  for (const auto& b : bufs_) any = any || b.ptr;
  if (!any) return;
  LAGA_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (auto& b : bufs_)
    if (b.ptr) free_buf(b);
}

void Scratch::reset_peak() {
  for (auto& b : bufs_) b.peak = b.bytes;
  peak_ = held_;
}

namespace {

// LAGA_CUDA_SCRATCH_CAP: bytes, or a number with a K, M or G suffix (powers of 1024; "512M", "2G").
std::size_t parse_scratch_cap(const char* text) {
  const std::string t(text);
  std::size_t used = 0;
  unsigned long long v = 0;
  bool ok = !t.empty() && t[0] >= '0' && t[0] <= '9';
  if (ok) {
    try {
      v = std::stoull(t, &used);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  unsigned shift = 0;
  if (ok && used < t.size()) {
    const char u = t[used];
    shift = (u == 'k' || u == 'K') ? 10 : (u == 'm' || u == 'M') ? 20 : (u == 'g' || u == 'G') ? 30 : 64;
    ok = shift < 64 && used + 1 == t.size() && v <= (~0ULL >> shift);
  }
  LAGA_REQUIRE(ok, "LAGA_CUDA_SCRATCH_CAP = '", t, "': expected a byte count, optionally with a K, M or G suffix");
  return static_cast<std::size_t>(v << shift);
}

}  // namespace

namespace {

// Sets the backend's device for the current thread for the lifetime of a call.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) { LAGA_CUDA_CHECK(cudaSetDevice(device)); }
};

// Tensors come from a stream-ordered pool (cudaMallocFromPoolAsync / cudaFreeAsync on the backend's one
// stream), as PyTorch's caching allocator does: cudaMalloc and cudaFree synchronize the device, so with them
// every tensor freed between two ops left the GPU idle while the host caught up (GEMMs timed inside the block
// ran up to 3x their time alone). Freed memory stays in the pool for the next allocation on the stream;
// reset_peak_used() hands the unused part back, so a run's device peak does not include the last run's pool.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device) : device_(device) {}
  ~CudaAllocator() override {
    if (!pool_) return;  // never set up (a backend refused for its device): touch no device
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    cudaMemPoolDestroy(pool_);
  }
  Device device() const override { return Device::Cuda; }
  // The stream every allocation and free is ordered on (the backend's, once it has checked the device); the
  // first call creates the pool.
  void set_stream(cudaStream_t stream) {
    stream_ = stream;
    if (pool_) return;
    DeviceGuard guard(device_);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    LAGA_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
    std::uint64_t keep = ~std::uint64_t(0);  // never release on synchronize: trim explicitly
    LAGA_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
  }

 protected:
  // Null on failure: the base class turns that into its "out of memory" error with the tensor's name. A
  // failure is retried once after the pool's unused memory is handed back (fragmentation).
  void* raw_allocate(std::size_t bytes) override {
    DeviceGuard guard(device_);
    void* p = nullptr;
    for (int attempt = 0; attempt < 2; ++attempt) {
      if (cudaMallocFromPoolAsync(&p, bytes, pool_, stream_) == cudaSuccess) {
        sample_used();
        return p;
      }
      (void)cudaGetLastError();  // an allocation failure is not sticky: clear it
      if (attempt == 0) trim();
    }
    return nullptr;
  }
  // Runs from tensor destructors: must not throw. A failure here means an earlier kernel failed, and that
  // error has been or will be reported by the call that synchronizes.
  void raw_free(void* ptr) override {
    cudaSetDevice(device_);
    (void)cudaFreeAsync(ptr, stream_);
  }

  void trim() {
    (void)cudaStreamSynchronize(stream_);
    (void)cudaMemPoolTrimTo(pool_, 0);
  }

 public:
  // cudaMemGetInfo's used bytes, high-water mark over the samples taken after each allocation.
  void sample_used() {
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    peak_used_ = std::max(peak_used_, total - free);
  }
  std::size_t peak_used() const { return peak_used_; }
  void reset_peak_used() {
    DeviceGuard guard(device_);
    trim();
    peak_used_ = 0;
    sample_used();
  }

 private:
  int device_;
  cudaMemPool_t pool_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::size_t peak_used_ = 0;
};

class CudaBackend final : public Backend {
 public:
  // Its own stream and stream-ordered pool.
  explicit CudaBackend(int device) : own_alloc_(std::make_unique<CudaAllocator>(device)), alloc_(own_alloc_.get()) {
    check_device(device);
    ctx_.device = device;
    DeviceGuard guard(device);
    LAGA_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx_.stream, cudaStreamNonBlocking));
    own_stream_ = true;
    own_alloc_->set_stream(ctx_.stream);
    set_up();
    // Scratch grows outside the allocator: sample the device's used bytes there too.
    ctx_.scratch.on_grow = [](void* alloc) { static_cast<CudaAllocator*>(alloc)->sample_used(); };
    ctx_.scratch.on_grow_user = own_alloc_.get();
  }
  // Hosted by a framework: its allocator (device memory of `device`) and its stream.
  CudaBackend(int device, Allocator& hosted, cudaStream_t stream) : alloc_(&hosted) {
    LAGA_REQUIRE(hosted.device() == Device::Cuda, "a cuda backend needs a cuda allocator, not one of device ",
                 device_name(hosted.device()));
    check_device(device);
    ctx_.device = device;
    ctx_.stream = stream;
    ctx_.scratch.hosted = &hosted;  // kernel scratch and cuDNN's workspace from the framework's allocator too
    set_up();
  }
  ~CudaBackend() override {
    cudaSetDevice(ctx_.device);
    if (ctx_.stream || !own_stream_) cudaStreamSynchronize(ctx_.stream);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (inv_freq_) cudaFree(inv_freq_);
    gemm_.reset();
    cudnn_.reset();
    if (own_alloc_) own_alloc_->set_stream(nullptr);  // the pool outlives the stream (members are destroyed after this body)
    if (own_stream_ && ctx_.stream) cudaStreamDestroy(ctx_.stream);
  }

  // A hosted backend follows the framework's current stream. Its buffers (kernel scratch, the GEMM workspace)
  // are reused on the new stream, so the work queued on the old one finishes first: the host waits for it,
  // unless either stream is capturing a CUDA graph, where nothing may wait; the capture is then ordered after
  // the work before it by its maker (torch.cuda.graph synchronizes the device before it begins). The GEMM
  // runner and cuDNN's handle move to the new stream with their plans; nothing is allocated.
  void set_stream(cudaStream_t stream) {
    LAGA_REQUIRE(!own_stream_, "set_cuda_stream: this backend owns its stream");
    if (stream == ctx_.stream) return;
    DeviceGuard guard(ctx_.device);
    if (!stream_capturing(ctx_.stream) && !stream_capturing(stream))
      LAGA_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
    ctx_.stream = stream;
    gemm_->set_stream(stream);
    if (cudnn_) cudnn_->set_stream(stream);
  }

  Device device() const override { return Device::Cuda; }
  const char* name() const override { return "cuda"; }
  Allocator& allocator() override { return *alloc_; }
  cudaStream_t stream() const { return ctx_.stream; }
  int device_index() const { return ctx_.device; }
  CudaAllocator& cuda_allocator() {
    LAGA_REQUIRE(own_alloc_ != nullptr, "this cuda backend allocates through its host framework's allocator");
    return *own_alloc_;
  }
  Context& context() { return ctx_; }

  void gemm(const GemmArgs& g) override {
    DeviceGuard guard(ctx_.device);
    dispatch_compute(g.dtype, "gemm", [](auto) {});
    gemm_->run(MatmulArgs{.ab_type = cuda_data_type(g.dtype), .c_type = cuda_data_type(g.c_dtype.value_or(g.dtype)), .trans_a = g.trans_a,
                          .trans_b = g.trans_b, .m = g.m, .n = g.n, .k = g.k, .batch = g.batch, .a = g.a, .lda = g.lda,
                          .stride_a = g.stride_a, .b = g.b, .ldb = g.ldb, .stride_b = g.stride_b, .c = g.c, .ldc = g.ldc,
                          .stride_c = g.stride_c, .alpha = float(g.alpha), .beta = float(g.beta)});
  }
  void copy(const CopyArgs& c) override {
    DeviceGuard guard(ctx_.device);
    copy_op(ctx_, c);
  }
  void fill(const Tensor& t, double value) override {
    DeviceGuard guard(ctx_.device);
    fill_op(ctx_, t.data(), t.numel(), t.dtype(), value);
  }
  void rmsnorm_forward(const RmsNormArgs& a) override {
    DeviceGuard guard(ctx_.device);
    rmsnorm_forward_op(ctx_, a);
  }
  void rmsnorm_backward(const RmsNormArgs& a) override {
    DeviceGuard guard(ctx_.device);
    rmsnorm_backward_op(ctx_, a);
  }
  void rope_forward(const RopeArgs& a) override {
    DeviceGuard guard(ctx_.device);
    rope_op(ctx_, a, upload_inv_freq(a), false);
  }
  void rope_backward(const RopeArgs& a) override {
    DeviceGuard guard(ctx_.device);
    rope_op(ctx_, a, upload_inv_freq(a), true);
  }
  void attention_forward(const AttentionFwdParams& p) override {
    DeviceGuard guard(ctx_.device);
    if (p.batch > 0 && p.q_len > 0 && pick_cudnn(p, nullptr)) {
      ++counts_.cudnn_forward;
      return;
    }
    ++counts_.laga_forward;
    cuda::attention_forward(ctx_, p);
  }
  void attention_backward(const AttentionBwdParams& p) override {
    DeviceGuard guard(ctx_.device);
    if (p.batch > 0 && p.q_len > 0 && pick_cudnn(p, &p)) {
      ++counts_.cudnn_backward;
      return;
    }
    ++counts_.laga_backward;
    cuda::attention_backward(ctx_, p);
  }

  void attention_merge(const AttentionMergeArgs& a) override {
    DeviceGuard guard(ctx_.device);
    attention_merge_op(ctx_, a);
  }

  void set_attention_provider(AttentionProvider p) { provider_ = p; }
  AttentionProvider attention_provider() const { return provider_; }
  void set_attention_deterministic(bool d) { deterministic_ = d, ctx_.flash_ordered_dq = d; }
  bool attention_deterministic() const { return deterministic_; }
  AttentionProviderCounts provider_counts() const {
    AttentionProviderCounts c = counts_;
    c.cudnn_graphs = cudnn_ ? cudnn_->graphs_built() : 0;
    return c;
  }
  void reset_provider_counts() { counts_ = {}; }
  void copy_from_host(const Tensor& dst, const void* host) override {
    if (!dst.data() || !dst.bytes()) return;
    DeviceGuard guard(ctx_.device);
    LAGA_CUDA_CHECK(cudaMemcpyAsync(dst.data(), host, dst.bytes(), cudaMemcpyHostToDevice, ctx_.stream));
    LAGA_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  void copy_to_host(void* host, const Tensor& src) override {
    if (!src.data() || !src.bytes()) return;
    DeviceGuard guard(ctx_.device);
    LAGA_CUDA_CHECK(cudaMemcpyAsync(host, src.data(), src.bytes(), cudaMemcpyDeviceToHost, ctx_.stream));
    LAGA_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  void synchronize() override {
    DeviceGuard guard(ctx_.device);
    LAGA_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
  }
  // Device-side timing: events recorded on the backend's stream, kept in a pool reused across passes.
  int mark() override {
    DeviceGuard guard(ctx_.device);
    if (marks_used_ == events_.size()) {
      cudaEvent_t e;
      LAGA_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    LAGA_CUDA_CHECK(cudaEventRecord(events_[marks_used_], ctx_.stream));
    return int(marks_used_++);
  }
  double elapsed(int a, int b) override {
    float ms = 0;
    LAGA_CUDA_CHECK(cudaEventElapsedTime(&ms, events_.at(a), events_.at(b)));
    return 1e-3 * double(ms);
  }
  void reset_marks() override { marks_used_ = 0; }

 private:
  static void check_device(int device) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    LAGA_REQUIRE(err == cudaSuccess && device >= 0 && device < count, "cuda device ", device,
                 " is not available (", count, " device(s)", err == cudaSuccess ? "" : ", ",
                 err == cudaSuccess ? "" : cudaGetErrorString(err), ")");
  }
  // Everything but the stream and the allocator.
  void set_up() {
    DeviceGuard guard(ctx_.device);
    LAGA_CUDA_CHECK(cudaDeviceGetAttribute(&ctx_.max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx_.device));
    gemm_ = std::make_unique<GemmRunner>(ctx_.stream);
    ctx_.gemm = gemm_.get();
    ctx_.eager_scratch_cap = cuda_default_eager_scratch_cap();
    ctx_.flash_fused_dq = cuda_default_flash_fused_dq();
    ctx_.multiprocessors = cuda_multiprocessor_count(ctx_.device);
    ctx_.flash_backward_blocks = cuda_default_flash_backward_blocks(ctx_.device);
  }

  std::vector<cudaEvent_t> events_;
  std::size_t marks_used_ = 0;
  // RoPE's frequencies arrive as a host array: uploaded when they differ from the last ones (the block
  // passes the same table every call).
  const double* upload_inv_freq(const RopeArgs& a) {
    const std::size_t half = static_cast<std::size_t>(a.dim / 2);
    if (half == 0) return nullptr;
    LAGA_REQUIRE(a.inv_freq != nullptr, "rope: inv_freq must be set");
    if (inv_freq_host_.size() == half && std::equal(inv_freq_host_.begin(), inv_freq_host_.end(), a.inv_freq))
      return inv_freq_;
    LAGA_REQUIRE(!stream_capturing(ctx_.stream), "rope: new frequencies to upload while a CUDA graph is being "
                 "captured, which cannot copy from the host: run the captured work once before capturing it");
    if (inv_freq_capacity_ < half) {
      if (inv_freq_) {
        LAGA_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream));
        LAGA_CUDA_CHECK(cudaFree(inv_freq_));
        inv_freq_ = nullptr;
      }
      LAGA_CUDA_CHECK(cudaMalloc(&inv_freq_, half * sizeof(double)));
      inv_freq_capacity_ = half;
    }
    inv_freq_host_.assign(a.inv_freq, a.inv_freq + half);
    // Pageable source: the copy is staged before the call returns, so the host vector may change later.
    LAGA_CUDA_CHECK(cudaMemcpyAsync(inv_freq_, inv_freq_host_.data(), half * sizeof(double), cudaMemcpyHostToDevice,
                                    ctx_.stream));
    return inv_freq_;
  }

  // The most a cuDNN workspace can take: the device's free memory and what its slot holds already (with a host
  // framework's allocator, which may hold free memory in its cache, the device's total).
  std::int64_t workspace_room() const {
    std::size_t free = 0, total = 0;
    LAGA_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    if (ctx_.scratch.hosted) return std::int64_t(total);
    return std::int64_t(free + ctx_.scratch.slot_bytes(ScratchSlot::cudnn_workspace));
  }
  std::int64_t scratch_cap() const {
    return ctx_.eager_scratch_cap > std::size_t(INT64_MAX) ? INT64_MAX : std::int64_t(ctx_.eager_scratch_cap);
  }
  // `auto`'s choice from the table, for the call's pass. cuDNN's deterministic backward keeps a workspace of 2
  // bytes per (head, query, key): auto takes it only under the backend's scratch cap, like eager attention's
  // scores. The non-deterministic one's workspace is O(heads x queries); its backward call checks the workspace
  // cuDNN asks for (pick_cudnn).
  bool auto_prefers_cudnn(const AttentionFwdParams& p, bool backward) const {
    const AttentionShape shape{p.dtype, p.d_qk, p.d_v, p.q_heads, p.kv_heads, p.q_len, p.kv_len};
    return builtin_attention_provider_table().choose(shape, backward ? AttentionPass::Backward : AttentionPass::Forward,
                                                     deterministic_ ? scratch_cap() : INT64_MAX,
                                                     deterministic_) == AttentionProvider::Cudnn;
  }
  // Whether cuDNN runs this call (and then it has been queued). `laga`: never. `cudnn`: always, or an
  // InvalidArgument naming the shape. `auto`: when the table prefers cuDNN for the shape and cuDNN takes it;
  // otherwise laga's kernels run (a fallback is counted).
  bool pick_cudnn(const AttentionFwdParams& p, const AttentionBwdParams* bp) {
    const bool backward = bp != nullptr;
    if (provider_ == AttentionProvider::Laga || p.kernel != AttentionKernel::Fused) return false;
    const bool forced = provider_ == AttentionProvider::Cudnn;
    auto shape_text = [&] {
      return detail::concat(backward ? "backward" : "forward", " of ", dtype_name(p.dtype), " attention d_qk ", p.d_qk,
                            ", d_v ", p.d_v, ", heads ", p.q_heads, "/", p.kv_heads, ", q_len ", p.q_len, ", kv_len ",
                            p.kv_len, ", q_offset ", p.q_offset);
    };
    if (!forced && !auto_prefers_cudnn(p, backward)) return false;
    const cuda::CudnnStatus& st = cuda::cudnn_status();
    std::string why = st.loaded ? (backward ? cuda::cudnn_attention_rejects(*bp) : cuda::cudnn_attention_rejects(p))
                                : "cuDNN is not available: " + st.error;
    if (why.empty()) {
      if (!cudnn_)
        cudnn_ = std::make_unique<cuda::CudnnAttention>(ctx_.stream, [this](std::size_t bytes) {
          return ctx_.scratch.get(ScratchSlot::cudnn_workspace, bytes, ctx_.stream);
        });
      if (backward) {
        const std::int64_t ws = cudnn_->backward_workspace(*bp, deterministic_);
        if (!forced && !deterministic_ && ws > scratch_cap())
          why = detail::concat("cuDNN's workspace of ", ws, " bytes exceeds the scratch cap of ", scratch_cap());
        else if (ws > std::int64_t(ctx_.scratch.slot_bytes(ScratchSlot::cudnn_workspace))) {  // the slot must grow
          const std::int64_t room = workspace_room();
          if (ws > room)
            why = detail::concat("cuDNN's ", deterministic_ ? "deterministic" : "non-deterministic",
                                 " backward needs a workspace of ", ws, " bytes, more than the GPU has for it (", room,
                                 " bytes)");
        }
      }
      if (why.empty() && (backward ? cudnn_->backward(*bp, deterministic_, &why) : cudnn_->forward(p, &why)))
        return true;
    }
    LAGA_REQUIRE(!forced, "attention provider cudnn cannot run the ", shape_text(), ": ", why);
    ++counts_.fallbacks;
    counts_.last_fallback = shape_text() + ": " + why;
    return false;
  }

  std::unique_ptr<CudaAllocator> own_alloc_;  // null when hosted
  Allocator* alloc_;                          // own_alloc_, or the host framework's
  bool own_stream_ = false;
  Context ctx_;
  AttentionProvider provider_ = AttentionProvider::Laga;
  bool deterministic_ = true;  // cuDNN's backward: its deterministic algorithm; laga's: ordered dQ adds
  AttentionProviderCounts counts_;
  std::unique_ptr<cuda::CudnnAttention> cudnn_;
  std::unique_ptr<GemmRunner> gemm_;
  double* inv_freq_ = nullptr;
  std::size_t inv_freq_capacity_ = 0;
  std::vector<double> inv_freq_host_;
};

}  // namespace
}  // namespace cuda

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

bool cuda_available() { return cuda_device_count() > 0; }

std::unique_ptr<Backend> make_cuda_backend(int device) { return std::make_unique<cuda::CudaBackend>(device); }

std::unique_ptr<Backend> make_cuda_backend(int device, Allocator& allocator, void* stream) {
  return std::make_unique<cuda::CudaBackend>(device, allocator, static_cast<cudaStream_t>(stream));
}

namespace {
cuda::CudaBackend& as_cuda(Backend& backend, const char* what) {
  auto* b = dynamic_cast<cuda::CudaBackend*>(&backend);
  LAGA_REQUIRE(b != nullptr, what, ": backend '", backend.name(), "' is not a CUDA backend");
  return *b;
}
}  // namespace

void* cuda_stream(Backend& backend) { return as_cuda(backend, "cuda_stream").stream(); }

void set_cuda_stream(Backend& backend, void* stream) {
  as_cuda(backend, "set_cuda_stream").set_stream(static_cast<cudaStream_t>(stream));
}

int cuda_device_of(Backend& backend) { return as_cuda(backend, "cuda_device_of").device_index(); }

CudaMemInfo cuda_mem_info(int device) {
  cuda::DeviceGuard guard(device);
  CudaMemInfo info;
  LAGA_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

namespace {
void require_device(int device) {
  const int count = cuda_device_count();
  LAGA_REQUIRE(device >= 0 && device < count, "cuda device ", device, " does not exist (", count, " device(s))");
}
}  // namespace

std::string cuda_device_name(int device) {
  require_device(device);
  cudaDeviceProp prop{};
  LAGA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop.name;
}

int cuda_multiprocessor_count(int device) {
  require_device(device);
  int sms = 0;
  LAGA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

std::size_t cuda_peak_used_bytes(Backend& backend) {
  return as_cuda(backend, "cuda_peak_used_bytes").cuda_allocator().peak_used();
}

void cuda_reset_peak_used(Backend& backend) { as_cuda(backend, "cuda_reset_peak_used").cuda_allocator().reset_peak_used(); }

CudaScratchInfo cuda_scratch_info(Backend& backend) {
  const cuda::Scratch& s = as_cuda(backend, "cuda_scratch_info").context().scratch;
  CudaScratchInfo info;
  info.held_bytes = s.held_bytes();
  info.peak_bytes = s.peak_bytes();
  for (int i = 0; i < int(cuda::ScratchSlot::count); ++i) {
    const auto slot = cuda::ScratchSlot(i);
    info.slots.push_back({cuda::scratch_slot_name(slot), s.slot_bytes(slot), s.slot_peak_bytes(slot)});
  }
  return info;
}

std::size_t cuda_scratch_peak_bytes(Backend& backend) {
  return as_cuda(backend, "cuda_scratch_peak_bytes").context().scratch.peak_bytes();
}

void cuda_reset_scratch_peak(Backend& backend, bool release) {
  cuda::CudaBackend& b = as_cuda(backend, "cuda_reset_scratch_peak");
  if (release) {
    cuda::DeviceGuard guard(b.device_index());
    b.context().scratch.release(b.stream());
  }
  b.context().scratch.reset_peak();
}

std::size_t cuda_default_eager_scratch_cap() {
  static const std::size_t cap = [] {
    const char* v = std::getenv("LAGA_CUDA_SCRATCH_CAP");
    return v && *v ? cuda::parse_scratch_cap(v) : std::size_t(1) << 30;
  }();
  return cap;
}

std::size_t cuda_eager_scratch_cap(Backend& backend) {
  return as_cuda(backend, "cuda_eager_scratch_cap").context().eager_scratch_cap;
}

void cuda_set_eager_scratch_cap(Backend& backend, std::size_t bytes) {
  as_cuda(backend, "cuda_set_eager_scratch_cap").context().eager_scratch_cap = bytes;
}

bool cuda_default_flash_fused_dq() {
  static const bool fused = [] {
    const char* v = std::getenv("LAGA_CUDA_FLASH_DQ");
    if (v == nullptr || *v == 0) return true;
    const std::string s(v);
    LAGA_REQUIRE(s == "fused" || s == "separate", "LAGA_CUDA_FLASH_DQ is '", s, "'; it must be 'fused' or 'separate'");
    return s == "fused";
  }();
  return fused;
}

int cuda_default_flash_backward_blocks(int device) {
  // -1: one block per SM (resolved per device)
  static const int blocks = [] {
    const char* v = std::getenv("LAGA_CUDA_FLASH_BACKWARD_BLOCKS");
    if (v == nullptr || *v == 0) return 0;
    const std::string s(v);
    if (s == "sm") return -1;
    std::size_t used = 0;
    long n = -1;
    try {
      n = s[0] >= '0' && s[0] <= '9' ? std::stol(s, &used) : -1;
    } catch (const std::exception&) {
      n = -1;
    }
    LAGA_REQUIRE(n >= 0 && n <= (1L << 30) && used == s.size(), "LAGA_CUDA_FLASH_BACKWARD_BLOCKS is '", s,
                 "'; it must be 0 (the default: one block per SM), a positive block count or 'sm' (one block per SM)");
    return int(n);
  }();
  return blocks < 0 ? cuda_multiprocessor_count(device) : blocks;
}

void cuda_set_attention_provider(Backend& backend, AttentionProvider provider) {
  as_cuda(backend, "cuda_set_attention_provider").set_attention_provider(provider);
}

AttentionProvider cuda_attention_provider(Backend& backend) {
  return as_cuda(backend, "cuda_attention_provider").attention_provider();
}

void cuda_set_attention_deterministic(Backend& backend, bool deterministic) {
  as_cuda(backend, "cuda_set_attention_deterministic").set_attention_deterministic(deterministic);
}

bool cuda_attention_deterministic(Backend& backend) {
  return as_cuda(backend, "cuda_attention_deterministic").attention_deterministic();
}

CudnnInfo cuda_cudnn_info() {
  const cuda::CudnnStatus& s = cuda::cudnn_status();
  return CudnnInfo{s.compiled, s.loaded, long(s.version), long(s.compiled_version), s.error};
}

AttentionProviderCounts cuda_attention_provider_counts(Backend& backend) {
  return as_cuda(backend, "cuda_attention_provider_counts").provider_counts();
}

void cuda_reset_attention_provider_counts(Backend& backend) {
  as_cuda(backend, "cuda_reset_attention_provider_counts").reset_provider_counts();
}

bool cuda_flash_fused_dq(Backend& backend) { return as_cuda(backend, "cuda_flash_fused_dq").context().flash_fused_dq; }

void cuda_set_flash_fused_dq(Backend& backend, bool fused) {
  as_cuda(backend, "cuda_set_flash_fused_dq").context().flash_fused_dq = fused;
}

bool cuda_flash_ws_forward(Backend& backend) {
  return as_cuda(backend, "cuda_flash_ws_forward").context().flash_ws_forward;
}

void cuda_set_flash_ws_forward(Backend& backend, bool warp_specialized) {
  as_cuda(backend, "cuda_set_flash_ws_forward").context().flash_ws_forward = warp_specialized;
}

int cuda_flash_forward_blocks(Backend& backend) {
  return as_cuda(backend, "cuda_flash_forward_blocks").context().flash_forward_blocks;
}

void cuda_set_flash_forward_blocks(Backend& backend, int blocks) {
  LAGA_REQUIRE(blocks >= 0, "cuda_set_flash_forward_blocks: blocks is ", blocks,
               "; it must be 0 (one per multiprocessor) or a positive count");
  as_cuda(backend, "cuda_set_flash_forward_blocks").context().flash_forward_blocks = blocks;
}

int cuda_flash_forward_head_group(Backend& backend) {
  return as_cuda(backend, "cuda_flash_forward_head_group").context().flash_forward_head_group;
}

void cuda_set_flash_forward_head_group(Backend& backend, int heads) {
  LAGA_REQUIRE(heads >= 0, "cuda_set_flash_forward_head_group: heads is ", heads,
               "; it must be 0 (the default order) or a positive count of heads");
  as_cuda(backend, "cuda_set_flash_forward_head_group").context().flash_forward_head_group = heads;
}

int cuda_flash_backward_blocks(Backend& backend) {
  return as_cuda(backend, "cuda_flash_backward_blocks").context().flash_backward_blocks;
}

void cuda_set_flash_backward_blocks(Backend& backend, int blocks) {
  LAGA_REQUIRE(blocks >= 0, "cuda_set_flash_backward_blocks: blocks is ", blocks,
               "; it must be 0 (one per multiprocessor) or a positive count");
  as_cuda(backend, "cuda_set_flash_backward_blocks").context().flash_backward_blocks = blocks;
}

int cuda_flash_backward_head_group(Backend& backend) {
  return as_cuda(backend, "cuda_flash_backward_head_group").context().flash_backward_head_group;
}

void cuda_set_flash_backward_head_group(Backend& backend, int heads) {
  LAGA_REQUIRE(heads >= 0, "cuda_set_flash_backward_head_group: heads is ", heads,
               "; it must be 0 (the default order) or a positive count of heads");
  as_cuda(backend, "cuda_set_flash_backward_head_group").context().flash_backward_head_group = heads;
}

bool cuda_flash_ws_backward(Backend& backend) {
  return as_cuda(backend, "cuda_flash_ws_backward").context().flash_ws_backward;
}

void cuda_set_flash_ws_backward(Backend& backend, bool warp_specialized) {
  as_cuda(backend, "cuda_set_flash_ws_backward").context().flash_ws_backward = warp_specialized;
}

bool cuda_flash_vk_rows(Backend& backend) { return as_cuda(backend, "cuda_flash_vk_rows").context().flash_vk_rows; }

void cuda_set_flash_vk_rows(Backend& backend, bool rows_resident) {
  as_cuda(backend, "cuda_set_flash_vk_rows").context().flash_vk_rows = rows_resident;
}

int cuda_flash_row_splits(Backend& backend) { return as_cuda(backend, "cuda_flash_row_splits").context().flash_row_splits; }

void cuda_set_flash_row_splits(Backend& backend, int splits) {
  LAGA_REQUIRE(splits >= 0 && splits <= 16, "cuda_set_flash_row_splits: splits is ", splits,
               "; it must be 0 (chosen per shape) or 1 to 16");
  as_cuda(backend, "cuda_set_flash_row_splits").context().flash_row_splits = splits;
}

}  // namespace laga
