// DecodeStream: a streamed D leg (or colocated leg) relayed event by event. The leg is read on a
// thread of the router's WorkerPool (httplib's server can only write a streamed answer after the
// handler returned, and the handler must know D's status first); the HTTP handler thread waits
// for D's headers, then drains events.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "router/leg.h"
#include "router/worker_pool.h"

namespace kvpush::router {

/// Thread-safety: all methods may be called from any thread; the pool task only fills the
/// shared state. The destructor stops the leg if it is still running and waits until the task
/// is done with the leg.
class DecodeStream {
 public:
  /// Starts POSTing `body` to `path` on `leg` as a task of `workers`. When the pool refuses it
  /// (stopping), the stream ends at once as a stopped leg.
  DecodeStream(WorkerPool& workers, std::shared_ptr<Leg> leg, std::string path,
               std::string request_id, std::string body);
  ~DecodeStream();
  DecodeStream(const DecodeStream&) = delete;
  DecodeStream& operator=(const DecodeStream&) = delete;

  /// Blocks until D's headers arrived or the leg ended without them. Returns D's status, or 0
  /// when the leg ended without an answer (see result()).
  int WaitHeaders();

  /// Blocks until the leg ended; returns its result (for a non-200 status, with D's body).
  LegResult WaitFinished();

  /// Waits up to `timeout` for events; moves every complete event received so far into
  /// `*events`. Returns true once the leg has ended and no event is left to take.
  bool TakeEvents(std::chrono::milliseconds timeout, std::vector<std::string>* events);

  /// The leg's result; meaningful once TakeEvents returned true or WaitFinished returned.
  LegResult result() const;

  /// D's Content-Type (after WaitHeaders).
  std::string content_type() const;

  /// Closes the leg's connection (D aborts the request). Idempotent.
  void Stop() { leg_->Stop(); }

 private:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool headers = false;
    int status = 0;
    std::string content_type;
    std::deque<std::string> events;
    bool finished = false;
    LegResult result;
  };
  std::shared_ptr<Leg> leg_;
  std::shared_ptr<Shared> shared_;
};

}  // namespace kvpush::router
