#include "server/metrics.h"

#include "http/prometheus.h"

namespace kvpush::server {
namespace {

/// The engine's scalar families, in page order, with how each reads its value.
struct EngineScalar {
  http::MetricFamily family;
  double (*value)(const EngineStats&);
};
const EngineScalar kEngineScalars[] = {
    {{"kvpush_num_requests_running", "gauge", "Requests in the running batch."},
     [](const EngineStats& s) { return static_cast<double>(s.num_running); }},
    {{"kvpush_num_requests_waiting", "gauge", "Requests waiting to be scheduled."},
     [](const EngineStats& s) { return static_cast<double>(s.num_waiting); }},
    {{"kvpush_num_requests_waiting_for_kv", "gauge",
      "Requests whose KV is being transferred from a prefill instance."},
     [](const EngineStats& s) { return static_cast<double>(s.num_waiting_for_kv); }},
    {{"kvpush_kv_loads_total", "counter", "Asynchronous KV loads that succeeded."},
     [](const EngineStats& s) { return static_cast<double>(s.kv_loads); }},
    {{"kvpush_kv_load_recomputes_total", "counter",
      "Failed KV loads recomputed locally (failure policy recompute)."},
     [](const EngineStats& s) { return static_cast<double>(s.kv_load_recomputes); }},
    {{"kvpush_kv_load_quarantines_total", "counter",
      "Failed KV loads whose blocks were held out of use because a WRITE could still land."},
     [](const EngineStats& s) { return static_cast<double>(s.kv_load_quarantines); }},
    {{"kvpush_kv_blocks_total", "gauge", "KV cache blocks in the pool."},
     [](const EngineStats& s) { return static_cast<double>(s.num_kv_blocks_total); }},
    {{"kvpush_kv_blocks_used", "gauge", "KV blocks referenced by requests."},
     [](const EngineStats& s) { return static_cast<double>(s.kv.num_used); }},
    {{"kvpush_kv_blocks_free", "gauge", "KV blocks free (never cached)."},
     [](const EngineStats& s) { return static_cast<double>(s.kv.num_free); }},
    {{"kvpush_kv_blocks_cached", "gauge", "KV blocks free but holding prefix-cache content."},
     [](const EngineStats& s) { return static_cast<double>(s.kv.num_cached); }},
    {{"kvpush_kv_cache_usage_perc", "gauge", "Fraction of KV blocks used (0-1)."},
     [](const EngineStats& s) {
       return s.num_kv_blocks_total > 0
                  ? static_cast<double>(s.kv.num_used) / static_cast<double>(s.num_kv_blocks_total)
                  : 0.0;
     }},
    {{"kvpush_prefix_cache_queries_total", "counter",
      "Full prompt blocks looked up in the prefix cache."},
     [](const EngineStats& s) { return static_cast<double>(s.kv.prefix_query_blocks); }},
    {{"kvpush_prefix_cache_hits_total", "counter", "Full prompt blocks found in the prefix cache."},
     [](const EngineStats& s) { return static_cast<double>(s.kv.prefix_hit_blocks); }},
    {{"kvpush_prefix_cache_evictions_total", "counter", "Cached blocks evicted for reuse."},
     [](const EngineStats& s) { return static_cast<double>(s.kv.evictions); }},
    {{"kvpush_prompt_tokens_total", "counter", "Prompt tokens of accepted requests."},
     [](const EngineStats& s) { return static_cast<double>(s.prompt_tokens); }},
    {{"kvpush_prompt_tokens_cached_total", "counter",
      "Prompt tokens served from the prefix cache."},
     [](const EngineStats& s) { return static_cast<double>(s.cached_prompt_tokens); }},
    {{"kvpush_prompt_tokens_computed_total", "counter",
      "Prompt tokens computed by this instance's model (prefill chunks, recomputation); "
      "never tokens whose KV came from a peer."},
     [](const EngineStats& s) { return static_cast<double>(s.prompt_tokens_computed); }},
    {{"kvpush_prompt_tokens_transferred_total", "counter",
      "P/D decode: prompt tokens whose KV arrived over the KV connector (loads that "
      "succeeded)."},
     [](const EngineStats& s) { return static_cast<double>(s.prompt_tokens_transferred); }},
    {{"kvpush_generation_tokens_total", "counter", "Generated tokens."},
     [](const EngineStats& s) { return static_cast<double>(s.generation_tokens); }},
    {{"kvpush_computed_tokens_total", "counter",
      "Tokens executed by the model (prefill chunks, decodes, recomputation)."},
     [](const EngineStats& s) { return static_cast<double>(s.computed_tokens); }},
    {{"kvpush_num_preemptions_total", "counter", "Requests preempted (recompute)."},
     [](const EngineStats& s) { return static_cast<double>(s.num_preemptions); }},
    {{"kvpush_engine_steps_total", "counter", "Engine steps executed."},
     [](const EngineStats& s) { return static_cast<double>(s.num_steps); }},
    {{"kvpush_requests_received_total", "counter", "Requests handed to the engine."},
     [](const EngineStats& s) { return static_cast<double>(s.requests_received); }},
};

}  // namespace

http::Labels ModelLabel(const std::string& model) {
  return {{"model_name", model}};
}

void HistogramSeries(http::PrometheusWriter& w, const std::string& name, const http::Labels& labels,
                     const Histogram& h) {
  w.HistogramSeries(name, labels, h.bounds(), h.counts(), h.sum(), h.count());
}

std::string RenderPrometheus(const EngineStats& s, const HttpCounters& responses,
                             const std::string& model_name) {
  http::PrometheusWriter w(ModelLabel(model_name));
  for (const EngineScalar& m : kEngineScalars) w.Scalar(m.family, m.value(s));
  w.Family({"kvpush_request_success_total", "counter", "Finished requests by finish reason."});
  for (FinishReason r :
       {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError}) {
    w.Sample("kvpush_request_success_total",
             static_cast<double>(s.finished_by_reason[static_cast<size_t>(r)]),
             {{"finished_reason", std::string(FinishReasonName(r))}});
  }
  w.Family({"kvpush_http_requests_total", "counter", "HTTP responses by path and status code."});
  for (const auto& [key, count] : responses) {
    w.Sample("kvpush_http_requests_total", static_cast<double>(count),
             {{"path", key.first}, {"status", std::to_string(key.second)}});
  }
  const struct {
    http::MetricFamily family;
    const Histogram& h;
  } histograms[] = {
      {{"kvpush_time_to_first_token_seconds", "histogram",
        "Time to first token (arrival to first token)."},
       s.ttft},
      {{"kvpush_time_per_output_token_seconds", "histogram",
        "Time per output token after the first (per request mean)."},
       s.tpot},
      {{"kvpush_inter_token_latency_seconds", "histogram", "Time between consecutive tokens."},
       s.itl},
      {{"kvpush_e2e_request_latency_seconds", "histogram", "Arrival to finish."}, s.e2e},
      {{"kvpush_request_queue_time_seconds", "histogram", "Arrival to first scheduled."},
       s.queue_time},
  };
  for (const auto& m : histograms) {
    w.Family(m.family);
    HistogramSeries(w, m.family.name, {}, m.h);
  }
  return w.str();
}

}  // namespace kvpush::server
