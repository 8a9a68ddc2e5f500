#include "server/pd_gate.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <string>

#include "common/recent_records.h"
#include "connector/pd_connector.h"
#include "http/prometheus.h"
#include "pd/checks.h"
#include "pd/ids.h"
#include "server/completion_state.h"
#include "server/metrics.h"

namespace kvpush::server {
namespace {

/// 404 for the P/D endpoints of an instance without a connector.
http::ApiError NotPdInstance() {
  return http::ApiError{404, "this instance has no KV connector (--role both)",
                        "invalid_request_error", "", "not_pd_instance"};
}

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
    {{"kvpush_kv_transfer_push_targets_partial_total", "counter",
      "PUSH_TARGETs sent with part of their blocks, the rest as the pool freed them (decode)."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(c.push_targets_partial);
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
    {{"kvpush_kv_transfer_first_tokens_unbound_total", "counter",
      "Decode: first tokens of the prefill instance not used because it sampled them under other "
      "sampling settings (the last prompt token was computed here)."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(c.first_tokens_unbound);
     }},
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
    {{"kvpush_kv_transfer_peers_fenced_total", "counter",
      "Connections to a prefill instance fenced because it left a quarantined transfer "
      "unanswered for broken_peer_ms while alive."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.peers_fenced); }},
    {{"kvpush_kv_transfer_status_queries_total", "counter",
      "Liveness queries (POST /kv/transfer_status) sent to a prefill instance about quarantined "
      "transfers."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.status_queries); }},
    {{"kvpush_kv_transfer_status_settled_total", "counter",
      "Quarantines ended by a prefill instance's \"settled\" answer to a liveness query."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.status_settled); }},
    {{"kvpush_kv_transfer_consumers_quarantined", "gauge",
      "Decode-side transfers whose blocks are quarantined now."},
     [](const connector::ConnectorStats& c) {
       return static_cast<double>(c.consumers_quarantined);
     }},
    {{"kvpush_kv_blocks_quarantined", "gauge",
      "KV blocks held out of use until no WRITE or READ can land in them."},
     [](const connector::ConnectorStats& c) { return static_cast<double>(c.blocks_quarantined); }},
};

std::string ConnectorMetrics(const connector::ConnectorStats& c, const std::string& model_name,
                             int64_t local_prefill_requests, int64_t prefill_legs_not_needed) {
  http::PrometheusWriter w(ModelLabel(model_name));
  w.Scalar({"kvpush_pd_local_prefill_requests_total", "counter",
            "Requests this P/D instance served whole, with no kv_transfer_params (on a decode "
            "instance: prefilled locally because the router sent no P leg, or a direct client)."},
           static_cast<double>(local_prefill_requests));
  w.Scalar({"kvpush_pd_prefill_legs_not_needed_total", "counter",
            "Prefill, push: P legs answered at once without a prefill, their prompt fitting one "
            "KV block, which the decode instance computes itself."},
           static_cast<double>(prefill_legs_not_needed));
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

/// vLLM's NIXL connector families (docs.vllm.ai "Production Metrics", NIXL KV Connector
/// Metrics): per-transfer histograms of the KV ops this instance posted (P's WRITEs in push, D's
/// READ in pull; HandoffTimelineLog::Xfers) and the failure counters.
std::string NixlMetrics(const connector::ConnectorStats& c,
                        const connector::HandoffTimelineLog& log, const std::string& model_name) {
  const connector::HandoffTimelineLog::XferHistograms x = log.Xfers();
  http::PrometheusWriter w(ModelLabel(model_name));
  const struct {
    http::MetricFamily family;
    const Histogram& h;
  } histograms[] = {
      {{"vllm:nixl_xfer_time_seconds", "histogram",
        "Histogram of transfer duration for NIXL KV Cache transfers (first post to every op "
        "done; P's WRITEs in push, D's READ in pull)."},
       x.xfer_time},
      {{"vllm:nixl_post_time_seconds", "histogram",
        "Histogram of transfer post time for NIXL KV Cache transfers (time inside the post "
        "calls)."},
       x.post_time},
      {{"vllm:nixl_bytes_transferred", "histogram",
        "Histogram of bytes transferred per NIXL KV Cache transfers."},
       x.bytes},
      {{"vllm:nixl_num_descriptors", "histogram",
        "Histogram of number of descriptors per NIXL KV Cache transfers."},
       x.descriptors},
  };
  for (const auto& m : histograms) {
    w.Family(m.family);
    HistogramSeries(w, m.family.name, {}, m.h);
  }
  w.Scalar({"vllm:nixl_num_failed_transfers_total", "counter",
            "Number of failed NIXL KV Cache transfers (KV WRITE/READ ops that ended in an "
            "error)."},
           static_cast<double>(c.transfers_failed));
  w.Scalar({"vllm:nixl_num_failed_notifications_total", "counter",
            "Number of failed NIXL KV Cache notifications (control messages that failed to post "
            "or complete)."},
           static_cast<double>(c.messages_failed));
  w.Scalar({"vllm:nixl_num_kv_expired_reqs_total", "counter",
            "Number of requests that had their KV expire (prefill leases that expired)."},
           static_cast<double>(c.leases_expired));
  return w.str();
}

std::string HandoffMetrics(const connector::HandoffTimelineLog& log,
                           const std::string& model_name) {
  const auto series = log.Histograms();
  http::PrometheusWriter w(ModelLabel(model_name));
  const std::string name = "kvpush_pd_handoff_phase_seconds";
  w.Family({"kvpush_pd_handoff_phase_seconds", "histogram",
            "P/D handoff intervals of the transfers that moved KV here (phase: prefill_compute, "
            "target_after_prefill, prefill_tail, writes, decode_request, decode_kv_wait, "
            "decode_verify, decode_load; docs/pd_protocol.md, Handoff timeline)."});
  for (const auto& s : series) {
    HistogramSeries(w, name, {{"phase", s.interval}, {"mode", s.mode}}, s.histogram);
  }
  return w.str();
}

}  // namespace

std::optional<http::ApiError> PassPdGate(const CompletionContext& context, PreparedRequest& p) {
  using Role = pd::KvTransferParams::Role;
  connector::PdConnector* conn = context.connector;
  pd::KvTransferParams& kv = p.kv;
  if (kv.role == Role::kNone) {
    if (conn != nullptr) context.state.local_prefills++;
    return std::nullopt;
  }
  // Role and id first (a D leg sent to a P instance is a 400, not a failed handshake).
  pd::KvTransferParams role_only = kv;
  role_only.mode = pd::KvTransferParams::Mode::kPush;
  const bool continuation = !p.request.resume.empty();
  if (Status v = conn->ValidateRequest(role_only, p.prompts[0], continuation); !v.ok()) {
    return http::ApiError::Invalid(v.message(), "kv_transfer_params");
  }
  if (kv.role == Role::kConsumer) {
    // Know P before the engine admits the request (cached after the first request). The wait
    // shares the endpoint's one handshake, ends at the watchdog, and ends when the router
    // aborts the transfer (POST /kv/abort).
    const std::string tid = kv.transfer_id;
    auto peer = conn->EnsurePeer(
        kv.remote_host, kv.remote_port,
        [&context, tid] { return context.transfers.IsAborted(tid); }, kv.remote_https);
    if (!peer.ok() && peer.status().code() == StatusCode::kAborted) return TransferAborted(tid);
    if (!peer.ok()) {
      const std::string endpoint = std::string(kv.remote_https ? "https://" : "") + kv.remote_host +
                                   ":" + std::to_string(kv.remote_port);
      spdlog::warn("transfer {}: 502 kv_peer_unavailable: prefill instance {}: {}", tid, endpoint,
                   peer.status().ToString());
      return http::ApiError{502, "prefill instance " + endpoint + ": " + peer.status().message(),
                            "server_error", "kv_transfer_params", "kv_peer_unavailable"};
    }
    if (!kv.remote_engine_id.empty() && kv.remote_engine_id != *peer) {
      return http::ApiError::Invalid("kv_transfer_params.remote_engine_id '" + kv.remote_engine_id +
                                         "' is not the instance at " + kv.remote_host + ":" +
                                         std::to_string(kv.remote_port) + " ('" + *peer + "')",
                                     "kv_transfer_params.remote_engine_id");
    }
    kv.remote_engine_id = *peer;
  }
  if (Status v = conn->ValidateRequest(kv, p.prompts[0], continuation); !v.ok()) {
    return http::ApiError::Invalid(v.message(), "kv_transfer_params");
  }
  if (context.transfers.IsAborted(kv.transfer_id)) return TransferAborted(kv.transfer_id);
  return std::nullopt;
}

std::optional<http::ApiError> SkipUnneededPrefill(const CompletionContext& context,
                                                  const PreparedRequest& p) {
  const connector::PdConnector* conn = context.connector;
  if (conn == nullptr || p.prompts.size() != 1 || p.echo_logprobs || !p.request.resume.empty()) {
    return std::nullopt;
  }
  const auto n = static_cast<int32_t>(p.prompts[0].size());
  const int32_t block_size = conn->block_size();
  if (pd::PushPrefillNeeded(p.kv, n, block_size)) return std::nullopt;
  context.state.prefill_legs_not_needed++;
  spdlog::debug("transfer {}: prefill not needed ({} prompt tokens, one block of {})",
                p.kv.transfer_id, n, block_size);
  return http::ApiError{503,
                        "prefill not needed: the prompt's " + std::to_string(n) +
                            " tokens fit one KV block, which the decode instance computes itself",
                        "server_error", "", "aborted"};
}

void RoutePdEndpoints(http::FrontDoor& s, const PdEndpoints& endpoints) {
  s.Post("/kv/handshake", [endpoints](const http::Request& req, http::Response& res) {
    if (endpoints.connector == nullptr) return http::ReplyError(res, NotPdInstance());
    auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (body.is_discarded()) {
      http::ReplyError(res, http::ApiError::Invalid("handshake body is not JSON"));
      return;
    }
    auto r = endpoints.connector->HandleHandshake(
        body, req.remote_addr + ":" + std::to_string(req.remote_port));
    if (!r.ok()) {
      const int code = r.status().code() == StatusCode::kFailedPrecondition ? 409
                       : r.status().code() == StatusCode::kInvalidArgument  ? 400
                                                                            : 503;
      http::ReplyError(res, http::ApiError{code, r.status().message(),
                                           code == 503 ? "server_error" : "invalid_request_error",
                                           "", code == 409 ? "incompatible_peer" : ""});
      return;
    }
    res.set_content(r->dump(), "application/json");
  });
  // The handoff timelines of the latest transfers (docs/pd_protocol.md, Handoff timeline).
  s.Get("/debug/handoff_timeline", [endpoints](const http::Request& req, http::Response& res) {
    if (endpoints.connector == nullptr) return http::ReplyError(res, NotPdInstance());
    const auto limit = req.has_param("limit") ? ParseListLimit(req.get_param_value("limit"), 4096)
                                              : std::optional<size_t>(256);
    if (!limit) {
      return http::ReplyError(res, http::ApiError::Invalid("limit must be an integer in [1, 4096]",
                                                           "limit", "invalid_limit"));
    }
    nlohmann::json body = {{"object", "list"},
                           {"data", endpoints.connector->timelines().Recent(*limit)}};
    res.set_content(body.dump(), "application/json");
  });
  // A decode instance asks about its quarantined push transfers (docs/pd_protocol.md §2b).
  s.Post("/kv/transfer_status", [endpoints](const http::Request& req, http::Response& res) {
    if (endpoints.connector == nullptr) return http::ReplyError(res, NotPdInstance());
    auto r =
        endpoints.connector->HandleTransferStatus(nlohmann::json::parse(req.body, nullptr, false));
    if (!r.ok()) {
      const StatusCode c = r.status().code();
      const int code = c == StatusCode::kInvalidArgument      ? 400
                       : c == StatusCode::kFailedPrecondition ? 409
                                                              : 503;
      return http::ReplyError(
          res, http::ApiError{code, r.status().message(),
                              code == 503 ? "server_error" : "invalid_request_error"});
    }
    res.set_content(r->dump(), "application/json");
  });
  // The router saw the other leg of a transfer fail: end this instance's part of it now.
  s.Post("/kv/abort", [endpoints](const http::Request& req, http::Response& res) {
    if (endpoints.connector == nullptr) return http::ReplyError(res, NotPdInstance());
    auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (!body.is_object()) {
      return http::ReplyError(res,
                              http::ApiError::Invalid("abort body must be a JSON object "
                                                      "{\"transfer_id\": \"<32 lowercase hex>\"}"));
    }
    const auto it = body.find("transfer_id");
    if (it == body.end() || !it->is_string() || !pd::IsValidTransferId(it->get<std::string>())) {
      return ReplyError(res,
                        http::ApiError::Invalid("transfer_id must be 32 lowercase hex characters",
                                                "transfer_id", "invalid_transfer_id"));
    }
    const std::string tid = it->get<std::string>();
    const std::vector<int64_t> ids = endpoints.transfers.Abort(tid);
    for (int64_t id : ids) endpoints.engine.Abort(id);
    endpoints.connector->AbortTransfer(tid);
    spdlog::info("POST /kv/abort: transfer {} aborted ({} request(s) in flight)", tid, ids.size());
    nlohmann::json out = {{"transfer_id", tid}, {"aborted_requests", ids.size()}};
    res.set_content(out.dump(), "application/json");
  });
}

std::string RenderPdMetrics(const connector::PdConnector* connector, const std::string& model_name,
                            int64_t local_prefill_requests, int64_t prefill_legs_not_needed) {
  if (connector == nullptr) return "";
  const connector::ConnectorStats stats = connector->stats();
  return ConnectorMetrics(stats, model_name, local_prefill_requests, prefill_legs_not_needed) +
         NixlMetrics(stats, connector->timelines(), model_name) +
         HandoffMetrics(connector->timelines(), model_name);
}

}  // namespace kvpush::server
