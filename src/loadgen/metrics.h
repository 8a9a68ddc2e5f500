// Metric aggregation of `kvpush bench`, with the definitions of vLLM's
// vllm/benchmarks/serve.py calculate_metrics (quoted per field below). Pure: no I/O, no clocks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvpush::loadgen {

/// What one benchmark request produced. Times in seconds; `start_s` is counted from the start
/// of the benchmark (vLLM stores perf_counter readings there).
struct RequestOutcome {
  bool success = false;
  std::string error;           ///< empty on success
  int64_t prompt_len = 0;      ///< input tokens (usage.prompt_tokens when sent, else dataset)
  int64_t output_tokens = -1;  ///< usage.completion_tokens; ≤ 0 = unknown (then chunks count)
  double ttft_s = 0;           ///< send → first chunk carrying generated content
  std::vector<double> itl_s;   ///< gaps between consecutive content chunks
  double latency_s = 0;        ///< E2EL: send → last content chunk (vLLM's `latency`)
  double start_s = 0;          ///< when the request was sent, from the benchmark start
  double queue_s = 0;          ///< scheduled arrival → sent (waiting for --max-concurrency)
  std::string generated_text;
};

/// mean / median / std (population, numpy's default ddof = 0) and percentiles, in ms. Empty
/// input gives zeros, as vLLM's `np.mean(x or 0)`.
struct MetricSummary {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  ///< (p, value)
};

/// The p-th percentile (0..100) of `values` with numpy's default linear interpolation
/// (rank p/100·(n−1)); 0 for an empty vector. Does not need sorted input.
double Percentile(std::vector<double> values, double p);

/// Summary of `values_s` (seconds) in milliseconds.
MetricSummary Summarize(const std::vector<double>& values_s,
                        const std::vector<double>& percentiles);

/// Goodput SLOs in ms by metric name ("ttft", "tpot", "e2el").
using GoodputSlos = std::map<std::string, double>;

/// Aggregate of a run. Throughputs are per second of `duration_s`.
struct BenchmarkMetrics {
  int64_t completed = 0;  ///< successful requests
  int64_t failed = 0;
  int64_t total_input = 0;            ///< Σ prompt_len over successful requests
  int64_t total_output = 0;           ///< Σ output lens (failed requests count 0)
  double request_throughput = 0;      ///< completed / duration
  double request_goodput = 0;         ///< requests meeting every SLO / duration
  double output_throughput = 0;       ///< total_output / duration
  double total_token_throughput = 0;  ///< (total_input + total_output) / duration
  double max_output_tokens_per_s =
      0;  ///< most content chunks in one 1-s bucket from the first send
  int64_t max_concurrent_requests = 0;  ///< peak overlap of [start, start + E2EL) intervals
  std::vector<int64_t> output_lens;     ///< per request, 0 for failed ones
  /// By metric name: "ttft", "tpot", "itl", "e2el", and with --max-concurrency
  /// "client_queue_time" and (finite rate) "e2el_including_client_queue".
  std::map<std::string, MetricSummary> summaries;
};

/// Aggregates per vLLM's calculate_metrics:
///  - output len = usage.completion_tokens, or the number of content chunks when unknown;
///  - TTFT per successful request; ITL pooled over all chunk gaps of all requests;
///  - TPOT = (E2EL − TTFT) / (output len − 1), only requests with output len > 1 (for goodput a
///    request with ≤ 1 token has TPOT 0);
///  - E2EL = latency; goodput counts requests whose every given SLO ≥ its metric.
/// `has_max_concurrency` / `finite_rate` add the client-queue summaries as vLLM does.
BenchmarkMetrics CalculateMetrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                                  const std::vector<double>& percentiles, const GoodputSlos& slos,
                                  bool has_max_concurrency, bool finite_rate);

/// Parses --goodput "KEY:VALUE" pairs (ms). Errors: kInvalidArgument for a bad pair, an unknown
/// key (allowed: ttft, tpot, e2el) or a negative value.
Result<GoodputSlos> ParseGoodput(const std::vector<std::string>& pairs);

/// Parses --metric-percentiles "25,50,99.9". Errors: kInvalidArgument (not a number, outside
/// [0, 100]).
Result<std::vector<double>> ParsePercentiles(const std::string& csv);

/// Parses --percentile-metrics "ttft,tpot,itl,e2el". Errors: kInvalidArgument for an unknown
/// name (allowed: ttft, tpot, itl, e2el, client_queue_time, e2el_including_client_queue).
Result<std::vector<std::string>> ParsePercentileMetrics(const std::string& csv);

}  // namespace kvpush::loadgen
