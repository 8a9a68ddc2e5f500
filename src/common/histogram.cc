#include "common/histogram.h"

#include <algorithm>
#include <utility>

namespace kvpush {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

std::vector<double> Histogram::LatencyBounds() {
  return {0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
          0.01,   0.015,   0.02,   0.025,   0.03,  0.04,   0.05,  0.06,  0.075, 0.08,
          0.1,    0.15,    0.2,    0.25,    0.3,   0.4,    0.5,   0.75,  0.8,   1.0,
          1.5,    2.0,     2.5,    5.0,     7.5,   10.0,   15.0,  20.0,  30.0,  40.0,
          50.0,   60.0,    80.0,   120.0,   160.0, 240.0,  480.0, 640.0, 960.0, 1920.0,
          2560.0, 7680.0};
}

std::vector<double> Histogram::OneTwoFiveBounds(int64_t max_value) {
  std::vector<double> out;
  for (int64_t exponent = 1;; exponent *= 10) {
    for (int64_t m : {1, 2, 5}) {
      const int64_t v = m * exponent;
      if (v > max_value) return out;
      out.push_back(static_cast<double>(v));
    }
  }
}

std::vector<double> Histogram::IterationTokenBounds() {
  return {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
}

void Histogram::Record(double value) {
  auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  counts_[static_cast<size_t>(it - bounds_.begin())]++;
  sum_ += value;
  ++count_;
}

}  // namespace kvpush
