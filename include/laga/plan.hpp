// The plan: per-rank memory, traffic and FLOPs of any configuration, at any size, without running it.
//
// The plan runs the block's real orchestration (src/mla/block.cpp) on the meta backend (shapes and byte
// accounting, no storage) with a phantom communicator, so its saved tensors, peaks and traffic are those
// of the code that runs: one source of truth. The closed-form traffic formula beside it is checked
// against both.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "laga/block.hpp"

namespace laga {

struct SavedTensor {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  std::size_t bytes = 0;
};

struct RankPlan {
  MlaConfig cfg;
  BlockOptions opts;
  BlockShape shape;
  std::vector<SavedTensor> saved;  // kept from forward to backward, largest first
  std::size_t saved_bytes = 0;
  std::size_t peak_forward = 0;    // peak live activation bytes during forward
  std::size_t peak_backward = 0;   // during backward, this layer's saved tensors included
  std::vector<CollectiveRecord> traffic;
  PassStats fwd, bwd;              // FLOPs by phase (seconds are not meaningful on meta)
  std::size_t bytes_sent() const;
  std::size_t bytes_received() const;
};

// Plans one rank (shape.rank) of the configuration. Throws InvalidArgument as validate() does.
RankPlan plan_rank(const MlaConfig&, const BlockOptions&, const BlockShape&);

// Closed form of the collectives one rank issues (DESIGN.md section 3), in call order, with bytes as
// CountingCommunicator counts them.
std::vector<CollectiveRecord> expected_traffic(const MlaConfig&, const BlockOptions&, const BlockShape&);

// The plan's traffic under two other accountings of the latent's collectives (tensor kv_latent), from its
// records; every other record counts as sent. 0 latent records (explicit): both equal bytes_sent().
struct TrafficWhatIf {
  // The latent's gradient (kv_latent, backward) in the plan's dtype instead of the accumulation dtype it
  // travels in (bf16: half its bytes; float32 and float64: unchanged).
  std::size_t latent_grad_in_dtype = 0;
  // As latent_grad_in_dtype, and the latent's all-gather and reduce-scatter counted as (P-1)/P of their input,
  // like an all-to-all, instead of the input to each of the P-1 other ranks: 1/P of their records. Ring shifts
  // (p2p) count as sent. Not a whole number of bytes when P does not divide the record.
  double latent_as_all_to_all = 0;
};
TrafficWhatIf traffic_what_if(const RankPlan&);

// The whole model at the plan's point: a layer's figures times cfg.num_hidden_layers (every layer's attention
// block is the same), or nullopt when the configuration does not give its layer count. Throws InvalidArgument
// when a total does not fit in 64 bits.
struct ModelTotal {
  long layers = 0;                // cfg.num_hidden_layers
  std::size_t saved_bytes = 0;    // saved_bytes x layers: what all layers keep from forward to backward
  std::size_t bytes_sent = 0;     // bytes_sent() x layers
  std::size_t bytes_received = 0;
  double flops = 0;               // forward + backward FLOPs x layers
};
std::optional<ModelTotal> model_total(const RankPlan&);

// Memory of `layers` stacked attention blocks on one rank: all layers' saved tensors at the end of
// forward, plus the larger transient peak of one layer's forward or backward.
struct DeviceFit {
  std::size_t activation_peak = 0;
  std::size_t weights_and_grads = 0;  // the attention block's weights (plan's dtype) and gradients (accum dtype)
  std::size_t total() const { return activation_peak + weights_and_grads; }
};
DeviceFit device_fit(const RankPlan&, int layers);

// Bytes one rank of a real run holds at its peak, as planned: the weights (the plan's dtype) and their
// gradients (accumulation dtype), the input x and dy and the outputs y and dx ([s, batch, d] each), and the
// larger activation peak of forward and backward.
std::size_t planned_run_bytes(const RankPlan&);
// Refuses (InvalidArgument) a run that needs more than `available` bytes of `where` ("host memory", "GPU 0"):
// `copies` ranks of `plan` in one process, plus `extra` bytes (a reference run's), naming the configuration,
// the bytes needed and the limit. Called before anything is allocated.
void require_fits(const RankPlan& plan, int copies, std::size_t extra, std::size_t available, const std::string& where);
// Physical memory of this host (sysconf), 0 when unknown.
std::size_t host_memory_bytes();

// "141GB", "80GiB", "1.5e11", "512MB" -> bytes (GB = 1e9, GiB = 2^30). Throws InvalidArgument.
double parse_bytes(const std::string& text);

}  // namespace laga
