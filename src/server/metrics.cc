#include "server/metrics.h"

#include "connector/pd_connector.h"
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

/// The connector's scalar families, in page order (the auth failures family goes between the two
/// tables), with how each reads its value.
struct ConnectorScalar {
  http::MetricFamily family;
  double (*value)(const connector::ConnectorStats&);
};
const ConnectorScalar kConnectorScalars[] = {
    {{"kvpush_kv_transfer_handshakes_total", "counter", "P/D handshakes completed."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.handshakes); }},
    {{"kvpush_kv_transfer_push_targets_sent_total", "counter", "PUSH_TARGETs sent (decode)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.push_targets_sent); }},
    {{"kvpush_kv_transfer_push_targets_received_total", "counter",
      "PUSH_TARGETs received (prefill)."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(c.push_targets_received);
     }},
    {{"kvpush_kv_transfer_writes_total", "counter", "KV WRITE transfers posted (prefill)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.writes_posted); }},
    {{"kvpush_kv_transfer_bytes_written_total", "counter", "KV bytes written to decode instances."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.bytes_written); }},
    {{"kvpush_kv_transfer_kv_ready_sent_total", "counter",
      "KV_READY sent (prefill, push), as a message or as the last WRITE's notification."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.kv_ready_sent); }},
    {{"kvpush_kv_transfer_kv_ready_on_write_total", "counter",
      "Prefill, push: KV_READYs that were the notification of the transfer's last WRITE (no "
      "message of their own)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.kv_ready_on_write); }},
    {{"kvpush_kv_transfer_kv_ready_received_total", "counter", "KV_READY messages received."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.kv_ready_received); }},
    {{"kvpush_kv_transfer_reads_total", "counter", "Pull READs completed (decode)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.reads_completed); }},
    {{"kvpush_kv_transfer_failed_total", "counter", "Transfers that ended in an error."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.transfers_failed); }},
    {{"kvpush_kv_transfer_watchdog_expired_total", "counter", "Decode watchdog expiries."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.watchdog_expired); }},
    {{"kvpush_kv_transfer_leases_expired_total", "counter", "Prefill leases that expired."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.leases_expired); }},
    {{"kvpush_kv_transfer_not_needed_total", "counter",
      "Decode: full prefix hits (no KV moved; NOT_NEEDED sent in push, RELEASE in pull)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.not_needed); }},
    {{"kvpush_kv_transfer_not_needed_received_total", "counter",
      "Prefill, push: NOT_NEEDED received (the decode instance had the prompt cached; the prefill "
      "was dropped or its KV not sent)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.not_needed_received); }},
    {{"kvpush_kv_transfer_aborted_total", "counter",
      "Transfers ended early by POST /kv/abort (blocks freed before their lease ran out)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.transfers_aborted); }},
    {{"kvpush_kv_transfer_pins_sent_total", "counter",
      "Pull (D): PIN requests (confirm and pin P's lease before reading)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.pins_sent); }},
    {{"kvpush_kv_transfer_pins_refused_total", "counter",
      "Pull (P): PINs refused (lease expired, unknown or dropped transfer)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.pins_refused); }},
    {{"kvpush_kv_transfer_pins_held_total", "counter",
      "Pull (P): PINs that arrived before the prefill's end, held and answered when it ended."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.pins_held); }},
    {{"kvpush_kv_transfer_blocks_verified_total", "counter",
      "Decode: received KV blocks whose XXH3 checksum was verified."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.blocks_verified); }},
    {{"kvpush_kv_transfer_checksum_mismatches_total", "counter",
      "Decode: transfers whose received KV failed its checksum (discarded, never cached)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.checksum_mismatches); }},
    {{"kvpush_kv_transfer_verify_seconds_sum", "counter",
      "Decode: time spent verifying received KV once complete (on the TTFT path)."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(static_cast<double>(c.verify_ns_sum) * 1e-9);
     }},
    {{"kvpush_kv_transfer_verify_early_seconds_sum", "counter",
      "Decode, push: time spent hashing KV chunks as each layer landed (overlapping P's compute)."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(static_cast<double>(c.verify_early_ns_sum) * 1e-9);
     }},
    {{"kvpush_kv_transfer_checksum_seconds_sum", "counter",
      "Prefill: time spent checksumming KV blocks it sends."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(static_cast<double>(c.checksum_ns_sum) * 1e-9);
     }},
    {{"kvpush_kv_transfer_bad_messages_total", "counter", "Malformed or unexpected peer messages."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.bad_messages); }},
};

const ConnectorScalar kConnectorTailScalars[] = {
    {{"kvpush_kv_transfer_push_tail_seconds_sum", "counter",
      "Push (P): prefill finished (first token sampled) -> KV_READY posted, summed."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(static_cast<double>(c.push_tail_ns_sum) * 1e-9);
     }},
    {{"kvpush_kv_transfer_push_tail_seconds_count", "counter",
      "Push (P): requests in the sum above."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.push_tail_count); }},
    {{"kvpush_kv_transfer_read_seconds_sum", "counter",
      "Pull (D): READ posted -> READ complete, summed over requests."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(static_cast<double>(c.read_ns_sum) * 1e-9);
     }},
    {{"kvpush_kv_transfer_read_seconds_count", "counter", "Pull (D): READs in the sum above."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.read_count); }},
    {{"kvpush_kv_transfer_descriptors_total", "counter",
      "KV descriptors (layer, K|V, block chunks) in the WRITEs/READs this instance posted."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.descriptors_posted); }},
    {{"kvpush_kv_transfer_ops_total", "counter",
      "Backend ops of those WRITEs/READs after coalescing adjacent descriptors."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.transfer_ops_posted); }},
    {{"kvpush_kv_transfer_control_messages_sent_total", "counter",
      "P/D control messages sent on their own (not riding on a WRITE)."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(c.control_messages_sent);
     }},
    {{"kvpush_kv_transfer_control_bytes_sent_total", "counter",
      "Payload bytes of those control messages (MAC trailer included)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.control_bytes_sent); }},
    {{"kvpush_kv_transfer_producers_active", "gauge", "Prefill-side transfers in flight."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.producers_active); }},
    {{"kvpush_kv_transfer_consumers_waiting", "gauge", "Decode-side transfers in flight."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.consumers_waiting); }},
    {{"kvpush_kv_transfer_quarantines_total", "counter",
      "Decode loads given up while a WRITE or READ could still land (blocks quarantined)."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.quarantines); }},
    {{"kvpush_kv_transfer_quarantines_released_total", "counter",
      "Quarantines that ended (nothing can land any more; blocks back in the pool)."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(c.quarantines_released);
     }},
    {{"kvpush_kv_transfer_consumers_quarantined", "gauge",
      "Decode-side transfers whose blocks are quarantined now."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(c.consumers_quarantined);
     }},
    {{"kvpush_kv_blocks_quarantined", "gauge",
      "KV blocks held out of use until no WRITE or READ can land in them."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.blocks_quarantined); }},
};

http::Labels ModelLabel(const std::string& model) {
  return {{"model_name", model}};
}

/// One series of a histogram family.
void Series(http::PrometheusWriter& w, const std::string& name, const http::Labels& labels,
            const Histogram& h) {
  w.HistogramSeries(name, labels, h.bounds(), h.counts(), h.sum(), h.count());
}

}  // namespace

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
    Series(w, m.family.name, {}, m.h);
  }
  return w.str();
}

std::string RenderConnectorMetrics(const connector::ConnectorStats& c,
                                   const std::string& model_name, int64_t local_prefill_requests) {
  http::PrometheusWriter w(ModelLabel(model_name));
  w.Scalar({"kvpush_pd_local_prefill_requests_total", "counter",
            "Requests this P/D instance served whole, with no kv_transfer_params (on a decode "
            "instance: prefilled locally because the router sent no P leg, or a direct client)."},
           static_cast<double>(local_prefill_requests));
  for (const ConnectorScalar& m : kConnectorScalars) w.Scalar(m.family, m.value(c));
  if (c.auth_enabled) {
    w.Family({"kvpush_kv_auth_failures_total", "counter",
              "Peers refused by --kv-auth-key-file authentication, by kind."});
    for (size_t k = 0; k < c.auth_failures.size(); ++k) {
      w.Sample("kvpush_kv_auth_failures_total", static_cast<double>(c.auth_failures[k]),
               {{"kind",
                 std::string(connector::AuthFailureName(static_cast<connector::AuthFailure>(k)))}});
    }
  }
  for (const ConnectorScalar& m : kConnectorTailScalars) w.Scalar(m.family, m.value(c));
  return w.str();
}

std::string RenderHandoffMetrics(const connector::HandoffTimelineLog& log,
                                 const std::string& model_name) {
  const auto series = log.Histograms();
  if (series.empty()) return "";
  http::PrometheusWriter w(ModelLabel(model_name));
  const std::string name = "kvpush_pd_handoff_phase_seconds";
  w.Family({"kvpush_pd_handoff_phase_seconds", "histogram",
            "P/D handoff intervals of the transfers that moved KV here (phase: prefill_compute, "
            "target_after_prefill, prefill_tail, writes, decode_request, decode_kv_wait, "
            "decode_verify, decode_load; docs/pd_protocol.md, Handoff timeline)."});
  for (const auto& s : series) {
    Series(w, name, {{"phase", s.interval}, {"mode", s.mode}}, s.histogram);
  }
  return w.str();
}

}  // namespace kvpush::server
