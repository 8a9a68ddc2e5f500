// The printed table and the result JSON of `kvpush bench`, in the layout and with the keys of
// vLLM's `vllm bench serve` (vllm/benchmarks/serve.py: benchmark() and main_async()). Pure.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "loadgen/metrics.h"

namespace kvpush::loadgen {

/// The run's configuration as it appears in the report and the JSON.
struct RunInfo {
  std::string date;  ///< "%Y%m%d-%H%M%S", local time (vLLM's current_dt)
  std::string backend = "openai";
  std::string label;     ///< --label; empty → null in JSON, backend in file names
  std::string model_id;  ///< --model, or the first /v1/models entry's root
  int64_t num_prompts = 0;
  double request_rate = 0;  ///< +inf allowed
  double burstiness = 1.0;
  std::optional<int64_t> max_concurrency;
  double duration_s = 0;
  std::vector<std::string> percentile_metrics;  ///< which summaries to print and save
  std::vector<double> percentiles;
  bool has_goodput = false;
  bool save_detailed = false;  ///< keep per-request arrays (vLLM --save-detailed)
};

/// Python's str(float) for the values kvpush formats: "inf", "10.0", "2.5".
std::string PyFloatStr(double v);

/// The "============ Serving Benchmark Result ============" table, lines in vLLM's order, each
/// "{:<40} {:<10}" (floats with 2 decimals), one section per selected percentile metric.
std::string FormatReport(const BenchmarkMetrics& m, const RunInfo& info);

/// The result JSON (ordered as vLLM writes it): date, endpoint_type, backend, label, model_id,
/// tokenizer_id (null: kvpush uses no client-side tokenizer), num_prompts, request_rate ("inf"
/// or a number), burstiness, max_concurrency, duration, completed, failed, total_input_tokens,
/// total_output_tokens, request_throughput, request_goodput (null without --goodput),
/// output_throughput, total_token_throughput, [input_lens, output_lens, ttfts, itls,
/// start_times, generated_texts, errors: only with save_detailed], latencies, queue_times,
/// max_output_tokens_per_s, max_concurrent_requests, rtfx, then mean_/median_/std_/p<P>_<metric>_ms
/// per selected metric. Per-request times are in seconds, summaries in ms.
nlohmann::ordered_json ResultJson(const BenchmarkMetrics& m,
                                  const std::vector<RequestOutcome>& outcomes, const RunInfo& info);

/// vLLM's default result file name: "{label or backend}-{rate}qps[-concurrency{C}]-{model
/// basename}-{date}.json".
std::string DefaultResultFilename(const RunInfo& info);

}  // namespace kvpush::loadgen
