// An instance's spans of a request (docs/server.md, "Traces"): the server span of each
// completion request (continuing the router's or the client's `traceparent`), its engine phases
// (queue, prefill, decode) and, on a P/D instance, the handoff phases of its transfer as the
// connector recorded them (HandoffRecord), all exported by an http::Tracer.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "connector/handoff_timeline.h"
#include "engine/request.h"
#include "http/tracing.h"

namespace kvpush::server {

/// One request's trace: its span's context (trace id, the instance's span id), the span it
/// continues (zero: none), and when it arrived (steady ns).
struct RequestTrace {
  http::TraceContext context;
  http::SpanId parent{};
  int64_t start_ns = 0;
};

/// The server span of a finished HTTP request (`name`, e.g. "POST /v1/completions", from
/// trace.start_ns to now, `attributes`, ERROR status with `error` when not empty), and children
/// for the engine phases of `timing` (an engine request's final output: queue = arrival -> first
/// scheduled, prefill = first scheduled -> first token, decode = first -> last token; phases not
/// reached are left out). Thread-safe (the tracer is).
void RecordRequestSpans(http::Tracer& tracer, const RequestTrace& trace, const std::string& name,
                        std::vector<http::SpanAttribute> attributes, const std::string& error,
                        const RequestOutput* timing);

/// The handoff phases of transfers as children of their requests' spans: a request registers its
/// transfer id with its trace (Register); when the connector finishes the transfer's
/// HandoffRecord (possibly after the HTTP request ended: P's WRITEs complete after its answer),
/// OnRecord exports one span per handoff interval reached (HandoffIntervals: prefill_compute,
/// writes, decode_kv_wait, ...). Keeps the newest `capacity` registrations. Thread-safe.
class HandoffTraces {
 public:
  /// Shares `tracer`: the connector's observer may call OnRecord after the server is gone.
  explicit HandoffTraces(std::shared_ptr<http::Tracer> tracer, size_t capacity = 4096)
      : tracer_(std::move(tracer)), capacity_(capacity) {}
  void Register(const std::string& transfer_id, const http::TraceContext& request_span);
  /// The connector's observer (HandoffTimelineLog::SetObserver).
  void OnRecord(const connector::HandoffRecord& r);

 private:
  const std::shared_ptr<http::Tracer> tracer_;
  const size_t capacity_;
  Mutex mu_;
  std::unordered_map<std::string, http::TraceContext> by_transfer_ GUARDED_BY(mu_);
  std::deque<std::string> order_ GUARDED_BY(mu_);
};

}  // namespace kvpush::server
