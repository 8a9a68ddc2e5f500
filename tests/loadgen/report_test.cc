// The printed table and the result JSON: vLLM's layout, key names and order.
#include "loadgen/report.h"

#include <gtest/gtest.h>

#include <limits>

namespace kvpush::loadgen {
namespace {

std::vector<RequestOutcome> TwoRequests() {
  RequestOutcome a;
  a.success = true;
  a.prompt_len = 10;
  a.output_tokens = 3;
  a.ttft_s = 0.1;
  a.itl_s = {0.01, 0.02};
  a.latency_s = 0.13;
  a.generated_text = "abc";
  RequestOutcome b;
  b.prompt_len = 7;
  b.error = "HTTP 503: overloaded";
  return {a, b};
}

RunInfo Info() {
  RunInfo info;
  info.date = "20261130-120000";
  info.model_id = "stories260K.gguf";
  info.num_prompts = 2;
  info.request_rate = std::numeric_limits<double>::infinity();
  info.max_concurrency = 4;
  info.duration_s = 1.0;
  info.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  info.percentiles = {99, 99.9};
  return info;
}

TEST(LoadgenReport, JsonHasVllmKeysInOrder) {
  auto outcomes = TwoRequests();
  auto info = Info();
  auto m = CalculateMetrics(outcomes, 1.0, info.percentiles, {}, true, false);
  auto j = ResultJson(m, outcomes, info);
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(k);
  std::vector<std::string> want = {"date",
                                   "endpoint_type",
                                   "backend",
                                   "label",
                                   "model_id",
                                   "tokenizer_id",
                                   "num_prompts",
                                   "request_rate",
                                   "burstiness",
                                   "max_concurrency",
                                   "duration",
                                   "completed",
                                   "failed",
                                   "total_input_tokens",
                                   "total_output_tokens",
                                   "request_throughput",
                                   "request_goodput",
                                   "output_throughput",
                                   "total_token_throughput",
                                   "latencies",
                                   "queue_times",
                                   "max_output_tokens_per_s",
                                   "max_concurrent_requests",
                                   "rtfx"};
  for (std::string metric : {"ttft", "tpot", "itl", "e2el"}) {
    for (std::string s : {"mean_", "median_", "std_", "p99_", "p99.9_"}) {
      want.push_back(s + metric + "_ms");
    }
  }
  EXPECT_EQ(keys, want);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_TRUE(j["label"].is_null());
  EXPECT_EQ(j["completed"], 1);
  EXPECT_EQ(j["total_input_tokens"], 10);
  EXPECT_EQ(j["total_output_tokens"], 3);
  EXPECT_DOUBLE_EQ(j["mean_ttft_ms"].get<double>(), 100.0);
}

TEST(LoadgenReport, DetailedJsonKeepsPerRequestArrays) {
  auto outcomes = TwoRequests();
  auto info = Info();
  info.save_detailed = true;
  info.request_rate = 2.5;
  auto m = CalculateMetrics(outcomes, 1.0, info.percentiles, {{"ttft", 200}}, true, true);
  info.has_goodput = true;
  auto j = ResultJson(m, outcomes, info);
  EXPECT_EQ(j["input_lens"], nlohmann::json({10, 7}));
  EXPECT_EQ(j["output_lens"], nlohmann::json({3, 0}));
  EXPECT_EQ(j["ttfts"][0], 0.1);
  EXPECT_EQ(j["itls"][0], nlohmann::json({0.01, 0.02}));
  EXPECT_EQ(j["generated_texts"][0], "abc");
  EXPECT_EQ(j["errors"], nlohmann::json({"", "HTTP 503: overloaded"}));
  EXPECT_EQ(j["request_rate"], 2.5);
  EXPECT_DOUBLE_EQ(j["request_goodput"].get<double>(), 1.0);
}

TEST(LoadgenReport, TableMatchesVllmLayout) {
  auto outcomes = TwoRequests();
  auto info = Info();
  info.percentile_metrics = {"ttft", "e2el"};
  info.percentiles = {99};
  auto m = CalculateMetrics(outcomes, 1.0, info.percentiles, {}, true, false);
  const std::string t = FormatReport(m, info);
  EXPECT_EQ(t.rfind("============ Serving Benchmark Result ============\n", 0), 0u);
  EXPECT_NE(t.find("Successful requests:                     1         \n"), std::string::npos);
  EXPECT_NE(t.find("Failed requests:                         1         \n"), std::string::npos);
  EXPECT_NE(t.find("Maximum request concurrency:             4         \n"), std::string::npos);
  EXPECT_EQ(t.find("Request rate configured"), std::string::npos);  // inf is not printed
  EXPECT_NE(t.find("Total input tokens:                      10        \n"), std::string::npos);
  EXPECT_NE(t.find("Total generated tokens:                  3         \n"), std::string::npos);
  EXPECT_NE(t.find("---------------Time to First Token----------------\n"), std::string::npos);
  EXPECT_NE(t.find("Mean TTFT (ms):                          100.00    \n"), std::string::npos);
  EXPECT_NE(t.find("P99 E2EL (ms):                           130.00    \n"), std::string::npos);
  EXPECT_EQ(t.find("TPOT"), std::string::npos);  // not selected
  EXPECT_NE(t.find("\n==================================================\n"), std::string::npos);
}

TEST(LoadgenReport, FileNameAndFloatFormat) {
  auto info = Info();
  EXPECT_EQ(DefaultResultFilename(info),
            "openai-infqps-concurrency4-stories260K.gguf-20261130-120000.json");
  info.request_rate = 2;
  info.max_concurrency.reset();
  info.label = "push";
  info.model_id = "org/model";
  EXPECT_EQ(DefaultResultFilename(info), "push-2.0qps-model-20261130-120000.json");
  EXPECT_EQ(PyFloatStr(0.5), "0.5");
  EXPECT_EQ(PyFloatStr(10), "10.0");
}

}  // namespace
}  // namespace kvpush::loadgen
