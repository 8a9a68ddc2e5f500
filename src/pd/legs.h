// The bodies of the two legs of a P/D request (docs/pd_protocol.md §1), which the router writes:
// pure functions over the client's JSON body.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "common/status.h"
#include "pd/kv_transfer_params.h"

namespace kvpush::pd {

/// P leg: `client` with "max_tokens": 1, "max_completion_tokens" and "stream_options" removed,
/// "stream": false and kv_transfer_params {do_remote_decode: true, do_remote_prefill: false,
/// transfer_mode, transfer_id}. `client` must be an object already carrying the request's
/// "seed". min_tokens stays: P clamps it to its max_tokens of 1 and so never samples EOS or a
/// stop id as the first token when the client asked for at least one.
nlohmann::json MakePrefillBody(const nlohmann::json& client, KvTransferParams::Mode mode,
                               const std::string& transfer_id);

/// D leg of a push: `client` (stream settings kept) with kv_transfer_params {do_remote_prefill:
/// true, do_remote_decode: false, transfer_mode: "push", transfer_id, remote_host, remote_port}
/// naming the prefill instance as the router reaches it (port in [1, 65535]), plus
/// "remote_scheme": "https" when `prefill_https` (the router reaches P over TLS, and so must D).
nlohmann::json MakeDecodePushBody(const nlohmann::json& client, const std::string& transfer_id,
                                  const std::string& prefill_host, int prefill_port,
                                  bool prefill_https = false);

/// D leg of a pull: `client` with P's `kv_transfer_params` (from `prefill_answer`, a PullAnswer's
/// JSON) copied verbatim, plus "pull_profile" inside it when `profile` is set. D validates what
/// it receives (ParseKvTransferParams, then its connector).
/// Errors: kInvalidArgument when `prefill_answer` has no kv_transfer_params object.
Result<nlohmann::json> MakeDecodePullBody(const nlohmann::json& client,
                                          const nlohmann::json& prefill_answer,
                                          std::optional<PullProfile> profile);

}  // namespace kvpush::pd
