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

/// A source of steady-clock time, injected where timers must be testable without sleeping
/// (e.g. the connector's TransferCore). Implementations must be safe to call from the thread
/// that owns the object they are injected into.
class Clock {
 public:
  virtual ~Clock() = default;
  /// The current steady-clock time.
  virtual TimePoint Now() const = 0;
  /// Now() in nanoseconds since the steady clock's epoch (the NowNs() scale).
  int64_t NowNanos() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Now().time_since_epoch()).count();
  }
};

/// The process's steady clock. Thread-safe.
class SystemClock final : public Clock {
 public:
  TimePoint Now() const override { return SteadyClock::now(); }
};

/// A clock that moves only when told (tests). Not thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(TimePoint start = TimePoint(std::chrono::hours(1))) : now_(start) {}
  TimePoint Now() const override { return now_; }
  void Advance(SteadyClock::duration d) { now_ += d; }

 private:
  TimePoint now_;
};

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
