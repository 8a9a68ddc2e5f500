// The server's P/D gate: the one server file that reaches into connector/ (docs/server.md,
// docs/pd_protocol.md §1). A completion request's gate step (between prepare and submit: a leg
// checked against this instance's connector), the P/D endpoints (/kv/handshake, /kv/abort,
// /debug/handoff_timeline) and the connector's /metrics families.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "http/api_error.h"
#include "http/front_door.h"
#include "server/completion_handler.h"
#include "server/completion_prepare.h"
#include "server/transfer_requests.h"

namespace kvpush::server {

/// Passes a prepared request through the P/D gate. A colocated request (no kv_transfer_params)
/// passes, and on a P/D instance counts as a local prefill. A leg is checked, in this order:
/// its role and transfer id against the instance (400, param kv_transfer_params); for a D leg,
/// P handshaken (502 kv_peer_unavailable when it cannot be reached) and remote_engine_id, when
/// given, naming it (400), then remote_engine_id set to P's; the whole leg against the prompt
/// (pull: count, hash, P's block ids; 400); its transfer not aborted (409 transfer_aborted).
/// Blocks on the handshake only (PdConnector::EnsurePeer); thread-safe.
std::optional<http::ApiError> PassPdGate(const CompletionContext& context, PreparedRequest& p);

/// Step "prefill needed" of a leg that passed the gate: a push P leg whose prompt (one prompt,
/// no echo with logprobs, not a continuation) fits one KV block is answered at once with the
/// answer of a prefill that D declared not needed (503 `aborted`; the router settles P's leg on
/// it, docs/router.md "Push"), without engine work: D computes such a prompt itself in every
/// case (pd::PushPrefillNeeded) and would only tell P NOT_NEEDED, usually after P computed it on
/// a core D needs. Counted in kvpush_pd_prefill_legs_not_needed_total. nullopt: prefill it.
/// Thread-safe.
std::optional<http::ApiError> SkipUnneededPrefill(const CompletionContext& context,
                                                  const PreparedRequest& p);

/// What the P/D endpoints use; `connector` null on a colocated instance (they answer 404
/// not_pd_instance there). Both references must outlive the front door.
struct PdEndpoints {
  connector::PdConnector* connector;
  Engine& engine;
  TransferRequests& transfers;
};

/// Registers POST /kv/handshake (409 incompatible_peer, 400, 503 by the handshake's error),
/// POST /kv/abort ({"transfer_id"}: its requests aborted, the connector told; 400 on a bad id)
/// and GET /debug/handoff_timeline (?limit in [1, 4096], default 256) on `door`.
void RoutePdEndpoints(http::FrontDoor& door, const PdEndpoints& endpoints);

/// The connector's /metrics families (kvpush_kv_transfer_*, kvpush_kv_auth_failures_total,
/// kvpush_pd_handoff_phase_seconds, and kvpush_pd_local_prefill_requests_total =
/// `local_prefill_requests`: requests this P/D instance served with no kv_transfer_params, and
/// kvpush_pd_prefill_legs_not_needed_total = `prefill_legs_not_needed`: SkipUnneededPrefill);
/// "" without a connector. Thread-safe.
std::string RenderPdMetrics(const connector::PdConnector* connector, const std::string& model_name,
                            int64_t local_prefill_requests, int64_t prefill_legs_not_needed);

}  // namespace kvpush::server
