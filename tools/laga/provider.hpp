// --attention-provider for `laga run` and `laga bench`: validated before anything runs (the documents record
// the cuDNN loaded and the calls each provider ran: cudnn_report, attention_calls_report in laga/measure.hpp).
#pragma once

#include <string>

#include "laga/attention_provider.hpp"
#include "laga/cuda.hpp"
#include "laga/errors.hpp"

namespace laga::cli {

// Parses --attention-provider; cudnn needs the cuda device and a cuDNN this process can load. Throws
// InvalidArgument (exit 2) before anything runs.
inline AttentionProvider check_attention_provider(const std::string& text, bool cuda) {
  const AttentionProvider p = parse_attention_provider(text);
  if (p == AttentionProvider::Cudnn) {
    LAGA_REQUIRE(cuda, "attention-provider = cudnn: cuDNN runs on the GPU (add --device cuda)");
    const CudnnInfo info = cuda_cudnn_info();
    LAGA_REQUIRE(info.loaded, "attention-provider = cudnn: cuDNN is not available (", info.error,
                 "); use --attention-provider auto or laga");
  }
  return p;
}

}  // namespace laga::cli
