// The p2p layout (the ring): the token map, what each form keeps and moves, the memory the plan gives it
// beside all_gather, and the inputs p2p refuses. The ring against the single-rank result at P = 1..8 is the
// conformance suite's (tests/conformance).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "laga/errors.hpp"
#include "laga/plan.hpp"
#include "laga/token_map.hpp"

namespace {

using namespace laga;

TEST(TokenMap, ContiguousLayoutsAndZigzag) {
  for (Layout l : {Layout::A2A, Layout::AllGather}) {
    const auto t = rank_tokens(l, 12, 3, 1);
    ASSERT_EQ(t.size(), 1u);
    EXPECT_EQ(t[0].local, 0);
    EXPECT_EQ(t[0].global, 4);
    EXPECT_EQ(t[0].count, 4);
  }
  // S = 8, P = 2: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2.
  EXPECT_EQ(rank_positions(Layout::P2P, 8, 2, 0), (std::vector<std::int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(rank_positions(Layout::P2P, 8, 2, 1), (std::vector<std::int64_t>{2, 3, 4, 5}));
  EXPECT_EQ(rank_positions(Layout::P2P, 4, 1, 0), (std::vector<std::int64_t>{0, 1, 2, 3}));
  // Every position once over the ranks; assembling the shards puts each token back in place.
  for (int P : {1, 2, 4, 8}) {
    const std::int64_t S = 16 * P, row = 3;
    std::vector<double> shards;
    std::vector<int> seen(S, 0);
    for (int r = 0; r < P; ++r)
      for (std::int64_t pos : rank_positions(Layout::P2P, S, P, r)) {
        ++seen[pos];
        for (std::int64_t j = 0; j < row; ++j) shards.push_back(double(pos * row + j));
      }
    for (std::int64_t p = 0; p < S; ++p) EXPECT_EQ(seen[p], 1) << "P " << P << " position " << p;
    const std::vector<double> whole = assemble_sequence(Layout::P2P, shards, S, P, row);
    for (std::int64_t i = 0; i < S * row; ++i) ASSERT_EQ(whole[i], double(i)) << "P " << P;
  }
  EXPECT_THROW(rank_tokens(Layout::P2P, 12, 4, 0), InvalidArgument);  // 12 tokens are not 8 chunks
}

// What each form keeps: LAGA its local latent (no per-head K/V), explicit its local per-head K/V as well.
TEST(RingBlock, SavedTensorsAreNamed) {
  const MlaConfig cfg = preset("tiny");
  const BlockShape sh{.batch = 1, .seq = 16, .ranks = 4, .rank = 1};
  auto names = [&](Form f) {
    std::map<std::string, std::size_t> out;
    for (const auto& t : plan_rank(cfg, BlockOptions{.form = f, .layout = Layout::P2P, .dtype = DType::F32}, sh).saved)
      out[t.name] = t.bytes;
    return out;
  };
  const auto laga = names(Form::Laga), ex = names(Form::Explicit);
  const std::size_t T = 4;  // local rows
  EXPECT_EQ(laga.at("latent"), T * std::size_t(cfg.latent_dim()) * 4);
  EXPECT_EQ(laga.count("k_local"), 0u);
  EXPECT_EQ(ex.at("k_local"), T * std::size_t(cfg.num_attention_heads * cfg.qk_head_dim()) * 4);
  EXPECT_EQ(ex.at("v_local"), T * std::size_t(cfg.num_attention_heads * cfg.v_head_dim) * 4);
  EXPECT_EQ(laga.at("lse"), 2 * std::size_t(cfg.num_attention_heads) * 2 * 4);  // [2, batch, n_h, c]
  for (const char* n : {"q_att", "o_att/o", "latent", "kv_down", "kv_rstd"}) EXPECT_EQ(laga.count(n), 1u) << n;
}

// DeepSeek-V3, S = 16384, P = 8, bf16: the ring holds one chunk pair's K/V at a time, so LAGA p2p peaks far
// below LAGA all_gather (K/V of all S tokens for every head) and keeps less than explicit p2p.
TEST(RingBlock, PlanMemoryAgainstAllGatherAndExplicitRing) {
  const MlaConfig cfg = preset("deepseek-v3");
  const BlockShape sh{.batch = 1, .seq = 16384, .ranks = 8, .rank = 7};
  auto plan = [&](Form f, Layout l) {
    return plan_rank(cfg, BlockOptions{.form = f, .layout = l, .dtype = DType::BF16}, sh);
  };
  const RankPlan laga_p2p = plan(Form::Laga, Layout::P2P), laga_ag = plan(Form::Laga, Layout::AllGather),
                 ex_p2p = plan(Form::Explicit, Layout::P2P);
  EXPECT_LT(std::max(laga_p2p.peak_forward, laga_p2p.peak_backward),
            std::max(laga_ag.peak_forward, laga_ag.peak_backward) / 2);
  EXPECT_LT(laga_p2p.saved_bytes, ex_p2p.saved_bytes);
  EXPECT_LT(laga_p2p.bytes_sent() * 10, ex_p2p.bytes_sent());
}

TEST(RingBlock, RefusesWhatTheRingCannotRun) {
  const MlaConfig cfg = preset("tiny");
  const BlockShape sh{.batch = 1, .seq = 20, .ranks = 4, .rank = 0};  // 20 tokens: not 8 chunks
  const BlockOptions ok{.form = Form::Laga, .layout = Layout::P2P, .kernel = AttentionKernel::Fused};
  auto message = [&](BlockOptions o, BlockShape s) {
    try {
      validate(cfg, o, s);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(ok, sh).find("not divisible by 2 x sp = 8"), std::string::npos) << message(ok, sh);
  BlockShape good = sh;
  good.seq = 32;
  EXPECT_EQ(message(ok, good), "");
  BlockOptions o = ok;
  o.kernel = AttentionKernel::Eager;
  EXPECT_NE(message(o, good).find("kernel = eager with layout = p2p"), std::string::npos) << message(o, good);
  o = ok;
  o.form = Form::Absorbed;
  EXPECT_NE(message(o, good).find("form = absorbed with layout = p2p"), std::string::npos) << message(o, good);
  o = ok;
  o.recompute = Recompute::KV;
  EXPECT_NE(message(o, good).find("recompute = kv with layout = p2p"), std::string::npos) << message(o, good);
  EXPECT_EQ(parse_layout("p2p"), Layout::P2P);
  EXPECT_STREQ(layout_name(Layout::P2P), "p2p");
}

}  // namespace
