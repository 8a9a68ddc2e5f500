// The bodies of the two legs of a P/D request (docs/pd_protocol.md §1): pure functions over the
// client's JSON body, plus the per-request identifiers the router mints.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "common/status.h"
#include "router/instance_pool.h"

namespace kvpush::router {

/// A request's flow: a P/D request in push or pull mode, or (the router's `--colocated` mode) a
/// whole request forwarded to one colocated instance, with no KV transfer.
enum class TransferMode { kPush, kPull, kColocated };

/// "push" / "pull" / "colocated".
const char* TransferModeName(TransferMode mode);

/// A request's flow: transfer mode, and for pull the `pull_profile` to send D ("" = none: D's
/// configured default applies).
struct ModeChoice {
  TransferMode mode = TransferMode::kPush;
  std::string pull_profile;
};

/// Parses an `x-kvpush-mode` header value: "push", "pull" (profile = `default_pull_profile`),
/// "pull-vllm", "pull-fast". Errors: kInvalidArgument naming the accepted values.
Result<ModeChoice> ParseModeHeader(const std::string& value,
                                   const std::string& default_pull_profile);

/// True for a client-supplied `x-request-id` the router keeps: 1..256 visible ASCII characters
/// (0x21..0x7e), the instances' rule, so the same header gives the same id in every mode.
bool IsValidRequestId(const std::string& id);

/// Random identifiers. Thread-safe (one mutex around a 64-bit Mersenne Twister seeded from
/// std::random_device).
class IdMinter {
 public:
  IdMinter();
  /// `prefix` + 32 lowercase hex chars, e.g. "cmpl-0f3a...".
  std::string RequestId(const std::string& prefix);
  /// 32 lowercase hex chars.
  std::string TransferId();
  /// Uniform in [0, 2^53) (exactly representable as a JSON number everywhere).
  uint64_t Seed();

 private:
  std::string Hex32();
  std::mutex mu_;
  std::mt19937_64 rng_;
};

/// P leg: `client` with "max_tokens": 1, "max_completion_tokens" and "stream_options" removed,
/// "stream": false and kv_transfer_params {do_remote_decode: true, do_remote_prefill: false,
/// transfer_mode, transfer_id}. `client` must be an object already carrying the request's
/// "seed".
nlohmann::json MakePrefillBody(const nlohmann::json& client, TransferMode mode,
                               const std::string& transfer_id);

/// D leg of a push: `client` (stream settings kept) with kv_transfer_params {do_remote_prefill:
/// true, do_remote_decode: false, transfer_mode: "push", transfer_id, remote_host, remote_port}
/// naming the prefill instance as the router reaches it.
nlohmann::json MakeDecodePushBody(const nlohmann::json& client, const std::string& transfer_id,
                                  const InstanceAddress& prefill);

/// D leg of a pull: `client` with P's `kv_transfer_params` (from `prefill_answer`) copied
/// verbatim, plus "pull_profile" inside it when `pull_profile` is not empty.
/// Errors: kInvalidArgument when `prefill_answer` has no kv_transfer_params object.
Result<nlohmann::json> MakeDecodePullBody(const nlohmann::json& client,
                                          const nlohmann::json& prefill_answer,
                                          const std::string& pull_profile);

/// {"error": {"message", "type", "param": null, "code"}} as one line; `code` null when empty.
std::string ErrorJson(const std::string& message, const std::string& type,
                      const std::string& code = {}, const std::string& param = {});

}  // namespace kvpush::router
