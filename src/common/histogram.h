// Histogram: a Prometheus-style cumulative-bucket histogram of seconds (or any unit).
#pragma once

#include <cstdint>
#include <vector>

namespace kvpush {

/// Fixed upper bounds (ascending, +Inf implicit), per-bucket counts, sum and count. Value type;
/// not thread-safe (the engine thread records, readers take copies).
class Histogram {
 public:
  Histogram() = default;
  explicit Histogram(std::vector<double> bounds);

  /// Bucket bounds (seconds) of every latency histogram: a superset of vLLM's three latency
  /// bucket sets (vllm/v1/metrics/loggers.py: TTFT 0.001..2560, ITL/TPOT 0.01..80, request
  /// phases 0.3..7680), so any `le` a vLLM alert or dashboard names exists here too, plus finer
  /// bounds from 100 us (a CPU decode step, a sub-millisecond handoff). 52 bounds.
  static std::vector<double> LatencyBounds();
  /// vLLM's build_1_2_5_buckets(max_value): 1, 2, 5, 10, 20, 50, ... up to `max_value`
  /// (token counts per request; max_value = max_model_len).
  static std::vector<double> OneTwoFiveBounds(int64_t max_value);
  /// Tokens per engine step (vLLM's iteration_tokens_total buckets, its default CUDA-graph
  /// capture sizes): 1, 8, 16, ..., 16384.
  static std::vector<double> IterationTokenBounds();

  void Record(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  /// counts()[i] = observations <= bounds()[i] and > bounds()[i-1]; counts().back() is +Inf.
  const std::vector<uint64_t>& counts() const { return counts_; }
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

}  // namespace kvpush
