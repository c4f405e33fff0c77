// Which tokens of the whole sequence each sequence-parallel rank holds, per layout: the one place that
// says it. Everything that assembles a whole sequence from the ranks' shards or splits one into them (the
// check against the single-rank result, laga run --save / --load, the PyTorch module) goes through it.
//
//   a2a, all_gather: rank r holds the s = S/P consecutive tokens r*s .. r*s + s - 1.
//   p2p:             the sequence is cut into 2P chunks of c = S/(2P) tokens; rank r holds chunks r and
//                    2P-1-r, in that order (the zigzag that balances causal attention over the ring: every
//                    rank gets one early and one late chunk).
#pragma once

#include <cstdint>
#include <vector>

#include "laga/block.hpp"

namespace laga {

// `count` consecutive tokens: this rank's tokens local .. local+count-1 are the sequence's global ..
// global+count-1.
struct TokenSpan {
  std::int64_t local = 0;
  std::int64_t global = 0;
  std::int64_t count = 0;
};

// The spans of rank `rank` of `ranks` over a sequence of `seq` tokens, in local order (they cover the local
// tokens 0 .. seq/ranks - 1). Throws InvalidArgument when the layout cannot split `seq` that way.
std::vector<TokenSpan> rank_tokens(Layout, std::int64_t seq, int ranks, int rank);

// The global position of every local token (rank_tokens spelled out).
std::vector<std::int64_t> rank_positions(Layout, std::int64_t seq, int ranks, int rank);

// The whole token-major sequence [seq, row] from the ranks' shards [seq / ranks, row] concatenated in rank
// order (what an all-gather of the shards gives).
std::vector<double> assemble_sequence(Layout, const std::vector<double>& shards, std::int64_t seq, int ranks,
                                      std::int64_t row);

}  // namespace laga
