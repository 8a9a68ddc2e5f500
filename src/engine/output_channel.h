// OutputChannel: the per-request, thread-safe queue from the engine thread to one consumer
// (an HTTP handler thread or an offline caller).
#pragma once

#include <chrono>
#include <deque>
#include <optional>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine/request.h"

namespace kvpush {

/// Single-producer (engine thread), single-consumer queue of RequestOutput. The producer pushes
/// deltas and finally one output with finished() == true, after which the channel is closed.
/// Thread-safety: every method may be called from any thread.
class OutputChannel {
 public:
  /// Appends an output and wakes the consumer. Ignored after the final output.
  void Push(RequestOutput output);

  /// Waits up to `timeout` for the next output. Returns nullopt on timeout or once the final
  /// output has been taken.
  std::optional<RequestOutput> Next(std::chrono::milliseconds timeout);

  /// Non-blocking: pops everything available (possibly nothing).
  std::deque<RequestOutput> TakeAll();

  /// True once the final output has been pushed (it may not have been taken yet).
  bool closed() const;

 private:
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<RequestOutput> queue_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
  bool final_taken_ GUARDED_BY(mu_) = false;
};

}  // namespace kvpush
