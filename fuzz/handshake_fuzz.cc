// libFuzzer target: the P/D handshake document (src/connector/handshake.h), the JSON any process
// that reaches an instance's port can POST to /kv/handshake (and that a peer answers with), and
// its field codecs (Base64Decode for agent_metadata, ParseHex64 for incarnation, fingerprint and
// compat hash) fed the raw input as well.
// Asserted:
//   * HandshakeInfo::FromJson refuses with kInvalidArgument and a message, or returns a document
//     whose fields are in their documented ranges (valid layout, role prefill|decode|both,
//     engine_id 1..255 bytes, region generation != 0, non-negative lease and watchdog);
//   * an accepted document re-encodes (ToJson) to one that FromJson accepts as the same value;
//     CheckCompatible of the two answers OK or kFailedPrecondition;
//   * Base64Decode / ParseHex64 refuse with kInvalidArgument, or give a value that
//     encode-then-decode returns unchanged (4 characters -> at most 3 bytes; 1..16 hex digits).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "connector/handshake.h"
#include "fuzz_check.h"
#include "json_boundary.h"

using namespace kvpush;
using namespace kvpush::connector;

namespace {

bool Same(const HandshakeInfo& a, const HandshakeInfo& b) {
  return a.engine_id == b.engine_id && a.incarnation == b.incarnation && a.role == b.role &&
         a.connector_version == b.connector_version && a.transfer_backend == b.transfer_backend &&
         a.model_fingerprint == b.model_fingerprint && a.layout == b.layout &&
         a.kv_region_index == b.kv_region_index &&
         a.kv_region_generation == b.kv_region_generation && a.lease_ms == b.lease_ms &&
         a.watchdog_ms == b.watchdog_ms && a.agent_metadata == b.agent_metadata;
}

void CheckRefusal(const Status& s) {
  Check(s.code() == StatusCode::kInvalidArgument && !s.message().empty());
}

/// The compat hash of the fields `j` describes (FromJson checked them all before it compares the
/// hash), so that a mutated layout is not refused for its now stale hash alone.
std::string RecomputedCompatHash(const nlohmann::json& j) {
  HandshakeInfo h;
  h.model_fingerprint = ParseHex64(j["model_fingerprint"].get<std::string>()).value();
  h.connector_version = j["connector_version"].get<int>();
  h.transfer_backend = j["transfer_backend"].get<std::string>();
  const auto& l = j["layout"];
  h.layout.num_layers = l["num_layers"].get<int32_t>();
  h.layout.num_kv_heads = l["num_kv_heads"].get<int32_t>();
  h.layout.head_dim = l["head_dim"].get<int32_t>();
  h.layout.block_size = l["block_size"].get<int32_t>();
  const std::string dt = l["dtype"].get<std::string>();
  h.layout.dtype = dt == "f32" ? KvDtype::kF32 : dt == "f16" ? KvDtype::kF16 : KvDtype::kBF16;
  return Hex64(h.CompatHash());
}

/// FromJson's contract on one document.
void CheckDocument(nlohmann::json j) {
  auto h = HandshakeInfo::FromJson(j);
  if (!h.ok() && h.status().message().find("compat_hash does not match") != std::string::npos) {
    CheckRefusal(h.status());
    j["compat_hash"] = RecomputedCompatHash(j);
    h = HandshakeInfo::FromJson(j);
  }
  if (!h.ok()) {
    CheckRefusal(h.status());
    return;
  }
  Check(!h->engine_id.empty() && h->engine_id.size() <= 255);
  Check(h->role == "prefill" || h->role == "decode" || h->role == "both");
  Check(h->layout.Validate().ok());
  Check(h->kv_region_generation != 0 && h->lease_ms >= 0 && h->watchdog_ms >= 0);
  auto again = HandshakeInfo::FromJson(h->ToJson());
  Check(again.ok() && Same(*h, *again));
  const Status compat = CheckCompatible(*h, *again);
  Check(compat.ok() || compat.code() == StatusCode::kFailedPrecondition);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);

  auto bytes = Base64Decode(text);
  if (bytes.ok()) {
    Check(bytes->size() <= text.size() / 4 * 3);
    auto back = Base64Decode(Base64Encode(*bytes));
    Check(back.ok() && *back == *bytes);
  } else {
    CheckRefusal(bytes.status());
  }
  auto hex = ParseHex64(text);
  if (hex.ok()) {
    Check(!text.empty() && text.size() <= 16);
    auto back = ParseHex64(Hex64(*hex));
    Check(back.ok() && *back == *hex);
  } else {
    CheckRefusal(hex.status());
  }

  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  CheckDocument(j);
  CheckDocument(kvpush::fuzz::WithBoundaryNumber(j, kvpush::fuzz::BoundarySeed(data, size)));
  return 0;
}
