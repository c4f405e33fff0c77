// The strategies a report sets side by side: the three forms, with the absorbed form's two ways to run
// attention and LAGA with K/V recomputation.
#pragma once

#include "laga/block.hpp"

namespace laga::cli {

struct Variant {
  const char* label;
  Form form;
  Recompute recompute;
  AbsorbedAttention absorbed;
};

inline constexpr Variant kVariants[] = {
    {"explicit", Form::Explicit, Recompute::None, AbsorbedAttention::Mqa},
    {"absorbed (mqa)", Form::Absorbed, Recompute::None, AbsorbedAttention::Mqa},
    {"absorbed (expanded)", Form::Absorbed, Recompute::None, AbsorbedAttention::Expanded},
    {"laga", Form::Laga, Recompute::None, AbsorbedAttention::Mqa},
    {"laga +recompute kv", Form::Laga, Recompute::KV, AbsorbedAttention::Mqa},
};

inline BlockOptions with_variant(BlockOptions o, const Variant& v) {
  o.form = v.form;
  o.recompute = v.recompute;
  o.absorbed_attention = v.absorbed;
  return o;
}

}  // namespace laga::cli
