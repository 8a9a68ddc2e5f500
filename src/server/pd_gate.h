// The P/D gate of a completion request (docs/server.md, docs/pd_protocol.md §1): the step
// between prepare and submit that checks a leg against this instance's connector. The only
// handler step that calls the connector.
#pragma once

#include <optional>

#include "http/api_error.h"
#include "server/completion_handler.h"
#include "server/completion_prepare.h"

namespace kvpush::server {

/// Passes a prepared request through the P/D gate. A colocated request (no kv_transfer_params)
/// passes, and on a P/D instance counts as a local prefill. A leg is checked, in this order:
/// its role and transfer id against the instance (400, param kv_transfer_params); for a D leg,
/// P handshaken (502 kv_peer_unavailable when it cannot be reached) and remote_engine_id, when
/// given, naming it (400), then remote_engine_id set to P's; the whole leg against the prompt
/// (pull: count, hash, P's block ids; 400); its transfer not aborted (409 transfer_aborted).
/// Blocks on the handshake only (PdConnector::EnsurePeer); thread-safe.
std::optional<http::ApiError> PassPdGate(const CompletionContext& context, PreparedRequest& p);

}  // namespace kvpush::server
