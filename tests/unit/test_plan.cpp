// The plan equals the measurement, exactly: saved tensors, peaks, traffic and FLOPs of the meta-backend
// plan against the CPU allocator and counting communicator of real runs, over a grid of configurations.
#include <gtest/gtest.h>

#include "laga/errors.hpp"
#include "laga/plan.hpp"
#include "laga/problem.hpp"

namespace laga {
namespace {

struct GridCase {
  int ranks;
  Layout layout;
  AttentionKernel kernel;
  std::int64_t batch;
};

std::string case_name(const testing::TestParamInfo<GridCase>& info) {
  const GridCase& c = info.param;
  return std::string(layout_name(c.layout)) + "_P" + std::to_string(c.ranks) + "_" + kernel_name(c.kernel) + "_b" +
         std::to_string(c.batch);
}

bool same_records(const std::vector<CollectiveRecord>& a, const std::vector<CollectiveRecord>& b, std::string* why) {
  if (a.size() != b.size()) {
    *why = "record counts " + std::to_string(a.size()) + " vs " + std::to_string(b.size());
    return false;
  }
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].phase != b[i].phase || a[i].kind != b[i].kind || a[i].tensor != b[i].tensor ||
        a[i].bytes_sent != b[i].bytes_sent || a[i].bytes_received != b[i].bytes_received || a[i].calls != b[i].calls) {
      *why = "record " + std::to_string(i) + " (" + a[i].tensor + " vs " + b[i].tensor + ", " +
             std::to_string(a[i].bytes_sent) + " vs " + std::to_string(b[i].bytes_sent) + " bytes)";
      return false;
    }
  return true;
}

class PlanEqualsMeasurement : public testing::TestWithParam<GridCase> {};

TEST_P(PlanEqualsMeasurement, SavedPeaksTrafficAndFlops) {
  const GridCase& c = GetParam();
  const MlaConfig cfg = preset("tiny");
  const std::int64_t seq = 16;
  for (const Variant& v : kAllVariants) {
    if (c.layout == Layout::P2P && (v.form == Form::Absorbed || v.recompute != Recompute::None)) continue;
    SCOPED_TRACE(v.name());
    const BlockOptions opts = v.options(c.layout, c.kernel, DType::F32);
    GroupRun measured = run_thread_group(cfg, opts, c.batch, seq, c.ranks, 7);
    for (int r = 0; r < c.ranks; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      const BlockShape shape{.batch = c.batch, .seq = seq, .ranks = c.ranks, .rank = r};
      const RankPlan plan = plan_rank(cfg, opts, shape);
      const RankRun& run = measured.ranks[r];
      // Saved tensors: the same names with the same bytes.
      ASSERT_EQ(plan.saved.size(), run.saved.size());
      std::map<std::string, std::size_t> planned;
      for (const auto& t : plan.saved) planned[t.name] = t.bytes;
      for (const auto& rec : run.saved) EXPECT_EQ(planned[rec.name], rec.bytes) << rec.name;
      EXPECT_EQ(plan.saved_bytes, run.saved_bytes);
      EXPECT_EQ(plan.peak_forward, run.fwd.peak_bytes);
      EXPECT_EQ(plan.peak_backward, run.bwd.peak_bytes);
      std::string why;
      EXPECT_TRUE(same_records(plan.traffic, run.traffic, &why)) << "plan vs measured: " << why;
      EXPECT_TRUE(same_records(expected_traffic(cfg, opts, shape), run.traffic, &why)) << "formula vs measured: " << why;
      for (int p = 0; p < kOpPhaseCount; ++p) {
        EXPECT_EQ(plan.fwd.flops[p], run.fwd.flops[p]) << op_phase_name(OpPhase(p));
        EXPECT_EQ(plan.bwd.flops[p], run.bwd.flops[p]) << op_phase_name(OpPhase(p));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, PlanEqualsMeasurement,
                         testing::Values(GridCase{1, Layout::A2A, AttentionKernel::Fused, 1},
                                         GridCase{1, Layout::A2A, AttentionKernel::Eager, 2},
                                         GridCase{2, Layout::A2A, AttentionKernel::Fused, 2},
                                         GridCase{2, Layout::AllGather, AttentionKernel::Eager, 1},
                                         GridCase{4, Layout::A2A, AttentionKernel::Eager, 1},
                                         GridCase{4, Layout::AllGather, AttentionKernel::Fused, 2},
                                         GridCase{1, Layout::P2P, AttentionKernel::Fused, 1},
                                         GridCase{2, Layout::P2P, AttentionKernel::Fused, 2},
                                         GridCase{4, Layout::P2P, AttentionKernel::Fused, 1}),
                         case_name);

// The arithmetic for one tiny configuration, by hand: preset tiny (d=32, n_h=4, r_q=16, r_kv=16, d_n=8,
// d_r=8, d_v=8; so d_qk=16 and the latent is 24 wide), S=8, batch 1, P=1, float32 (4 bytes), fused.
TEST(PlanByHand, TinyExplicitFused) {
  const BlockOptions opts{.form = Form::Explicit, .layout = Layout::A2A, .kernel = AttentionKernel::Fused,
                          .dtype = DType::F32};
  const RankPlan p = plan_rank(preset("tiny"), opts, BlockShape{.batch = 1, .seq = 8, .ranks = 1, .rank = 0});
  std::map<std::string, std::size_t> saved;
  for (const auto& t : p.saved) saved[t.name] = t.bytes;
  const std::map<std::string, std::size_t> expected{
      {"q_down", 8 * 16 * 4},   // x W_DQ, input of q_norm
      {"q_rstd", 8 * 4},        // q_norm's 1/rms per token
      {"c_q", 8 * 16 * 4},      // input of W_UQ
      {"kv_down", 8 * 24 * 4},  // x W_DKV, input of kv_norm
      {"kv_rstd", 8 * 4},
      {"latent", 8 * 24 * 4},     // [c_kv | k_pe], input of W_UK / W_UV
      {"q_att", 8 * 4 * 16 * 4},  // attention inputs q, k, v
      {"k_att", 8 * 4 * 16 * 4},
      {"v_att", 8 * 4 * 8 * 4},
      {"o_att", 8 * 4 * 8 * 4},  // fused attention keeps its output and log-sum-exp
      {"lse", 4 * 8 * 4},
      {"o", 8 * 4 * 8 * 4},  // input of W_O
  };
  EXPECT_EQ(saved, expected);
  EXPECT_EQ(p.saved_bytes, 9920u);  // 512+32+512+768+32+768+2048+2048+1024+1024+128+1024
  // a2a at P=1: every collective is still issued (q, k, v, o forward; o, k, v, q backward) but moves nothing.
  ASSERT_EQ(p.traffic.size(), 8u);
  for (const auto& r : p.traffic) EXPECT_EQ(r.bytes_sent + r.bytes_received, 0u) << r.tensor;
}

TEST(PlanByHand, TrafficAtDeepSeekV3Size) {
  // Values per local token and collective, bf16 (2 bytes), P=8, a2a: explicit moves q (128*192), k (128*192),
  // v (128*128), o (128*128) with 7/8 leaving the rank; LAGA moves q, o and a 576-wide latent to 7 ranks.
  const MlaConfig cfg = preset("deepseek-v3");
  const BlockShape sh{.batch = 1, .seq = 8 * 1024, .ranks = 8, .rank = 0};
  const std::size_t s = 1024;
  auto sent = [&](Form f, Layout l) {
    std::size_t b = 0;
    for (const auto& r : expected_traffic(cfg, BlockOptions{.form = f, .layout = l, .dtype = DType::BF16}, sh))
      if (r.phase == Phase::Forward) b += r.bytes_sent;
    return b;
  };
  EXPECT_EQ(sent(Form::Explicit, Layout::A2A), s * 2 * (24576 + 24576 + 16384 + 16384) * 7 / 8);
  EXPECT_EQ(sent(Form::Laga, Layout::A2A), s * 2 * ((24576 + 16384) * 7 / 8 + 576 * 7));
  EXPECT_EQ(sent(Form::Explicit, Layout::AllGather), s * 2 * 40960 * 7);
  EXPECT_EQ(sent(Form::Laga, Layout::AllGather), s * 2 * 576 * 7);
  EXPECT_EQ(sent(Form::Absorbed, Layout::AllGather), sent(Form::Laga, Layout::AllGather));
  // Backward: explicit mirrors its forward; the latent gradient is reduce-scattered in float32 (4 bytes).
  auto sent_backward = [&](Form f, Layout l) {
    std::size_t b = 0;
    for (const auto& r : expected_traffic(cfg, BlockOptions{.form = f, .layout = l, .dtype = DType::BF16}, sh))
      if (r.phase == Phase::Backward) b += r.bytes_sent;
    return b;
  };
  EXPECT_EQ(sent_backward(Form::Explicit, Layout::A2A), sent(Form::Explicit, Layout::A2A));
  EXPECT_EQ(sent_backward(Form::Laga, Layout::A2A), s * (2 * (24576 + 16384) * 7 / 8 + 4 * 576 * 7));
  EXPECT_EQ(sent_backward(Form::Laga, Layout::AllGather), s * 4 * 576 * 7);
}

// The traffic under the latent's other accountings, by hand. Preset tiny (n_h=4, d_qk=16, d_v=8, latent 24
// wide), S=16, batch 1, P=2: T=8 local tokens; bf16 (2 bytes), the latent's gradient in float32 (4 bytes).
TEST(PlanByHand, TrafficWhatIfs) {
  const MlaConfig tiny = preset("tiny");
  const BlockShape sh{.batch = 1, .seq = 16, .ranks = 2, .rank = 1};
  auto plan = [&](Form f, Layout l, DType dt) {
    return plan_rank(tiny, BlockOptions{.form = f, .layout = l, .kernel = AttentionKernel::Fused, .dtype = dt}, sh);
  };
  // LAGA a2a (2 heads a rank): q 8*2*16*2 = 512 bytes each way, o 8*2*8*2 = 256 each way, the latent gathered
  // 8*24*2 = 384 forward and its gradient reduce-scattered 8*24*4 = 768, each to the one other rank.
  const RankPlan la = plan(Form::Laga, Layout::A2A, DType::BF16);
  ASSERT_EQ(la.bytes_sent(), 2u * 512 + 2 * 256 + 384 + 768);
  TrafficWhatIf w = traffic_what_if(la);
  EXPECT_EQ(w.latent_grad_in_dtype, 2u * 512 + 2 * 256 + 384 + 384);      // the gradient in bf16: 384
  EXPECT_EQ(w.latent_as_all_to_all, 2.0 * 512 + 2 * 256 + 384 / 2 + 384 / 2);  // (P-1)/P of 384, both ways
  // Explicit has no latent: both accountings are as sent (q, k 512; v, o 256; each way).
  const RankPlan ex = plan(Form::Explicit, Layout::A2A, DType::BF16);
  ASSERT_EQ(ex.bytes_sent(), 2u * (512 + 512 + 256 + 256));
  w = traffic_what_if(ex);
  EXPECT_EQ(w.latent_grad_in_dtype, ex.bytes_sent());
  EXPECT_EQ(w.latent_as_all_to_all, double(ex.bytes_sent()));
  // all_gather: the latent alone, 384 forward and 768 back.
  w = traffic_what_if(plan(Form::Laga, Layout::AllGather, DType::BF16));
  EXPECT_EQ(w.latent_grad_in_dtype, 384u + 384);
  EXPECT_EQ(w.latent_as_all_to_all, 192.0 + 192);
  // p2p: the ring shifts the latent (384) forward and again in backward (kv_latent_resend, values: unchanged),
  // and its gradient P = 2 times (2 x 768, in bf16 2 x 384); ring shifts count as sent.
  const RankPlan ring = plan(Form::Laga, Layout::P2P, DType::BF16);
  ASSERT_EQ(ring.bytes_sent(), 384u + 384 + 2 * 768);
  w = traffic_what_if(ring);
  EXPECT_EQ(w.latent_grad_in_dtype, 384u + 384 + 2 * 384);
  EXPECT_EQ(w.latent_as_all_to_all, 384.0 + 384 + 2 * 384);
  // float32: the gradient already travels in the dtype; only the all-to-all accounting changes (768 each way).
  const RankPlan f32 = plan(Form::Laga, Layout::AllGather, DType::F32);
  ASSERT_EQ(f32.bytes_sent(), 768u + 768);
  w = traffic_what_if(f32);
  EXPECT_EQ(w.latent_grad_in_dtype, 768u + 768);
  EXPECT_EQ(w.latent_as_all_to_all, 384.0 + 384);
}

// The whole model: a layer's figures times num_hidden_layers; none when the configuration does not give it.
TEST(PlanByHand, ModelTotalIsALayerTimesTheLayerCount) {
  MlaConfig tiny = preset("tiny");
  const BlockOptions opts{.form = Form::Explicit, .layout = Layout::A2A, .kernel = AttentionKernel::Fused,
                          .dtype = DType::F32};
  const BlockShape sh{.batch = 1, .seq = 8, .ranks = 1, .rank = 0};
  EXPECT_FALSE(model_total(plan_rank(tiny, opts, sh)).has_value());
  tiny.num_hidden_layers = 3;
  const RankPlan p = plan_rank(tiny, opts, sh);
  const std::optional<ModelTotal> t = model_total(p);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->layers, 3);
  EXPECT_EQ(t->saved_bytes, 3u * 9920);  // PlanByHand.TinyExplicitFused's 9920 bytes a layer
  EXPECT_EQ(t->bytes_sent, 0u);          // P = 1
  EXPECT_EQ(t->flops, 3 * (p.fwd.total_flops() + p.bwd.total_flops()));
  EXPECT_GT(t->flops, 0.0);
  // At DeepSeek-V3 size, 61 layers, a2a, P = 8: LAGA sends 1/61 of the model's bytes in each layer.
  const MlaConfig ds = preset("deepseek-v3");
  const RankPlan la = plan_rank(ds, BlockOptions{.form = Form::Laga, .dtype = DType::BF16},
                                BlockShape{.batch = 1, .seq = 8192, .ranks = 8, .rank = 7});
  const std::size_t s = 1024;  // per layer: q and o each way (7/8 of 128*(192+128)), the latent to 7 ranks, back in float32
  EXPECT_EQ(model_total(la)->bytes_sent, 61 * s * (2 * 2 * (24576 + 16384) * 7 / 8 + (2 + 4) * 576 * 7));
}

TEST(PlanInput, BadValuesAreRefused) {
  EXPECT_THROW(parse_bytes("abc"), InvalidArgument);
  EXPECT_THROW(parse_bytes("12XB"), InvalidArgument);
  EXPECT_THROW(parse_bytes("-5GB"), InvalidArgument);
  EXPECT_DOUBLE_EQ(parse_bytes("141GB"), 141e9);
  EXPECT_DOUBLE_EQ(parse_bytes("80GiB"), 80.0 * (1ull << 30));
  const MlaConfig cfg = preset("deepseek-v3");
  const BlockOptions opts{.dtype = DType::BF16};
  try {
    plan_rank(cfg, opts, BlockShape{.batch = 1, .seq = 1000, .ranks = 3, .rank = 0});
    FAIL() << "seq not divisible by sp was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("seq = 1000 is not divisible by sp = 3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(plan_rank(cfg, opts, BlockShape{.batch = 1, .seq = 1024, .ranks = 0, .rank = 0}), InvalidArgument);
}

}  // namespace
}  // namespace laga

namespace laga {
namespace {

// Device fit by hand: the attention weights of DeepSeek-V3 are d*r_q + r_q + r_q*n_h*192 + d*576 + 512 +
// 512*n_h*128 + 512*n_h*128 + n_h*128*d parameters; bf16 weights (2 bytes) with float32 gradients (4 bytes).
TEST(PlanByHand, DeviceFitCountsBf16WeightsAndFloat32Gradients) {
  const MlaConfig cfg = preset("deepseek-v3");
  const BlockOptions opts{.form = Form::Laga, .layout = Layout::A2A, .kernel = AttentionKernel::Fused,
                          .dtype = DType::BF16};
  const RankPlan p = plan_rank(cfg, opts, BlockShape{.batch = 1, .seq = 4096, .ranks = 8, .rank = 7});
  const std::size_t params = 7168ull * 1536 + 1536 + 1536ull * 128 * 192 + 7168ull * 576 + 512 +
                             512ull * 128 * 128 * 2 + 128ull * 128 * 7168;
  const DeviceFit fit = device_fit(p, 61);
  EXPECT_EQ(fit.weights_and_grads, params * (2 + 4) * 61);
  EXPECT_EQ(fit.activation_peak, 60 * p.saved_bytes + std::max(p.peak_forward, p.peak_backward));
}

// kv_grad_reduce_fp32: explicit all_gather at P > 1 in bf16 reduce-scatters its K/V gradients in float32 (twice
// the bytes); the plan's block run (meta backend) counts exactly what the closed form says, and nothing else
// moves: not the forward, not a2a, not P = 1, not LAGA, not a float32 run.
TEST(PlanByHand, KvGradientsReducedInFloat32) {
  const MlaConfig cfg = preset("deepseek-v3");
  auto traffic = [&](Form f, Layout l, int P, DType dt, bool fp32) {
    const BlockOptions o{.form = f, .layout = l, .dtype = dt, .kv_grad_reduce_fp32 = fp32};
    return expected_traffic(cfg, o, BlockShape{.batch = 1, .seq = 2048, .ranks = P, .rank = 0});
  };
  auto bytes = [](const std::vector<CollectiveRecord>& rs, Phase ph, const std::string& tensor) {
    std::size_t b = 0;
    for (const auto& r : rs)
      if (r.phase == ph && (tensor.empty() || r.tensor == tensor)) b += r.bytes_sent;
    return b;
  };
  const auto off = traffic(Form::Explicit, Layout::AllGather, 4, DType::BF16, false);
  const auto on = traffic(Form::Explicit, Layout::AllGather, 4, DType::BF16, true);
  EXPECT_EQ(bytes(on, Phase::Backward, "k"), 2 * bytes(off, Phase::Backward, "k"));
  EXPECT_EQ(bytes(on, Phase::Backward, "v"), 2 * bytes(off, Phase::Backward, "v"));
  EXPECT_EQ(bytes(on, Phase::Forward, ""), bytes(off, Phase::Forward, ""));
  EXPECT_EQ(bytes(traffic(Form::Explicit, Layout::A2A, 4, DType::BF16, true), Phase::Backward, ""),
            bytes(traffic(Form::Explicit, Layout::A2A, 4, DType::BF16, false), Phase::Backward, ""));
  EXPECT_EQ(bytes(traffic(Form::Laga, Layout::AllGather, 4, DType::BF16, true), Phase::Backward, ""),
            bytes(traffic(Form::Laga, Layout::AllGather, 4, DType::BF16, false), Phase::Backward, ""));
  EXPECT_EQ(bytes(traffic(Form::Explicit, Layout::AllGather, 4, DType::F32, true), Phase::Backward, ""),
            bytes(traffic(Form::Explicit, Layout::AllGather, 4, DType::F32, false), Phase::Backward, ""));
  // The block itself (meta backend) sends what the closed form says, at a size where P = 4 splits evenly.
  const MlaConfig tiny = preset("tiny");
  for (int P : {1, 4}) {
    SCOPED_TRACE("P = " + std::to_string(P));
    const BlockOptions o{.form = Form::Explicit, .layout = Layout::AllGather, .dtype = DType::BF16,
                         .kv_grad_reduce_fp32 = true};
    const BlockShape sh{.batch = 2, .seq = 16, .ranks = P, .rank = P - 1};
    const RankPlan plan = plan_rank(tiny, o, sh);
    std::string why;
    EXPECT_TRUE(same_records(plan.traffic, expected_traffic(tiny, o, sh), &why)) << why;
    // The float32 copies are transient: the saved tensors are those of the default.
    BlockOptions d = o;
    d.kv_grad_reduce_fp32 = false;
    const RankPlan plain = plan_rank(tiny, d, sh);
    EXPECT_EQ(plan.saved_bytes, plain.saved_bytes);
    if (P > 1) EXPECT_GT(plan.peak_backward, plain.peak_backward);
    else EXPECT_EQ(plan.peak_backward, plain.peak_backward);
  }
}

}  // namespace
}  // namespace laga
