#include "server/metrics.h"

#include "http/prometheus.h"

namespace kvpush::server {
namespace {

/// A scalar family of the page, in page order, with how it reads its value.
struct EngineScalar {
  http::MetricFamily family;
  double (*value)(const EngineStats&);
};

double KvCacheUsage(const EngineStats& s) {
  return s.num_kv_blocks_total > 0
             ? static_cast<double>(s.kv.num_used) / static_cast<double>(s.num_kv_blocks_total)
             : 0.0;
}

/// vLLM's families (docs.vllm.ai "Production Metrics", vllm/v1/metrics/loggers.py), with vLLM's
/// names, types and units: a dashboard or alert written for vLLM reads them unchanged. The table
/// in docs/server.md says what each one counts here.
const EngineScalar kVllmScalars[] = {
    {{"vllm:num_requests_running", "gauge", "Number of requests in model execution batches."},
     [](const EngineStats& s) { return static_cast<double>(s.num_running); }},
    {{"vllm:num_requests_waiting", "gauge",
      "Number of requests waiting to be processed (waiting for the KV of a prefill instance "
      "included, as vLLM counts WAITING_FOR_REMOTE_KVS)."},
     [](const EngineStats& s) { return static_cast<double>(s.num_waiting + s.num_waiting_for_kv); }},
    {{"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage."},
     KvCacheUsage},
    {{"vllm:gpu_cache_usage_perc", "gauge",
      "KV-cache usage. 1 means 100 percent usage. vLLM's name before 0.10 (deprecated there for "
      "vllm:kv_cache_usage_perc); kept because vLLM's example Grafana dashboard reads it."},
     KvCacheUsage},
    {{"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed."},
     [](const EngineStats& s) { return static_cast<double>(s.prompt_tokens); }},
    {{"vllm:generation_tokens_total", "counter", "Number of generation tokens processed."},
     [](const EngineStats& s) { return static_cast<double>(s.generation_tokens); }},
    {{"vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine."},
     [](const EngineStats& s) { return static_cast<double>(s.num_preemptions); }},
    {{"vllm:prefix_cache_queries_total", "counter",
      "Prefix cache queries, in terms of number of queried tokens."},
     [](const EngineStats& s) { return static_cast<double>(s.prefix_cache_queried_tokens); }},
    {{"vllm:prefix_cache_hits_total", "counter",
      "Prefix cache hits, in terms of number of cached tokens."},
     [](const EngineStats& s) { return static_cast<double>(s.prefix_cache_hit_tokens); }},
    {{"vllm:external_prefix_cache_queries_total", "counter",
      "External prefix cache queries from the KV connector, in terms of number of queried "
      "tokens (every admitted prompt token on a P/D instance)."},
     [](const EngineStats& s) { return static_cast<double>(s.external_queried_tokens); }},
    {{"vllm:external_prefix_cache_hits_total", "counter",
      "External prefix cache hits from the KV connector, in terms of number of tokens whose KV "
      "arrived from a peer."},
     [](const EngineStats& s) { return static_cast<double>(s.prompt_tokens_transferred); }},
};

/// kvpush's own families: what vLLM has no family for.
const EngineScalar kKvpushScalars[] = {
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
    {{"kvpush_prefix_cache_evictions_total", "counter", "Cached blocks evicted for reuse."},
     [](const EngineStats& s) { return static_cast<double>(s.kv.evictions); }},
    {{"kvpush_prompt_tokens_cached_total", "counter",
      "Prompt tokens served from the local prefix cache (first admission; every request, "
      "prompt-logprobs ones included)."},
     [](const EngineStats& s) { return static_cast<double>(s.cached_prompt_tokens); }},
    {{"kvpush_prompt_tokens_computed_total", "counter",
      "Prompt tokens computed by this instance's model (prefill chunks, recomputation); "
      "never tokens whose KV came from a peer."},
     [](const EngineStats& s) { return static_cast<double>(s.prompt_tokens_computed); }},
    {{"kvpush_prompt_tokens_transferred_total", "counter",
      "P/D decode: prompt tokens whose KV arrived over the KV connector (loads that "
      "succeeded)."},
     [](const EngineStats& s) { return static_cast<double>(s.prompt_tokens_transferred); }},
    {{"kvpush_computed_tokens_total", "counter",
      "Tokens executed by the model (prefill chunks, decodes, recomputation)."},
     [](const EngineStats& s) { return static_cast<double>(s.computed_tokens); }},
    {{"kvpush_engine_steps_total", "counter", "Engine steps executed."},
     [](const EngineStats& s) { return static_cast<double>(s.num_steps); }},
    {{"kvpush_requests_received_total", "counter", "Requests handed to the engine."},
     [](const EngineStats& s) { return static_cast<double>(s.requests_received); }},
};

/// vLLM's histogram families of the engine, and which EngineStats histogram each shows.
struct EngineHistogram {
  http::MetricFamily family;
  const Histogram EngineStats::*h;
};
const EngineHistogram kVllmHistograms[] = {
    {{"vllm:time_to_first_token_seconds", "histogram",
      "Histogram of time to first token in seconds."},
     &EngineStats::ttft},
    {{"vllm:inter_token_latency_seconds", "histogram",
      "Histogram of inter-token latency in seconds."},
     &EngineStats::itl},
    {{"vllm:time_per_output_token_seconds", "histogram",
      "Histogram of time per output token in seconds (as in vLLM v1: the same observations as "
      "vllm:inter_token_latency_seconds, whose old name it is)."},
     &EngineStats::itl},
    {{"vllm:request_time_per_output_token_seconds", "histogram",
      "Histogram of time_per_output_token_seconds per request."},
     &EngineStats::tpot},
    {{"vllm:e2e_request_latency_seconds", "histogram",
      "Histogram of e2e request latency in seconds."},
     &EngineStats::e2e},
    {{"vllm:request_queue_time_seconds", "histogram",
      "Histogram of time spent in WAITING phase for request."},
     &EngineStats::queue_time},
    {{"vllm:request_inference_time_seconds", "histogram",
      "Histogram of time spent in RUNNING phase for request."},
     &EngineStats::inference_time},
    {{"vllm:request_prefill_time_seconds", "histogram",
      "Histogram of time spent in PREFILL phase for request."},
     &EngineStats::prefill_time},
    {{"vllm:request_decode_time_seconds", "histogram",
      "Histogram of time spent in DECODE phase for request."},
     &EngineStats::decode_time},
    {{"vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed."},
     &EngineStats::request_prompt_tokens},
    {{"vllm:request_generation_tokens", "histogram", "Number of generation tokens processed."},
     &EngineStats::request_generation_tokens},
    {{"vllm:request_prefill_kv_computed_tokens", "histogram",
      "Histogram of new KV tokens computed during prefill (excluding cached tokens)."},
     &EngineStats::request_prefill_kv_computed_tokens},
    {{"vllm:iteration_tokens_total", "histogram",
      "Histogram of number of tokens per engine_step."},
     &EngineStats::iteration_tokens},
};

/// The server's request-parameter histograms (RequestParamHistograms), vLLM's names.
void RenderRequestParams(http::PrometheusWriter& w, const RequestParamHistograms::Snapshot& p) {
  const struct {
    http::MetricFamily family;
    const Histogram& h;
  } rows[] = {
      {{"vllm:request_params_n", "histogram", "Histogram of the n request parameter."}, p.n},
      {{"vllm:request_params_max_tokens", "histogram",
        "Histogram of the max_tokens request parameter."},
       p.max_tokens},
      {{"vllm:request_max_num_generation_tokens", "histogram",
        "Histogram of maximum number of requested generation tokens (the longest choice of "
        "each request)."},
       p.max_num_generation_tokens},
  };
  for (const auto& m : rows) {
    w.Family(m.family);
    HistogramSeries(w, m.family.name, {}, m.h);
  }
}

}  // namespace

RequestParamHistograms::RequestParamHistograms(int64_t max_model_len)
    : snap_{Histogram(Histogram::OneTwoFiveBounds(max_model_len)),
            Histogram(Histogram::OneTwoFiveBounds(max_model_len)),
            Histogram(Histogram::OneTwoFiveBounds(max_model_len))} {}

void RequestParamHistograms::Record(int64_t n, int64_t max_tokens,
                                    int64_t max_num_generation_tokens) {
  MutexLock lock(mu_);
  snap_.n.Record(static_cast<double>(n));
  snap_.max_tokens.Record(static_cast<double>(max_tokens));
  snap_.max_num_generation_tokens.Record(static_cast<double>(max_num_generation_tokens));
}

RequestParamHistograms::Snapshot RequestParamHistograms::snapshot() const {
  MutexLock lock(mu_);
  return snap_;
}

http::Labels ModelLabel(const std::string& model) {
  return {{"model_name", model}};
}

void HistogramSeries(http::PrometheusWriter& w, const std::string& name, const http::Labels& labels,
                     const Histogram& h) {
  w.HistogramSeries(name, labels, h.bounds(), h.counts(), h.sum(), h.count());
}

std::string RenderPrometheus(const EngineStats& s, const HttpCounters& responses,
                             const RequestParamHistograms::Snapshot& params,
                             const std::string& model_name) {
  http::PrometheusWriter w(ModelLabel(model_name));
  for (const EngineScalar& m : kVllmScalars) w.Scalar(m.family, m.value(s));
  w.Family({"vllm:request_success_total", "counter",
            "Count of successfully processed requests, by finish reason."});
  for (FinishReason r :
       {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError}) {
    w.Sample("vllm:request_success_total",
             static_cast<double>(s.finished_by_reason[static_cast<size_t>(r)]),
             {{"finished_reason", std::string(FinishReasonName(r))}});
  }
  w.Family({"vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig."});
  w.Sample("vllm:cache_config_info", int64_t{1},
           {{"block_size", std::to_string(s.block_size)},
            {"cache_dtype", "auto"},
            {"enable_prefix_caching", s.prefix_caching_enabled ? "True" : "False"},
            {"num_gpu_blocks", std::to_string(s.num_kv_blocks_total)}});
  for (const EngineHistogram& m : kVllmHistograms) {
    w.Family(m.family);
    HistogramSeries(w, m.family.name, {}, s.*m.h);
  }
  RenderRequestParams(w, params);
  for (const EngineScalar& m : kKvpushScalars) w.Scalar(m.family, m.value(s));
  w.Family({"kvpush_http_requests_total", "counter", "HTTP responses by path and status code."});
  for (const auto& [key, count] : responses) {
    w.Sample("kvpush_http_requests_total", static_cast<double>(count),
             {{"path", key.first}, {"status", std::to_string(key.second)}});
  }
  return w.str();
}

}  // namespace kvpush::server
