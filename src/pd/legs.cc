#include "pd/legs.h"

namespace kvpush::pd {

using nlohmann::json;

json MakePrefillBody(const json& client, KvTransferParams::Mode mode,
                     const std::string& transfer_id) {
  json p = client;
  p["max_tokens"] = 1;
  p.erase("max_completion_tokens");
  p["stream"] = false;
  p.erase("stream_options");
  KvTransferParams kv;
  kv.role = KvTransferParams::Role::kProducer;
  kv.mode = mode;
  kv.transfer_id = transfer_id;
  p["kv_transfer_params"] = ToJson(kv);
  return p;
}

json MakeDecodePushBody(const json& client, const std::string& transfer_id,
                        const std::string& prefill_host, int prefill_port, bool prefill_https) {
  json d = client;
  KvTransferParams kv;
  kv.role = KvTransferParams::Role::kConsumer;
  kv.mode = KvTransferParams::Mode::kPush;
  kv.transfer_id = transfer_id;
  kv.remote_host = prefill_host;
  kv.remote_port = prefill_port;
  kv.remote_https = prefill_https;
  d["kv_transfer_params"] = ToJson(kv);
  return d;
}

Result<json> MakeDecodePullBody(const json& client, const json& prefill_answer,
                                std::optional<PullProfile> profile) {
  if (!prefill_answer.is_object() || !prefill_answer.contains("kv_transfer_params") ||
      !prefill_answer["kv_transfer_params"].is_object()) {
    return InvalidArgument("prefill instance returned no kv_transfer_params");
  }
  json d = client;
  d["kv_transfer_params"] = prefill_answer["kv_transfer_params"];
  if (profile) d["kv_transfer_params"]["pull_profile"] = PullProfileName(*profile);
  return d;
}

}  // namespace kvpush::pd
