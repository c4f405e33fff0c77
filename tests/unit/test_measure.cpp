// The library's measurement pieces the front ends share: names, the check policy, comparisons, the report
// of a rank's run, thread ranks.
#include <gtest/gtest.h>

#include <cmath>

#include "laga/errors.hpp"
#include "laga/measure.hpp"

namespace laga {
namespace {

TEST(MeasureNames, VariantIdsRoundTrip) {
  std::vector<std::string> ids;
  for (const Variant& v : kAllVariants) ids.push_back(variant_id(v));
  EXPECT_EQ(ids, (std::vector<std::string>{"explicit", "absorbed", "absorbed-expanded", "laga", "laga-recompute"}));
  EXPECT_EQ(parse_variant_ids(ids), (std::vector<std::size_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(parse_variant_ids({"laga", "explicit", "laga"}), (std::vector<std::size_t>{0, 3}));
  EXPECT_EQ(parse_variant_ids({"all"}).size(), kAllVariants.size());
  EXPECT_THROW(parse_variant_ids({"mla"}), InvalidArgument);
  EXPECT_EQ(parse_layouts({"all"}).size(), 2u);
  EXPECT_EQ(parse_kernels({"fused"}), std::vector<AttentionKernel>{AttentionKernel::Fused});
  EXPECT_THROW(parse_layouts({"ring"}), InvalidArgument);
  EXPECT_THROW(parse_device("gpu"), InvalidArgument);
  EXPECT_THROW(require_dtype_runs_on(DType::BF16, Device::Cpu), InvalidArgument);
  EXPECT_THROW(require_dtype_runs_on(DType::F64, Device::Cuda), InvalidArgument);
  EXPECT_NO_THROW(require_dtype_runs_on(DType::F32, Device::Cuda));
}

// A variant sets the form, recompute and absorbed attention only: every other option a front end chose
// (gradient dtype, accumulation into the gradients, overlap, the K/V gradient sum's dtype) stays.
TEST(MeasureNames, WithVariantKeepsTheOtherOptions) {
  const BlockOptions base{.layout = Layout::AllGather, .kernel = AttentionKernel::Eager, .dtype = DType::BF16,
                          .kv_grad_reduce_fp32 = true, .overlap = true, .grad_dtype = DType::BF16,
                          .accumulate_grads = true};
  for (const Variant& v : kAllVariants) {
    const BlockOptions o = with_variant(base, v);
    EXPECT_EQ(variant_of(o).name(), v.name());
    EXPECT_EQ(o.layout, base.layout);
    EXPECT_EQ(o.kernel, base.kernel);
    EXPECT_EQ(o.dtype, base.dtype);
    EXPECT_TRUE(o.kv_grad_reduce_fp32);
    EXPECT_TRUE(o.overlap);
    EXPECT_EQ(o.grad_dtype, std::optional<DType>(DType::BF16));
    EXPECT_TRUE(o.accumulate_grads);
  }
}

TEST(CheckPolicy, Bf16AtPAboveOneHoldsLagaToExplicitAtTheSameP) {
  BlockOptions laga{.form = Form::Laga, .dtype = DType::BF16};
  const CheckPolicy p = check_policy(laga, 4, Device::Cuda, 0);
  EXPECT_TRUE(p.same_p);
  EXPECT_EQ(p.same_p_tolerance, 1e-3);
  EXPECT_EQ(p.single_rank, 3e-2);  // bf16's own precision against the single-rank result
  EXPECT_TRUE(p.cpu_float64);
  EXPECT_EQ(p.cpu_float64_tolerance, 3e-2);
  // Explicit is its own same-P reference; at P = 1 there is none; absorbed rounds elsewhere.
  EXPECT_FALSE(check_policy(BlockOptions{.form = Form::Explicit, .dtype = DType::BF16}, 4, Device::Cuda, 0).same_p);
  EXPECT_FALSE(check_policy(laga, 1, Device::Cuda, 0).same_p);
  EXPECT_EQ(check_policy(laga, 1, Device::Cuda, 0).single_rank, 1e-3);
  // The ring sums key-chunk gradients of two attention calls in bf16 even at P = 1: held as P > 1 is.
  const BlockOptions ring{.form = Form::Laga, .layout = Layout::P2P, .dtype = DType::BF16};
  EXPECT_TRUE(check_policy(ring, 1, Device::Cuda, 0).same_p);
  EXPECT_EQ(check_policy(ring, 1, Device::Cuda, 0).single_rank, 3e-2);
  EXPECT_EQ(check_policy(BlockOptions{.form = Form::Absorbed, .dtype = DType::BF16}, 2, Device::Cuda, 0).same_p_tolerance,
            3e-2);
  // float32 and float64 on the cpu: one reference, the dtype's tolerance; --tolerance replaces it.
  const CheckPolicy f64 = check_policy(BlockOptions{.form = Form::Laga, .dtype = DType::F64}, 4, Device::Cpu, 0);
  EXPECT_EQ(f64.single_rank, 1e-10);
  EXPECT_FALSE(f64.same_p || f64.cpu_float64);
  EXPECT_EQ(check_policy(laga, 4, Device::Cuda, 5e-2).single_rank, 5e-2);
}

TEST(CheckAgainst, NanAndLargeErrorsFail) {
  GlobalResult ref{.y = {1, 2}, .dx = {3, 4}, .grads = {{"w_o", {1, 1}}}};
  GlobalResult got = ref;
  EXPECT_TRUE(check_against(CheckReference::SingleRank, got, ref, 1e-12).ok());
  got.dx[1] = std::nan("");
  const CheckResult nan = check_against(CheckReference::SingleRank, got, ref, 1e-12);
  EXPECT_FALSE(nan.ok());
  EXPECT_FALSE(nan.tensors[1].ok);
  got = ref;
  got.grads[0].second[0] = 1.1;
  EXPECT_FALSE(check_against(CheckReference::SameP, got, ref, 1e-3).ok());
  EXPECT_TRUE(check_against(CheckReference::SameP, got, ref, 1e-1).ok());
  const nlohmann::json j = check_report({check_against(CheckReference::CpuFloat64, got, ref, 1e-1)});
  EXPECT_EQ(j[0]["reference"], "CPU float64");
  EXPECT_EQ(j[0]["tensors"].size(), 3u);
}

TEST(RankReport, ThreadRanksMeasureAndGatherOneSchema) {
  const MlaConfig cfg = preset("tiny");
  const BlockOptions opts{.form = Form::Laga, .dtype = DType::F32};
  const int P = 2;
  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < P; ++r) backends.push_back(make_cpu_backend());
  std::vector<std::vector<nlohmann::json>> gathered(P);
  run_thread_ranks(P, [&](int r, Communicator& comm) {
    const BlockShape shape{.batch = 1, .seq = 16, .ranks = P, .rank = r};
    const Measurement m = measure(cfg, opts, shape, *backends[r], comm, 7, 1);
    EXPECT_FALSE(m.memory.have);
    gathered[r] = gather_reports(comm, rank_report(m.run, r, m.memory, -1));
  });
  for (int r = 0; r < P; ++r) {
    ASSERT_EQ(gathered[r].size(), std::size_t(P));
    for (int k = 0; k < P; ++k) {
      const nlohmann::json& j = gathered[r][k];
      EXPECT_EQ(j["rank"], k);
      EXPECT_GT(j["bytes_sent"].get<std::size_t>(), 0u);
      std::size_t sent = 0;
      for (const auto& c : j["traffic"]) sent += c["bytes_sent"].get<std::size_t>();
      EXPECT_EQ(j["bytes_sent"], sent);
      EXPECT_FALSE(j.contains("gpu"));
      // The span runs from the first op's start to the last op's end: the ops' time and the gaps between them.
      for (const char* pass : {"forward", "backward"}) {
        const double ops = j[std::string("seconds_") + pass + "_total"], span = j[std::string("seconds_") + pass + "_span"];
        EXPECT_GT(ops, 0) << pass;
        EXPECT_GE(span, ops) << pass;
      }
    }
  }
  EXPECT_EQ(options_report(opts)["variant"], "laga");
}

// A bench point's record holds the run as laga run writes it: each rank's rank_report (the last repeat) and the
// block options, beside the statistics of the repeats and the modeled time.
TEST(BenchPointReport, RanksAreRankReportsBesideTheRepeatStatistics) {
  const MlaConfig cfg = preset("tiny");
  const BlockOptions opts{.form = Form::Laga, .dtype = DType::F32};
  auto be = make_cpu_backend();
  auto comm = make_phantom_communicator(*be, 1, 2);
  const BlockShape shape{.batch = 1, .seq = 16, .ranks = 2, .rank = 1};
  RepeatedMeasurement rm = measure_repeated(cfg, opts, shape, *be, *comm, 7, 1, 3);
  ASSERT_EQ(rm.repeats.size(), 3u);
  EXPECT_EQ(rm.repeats.back().fwd.total_seconds(), rm.last.run.fwd.total_seconds());
  BenchPoint p{.seq = 16, .batch = 1, .sp = 2, .opts = opts, .ranks_run = "phantom", .rank = 1};
  p.runs.push_back(rm.last.run);
  p.repeats.push_back(rm.repeats);
  const nlohmann::ordered_json doc = bench_point_report(p, default_time_model(), 3, 1, -1, *be);
  const nlohmann::json run = run_report(opts, {rank_report(rm.last.run, 1, DeviceMemory{}, -1)}, nullptr, *be);
  for (const auto& [key, value] : run.items()) {
    ASSERT_TRUE(doc.contains(key)) << key;
    if (key != "ranks") EXPECT_EQ(nlohmann::json(doc[key]), value) << key;
  }
  ASSERT_EQ(doc["ranks"].size(), 1u);
  EXPECT_EQ(doc["ranks"][0]["rank"], 1);
  EXPECT_EQ(nlohmann::json(doc["ranks"][0]), run["ranks"][0]);  // the same record, key for key and figure for figure
  EXPECT_EQ(doc["repeats"]["rank"], 1);
  EXPECT_EQ(doc["repeats"]["block"]["n"], 3);
  // The block's span holds its ops and the gaps between them: never below their sum (within the rounding of
  // the seconds), repeat by repeat.
  EXPECT_EQ(doc["repeats"]["block_span"]["n"], 3);
  for (const TimedRepeat& r : rm.repeats) EXPECT_GE(r.block_span_seconds(), r.block_seconds() * (1 - 1e-12));
  EXPECT_GT(doc["repeats"]["block_span"]["min"].get<double>(), 0.0);
  EXPECT_EQ(doc["modeled"]["placements"].size(), 2u);
  EXPECT_FALSE(doc.contains("check") || doc.contains("gemms") || doc.contains("exposed_communication"));
}

}  // namespace
}  // namespace laga
