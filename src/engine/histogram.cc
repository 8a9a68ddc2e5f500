#include "engine/histogram.h"

#include <algorithm>
#include <utility>

namespace kvpush {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

std::vector<double> Histogram::LatencyBounds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0};
}

void Histogram::Record(double value) {
  auto it = std::lower_bound(bounds_.begin(), bounds_.end(), value);
  counts_[static_cast<size_t>(it - bounds_.begin())]++;
  sum_ += value;
  ++count_;
}

}  // namespace kvpush
