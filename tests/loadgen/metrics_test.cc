// CalculateMetrics on hand-made timings: every figure checked against values worked out by hand
// with vLLM's definitions (vllm/benchmarks/serve.py calculate_metrics).
#include "loadgen/metrics.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kvpush::loadgen {
namespace {

constexpr double kEps = 1e-9;

RequestOutcome Ok(int64_t prompt, int64_t out, double ttft, std::vector<double> itl, double e2el,
                  double start) {
  RequestOutcome o;
  o.success = true;
  o.prompt_len = prompt;
  o.output_tokens = out;
  o.ttft_s = ttft;
  o.itl_s = std::move(itl);
  o.latency_s = e2el;
  o.start_s = start;
  return o;
}

// A: 4 tokens, B: 1 token (no TPOT), C: failed.
std::vector<RequestOutcome> ThreeRequests() {
  RequestOutcome failed;
  failed.prompt_len = 5;
  failed.error = "boom";
  return {Ok(10, 4, 0.1, {0.02, 0.03, 0.05}, 0.2, 0.0), Ok(20, 1, 0.3, {}, 0.3, 0.5), failed};
}

TEST(LoadgenMetrics, CountsTokensAndThroughputs) {
  auto m = CalculateMetrics(ThreeRequests(), 2.0, {99}, {}, false, false);
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 30);  // the failed request's prompt does not count
  EXPECT_EQ(m.total_output, 5);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{4, 1, 0}));
  EXPECT_NEAR(m.request_throughput, 1.0, kEps);
  EXPECT_NEAR(m.output_throughput, 2.5, kEps);
  EXPECT_NEAR(m.total_token_throughput, 17.5, kEps);
  EXPECT_NEAR(m.request_goodput, 0.0, kEps);  // no SLOs given
}

TEST(LoadgenMetrics, TtftTpotItlE2elMatchVllmDefinitions) {
  auto m = CalculateMetrics(ThreeRequests(), 2.0, {50, 99}, {}, false, false);
  const auto& ttft = m.summaries.at("ttft");
  EXPECT_NEAR(ttft.mean_ms, 200.0, kEps);
  EXPECT_NEAR(ttft.median_ms, 200.0, kEps);
  EXPECT_NEAR(ttft.std_ms, 100.0, kEps);  // population std (numpy ddof=0)
  ASSERT_EQ(ttft.percentiles_ms.size(), 2u);
  EXPECT_NEAR(ttft.percentiles_ms[1].second, 298.0, 1e-6);  // 100 + 200·0.99 (linear)
  // TPOT only from A: (0.2 − 0.1) / (4 − 1).
  const auto& tpot = m.summaries.at("tpot");
  EXPECT_NEAR(tpot.mean_ms, 100.0 / 3.0, 1e-9);
  EXPECT_NEAR(tpot.std_ms, 0.0, kEps);
  // ITL pooled: {20, 30, 50} ms.
  const auto& itl = m.summaries.at("itl");
  EXPECT_NEAR(itl.mean_ms, 100.0 / 3.0, 1e-9);
  EXPECT_NEAR(itl.median_ms, 30.0, 1e-9);
  // Deviations from the mean 100/3: −40/3, −10/3, 50/3.
  EXPECT_NEAR(itl.std_ms, std::sqrt((1600.0 / 9 + 100.0 / 9 + 2500.0 / 9) / 3.0), 1e-9);
  EXPECT_NEAR(itl.percentiles_ms[1].second, 49.6, 1e-9);  // rank 1.98: 30 + 20·0.98
  EXPECT_NEAR(m.summaries.at("e2el").mean_ms, 250.0, kEps);
  EXPECT_EQ(m.summaries.count("client_queue_time"), 0u);
}

TEST(LoadgenMetrics, GoodputCountsRequestsMeetingEverySlo) {
  // ttft ≤ 150 ms: only A. tpot ≤ 30 ms: only B (A's is 33.3, B's counts as 0).
  EXPECT_NEAR(
      CalculateMetrics(ThreeRequests(), 2.0, {99}, {{"ttft", 150}}, false, false).request_goodput,
      0.5, kEps);
  EXPECT_NEAR(
      CalculateMetrics(ThreeRequests(), 2.0, {99}, {{"tpot", 30}}, false, false).request_goodput,
      0.5, kEps);
  EXPECT_NEAR(
      CalculateMetrics(ThreeRequests(), 2.0, {99}, {{"ttft", 150}, {"tpot", 30}}, false, false)
          .request_goodput,
      0.0, kEps);
  EXPECT_NEAR(
      CalculateMetrics(ThreeRequests(), 2.0, {99}, {{"e2el", 300}}, false, false).request_goodput,
      1.0, kEps);
}

TEST(LoadgenMetrics, PeaksOfConcurrencyAndOutputRate) {
  auto m = CalculateMetrics(ThreeRequests(), 2.0, {99}, {}, false, false);
  EXPECT_EQ(m.max_concurrent_requests, 1);            // [0, 0.2) and [0.5, 0.8) do not overlap
  EXPECT_NEAR(m.max_output_tokens_per_s, 5.0, kEps);  // all 5 chunks in second 0
  // Back-to-back intervals [0, 1) and [1, 2): the departure is counted first.
  auto touch = CalculateMetrics({Ok(1, 2, 0.5, {0.5}, 1.0, 0.0), Ok(1, 2, 0.5, {0.5}, 1.0, 1.0)},
                                2.0, {99}, {}, false, false);
  EXPECT_EQ(touch.max_concurrent_requests, 1);
  auto overlap = CalculateMetrics({Ok(1, 2, 0.5, {0.5}, 1.0, 0.0), Ok(1, 2, 0.5, {0.5}, 1.0, 0.5)},
                                  2.0, {99}, {}, false, false);
  EXPECT_EQ(overlap.max_concurrent_requests, 2);
}

TEST(LoadgenMetrics, OutputLenFallsBackToChunksWithoutUsage) {
  auto m = CalculateMetrics({Ok(3, -1, 0.1, {0.01, 0.01}, 0.12, 0)}, 1.0, {99}, {}, false, false);
  EXPECT_EQ(m.total_output, 3);
  EXPECT_NEAR(m.summaries.at("tpot").mean_ms, 10.0, 1e-9);  // (120 − 100) / 2
}

TEST(LoadgenMetrics, ClientQueueSummariesOnlyWithMaxConcurrency) {
  auto reqs = ThreeRequests();
  reqs[0].queue_s = 0.05;
  auto m = CalculateMetrics(reqs, 2.0, {99}, {}, true, true);
  EXPECT_NEAR(m.summaries.at("client_queue_time").mean_ms, 25.0, kEps);
  EXPECT_NEAR(m.summaries.at("e2el_including_client_queue").mean_ms, 275.0, kEps);
  EXPECT_EQ(CalculateMetrics(reqs, 2.0, {99}, {}, true, false)
                .summaries.count("e2el_including_client_queue"),
            0u);
}

TEST(LoadgenMetrics, EmptyRunGivesZeros) {
  auto m = CalculateMetrics({}, 1.0, {99}, {}, false, false);
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.summaries.at("ttft").mean_ms, 0.0);
  EXPECT_EQ(m.summaries.at("ttft").percentiles_ms[0].second, 0.0);
}

TEST(LoadgenMetrics, PercentileIsNumpyLinear) {
  EXPECT_NEAR(Percentile({1, 2, 3, 4}, 50), 2.5, kEps);
  EXPECT_NEAR(Percentile({4, 1, 3, 2}, 25), 1.75, kEps);
  EXPECT_NEAR(Percentile({7}, 99), 7.0, kEps);
  EXPECT_NEAR(Percentile({1, 2}, 100), 2.0, kEps);
}

TEST(LoadgenMetrics, ParsesFlags) {
  auto g = ParseGoodput({"ttft:500", "e2el:2000.5"});
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->at("ttft"), 500.0);
  EXPECT_EQ(g->at("e2el"), 2000.5);
  EXPECT_FALSE(ParseGoodput({"itl:5"}).ok());
  EXPECT_FALSE(ParseGoodput({"ttft=5"}).ok());
  EXPECT_FALSE(ParseGoodput({"ttft:-1"}).ok());
  auto p = ParsePercentiles("50, 90,99.9");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, (std::vector<double>{50, 90, 99.9}));
  EXPECT_FALSE(ParsePercentiles("101").ok());
  EXPECT_FALSE(ParsePercentiles("x").ok());
  EXPECT_TRUE(ParsePercentileMetrics("ttft,tpot,itl,e2el").ok());
  EXPECT_FALSE(ParsePercentileMetrics("ttft,latency").ok());
}

}  // namespace
}  // namespace kvpush::loadgen
