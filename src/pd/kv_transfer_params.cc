#include "pd/kv_transfer_params.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "common/encoding.h"
#include "pd/ids.h"

namespace kvpush::pd {
namespace {

using nlohmann::json;
using Role = KvTransferParams::Role;
using Mode = KvTransferParams::Mode;

ParamError Bad(const std::string& field, const std::string& msg) {
  return {"kv_transfer_params." + field + " " + msg, "kv_transfer_params." + field};
}

/// Typed reads of one object's members: a member that is absent or null leaves the output as it
/// was; any other mismatch is a ParamError naming the member.
class Reader {
 public:
  explicit Reader(const json& j) : j_(j) {}

  bool Given(const char* k) const { return j_.contains(k) && !j_[k].is_null(); }

  std::optional<ParamError> Flag(const char* k, bool& out) const {
    if (!Given(k)) return std::nullopt;
    if (!j_[k].is_boolean()) return Bad(k, "must be a boolean");
    out = j_[k].get<bool>();
    return std::nullopt;
  }

  std::optional<ParamError> String(const char* k, size_t max, std::string& out) const {
    if (!Given(k)) return std::nullopt;
    if (!j_[k].is_string()) return Bad(k, "must be a string");
    out = j_[k].get<std::string>();
    if (out.size() > max) return Bad(k, "is too long");
    return std::nullopt;
  }

  template <class Int>
  std::optional<ParamError> Integer(const char* k, int64_t lo, int64_t hi, Int& out) const {
    if (!Given(k)) return std::nullopt;
    if (!j_[k].is_number_integer()) return Bad(k, "must be an integer");
    // An unsigned number beyond int64 would wrap (2^64 - 1 -> -1, a valid first_token_id).
    if (j_[k].is_number_unsigned() && j_[k].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return Bad(k, "is out of range");
    }
    const auto v = j_[k].get<int64_t>();
    if (v < lo || v > hi) return Bad(k, "is out of range");
    out = static_cast<Int>(v);
    return std::nullopt;
  }

  std::optional<ParamError> BlockIds(const char* k, std::vector<int32_t>& out) const {
    if (!Given(k)) return std::nullopt;
    const json& b = j_[k];
    if (!b.is_array()) return Bad(k, "must be an array of integers");
    if (b.size() > 1000000) return Bad(k, "has too many entries");
    out.reserve(b.size());
    for (const auto& x : b) {
      if (!x.is_number_integer()) return Bad(k, "must be an array of integers");
      const auto id = x.get<int64_t>();
      if (id < 0 || id > 0x7fffffff) return Bad(k, "has an out-of-range id");
      out.push_back(static_cast<int32_t>(id));
    }
    return std::nullopt;
  }

  std::optional<ParamError> FiniteFloat(const char* k, float& out) const {
    if (!Given(k)) return std::nullopt;
    if (!j_[k].is_number()) return Bad(k, "must be a number");
    out = j_[k].get<float>();
    // A double beyond float's range (1e300) would become an infinite logprob.
    if (!std::isfinite(out)) return Bad(k, "is out of range");
    return std::nullopt;
  }

 private:
  const json& j_;
};

/// The role and transfer mode (the fields that decide which others are read).
std::optional<ParamError> ReadRoleAndMode(const Reader& in, KvTransferParams& p) {
  bool decode = false, prefill = false;
  if (auto e = in.Flag("do_remote_decode", decode)) return e;
  if (auto e = in.Flag("do_remote_prefill", prefill)) return e;
  if (decode && prefill) {
    return Bad("do_remote_prefill", "and do_remote_decode cannot both be true");
  }
  if (!decode && !prefill) return std::nullopt;  // nothing asked of the connector
  p.role = decode ? Role::kProducer : Role::kConsumer;
  std::string mode = "pull";  // vLLM's NixlConnector semantics unless told otherwise
  if (auto e = in.String("transfer_mode", 16, mode)) return e;
  if (mode == "push") {
    p.mode = Mode::kPush;
  } else if (mode == "pull") {
    p.mode = Mode::kPull;
  } else {
    return Bad("transfer_mode", "must be \"push\" or \"pull\"");
  }
  return std::nullopt;
}

/// transfer_id (or remote_request_id) and the producer's address.
std::optional<ParamError> ReadIdAndPeer(const Reader& in, KvTransferParams& p) {
  if (auto e = in.String("transfer_id", 64, p.transfer_id)) return e;
  if (p.transfer_id.empty()) {
    if (auto e = in.String("remote_request_id", 64, p.transfer_id)) return e;
  }
  if (!IsValidTransferId(p.transfer_id)) {
    return Bad("transfer_id", "must be 32 lowercase hex characters");
  }
  if (auto e = in.String("remote_engine_id", 255, p.remote_engine_id)) return e;
  if (auto e = in.String("remote_host", 255, p.remote_host)) return e;
  if (auto e = in.Integer("remote_port", 0, 65535, p.remote_port)) return e;
  std::string scheme = "http";
  if (auto e = in.String("remote_scheme", 8, scheme)) return e;
  if (scheme != "http" && scheme != "https") {
    return Bad("remote_scheme", "must be \"http\" or \"https\"");
  }
  p.remote_https = scheme == "https";
  if (p.role == Role::kConsumer && (p.remote_host.empty() || p.remote_port <= 0)) {
    return Bad("remote_host", "and remote_port are required with do_remote_prefill");
  }
  return std::nullopt;
}

/// What a pull producer returned: its blocks, the prompt's size and hash, the first token.
std::optional<ParamError> ReadPullFields(const Reader& in, KvTransferParams& p) {
  if (auto e = in.BlockIds("remote_block_ids", p.remote_block_ids)) return e;
  if (auto e = in.Integer("num_prompt_tokens", 0, 0x7fffffff, p.num_prompt_tokens)) return e;
  std::string hash;
  if (auto e = in.String("prompt_hash", 16, hash)) return e;
  if (!hash.empty()) {
    auto parsed = ParseHex64(hash);  // 1-16 hex digits, nothing else
    if (!parsed.ok()) return Bad("prompt_hash", "must be 1-16 hex digits");
    p.prompt_hash = *parsed;
  }
  if (p.prompt_hash != 0 && p.num_prompt_tokens == 0) {
    // The hash is of a prompt's num_prompt_tokens tokens; alone it would be dropped on the way.
    return Bad("prompt_hash", "is given without num_prompt_tokens");
  }
  if (auto e = in.Integer("first_token_id", -1, 0x7fffffff, p.first_token_id)) return e;
  if (auto e = in.FiniteFloat("first_token_logprob", p.first_token_logprob)) return e;
  if (p.first_token_id < 0 && p.first_token_logprob != 0.0f) {
    // The logprob belongs to a first token; alone it would be dropped on the way to D.
    return Bad("first_token_logprob", "is given without a first_token_id");
  }
  std::string profile;
  if (auto e = in.String("pull_profile", 16, profile)) return e;
  if (!profile.empty()) {
    p.pull_profile = ParsePullProfile(profile);
    if (!p.pull_profile) return Bad("pull_profile", "must be \"vllm\" or \"fast\"");
  }
  if (p.role == Role::kConsumer && p.mode == Mode::kPull && p.remote_block_ids.empty()) {
    return Bad("remote_block_ids", "is required for a pull (do_remote_prefill) request");
  }
  return std::nullopt;
}

}  // namespace

std::string_view PullProfileName(PullProfile profile) {
  return profile == PullProfile::kVllm ? "vllm" : "fast";
}

std::optional<PullProfile> ParsePullProfile(std::string_view name) {
  if (name == "vllm") return PullProfile::kVllm;
  if (name == "fast") return PullProfile::kFast;
  return std::nullopt;
}

std::variant<KvTransferParams, ParamError> ParseKvTransferParams(const json& j) {
  KvTransferParams p;
  if (j.is_null()) return p;
  if (!j.is_object())
    return ParamError{"kv_transfer_params must be an object", "kv_transfer_params"};
  const Reader in(j);
  if (auto e = ReadRoleAndMode(in, p)) return *e;
  if (p.role == Role::kNone) return p;
  if (auto e = ReadIdAndPeer(in, p)) return *e;
  if (auto e = ReadPullFields(in, p)) return *e;
  return p;
}

json ToJson(const KvTransferParams& p) {
  json j = {{"do_remote_decode", p.role == Role::kProducer},
            {"do_remote_prefill", p.role == Role::kConsumer},
            {"transfer_mode", p.mode == Mode::kPush ? "push" : "pull"},
            {"transfer_id", p.transfer_id}};
  if (!p.remote_engine_id.empty()) j["remote_engine_id"] = p.remote_engine_id;
  if (!p.remote_host.empty()) j["remote_host"] = p.remote_host;
  if (p.remote_port != 0) j["remote_port"] = p.remote_port;
  if (p.remote_https) j["remote_scheme"] = "https";
  if (!p.remote_block_ids.empty()) j["remote_block_ids"] = p.remote_block_ids;
  if (p.num_prompt_tokens > 0) {
    j["num_prompt_tokens"] = p.num_prompt_tokens;
    j["prompt_hash"] = Hex64(p.prompt_hash);
  }
  if (p.first_token_id >= 0) {
    j["first_token_id"] = p.first_token_id;
    j["first_token_logprob"] = p.first_token_logprob;
  }
  if (p.pull_profile) j["pull_profile"] = PullProfileName(*p.pull_profile);
  return j;
}

json ToJson(const PullAnswer& answer) {
  json j = ToJson(answer.params);
  j["remote_request_id"] = answer.params.transfer_id;
  j["lease_ms"] = answer.lease_ms;
  j["tp_size"] = 1;
  return j;
}

}  // namespace kvpush::pd
