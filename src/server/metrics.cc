#include "server/metrics.h"

#include <cstdio>
#include <sstream>

#include "connector/pd_connector.h"

namespace kvpush::server {
namespace {

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

class Writer {
 public:
  explicit Writer(const std::string& model)
      : model_label_("model_name=\"" + Escape(model) + "\"") {}

  void Header(const std::string& name, const char* type, const char* help) {
    os_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void Sample(const std::string& name, double v, const std::string& extra = {}) {
    os_ << name << "{" << model_label_ << (extra.empty() ? "" : ",") << extra << "} " << Num(v)
        << "\n";
  }
  void Scalar(const std::string& name, const char* type, const char* help, double v) {
    Header(name, type, help);
    Sample(name, v);
  }
  void Hist(const std::string& name, const char* help, const Histogram& h) {
    Header(name, "histogram", help);
    HistSeries(name, "", h);
  }
  /// One series of a histogram family, `labels` ("k=\"v\",..." or empty) on every sample (call
  /// Header once before the first series).
  void HistSeries(const std::string& name, const std::string& labels, const Histogram& h) {
    const std::string le = labels.empty() ? "le=\"" : labels + ",le=\"";
    uint64_t cum = 0;
    for (size_t i = 0; i < h.bounds().size(); ++i) {
      cum += h.counts()[i];
      Sample(name + "_bucket", static_cast<double>(cum), le + Num(h.bounds()[i]) + "\"");
    }
    cum += h.counts().empty() ? 0 : h.counts().back();
    Sample(name + "_bucket", static_cast<double>(cum), le + "+Inf\"");
    Sample(name + "_sum", h.sum(), labels);
    Sample(name + "_count", static_cast<double>(h.count()), labels);
  }
  std::string str() const { return os_.str(); }

 private:
  std::string model_label_;
  std::ostringstream os_;
};

}  // namespace

std::string RenderPrometheus(const EngineStats& s, const HttpCounters& http,
                             const std::string& model_name) {
  Writer w(model_name);
  w.Scalar("kvpush_num_requests_running", "gauge", "Requests in the running batch.", s.num_running);
  w.Scalar("kvpush_num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
           s.num_waiting);
  w.Scalar("kvpush_num_requests_waiting_for_kv", "gauge",
           "Requests whose KV is being transferred from a prefill instance.", s.num_waiting_for_kv);
  w.Scalar("kvpush_kv_loads_total", "counter", "Asynchronous KV loads that succeeded.",
           static_cast<double>(s.kv_loads));
  w.Scalar("kvpush_kv_load_recomputes_total", "counter",
           "Failed KV loads recomputed locally (failure policy recompute).",
           static_cast<double>(s.kv_load_recomputes));
  w.Scalar("kvpush_kv_load_quarantines_total", "counter",
           "Failed KV loads whose blocks were held out of use because a WRITE could still land.",
           static_cast<double>(s.kv_load_quarantines));
  w.Scalar("kvpush_kv_blocks_total", "gauge", "KV cache blocks in the pool.",
           s.num_kv_blocks_total);
  w.Scalar("kvpush_kv_blocks_used", "gauge", "KV blocks referenced by requests.", s.kv.num_used);
  w.Scalar("kvpush_kv_blocks_free", "gauge", "KV blocks free (never cached).", s.kv.num_free);
  w.Scalar("kvpush_kv_blocks_cached", "gauge", "KV blocks free but holding prefix-cache content.",
           s.kv.num_cached);
  w.Scalar("kvpush_kv_cache_usage_perc", "gauge", "Fraction of KV blocks used (0-1).",
           s.num_kv_blocks_total > 0
               ? static_cast<double>(s.kv.num_used) / static_cast<double>(s.num_kv_blocks_total)
               : 0.0);
  w.Scalar("kvpush_prefix_cache_queries_total", "counter",
           "Full prompt blocks looked up in the prefix cache.",
           static_cast<double>(s.kv.prefix_query_blocks));
  w.Scalar("kvpush_prefix_cache_hits_total", "counter",
           "Full prompt blocks found in the prefix cache.",
           static_cast<double>(s.kv.prefix_hit_blocks));
  w.Scalar("kvpush_prefix_cache_evictions_total", "counter", "Cached blocks evicted for reuse.",
           static_cast<double>(s.kv.evictions));
  w.Scalar("kvpush_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.",
           static_cast<double>(s.prompt_tokens));
  w.Scalar("kvpush_prompt_tokens_cached_total", "counter",
           "Prompt tokens served from the prefix cache.",
           static_cast<double>(s.cached_prompt_tokens));
  w.Scalar("kvpush_prompt_tokens_computed_total", "counter",
           "Prompt tokens computed by this instance's model (prefill chunks, recomputation); "
           "never tokens whose KV came from a peer.",
           static_cast<double>(s.prompt_tokens_computed));
  w.Scalar("kvpush_prompt_tokens_transferred_total", "counter",
           "P/D decode: prompt tokens whose KV arrived over the KV connector (loads that "
           "succeeded).",
           static_cast<double>(s.prompt_tokens_transferred));
  w.Scalar("kvpush_generation_tokens_total", "counter", "Generated tokens.",
           static_cast<double>(s.generation_tokens));
  w.Scalar("kvpush_computed_tokens_total", "counter",
           "Tokens executed by the model (prefill chunks, decodes, recomputation).",
           static_cast<double>(s.computed_tokens));
  w.Scalar("kvpush_num_preemptions_total", "counter", "Requests preempted (recompute).",
           static_cast<double>(s.num_preemptions));
  w.Scalar("kvpush_engine_steps_total", "counter", "Engine steps executed.",
           static_cast<double>(s.num_steps));
  w.Scalar("kvpush_requests_received_total", "counter", "Requests handed to the engine.",
           static_cast<double>(s.requests_received));

  w.Header("kvpush_request_success_total", "counter", "Finished requests by finish reason.");
  for (FinishReason r :
       {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError}) {
    w.Sample("kvpush_request_success_total",
             static_cast<double>(s.finished_by_reason[static_cast<size_t>(r)]),
             "finished_reason=\"" + std::string(FinishReasonName(r)) + "\"");
  }
  w.Header("kvpush_http_requests_total", "counter", "HTTP responses by path and status code.");
  for (const auto& [key, count] : http) {
    w.Sample("kvpush_http_requests_total", static_cast<double>(count),
             "path=\"" + Escape(key.first) + "\",status=\"" + std::to_string(key.second) + "\"");
  }

  w.Hist("kvpush_time_to_first_token_seconds", "Time to first token (arrival to first token).",
         s.ttft);
  w.Hist("kvpush_time_per_output_token_seconds",
         "Time per output token after the first (per request mean).", s.tpot);
  w.Hist("kvpush_inter_token_latency_seconds", "Time between consecutive tokens.", s.itl);
  w.Hist("kvpush_e2e_request_latency_seconds", "Arrival to finish.", s.e2e);
  w.Hist("kvpush_request_queue_time_seconds", "Arrival to first scheduled.", s.queue_time);
  return w.str();
}

std::string RenderConnectorMetrics(const connector::ConnectorStats& c,
                                   const std::string& model_name, int64_t local_prefill_requests) {
  Writer w(model_name);
  auto counter = [&](const char* name, const char* help, int64_t v) {
    w.Scalar(name, "counter", help, static_cast<double>(v));
  };
  counter("kvpush_pd_local_prefill_requests_total",
          "Requests this P/D instance served whole, with no kv_transfer_params (on a decode "
          "instance: prefilled locally because the router sent no P leg, or a direct client).",
          local_prefill_requests);
  counter("kvpush_kv_transfer_handshakes_total", "P/D handshakes completed.", c.handshakes);
  counter("kvpush_kv_transfer_push_targets_sent_total", "PUSH_TARGETs sent (decode).",
          c.push_targets_sent);
  counter("kvpush_kv_transfer_push_targets_received_total", "PUSH_TARGETs received (prefill).",
          c.push_targets_received);
  counter("kvpush_kv_transfer_writes_total", "KV WRITE transfers posted (prefill).",
          c.writes_posted);
  counter("kvpush_kv_transfer_bytes_written_total", "KV bytes written to decode instances.",
          c.bytes_written);
  counter("kvpush_kv_transfer_kv_ready_sent_total",
          "KV_READY sent (prefill, push), as a message or as the last WRITE's notification.",
          c.kv_ready_sent);
  counter("kvpush_kv_transfer_kv_ready_on_write_total",
          "Prefill, push: KV_READYs that were the notification of the transfer's last WRITE (no "
          "message of their own).",
          c.kv_ready_on_write);
  counter("kvpush_kv_transfer_kv_ready_received_total", "KV_READY messages received.",
          c.kv_ready_received);
  counter("kvpush_kv_transfer_reads_total", "Pull READs completed (decode).", c.reads_completed);
  counter("kvpush_kv_transfer_failed_total", "Transfers that ended in an error.",
          c.transfers_failed);
  counter("kvpush_kv_transfer_watchdog_expired_total", "Decode watchdog expiries.",
          c.watchdog_expired);
  counter("kvpush_kv_transfer_leases_expired_total", "Prefill leases that expired.",
          c.leases_expired);
  counter("kvpush_kv_transfer_not_needed_total",
          "Decode: full prefix hits (no KV moved; NOT_NEEDED sent in push, RELEASE in pull).",
          c.not_needed);
  counter("kvpush_kv_transfer_not_needed_received_total",
          "Prefill, push: NOT_NEEDED received (the decode instance had the prompt cached; the "
          "prefill was dropped or its KV not sent).",
          c.not_needed_received);
  counter("kvpush_kv_transfer_aborted_total",
          "Transfers ended early by POST /kv/abort (blocks freed before their lease ran out).",
          c.transfers_aborted);
  counter("kvpush_kv_transfer_pins_sent_total",
          "Pull (D): PIN requests (confirm and pin P's lease before reading).", c.pins_sent);
  counter("kvpush_kv_transfer_pins_refused_total",
          "Pull (P): PINs refused (lease expired, unknown or dropped transfer).", c.pins_refused);
  counter("kvpush_kv_transfer_blocks_verified_total",
          "Decode: received KV blocks whose XXH3 checksum was verified.", c.blocks_verified);
  counter("kvpush_kv_transfer_checksum_mismatches_total",
          "Decode: transfers whose received KV failed its checksum (discarded, never cached).",
          c.checksum_mismatches);
  w.Scalar("kvpush_kv_transfer_verify_seconds_sum", "counter",
           "Decode: time spent verifying received KV once complete (on the TTFT path).",
           static_cast<double>(c.verify_ns_sum) * 1e-9);
  w.Scalar("kvpush_kv_transfer_verify_early_seconds_sum", "counter",
           "Decode, push: time spent hashing KV chunks as each layer landed (overlapping P's "
           "compute).",
           static_cast<double>(c.verify_early_ns_sum) * 1e-9);
  w.Scalar("kvpush_kv_transfer_checksum_seconds_sum", "counter",
           "Prefill: time spent checksumming KV blocks it sends.",
           static_cast<double>(c.checksum_ns_sum) * 1e-9);
  counter("kvpush_kv_transfer_bad_messages_total", "Malformed or unexpected peer messages.",
          c.bad_messages);
  if (c.auth_enabled) {
    w.Header("kvpush_kv_auth_failures_total", "counter",
             "Peers refused by --kv-auth-key-file authentication, by kind.");
    for (size_t k = 0; k < c.auth_failures.size(); ++k) {
      w.Sample("kvpush_kv_auth_failures_total", static_cast<double>(c.auth_failures[k]),
               "kind=\"" +
                   std::string(connector::AuthFailureName(static_cast<connector::AuthFailure>(k))) +
                   "\"");
    }
  }
  w.Scalar("kvpush_kv_transfer_push_tail_seconds_sum", "counter",
           "Push (P): prefill finished (first token sampled) -> KV_READY posted, summed.",
           static_cast<double>(c.push_tail_ns_sum) * 1e-9);
  counter("kvpush_kv_transfer_push_tail_seconds_count", "Push (P): requests in the sum above.",
          c.push_tail_count);
  w.Scalar("kvpush_kv_transfer_read_seconds_sum", "counter",
           "Pull (D): READ posted -> READ complete, summed over requests.",
           static_cast<double>(c.read_ns_sum) * 1e-9);
  counter("kvpush_kv_transfer_read_seconds_count", "Pull (D): READs in the sum above.",
          c.read_count);
  counter("kvpush_kv_transfer_descriptors_total",
          "KV descriptors (layer, K|V, block chunks) in the WRITEs/READs this instance posted.",
          c.descriptors_posted);
  counter("kvpush_kv_transfer_ops_total",
          "Backend ops of those WRITEs/READs after coalescing adjacent descriptors.",
          c.transfer_ops_posted);
  counter("kvpush_kv_transfer_control_messages_sent_total",
          "P/D control messages sent on their own (not riding on a WRITE).",
          c.control_messages_sent);
  counter("kvpush_kv_transfer_control_bytes_sent_total",
          "Payload bytes of those control messages (MAC trailer included).",
          c.control_bytes_sent);
  w.Scalar("kvpush_kv_transfer_producers_active", "gauge", "Prefill-side transfers in flight.",
           static_cast<double>(c.producers_active));
  w.Scalar("kvpush_kv_transfer_consumers_waiting", "gauge", "Decode-side transfers in flight.",
           static_cast<double>(c.consumers_waiting));
  counter("kvpush_kv_transfer_quarantines_total",
          "Decode loads given up while a WRITE or READ could still land (blocks quarantined).",
          c.quarantines);
  counter("kvpush_kv_transfer_quarantines_released_total",
          "Quarantines that ended (nothing can land any more; blocks back in the pool).",
          c.quarantines_released);
  w.Scalar("kvpush_kv_transfer_consumers_quarantined", "gauge",
           "Decode-side transfers whose blocks are quarantined now.",
           static_cast<double>(c.consumers_quarantined));
  w.Scalar("kvpush_kv_blocks_quarantined", "gauge",
           "KV blocks held out of use until no WRITE or READ can land in them.",
           static_cast<double>(c.blocks_quarantined));
  return w.str();
}

std::string RenderHandoffMetrics(const connector::HandoffTimelineLog& log,
                                 const std::string& model_name) {
  const auto series = log.Histograms();
  if (series.empty()) return "";
  Writer w(model_name);
  const std::string name = "kvpush_pd_handoff_phase_seconds";
  w.Header(name, "histogram",
           "P/D handoff intervals of the transfers that moved KV here (phase: prefill_compute, "
           "target_after_prefill, prefill_tail, writes, decode_request, decode_kv_wait, "
           "decode_verify, decode_load; docs/pd_protocol.md, Handoff timeline).");
  for (const auto& s : series) {
    w.HistSeries(name, "phase=\"" + s.interval + "\",mode=\"" + s.mode + "\"", s.histogram);
  }
  return w.str();
}

}  // namespace kvpush::server
