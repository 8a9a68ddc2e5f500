// Request tracing: spans of the router and the instances, exported to an OpenTelemetry collector
// over OTLP/HTTP in protobuf (vLLM's --otlp-traces-endpoint; docs/server.md, "Traces"). The
// encoding follows opentelemetry-proto v1 (collector/trace/v1/trace_service.proto,
// trace/v1/trace.proto, common/v1/common.proto, resource/v1/resource.proto); only the fields
// kvpush sets are written, with their field numbers from those files.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <variant>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "http/trace_context.h"

namespace kvpush::http {

/// One attribute of a span or a resource (OTLP KeyValue with a string, int, double or bool).
struct SpanAttribute {
  std::string key;
  std::variant<std::string, int64_t, double, bool> value;
};

/// OTLP Span.SpanKind values.
enum class SpanKind : uint8_t { kInternal = 1, kServer = 2, kClient = 3 };

/// One finished span. Times are Unix nanoseconds (Tracer::UnixNanos converts steady-clock ns).
struct Span {
  TraceId trace_id{};
  SpanId span_id{};
  SpanId parent_span_id{};  ///< all zero: a root span
  std::string name;
  SpanKind kind = SpanKind::kInternal;
  uint64_t start_unix_ns = 0;
  uint64_t end_unix_ns = 0;
  std::vector<SpanAttribute> attributes;
  bool error = false;          ///< status code ERROR (else UNSET)
  std::string status_message;  ///< with error
};

/// The protobuf bytes of an ExportTraceServiceRequest holding `spans` under one resource
/// (`resource` attributes, e.g. service.name) and one instrumentation scope. Pure.
std::string EncodeOtlpTraces(const std::vector<SpanAttribute>& resource,
                             std::string_view scope_name, std::string_view scope_version,
                             std::span<const Span> spans);

/// Collects finished spans and exports them in batches from a thread of its own: POST
/// application/x-protobuf to the endpoint (OTLP/HTTP). Record never blocks on I/O: when the queue
/// is full the span is dropped and counted. An export that fails is logged (its first failure
/// and every 100th) and dropped: tracing never holds a request. Thread-safe.
class Tracer {
 public:
  struct Options {
    /// "http://HOST:PORT[/PATH]"; an empty path means OTLP's default "/v1/traces".
    std::string endpoint;
    std::string service_name = "kvpush";
    std::string version = "unknown";      ///< the build (the instrumentation scope's version)
    std::vector<SpanAttribute> resource;  ///< more resource attributes (e.g. kvpush.role)
    size_t max_queue = 8192;
    size_t max_batch = 512;
    std::chrono::milliseconds flush_interval{200};
    double timeout_s = 5.0;
  };
  /// Errors: kInvalidArgument (the endpoint is not http://HOST:PORT[/PATH]; https and gRPC are
  /// not supported).
  static Result<std::unique_ptr<Tracer>> Create(Options options);
  /// Exports what is queued (waiting at most about timeout_s), then stops the thread.
  ~Tracer();
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  void Record(Span span);
  /// The context of a new span: `parent`'s trace (a new one when there is none) and a new span
  /// id. Its parent span id is `parent`'s span id (zero when none).
  TraceContext NewSpan(const std::optional<TraceContext>& parent);
  SpanId NewSpanId();
  /// Unix time minus the steady clock (ns), read now. Convert the times of one span family with
  /// one offset, so that equal steady times stay equal.
  static int64_t UnixOffset();
  /// A steady-clock reading (NowNs, ns) as Unix time (ns), given UnixOffset().
  static uint64_t UnixNanos(int64_t steady_ns, int64_t offset) {
    return static_cast<uint64_t>(steady_ns + offset);
  }

  uint64_t exported() const;  ///< spans the collector accepted
  uint64_t dropped() const;   ///< spans dropped (queue full, or their export failed)

 private:
  explicit Tracer(Options options, std::string host, int port, std::string path);
  void Run();
  void Export(std::vector<Span> batch);

  const Options options_;
  const std::string host_, path_;
  const int port_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Span> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::mt19937_64 rng_ GUARDED_BY(mu_);
  uint64_t exported_ GUARDED_BY(mu_) = 0;
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
  uint64_t failures_ GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace kvpush::http
