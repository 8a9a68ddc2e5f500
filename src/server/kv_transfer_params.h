// kv_transfer_params (vLLM's P/D request field, docs/pd_protocol.md §1) -> KvTransferParams.
#pragma once

#include <nlohmann/json.hpp>
#include <variant>

#include "engine/request.h"
#include "server/api_error.h"

namespace kvpush::server {

/// Parses the `kv_transfer_params` object of a request. Null, or neither do_remote_decode nor
/// do_remote_prefill true -> Role::kNone. Errors (HTTP 400, param
/// "kv_transfer_params.<field>"): both do_remote_decode and do_remote_prefill,
/// unknown transfer_mode, malformed transfer_id, wrong types, out-of-range port or block ids,
/// more than 1,000,000 block ids. Unknown fields are ignored (vLLM adds more). Pure; never throws.
std::variant<KvTransferParams, ApiError> ParseKvTransferParams(const nlohmann::json& j);

}  // namespace kvpush::server
