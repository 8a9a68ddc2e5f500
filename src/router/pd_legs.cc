#include "router/pd_legs.h"

namespace kvpush::router {

using nlohmann::json;

const char* TransferModeName(TransferMode mode) {
  switch (mode) {
    case TransferMode::kPush:
      return "push";
    case TransferMode::kPull:
      return "pull";
    case TransferMode::kColocated:
      return "colocated";
  }
  return "unknown";
}

Result<ModeChoice> ParseModeHeader(const std::string& value,
                                   const std::string& default_pull_profile) {
  if (value == "push") return ModeChoice{TransferMode::kPush, ""};
  if (value == "pull") return ModeChoice{TransferMode::kPull, default_pull_profile};
  if (value == "pull-vllm") return ModeChoice{TransferMode::kPull, "vllm"};
  if (value == "pull-fast") return ModeChoice{TransferMode::kPull, "fast"};
  return InvalidArgument("x-kvpush-mode: '" + value +
                         "' is not one of push, pull, pull-vllm, pull-fast");
}

bool IsValidRequestId(const std::string& id) {
  if (id.empty() || id.size() > 256) return false;
  for (char c : id) {
    if (c <= 0x20 || c >= 0x7f) return false;  // visible ASCII only, as the instances accept
  }
  return true;
}

IdMinter::IdMinter() : rng_(std::random_device{}()) {}

std::string IdMinter::Hex32() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  id.reserve(32);
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < 2; ++i) {
    uint64_t x = rng_();
    for (int k = 0; k < 16; ++k, x >>= 4) id += kHex[x & 15];
  }
  return id;
}

std::string IdMinter::RequestId(const std::string& prefix) {
  return prefix + Hex32();
}

std::string IdMinter::TransferId() {
  return Hex32();
}

uint64_t IdMinter::Seed() {
  std::lock_guard<std::mutex> lock(mu_);
  return rng_() >> 11;
}

json MakePrefillBody(const json& client, TransferMode mode, const std::string& transfer_id) {
  json p = client;
  p["max_tokens"] = 1;
  p.erase("max_completion_tokens");
  // min_tokens stays: P clamps it to its max_tokens of 1 and so never samples EOS or a stop id as
  // the first token when the client asked for at least one (docs/pd_protocol.md §1).
  p["stream"] = false;
  p.erase("stream_options");
  p["kv_transfer_params"] = {{"do_remote_decode", true},
                             {"do_remote_prefill", false},
                             {"transfer_mode", TransferModeName(mode)},
                             {"transfer_id", transfer_id}};
  return p;
}

json MakeDecodePushBody(const json& client, const std::string& transfer_id,
                        const InstanceAddress& prefill) {
  json d = client;
  d["kv_transfer_params"] = {{"do_remote_prefill", true},   {"do_remote_decode", false},
                             {"transfer_mode", "push"},     {"transfer_id", transfer_id},
                             {"remote_host", prefill.host}, {"remote_port", prefill.port}};
  return d;
}

Result<json> MakeDecodePullBody(const json& client, const json& prefill_answer,
                                const std::string& pull_profile) {
  if (!prefill_answer.is_object() || !prefill_answer.contains("kv_transfer_params") ||
      !prefill_answer["kv_transfer_params"].is_object()) {
    return InvalidArgument("prefill instance returned no kv_transfer_params");
  }
  json d = client;
  d["kv_transfer_params"] = prefill_answer["kv_transfer_params"];
  if (!pull_profile.empty()) d["kv_transfer_params"]["pull_profile"] = pull_profile;
  return d;
}

std::string ErrorJson(const std::string& message, const std::string& type,
                      const std::string& code, const std::string& param) {
  json e = {{"message", message}, {"type", type}, {"param", nullptr}};
  if (!param.empty()) e["param"] = param;
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kvpush::router
