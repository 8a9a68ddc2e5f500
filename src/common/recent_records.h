// RecentRecords: the last N records of something (a bounded ring, oldest dropped first), and the
// `limit` query parameter of the debug listings that return them (GET /debug/handoff_timeline on
// an instance and on the router).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvpush {

/// A listing's `limit`: decimal digits only (no sign, space or exponent), a value in [1, max].
/// nullopt otherwise (the caller answers 400). Pure.
inline std::optional<size_t> ParseListLimit(std::string_view v, size_t max) {
  if (v.empty() || v.size() > 9 || v.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  size_t n = 0;
  for (char c : v) n = n * 10 + static_cast<size_t>(c - '0');
  if (n < 1 || n > max) return std::nullopt;
  return n;
}

/// The last `capacity` records added (capacity >= 1). Thread-safe.
template <typename T>
class RecentRecords {
 public:
  explicit RecentRecords(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

  /// Keeps `r`, dropping the oldest record when full.
  void Add(T r) {
    MutexLock lock(mu_);
    ring_.push_back(std::move(r));
    if (ring_.size() > capacity_) ring_.pop_front();
  }
  /// Copies of the newest `limit` records, oldest first.
  std::vector<T> Newest(size_t limit) const {
    MutexLock lock(mu_);
    const size_t n = std::min(limit, ring_.size());
    return std::vector<T>(ring_.end() - static_cast<std::ptrdiff_t>(n), ring_.end());
  }

 private:
  const size_t capacity_;
  mutable Mutex mu_;
  std::deque<T> ring_ GUARDED_BY(mu_);
};

}  // namespace kvpush
