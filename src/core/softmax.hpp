// The finish of a softmax row in every attention kernel (CPU eager and fused; CUDA eager, generic fused and
// tensor-core): from the row's maximum m (in the units of the log-sum-exp) and its sum l of exp(s - m) over the
// visible keys, the probabilities' factor 1 / l and the log-sum-exp m + log(l). A row that sees no key has l = 0:
// factor 0 (its output is zero) and log-sum-exp -inf (core/causal.hpp gives the keys a row sees).
#pragma once

#include <cmath>
#include <type_traits>

#include "core/causal.hpp"  // LAGA_HOST_DEVICE

namespace laga {

template <class T>
LAGA_HOST_DEVICE T softmax_inv(T l) {
  return l > T(0) ? T(1) / l : T(0);
}

template <class T>
LAGA_HOST_DEVICE T softmax_lse(T m, T l) {
  if constexpr (std::is_same_v<T, float>)
    return l > 0.f ? m + logf(l) : -INFINITY;
  else
    return l > T(0) ? m + std::log(l) : -T(INFINITY);
}

}  // namespace laga
