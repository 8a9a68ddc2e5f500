#include "server/pd_gate.h"

#include <string>

#include "connector/pd_connector.h"
#include "server/completion_state.h"

namespace kvpush::server {

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
  if (Status v = conn->ValidateRequest(role_only, p.prompts[0]); !v.ok()) {
    return http::ApiError::Invalid(v.message(), "kv_transfer_params");
  }
  if (kv.role == Role::kConsumer) {
    // Know P before the engine admits the request (cached after the first request).
    auto peer = conn->EnsurePeer(kv.remote_host, kv.remote_port);
    if (!peer.ok()) {
      return http::ApiError{502,
                            "prefill instance " + kv.remote_host + ":" +
                                std::to_string(kv.remote_port) + ": " + peer.status().message(),
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
  if (Status v = conn->ValidateRequest(kv, p.prompts[0]); !v.ok()) {
    return http::ApiError::Invalid(v.message(), "kv_transfer_params");
  }
  if (context.transfers.IsAborted(kv.transfer_id)) return TransferAborted(kv.transfer_id);
  return std::nullopt;
}

}  // namespace kvpush::server
