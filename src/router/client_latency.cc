#include "router/client_latency.h"

#include <string>

namespace kvpush::router {
namespace {

size_t Index(TransferMode mode, ClientLatency which) {
  return static_cast<size_t>(which) * 3 + static_cast<size_t>(mode);
}

const http::MetricFamily kFamilies[] = {
    {"kvpush_router_time_to_first_token_seconds", "histogram",
     "Client-side time to first token of streamed requests, by transfer mode: the router "
     "received the request -> it relayed the first data event."},
    {"kvpush_router_inter_token_latency_seconds", "histogram",
     "Client-side time between consecutive data events of streamed requests, by transfer mode."},
    {"kvpush_router_e2e_request_latency_seconds", "histogram",
     "Client-side latency of requests answered 200, by transfer mode: received -> the answer's "
     "end."},
};

}  // namespace

ClientLatencies::ClientLatencies() {
  MutexLock lock(mu_);
  for (Histogram& h : h_) h = Histogram(Histogram::LatencyBounds());
}

void ClientLatencies::Record(TransferMode mode, ClientLatency which, double seconds) {
  if (static_cast<size_t>(mode) >= kModes || which == ClientLatency::kCount) return;
  MutexLock lock(mu_);
  h_[Index(mode, which)].Record(seconds);
}

void ClientLatencies::Render(http::PrometheusWriter& w,
                             const std::vector<TransferMode>& modes) const {
  MutexLock lock(mu_);
  for (size_t k = 0; k < kKinds; ++k) {
    w.Family(kFamilies[k]);
    for (TransferMode m : modes) {
      const Histogram& h = h_[Index(m, static_cast<ClientLatency>(k))];
      w.HistogramSeries(kFamilies[k].name, {{"mode", TransferModeName(m)}}, h.bounds(),
                        h.counts(), h.sum(), h.count());
    }
  }
}

}  // namespace kvpush::router
