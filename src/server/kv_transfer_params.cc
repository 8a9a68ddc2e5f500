#include "server/kv_transfer_params.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "connector/handshake.h"
#include "connector/messages.h"

namespace kvpush::server {
namespace {

ApiError Bad(const std::string& field, const std::string& msg) {
  return ApiError::Invalid("kv_transfer_params." + field + " " + msg,
                           "kv_transfer_params." + field);
}

}  // namespace

std::variant<KvTransferParams, ApiError> ParseKvTransferParams(const nlohmann::json& j) {
  KvTransferParams p;
  if (j.is_null()) return p;
  if (!j.is_object()) return ApiError::Invalid("kv_transfer_params must be an object",
                                               "kv_transfer_params");
  auto flag = [&](const char* k, bool& out) -> std::optional<ApiError> {
    out = false;
    if (!j.contains(k) || j[k].is_null()) return std::nullopt;
    if (!j[k].is_boolean()) return Bad(k, "must be a boolean");
    out = j[k].get<bool>();
    return std::nullopt;
  };
  auto str = [&](const char* k, std::string& out, size_t max) -> std::optional<ApiError> {
    if (!j.contains(k) || j[k].is_null()) return std::nullopt;
    if (!j[k].is_string()) return Bad(k, "must be a string");
    out = j[k].get<std::string>();
    if (out.size() > max) return Bad(k, "is too long");
    return std::nullopt;
  };
  auto integer = [&](const char* k, int64_t lo, int64_t hi, int64_t& out) -> std::optional<ApiError> {
    if (!j.contains(k) || j[k].is_null()) return std::nullopt;
    if (!j[k].is_number_integer()) return Bad(k, "must be an integer");
    // An unsigned number beyond int64 would wrap (2^64 - 1 -> -1, a valid first_token_id).
    if (j[k].is_number_unsigned() && j[k].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Bad(k, "is out of range");
    }
    out = j[k].get<int64_t>();
    if (out < lo || out > hi) return Bad(k, "is out of range");
    return std::nullopt;
  };
  bool decode = false, prefill = false;
  if (auto e = flag("do_remote_decode", decode)) return *e;
  if (auto e = flag("do_remote_prefill", prefill)) return *e;
  if (decode && prefill) {
    return Bad("do_remote_prefill", "and do_remote_decode cannot both be true");
  }
  if (!decode && !prefill) return p;  // nothing asked of the connector
  p.role = decode ? KvTransferParams::Role::kProducer : KvTransferParams::Role::kConsumer;
  std::string mode = "pull";  // vLLM's NixlConnector semantics unless told otherwise
  if (auto e = str("transfer_mode", mode, 16)) return *e;
  if (mode == "push") {
    p.mode = KvTransferParams::Mode::kPush;
  } else if (mode == "pull") {
    p.mode = KvTransferParams::Mode::kPull;
  } else {
    return Bad("transfer_mode", "must be \"push\" or \"pull\"");
  }
  if (auto e = str("transfer_id", p.transfer_id, 64)) return *e;
  if (p.transfer_id.empty()) {
    std::string rid;
    if (auto e = str("remote_request_id", rid, 64)) return *e;
    p.transfer_id = rid;
  }
  if (!connector::IsValidTransferId(p.transfer_id)) return Bad("transfer_id", "must be 32 lowercase hex characters");
  if (auto e = str("remote_engine_id", p.remote_engine_id, 255)) return *e;
  if (auto e = str("remote_host", p.remote_host, 255)) return *e;
  int64_t v = 0;
  if (auto e = integer("remote_port", 0, 65535, v)) return *e;
  p.remote_port = static_cast<int32_t>(v);
  if (p.role == KvTransferParams::Role::kConsumer) {
    if (p.remote_host.empty() || p.remote_port <= 0) {
      return Bad("remote_host", "and remote_port are required with do_remote_prefill");
    }
  }
  if (j.contains("remote_block_ids") && !j["remote_block_ids"].is_null()) {
    const auto& b = j["remote_block_ids"];
    if (!b.is_array()) return Bad("remote_block_ids", "must be an array of integers");
    if (b.size() > 1000000) return Bad("remote_block_ids", "has too many entries");
    p.remote_block_ids.reserve(b.size());
    for (const auto& x : b) {
      if (!x.is_number_integer()) return Bad("remote_block_ids", "must be an array of integers");
      const auto id = x.get<int64_t>();
      if (id < 0 || id > 0x7fffffff) return Bad("remote_block_ids", "has an out-of-range id");
      p.remote_block_ids.push_back(static_cast<int32_t>(id));
    }
  }
  if (auto e = integer("num_prompt_tokens", 0, 0x7fffffff, v)) return *e;
  p.num_prompt_tokens = static_cast<int32_t>(v);
  std::string hash;
  if (auto e = str("prompt_hash", hash, 16)) return *e;
  if (!hash.empty()) {
    auto parsed = connector::ParseHex64(hash);  // 1-16 hex digits, nothing else
    if (!parsed.ok()) return Bad("prompt_hash", "must be 1-16 hex digits");
    p.prompt_hash = *parsed;
  }
  v = -1;
  if (auto e = integer("first_token_id", -1, 0x7fffffff, v)) return *e;
  p.first_token_id = static_cast<int32_t>(v);
  if (j.contains("first_token_logprob") && !j["first_token_logprob"].is_null()) {
    if (!j["first_token_logprob"].is_number()) return Bad("first_token_logprob", "must be a number");
    p.first_token_logprob = j["first_token_logprob"].get<float>();
    // A double beyond float's range (1e300) would become an infinite logprob.
    if (!std::isfinite(p.first_token_logprob)) return Bad("first_token_logprob", "is out of range");
  }
  std::string profile;
  if (auto e = str("pull_profile", profile, 16)) return *e;
  if (profile == "vllm") {
    p.pull_profile = 0;
  } else if (profile == "fast") {
    p.pull_profile = 1;
  } else if (!profile.empty()) {
    return Bad("pull_profile", "must be \"vllm\" or \"fast\"");
  }
  if (p.role == KvTransferParams::Role::kConsumer && p.mode == KvTransferParams::Mode::kPull &&
      p.remote_block_ids.empty()) {
    return Bad("remote_block_ids", "is required for a pull (do_remote_prefill) request");
  }
  return p;
}

}  // namespace kvpush::server
