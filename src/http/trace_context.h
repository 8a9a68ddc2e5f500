// W3C Trace Context (https://www.w3.org/TR/trace-context/, §3.2 "traceparent Header"): the
// `traceparent` header that ties a client's trace to the router's and the instances' spans.
// Pure; table-tested (tests/http/tracing_test.cc, Traceparent.*).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>

namespace kvpush::http {

using TraceId = std::array<uint8_t, 16>;
using SpanId = std::array<uint8_t, 8>;

/// A span's place in a trace: which trace, which span (the parent of the spans the receiver
/// makes), and the trace flags (bit 0: sampled).
struct TraceContext {
  TraceId trace_id{};
  SpanId span_id{};
  uint8_t flags = 1;
  bool sampled() const { return (flags & 1) != 0; }
};

/// Parses a traceparent value: "00-<32 hex trace-id>-<16 hex parent-id>-<2 hex flags>" in
/// lower-case hex. A higher version is read by its first four fields when they are followed by
/// nothing or by '-' (the spec's forward compatibility). nullopt when invalid: version "ff", a
/// wrong length or separator, upper-case or non-hex digits, an all-zero trace or parent id, or
/// extra data after a version-00 value.
std::optional<TraceContext> ParseTraceparent(std::string_view value);

/// "00-<trace-id>-<span-id>-<flags>", lower-case hex.
std::string FormatTraceparent(const TraceContext& c);

/// Lower-case hex of `bytes`.
std::string Hex(const uint8_t* bytes, size_t n);

/// Random ids, never all zero (the spec's invalid value). Not thread-safe: `rng` is the caller's.
TraceId NewTraceId(std::mt19937_64& rng);
SpanId NewSpanId(std::mt19937_64& rng);

}  // namespace kvpush::http
