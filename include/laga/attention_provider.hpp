// Attention providers: which implementation runs a backend's attention calls. The block never knows; the
// CUDA backend asks per call (laga/cuda.hpp: cuda_set_attention_provider).
//   laga   the project's own kernels (eager, fused 192/128 and 576/512 on tensor cores, FMA otherwise)
//   cudnn  cuDNN's fused attention through its graph API (192/128 MHA, bf16, causal with q_offset >= 0)
//   auto   per shape and pass (forward, backward), the faster of the two by the table of measured times
//          below; laga where cuDNN cannot run the shape or the table has nothing close. The passes choose on
//          their own: laga's forward may feed cuDNN's backward, both keeping the same log-sum-exp (the natural
//          log of the sum of exp of the scaled scores, float32 [batch, heads, q_len])
// The table is data kept in the repo (bench/attention-providers.json, embedded at build time) and
// regenerated on the GPU by `laga bench-attention --out bench/attention-providers.json`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "laga/tensor.hpp"

namespace laga {

enum class AttentionProvider { Automatic, Laga, Cudnn };
enum class AttentionPass { Forward, Backward };

// "auto", "laga", "cudnn".
const char* attention_provider_name(AttentionProvider);
// Throws InvalidArgument naming the value and the choices.
AttentionProvider parse_attention_provider(const std::string& text);

// What a provider choice depends on: one attention call's shape (the fused kernel's; eager always runs laga).
struct AttentionShape {
  DType dtype = DType::BF16;
  std::int64_t d_qk = 0, d_v = 0;
  std::int64_t q_heads = 0, kv_heads = 0;
  std::int64_t q_len = 0, kv_len = 0;
};

// One measured point: both providers' median forward and backward times at one shape (MHA).
struct AttentionTiming {
  std::string dtype;  // "bfloat16"
  std::int64_t d_qk = 0, d_v = 0, heads = 0, q_len = 0, kv_len = 0;
  double laga_fwd_ms = 0, laga_bwd_ms = 0;
  double cudnn_fwd_ms = 0, cudnn_bwd_ms = 0;  // 0: cuDNN did not run this pass at this point
  std::int64_t cudnn_workspace_bytes = 0;      // the largest workspace its plans asked for (optional field)
  // The non-deterministic backwards (optional fields; 0: not measured): cuDNN's (dQ by float32 atomics) with its
  // workspace, and laga's (dQ's row tiles added to in any order).
  double cudnn_nondeterministic_bwd_ms = 0;
  std::int64_t cudnn_nondeterministic_workspace_bytes = 0;
  double laga_nondeterministic_bwd_ms = 0;
  // The faster provider for one pass; laga on a tie or where cuDNN did not run it. deterministic = false
  // compares the non-deterministic backwards where the point has them (each provider's deterministic one
  // where it does not).
  AttentionProvider faster(AttentionPass pass, bool deterministic = true) const;
};

struct AttentionProviderTable {
  std::vector<AttentionTiming> points;
  // The point nearest to `s` (distance in log heads, log q_len, log kv_len) among those of the same dtype
  // and head dims; null when none (or when `s` is not MHA).
  const AttentionTiming* nearest(const AttentionShape& s) const;
  // cuDNN's workspace for `s`: the nearest point's, scaled by heads x q_len x kv_len (its deterministic
  // backward's workspace grows so: 2 bytes per (head, query, key) on the H200, cuDNN 9.14 and 9.19); 0 without
  // a point. deterministic = false: the non-deterministic backward's, scaled by heads x q_len (0 where the
  // point has none).
  std::int64_t cudnn_workspace(const AttentionShape& s, bool deterministic = true) const;
  // `auto`'s choice for one pass of `s`: the nearest point's faster provider for that pass, laga when there is
  // no such point, and for the backward laga when cuDNN's workspace for `s` would exceed `max_workspace` bytes
  // (the forward's is small and not measured).
  AttentionProvider choose(const AttentionShape& s, AttentionPass pass, std::int64_t max_workspace = INT64_MAX,
                           bool deterministic = true) const;

  // The JSON document: {"points": [{"dtype", "d_qk", "d_v", "heads", "q_len", "kv_len", "laga_fwd_ms",
  // "laga_bwd_ms", "cudnn_fwd_ms", "cudnn_bwd_ms", optional "cudnn_workspace_bytes",
  // "cudnn_nondeterministic_bwd_ms", "cudnn_nondeterministic_workspace_bytes", "laga_nondeterministic_bwd_ms"},
  // ...], ...}; other keys (machine, commit, versions) are kept by the writer and ignored here. Throws
  // InvalidArgument naming the field that is missing or invalid.
  static AttentionProviderTable from_json(const std::string& text);
};

// The table built into this binary (bench/attention-providers.json at build time).
const AttentionProviderTable& builtin_attention_provider_table();

}  // namespace laga
