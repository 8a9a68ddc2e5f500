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

  /// Bucket bounds used for latency histograms (seconds), vLLM's TTFT buckets.
  static std::vector<double> LatencyBounds();

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
