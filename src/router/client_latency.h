// ClientLatencies: the router's histograms of what its clients saw, per transfer mode: time to
// first token, inter-token latency and end-to-end latency (docs/router.md, "Metrics"). These are
// the P/D numbers kvpush exists for, measured where a client measures them (the instances'
// vllm:* histograms start only when the request reaches them).
#pragma once

#include <array>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "common/histogram.h"
#include "http/prometheus.h"
#include "router/flow_mode.h"

namespace kvpush::router {

/// Which client-side latency an observation is.
enum class ClientLatency : uint8_t {
  /// Streamed requests: the router received the request (its body parsed) -> it relayed the
  /// answer's first data event.
  kTtft,
  /// Streamed requests: between consecutive data events relayed (events D sent together are
  /// relayed together: their gaps are ~0, as the client sees them).
  kItl,
  /// Every request answered 200: received -> the answer's last byte handed to the HTTP layer.
  kE2e,
  kCount
};

/// One histogram (seconds, Histogram::LatencyBounds: a superset of vLLM's bounds) per (latency,
/// mode). Thread-safe: flows record from any thread, /metrics renders.
class ClientLatencies {
 public:
  ClientLatencies();
  void Record(TransferMode mode, ClientLatency which, double seconds);
  /// kvpush_router_time_to_first_token_seconds, kvpush_router_inter_token_latency_seconds and
  /// kvpush_router_e2e_request_latency_seconds, one series per mode of `modes` (mode="push", ...).
  void Render(http::PrometheusWriter& w, const std::vector<TransferMode>& modes) const;

 private:
  static constexpr size_t kModes = 3;
  static constexpr size_t kKinds = static_cast<size_t>(ClientLatency::kCount);
  mutable Mutex mu_;
  std::array<Histogram, kModes * kKinds> h_ GUARDED_BY(mu_);
};

}  // namespace kvpush::router
