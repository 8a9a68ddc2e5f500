// Prometheus text exposition (format 0.0.4) of the engine's and the HTTP server's metrics (the
// connector's are written by the P/D gate, pd_gate.h). Families vLLM has carry vLLM's `vllm:`
// names and units (tokens, seconds); kvpush's own are `kvpush_*`. Every family is listed in
// docs/server.md, "Metrics", with what it counts here.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "engine/engine_stats.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "common/histogram.h"
#include "http/prometheus.h"

namespace kvpush::server {

/// HTTP responses counted by (path, status code). Value type.
using HttpCounters = std::map<std::pair<std::string, int>, int64_t>;

/// vLLM's request-parameter histograms, kept by the HTTP server (the engine sees one request
/// per choice): one observation per completion request that finished, whatever its outcome.
/// Bounds: 1, 2, 5, 10, ... up to max_model_len (vLLM's build_1_2_5_buckets). Thread-safe.
class RequestParamHistograms {
 public:
  struct Snapshot {
    Histogram n;                          ///< the request's `n`
    Histogram max_tokens;                 ///< its max_tokens (as given or defaulted)
    Histogram max_num_generation_tokens;  ///< tokens of its longest choice
  };
  explicit RequestParamHistograms(int64_t max_model_len);
  void Record(int64_t n, int64_t max_tokens, int64_t max_num_generation_tokens);
  Snapshot snapshot() const;

 private:
  mutable Mutex mu_;
  Snapshot snap_ GUARDED_BY(mu_);
};

/// Renders every engine and server metric. `model_name` becomes the model_name label. Pure;
/// thread-safe.
std::string RenderPrometheus(const EngineStats& stats, const HttpCounters& responses,
                             const RequestParamHistograms::Snapshot& params,
                             const std::string& model_name);

/// {{"model_name", model}}: the label every instance metric carries (vLLM's name).
http::Labels ModelLabel(const std::string& model);

/// One series of a histogram family of `w` (Family written before): `h`'s buckets, sum, count.
void HistogramSeries(http::PrometheusWriter& w, const std::string& name, const http::Labels& labels,
                     const Histogram& h);

}  // namespace kvpush::server
