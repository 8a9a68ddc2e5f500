// The router's flow choice (the x-kvpush-mode header) and the per-request identifiers it mints.
// The legs' bodies are pd/legs.h.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "pd/kv_transfer_params.h"

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
  Mutex mu_;
  std::mt19937_64 rng_ GUARDED_BY(mu_);
};

/// The pd/ transfer mode of a P/D flow (kPush or kPull; kColocated has no legs).
pd::KvTransferParams::Mode PdModeOf(TransferMode mode);

/// The body of http::ApiError{status, message, type, param, code} (one line; `param` and `code`
/// null when empty), for errors written inside a stream or another body.
std::string ErrorJson(const std::string& message, const std::string& type,
                      const std::string& code = {}, const std::string& param = {});

}  // namespace kvpush::router
