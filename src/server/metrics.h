// Prometheus text exposition (format 0.0.4) of the engine's and the HTTP server's metrics (the
// connector's are written by the P/D gate, pd_gate.h).
// Metric names are listed in docs/server.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "engine/engine_stats.h"
#include "engine/histogram.h"
#include "http/prometheus.h"

namespace kvpush::server {

/// HTTP responses counted by (path, status code). Value type.
using HttpCounters = std::map<std::pair<std::string, int>, int64_t>;

/// Renders every metric. `model_name` becomes the model_name label. Pure; thread-safe.
std::string RenderPrometheus(const EngineStats& stats, const HttpCounters& responses,
                             const std::string& model_name);

/// {{"model_name", model}}: the label every instance metric carries (vLLM's name).
http::Labels ModelLabel(const std::string& model);

/// One series of a histogram family of `w` (Family written before): `h`'s buckets, sum, count.
void HistogramSeries(http::PrometheusWriter& w, const std::string& name, const http::Labels& labels,
                     const Histogram& h);

}  // namespace kvpush::server
