// Monotonic clock helpers. All durations in kvpush are steady-clock based; wall-clock time is
// used only for log/HTTP timestamps.
#pragma once

#include <chrono>
#include <cstdint>

namespace kvpush {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;

/// Nanoseconds on the steady clock since an arbitrary epoch. Thread-safe.
inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
      .count();
}

/// Seconds (double) between two NowNs() readings.
inline double NsToSeconds(int64_t ns) {
  return static_cast<double>(ns) * 1e-9;
}
inline double NsToMs(int64_t ns) {
  return static_cast<double>(ns) * 1e-6;
}

/// Measures elapsed time from construction (or Reset()). Not thread-safe.
class Stopwatch {
 public:
  Stopwatch() : start_(NowNs()) {}
  void Reset() { start_ = NowNs(); }
  int64_t ElapsedNs() const { return NowNs() - start_; }
  double ElapsedMs() const { return NsToMs(ElapsedNs()); }

 private:
  int64_t start_;
};

}  // namespace kvpush
