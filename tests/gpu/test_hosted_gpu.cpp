// A CUDA backend hosted by a framework (laga/hosted.hpp, as the PyTorch module makes it) takes its kernel
// scratch and cuDNN's workspace from the host's allocator, so the host's counters see them: after a block's
// forward and backward, releasing the scratch hands the host back exactly the bytes the backend reports held.
// A step of it can be captured in a CUDA graph once it has run eagerly.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_util.hpp"
#include "laga/block.hpp"
#include "laga/comm.hpp"
#include "laga/errors.hpp"
#include "laga/hosted.hpp"
#include "laga/problem.hpp"

#ifdef LAGA_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace laga::gpu_test {
namespace {

// The host: device memory from another allocator, every byte it hands out counted.
class CountingHost final : public Allocator {
 public:
  explicit CountingHost(Allocator& inner) : inner_(inner) {}
  Device device() const override { return inner_.device(); }
  std::size_t outstanding = 0;

 protected:
  void* raw_allocate(std::size_t bytes) override {
    void* p = nullptr;
    const std::uint64_t id = inner_.allocate(bytes, "host", MemoryKind::External, &p);
    held_[p] = {id, bytes};
    outstanding += bytes;
    return p;
  }
  void raw_free(void* p) override {
    const auto [id, bytes] = held_.at(p);
    held_.erase(p);
    inner_.free(id, p);
    outstanding -= bytes;
  }

 private:
  Allocator& inner_;
  std::map<void*, std::pair<std::uint64_t, std::size_t>> held_;
};

TEST(CudaHostedScratch, ComesFromTheHostsAllocator) {
  LAGA_REQUIRE_GPU();
  Backends be;
  CountingHost host(be.gpu->allocator());
  auto hosted = make_cuda_backend(0, host, nullptr);
  auto comm = make_single_rank_communicator(*hosted);
  const BlockOptions opts{.kernel = AttentionKernel::Fused, .dtype = DType::BF16};
  {
    const RankRun r = run_rank(mla_dims(), opts, BlockShape{.batch = 1, .seq = 128, .ranks = 1, .rank = 0}, *hosted,
                               *comm, 3);
  }
  const CudaScratchInfo info = cuda_scratch_info(*hosted);
  EXPECT_GT(info.held_bytes, 0u) << "the fused backward used no scratch";
  const std::size_t before = host.outstanding;
  EXPECT_GE(before, info.held_bytes);
  cuda_reset_scratch_peak(*hosted, /*release=*/true);
  EXPECT_EQ(before - host.outstanding, info.held_bytes);
}

#ifdef LAGA_HAVE_CUDA
// Device memory taken once from `inner` and handed out in order, never reused: a step whose tensors come from
// it asks the driver for nothing, so it can run inside a capture (PyTorch's caching allocator serves a capture
// from the graph's own pool instead).
class Arena final : public Allocator {
 public:
  Arena(Allocator& inner, std::size_t bytes) : inner_(inner), size_(bytes) {
    id_ = inner_.allocate(bytes, "arena", MemoryKind::External, &base_);
  }
  ~Arena() override { inner_.free(id_, base_); }
  Device device() const override { return Device::Cuda; }

 protected:
  void* raw_allocate(std::size_t bytes) override {
    const std::size_t at = (used_ + 255) / 256 * 256;
    if (at + bytes > size_) return nullptr;
    used_ = at + bytes;
    return static_cast<char*>(base_) + at;
  }
  void raw_free(void*) override {}

 private:
  Allocator& inner_;
  void* base_ = nullptr;
  std::uint64_t id_ = 0;
  std::size_t size_, used_ = 0;
};

// The block's forward and backward on a hosted backend, captured in a CUDA graph after the same step ran
// eagerly on another stream, as torch.cuda.graph takes a training step: the backend moves to the capturing
// stream inside the capture (no wait, no allocation), the replay writes the eager step's bits, and the kernel
// scratch the graph uses stays held when the scratch is released. A step whose scratch would have to grow
// inside a capture is refused by name.
TEST(CudaHostedCapture, ACapturedStepReplaysTheEagerBits) {
  LAGA_REQUIRE_GPU();
  Backends be;
  cudaStream_t eager = nullptr, capture = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&eager, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&capture, cudaStreamNonBlocking), cudaSuccess);
  {
    Arena arena(be.gpu->allocator(), std::size_t(1) << 30);
    auto hosted = make_cuda_backend(0, arena, eager);
    auto single = make_single_rank_communicator(*hosted);
    CountingCommunicator comm(*single);
    const MlaConfig cfg = mla_dims();
    const BlockOptions opts{.kernel = AttentionKernel::Fused, .dtype = DType::BF16};
    const BlockShape shape{.batch = 1, .seq = 256, .ranks = 1, .rank = 0};
    const BlockShape longer{.batch = 1, .seq = 1024, .ranks = 1, .rank = 0};
    const MlaWeights w = make_weights(cfg, opts.dtype, *be.gpu, 7);
    const Tensor x = make_shard(cfg, shape, opts.dtype, *be.gpu, 7, DataStream::X, opts.layout);
    const Tensor dy = make_shard(cfg, shape, opts.dtype, *be.gpu, 7, DataStream::Dy, opts.layout);
    const Tensor x_long = make_shard(cfg, longer, opts.dtype, *be.gpu, 7, DataStream::X, opts.layout);
    const Tensor dy_long = make_shard(cfg, longer, opts.dtype, *be.gpu, 7, DataStream::Dy, opts.layout);
    be.gpu->synchronize();
    struct Step {
      Tensor y, dx;
      MlaGrads grads;
    };
    auto step = [&](Step& s, const BlockShape& sh, const Tensor& xs, const Tensor& dys) {
      MlaBlock block(cfg, opts, sh, *hosted, comm);
      block.set_timing(false);  // timing waits for the queue at the end of each pass, which a capture cannot
      SavedContext ctx;
      s.y = block.forward(ctx, xs, w);
      s.grads = allocate_grads(cfg, opts, arena);
      s.dx = block.backward(s.grads, ctx, dys, xs, w);
    };
    auto outputs = [&](const Step& s) {
      std::vector<std::vector<std::uint8_t>> out{raw_bytes(*hosted, s.y), raw_bytes(*hosted, s.dx)};
      for (const auto& [name, t] : s.grads.named()) out.push_back(raw_bytes(*hosted, *t));
      return out;
    };
    Step first;
    step(first, shape, x, dy);
    const auto eager_bits = outputs(first);

    // The capture, on its own stream; laga moves to it inside the capture, as the module does at each call.
    ASSERT_EQ(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal), cudaSuccess);
    Step captured;
    std::string error;
    try {
      set_cuda_stream(*hosted, capture);
      step(captured, shape, x, dy);
    } catch (const std::exception& e) {
      error = e.what();
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(capture, &graph);
    (void)cudaGetLastError();  // a failed capture leaves its error behind for the next launch check to find
    if (!error.empty() || ended != cudaSuccess) {
      if (graph) (void)cudaGraphDestroy(graph);
      set_cuda_stream(*hosted, eager);
      FAIL() << "the step failed inside the capture: " << error << " (end of capture: " << cudaGetErrorString(ended)
             << ")";
    }
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    // What the graph writes, poisoned (NaN bytes), then the replay on the other stream.
    std::vector<const Tensor*> written{&captured.y, &captured.dx};
    for (const auto& [name, t] : captured.grads.named()) written.push_back(t);
    for (const Tensor* t : written) ASSERT_EQ(cudaMemsetAsync(t->data(), 0xff, t->bytes(), eager), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, eager), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(eager), cudaSuccess);
    EXPECT_EQ(outputs(captured), eager_bits) << "the replay's output or gradients differ from the eager step's";
    const std::size_t held = cuda_scratch_info(*hosted).held_bytes;
    EXPECT_GT(held, 0u);
    cuda_reset_scratch_peak(*hosted, /*release=*/true);
    EXPECT_EQ(cuda_scratch_info(*hosted).held_bytes, held) << "scratch a captured graph uses was released";
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);

    // A longer sequence needs more scratch than the eager step made: refused inside a capture.
    ASSERT_EQ(cudaStreamBeginCapture(capture, cudaStreamCaptureModeGlobal), cudaSuccess);
    Step grown;
    std::string refused;
    try {
      step(grown, longer, x_long, dy_long);
    } catch (const InvalidArgument& e) {
      refused = e.what();
    }
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(capture, &broken);
    if (broken) (void)cudaGraphDestroy(broken);
    (void)cudaGetLastError();
    EXPECT_NE(refused.find("while a CUDA graph is being captured"), std::string::npos)
        << "a scratch growth inside a capture was not refused by name: '" << refused << "'";
    set_cuda_stream(*hosted, eager);
    EXPECT_EQ(cudaStreamSynchronize(eager), cudaSuccess);
  }
  EXPECT_EQ(cudaStreamDestroy(eager), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(capture), cudaSuccess);
}
#endif

}  // namespace
}  // namespace laga::gpu_test
