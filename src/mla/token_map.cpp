// The token map (include/laga/token_map.hpp).
#include "laga/token_map.hpp"

#include <algorithm>

#include "laga/errors.hpp"

namespace laga {

std::vector<TokenSpan> rank_tokens(Layout layout, std::int64_t seq, int ranks, int rank) {
  LAGA_REQUIRE(ranks >= 1 && rank >= 0 && rank < ranks, "rank = ", rank, " of sp = ", ranks,
               ": must be in [0, sp)");
  LAGA_REQUIRE(seq >= 1 && seq % ranks == 0, "seq = ", seq, " is not divisible by sp = ", ranks,
               ": each rank holds S/P tokens");
  const std::int64_t s = seq / ranks;
  if (layout != Layout::P2P) return {TokenSpan{0, rank * s, s}};
  LAGA_REQUIRE(seq % (2 * std::int64_t(ranks)) == 0, "seq = ", seq, " is not divisible by 2 x sp = ", 2 * ranks,
               ": the p2p layout gives each rank two chunks of S/(2P) tokens");
  const std::int64_t c = s / 2;
  return {TokenSpan{0, rank * c, c}, TokenSpan{c, (2 * std::int64_t(ranks) - 1 - rank) * c, c}};
}

std::vector<std::int64_t> rank_positions(Layout layout, std::int64_t seq, int ranks, int rank) {
  std::vector<std::int64_t> out;
  for (const TokenSpan& t : rank_tokens(layout, seq, ranks, rank))
    for (std::int64_t i = 0; i < t.count; ++i) out.push_back(t.global + i);
  return out;
}

std::vector<double> assemble_sequence(Layout layout, const std::vector<double>& shards, std::int64_t seq, int ranks,
                                      std::int64_t row) {
  LAGA_REQUIRE(std::int64_t(shards.size()) == seq * row, "assemble_sequence: ", shards.size(), " values for ", seq,
               " tokens of ", row);
  const std::int64_t s = seq / ranks;
  std::vector<double> whole(shards.size());
  for (int p = 0; p < ranks; ++p)
    for (const TokenSpan& t : rank_tokens(layout, seq, ranks, p))
      std::copy_n(shards.begin() + (p * s + t.local) * row, t.count * row, whole.begin() + t.global * row);
  return whole;
}

}  // namespace laga
