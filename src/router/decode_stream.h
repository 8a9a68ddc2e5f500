// DecodeStream: a streamed D leg (or colocated leg) relayed event by event, read on the thread
// that relays it: the HTTP handler thread writes the request and reads D's status, and once the
// handler returned, httplib's content provider (the same thread) reads D's events and writes
// them to the client. No other thread touches the token path.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "router/leg.h"
#include "router/sse_splitter.h"

namespace kvpush::router {

/// Thread-safety: one thread at a time (the handler thread, then the content provider and its
/// releaser, which httplib runs on that same thread); Stop() from any thread.
class DecodeStream {
 public:
  explicit DecodeStream(std::shared_ptr<Leg> leg) : leg_(std::move(leg)) {}
  /// Closes the leg's connection when the stream did not end (D aborts the request).
  ~DecodeStream() {
    if (!finished_) leg_->Stop();
  }
  DecodeStream(const DecodeStream&) = delete;
  DecodeStream& operator=(const DecodeStream&) = delete;

  /// Writes the request (unless Leg::SendAhead did) and reads D's status and headers on this
  /// thread. Returns D's status, or 0 when the leg ended without an answer (see result()).
  int Start(const std::string& path, const std::string& request_id, const std::string& body);

  /// For a non-200 status: reads the rest of D's body; returns the leg's result.
  LegResult WaitFinished();

  /// Reads D's stream for up to `timeout` (0: only what already arrived) and moves every
  /// complete event into `*events`. Returns true once the leg has ended (its result is final)
  /// and no event is left to take. D silent for longer than the leg's I/O timeout fails the
  /// leg ("read timed out"), as any other read.
  bool TakeEvents(std::chrono::milliseconds timeout, std::vector<std::string>* events);

  /// The leg's result; meaningful once TakeEvents returned true or WaitFinished returned.
  const LegResult& result() const { return result_; }

  /// D's Content-Type (after Start).
  const std::string& content_type() const { return result_.content_type; }

  /// Closes the leg's connection (D aborts the request). Thread-safe, idempotent.
  void Stop() { leg_->Stop(); }

 private:
  std::shared_ptr<Leg> leg_;
  SseSplitter splitter_;
  LegResult result_;
  bool finished_ = false;
  int64_t last_data_ns_ = 0;  ///< when D's stream last delivered bytes (or the head arrived)
};

}  // namespace kvpush::router
