// Prometheus text exposition (format 0.0.4) of the engine's and the HTTP server's metrics.
// Metric names are listed in docs/server.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "engine/engine_stats.h"

namespace kvpush::connector {
struct ConnectorStats;
class HandoffTimelineLog;
}  // namespace kvpush::connector

namespace kvpush::server {

/// HTTP responses counted by (path, status code). Value type.
using HttpCounters = std::map<std::pair<std::string, int>, int64_t>;

/// Renders every metric. `model_name` becomes the model_name label. Pure; thread-safe.
std::string RenderPrometheus(const EngineStats& stats, const HttpCounters& responses,
                             const std::string& model_name);

/// The P/D connector's counters (kvpush_kv_transfer_*), Prometheus text, and
/// kvpush_pd_local_prefill_requests_total = `local_prefill_requests` (requests this P/D
/// instance served with no kv_transfer_params: prefilled here, no P leg).
std::string RenderConnectorMetrics(const connector::ConnectorStats& stats,
                                   const std::string& model_name,
                                   int64_t local_prefill_requests = 0);

/// kvpush_pd_handoff_phase_seconds{phase, mode}: one histogram per handoff interval
/// (connector/handoff_timeline.h, HandoffIntervals) and mode observed on this instance.
std::string RenderHandoffMetrics(const connector::HandoffTimelineLog& log,
                                 const std::string& model_name);

}  // namespace kvpush::server
