// Ranks agree before they compute: a fingerprint of what a run depends on (configuration, options, derived
// sizes), compared across the ranks with one small collective before any data collective. Ranks given
// different input (a node-local config file that differs, a flag missing on one node) would otherwise run
// mismatched collectives and hang, or compute nonsense and succeed.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "laga/block.hpp"
#include "laga/comm.hpp"

namespace laga {

// At most this many fields (the collective has a fixed size, so ranks never disagree on its count).
inline constexpr std::size_t kMaxFingerprintFields = 96;

struct Fingerprint {
  std::vector<std::pair<std::string, std::string>> fields;  // (name, value as text), in a fixed order
  void add(const std::string& name, const std::string& value);
};

// The configuration's fields, the block options, and the sizes derived from `shape` that every rank shares
// (S, batch, P, local tokens, heads in the attention layout, bytes each collective moves); not the rank.
Fingerprint run_fingerprint(const MlaConfig&, const BlockOptions&, const BlockShape&);

// Compares `mine` across the ranks of `comm` (one all_gather of two 32-bit hash halves per field). When a
// field differs, throws InvalidArgument on every rank with the same message, naming the first field that
// differs and the groups of ranks that agree on it.
void require_agreement(Communicator& comm, const Fingerprint& mine);

}  // namespace laga
