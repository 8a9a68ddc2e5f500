#include "connector/handshake.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>

#include "xfer/metadata.h"

namespace kvpush::connector {
namespace {

const char* DtypeName(KvDtype d) {
  switch (d) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kF16:
      return "f16";
    case KvDtype::kBF16:
      return "bf16";
  }
  return "?";
}

}  // namespace

uint64_t HandshakeInfo::CompatHash() const {
  std::string s = Hex64(model_fingerprint) + "|" + std::to_string(layout.num_layers) + "|" +
                  std::to_string(layout.num_kv_heads) + "|" + std::to_string(layout.head_dim) +
                  "|" + std::to_string(layout.block_size) + "|" + DtypeName(layout.dtype) + "|" +
                  std::to_string(connector_version) + "|" + transfer_backend;
  return XXH3_64bits(s.data(), s.size());
}

nlohmann::json HandshakeInfo::ToJson() const {
  nlohmann::json j;
  j["engine_id"] = engine_id;
  j["incarnation"] = Hex64(incarnation);
  j["role"] = role;
  j["connector_version"] = connector_version;
  j["transfer_backend"] = transfer_backend;
  j["model_fingerprint"] = Hex64(model_fingerprint);
  j["layout"] = {{"num_layers", layout.num_layers}, {"num_kv_heads", layout.num_kv_heads},
                 {"head_dim", layout.head_dim},     {"block_size", layout.block_size},
                 {"num_blocks", layout.num_blocks}, {"dtype", DtypeName(layout.dtype)}};
  j["kv_region"] = {{"index", kv_region_index}, {"generation", kv_region_generation}};
  j["compat_hash"] = Hex64(CompatHash());
  j["lease_ms"] = lease_ms;
  j["watchdog_ms"] = watchdog_ms;
  j["agent_metadata"] = Base64Encode(agent_metadata);
  return j;
}

Result<HandshakeInfo> HandshakeInfo::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("handshake: body is not a JSON object");
  HandshakeInfo h;
  auto str = [&](const char* k, std::string& out) -> Status {
    if (!j.contains(k) || !j[k].is_string()) {
      return InvalidArgument(std::string("handshake: '") + k + "' must be a string");
    }
    out = j[k].get<std::string>();
    return Status::Ok();
  };
  auto num = [&](const nlohmann::json& o, const char* k, int64_t lo, int64_t hi,
                 int64_t& out) -> Status {
    if (!o.contains(k) || !o[k].is_number_integer()) {
      return InvalidArgument(std::string("handshake: '") + k + "' must be an integer");
    }
    out = o[k].get<int64_t>();
    if (out < lo || out > hi) {
      return InvalidArgument(std::string("handshake: '") + k + "' out of range");
    }
    return Status::Ok();
  };
  std::string inc, fp, compat, md;
  KVP_RETURN_IF_ERROR(str("engine_id", h.engine_id));
  if (h.engine_id.empty() || h.engine_id.size() > 255) {
    return InvalidArgument("handshake: 'engine_id' must be 1..255 bytes");
  }
  KVP_RETURN_IF_ERROR(str("incarnation", inc));
  KVP_ASSIGN_OR_RETURN(h.incarnation, ParseHex64(inc));
  KVP_RETURN_IF_ERROR(str("role", h.role));
  if (h.role != "prefill" && h.role != "decode" && h.role != "both") {
    return InvalidArgument("handshake: 'role' must be prefill, decode or both");
  }
  KVP_RETURN_IF_ERROR(str("transfer_backend", h.transfer_backend));
  KVP_RETURN_IF_ERROR(str("model_fingerprint", fp));
  KVP_ASSIGN_OR_RETURN(h.model_fingerprint, ParseHex64(fp));
  KVP_RETURN_IF_ERROR(str("compat_hash", compat));
  KVP_RETURN_IF_ERROR(str("agent_metadata", md));
  KVP_ASSIGN_OR_RETURN(h.agent_metadata, Base64Decode(md));
  int64_t v = 0;
  KVP_RETURN_IF_ERROR(num(j, "connector_version", 0, 1 << 20, v));
  h.connector_version = static_cast<int>(v);
  KVP_RETURN_IF_ERROR(num(j, "lease_ms", 0, 1ll << 40, h.lease_ms));
  KVP_RETURN_IF_ERROR(num(j, "watchdog_ms", 0, 1ll << 40, h.watchdog_ms));
  if (!j.contains("layout") || !j["layout"].is_object()) {
    return InvalidArgument("handshake: 'layout' must be an object");
  }
  const auto& l = j["layout"];
  KVP_RETURN_IF_ERROR(num(l, "num_layers", 1, 1 << 16, v));
  h.layout.num_layers = static_cast<int32_t>(v);
  KVP_RETURN_IF_ERROR(num(l, "num_kv_heads", 1, 1 << 16, v));
  h.layout.num_kv_heads = static_cast<int32_t>(v);
  KVP_RETURN_IF_ERROR(num(l, "head_dim", 1, 1 << 16, v));
  h.layout.head_dim = static_cast<int32_t>(v);
  KVP_RETURN_IF_ERROR(num(l, "block_size", 1, 1 << 16, v));
  h.layout.block_size = static_cast<int32_t>(v);
  KVP_RETURN_IF_ERROR(num(l, "num_blocks", 1, 1 << 30, v));
  h.layout.num_blocks = static_cast<int32_t>(v);
  if (!l.contains("dtype") || !l["dtype"].is_string()) {
    return InvalidArgument("handshake: layout 'dtype' must be a string");
  }
  const std::string dt = l["dtype"].get<std::string>();
  if (dt == "f32") {
    h.layout.dtype = KvDtype::kF32;
  } else if (dt == "f16") {
    h.layout.dtype = KvDtype::kF16;
  } else if (dt == "bf16") {
    h.layout.dtype = KvDtype::kBF16;
  } else {
    return InvalidArgument("handshake: unknown dtype '" + dt + "'");
  }
  KVP_RETURN_IF_ERROR(h.layout.Validate());
  if (!j.contains("kv_region") || !j["kv_region"].is_object()) {
    return InvalidArgument("handshake: 'kv_region' must be an object");
  }
  KVP_RETURN_IF_ERROR(num(j["kv_region"], "index", 0, 0xffffffffll, v));
  h.kv_region_index = static_cast<uint32_t>(v);
  KVP_RETURN_IF_ERROR(num(j["kv_region"], "generation", 1, 0xffffffffll, v));
  h.kv_region_generation = static_cast<uint32_t>(v);
  KVP_ASSIGN_OR_RETURN(uint64_t c, ParseHex64(compat));
  if (c != h.CompatHash()) {
    return InvalidArgument("handshake: compat_hash does not match the described fields");
  }
  return h;
}

Status CheckCompatible(const HandshakeInfo& self, const HandshakeInfo& peer) {
  auto diff = [&](const char* field, const std::string& here, const std::string& there) {
    return FailedPrecondition(std::string(field) + ": " + here + " here, " + there + " on peer '" +
                              peer.engine_id + "'");
  };
  if (self.connector_version != peer.connector_version) {
    return diff("connector_version", std::to_string(self.connector_version),
                std::to_string(peer.connector_version));
  }
  if (self.model_fingerprint != peer.model_fingerprint) {
    return diff("model_fingerprint", Hex64(self.model_fingerprint), Hex64(peer.model_fingerprint));
  }
  const KvLayout& a = self.layout;
  const KvLayout& b = peer.layout;
  if (a.num_layers != b.num_layers) {
    return diff("num_layers", std::to_string(a.num_layers), std::to_string(b.num_layers));
  }
  if (a.num_kv_heads != b.num_kv_heads) {
    return diff("num_kv_heads", std::to_string(a.num_kv_heads), std::to_string(b.num_kv_heads));
  }
  if (a.head_dim != b.head_dim) {
    return diff("head_dim", std::to_string(a.head_dim), std::to_string(b.head_dim));
  }
  if (a.block_size != b.block_size) {
    return diff("block_size", std::to_string(a.block_size), std::to_string(b.block_size));
  }
  if (a.dtype != b.dtype) return diff("dtype", DtypeName(a.dtype), DtypeName(b.dtype));
  if (self.transfer_backend != peer.transfer_backend) {
    return diff("transfer_backend", self.transfer_backend, peer.transfer_backend);
  }
  if (self.engine_id == peer.engine_id) {
    return FailedPrecondition("peer has the same engine_id '" + peer.engine_id + "' as this one");
  }
  // A decode instance needs the prefill's lease to outlast its own watchdog, or a pull READ
  // could land after P reused the blocks (docs/pd_protocol.md §2).
  const bool self_decodes = self.role != "prefill";
  const bool peer_prefills = peer.role != "decode";
  if (self_decodes && peer_prefills && peer.lease_ms <= self.watchdog_ms + 1000) {
    return diff("lease_ms", "> watchdog_ms + 1000 = " + std::to_string(self.watchdog_ms + 1000),
                std::to_string(peer.lease_ms));
  }
  return Status::Ok();
}

Status CheckPeerPool(const HandshakeInfo& peer) {
  const KvLayout& l = peer.layout;
  const uint64_t per_block = 2 * static_cast<uint64_t>(std::max(l.num_layers, 1));
  if (l.num_blocks < 1 || static_cast<uint64_t>(l.num_blocks) * per_block > kMaxPeerChunks) {
    return InvalidArgument("num_blocks: peer '" + peer.engine_id + "' declares " +
                           std::to_string(l.num_blocks) + " KV blocks; at most " +
                           std::to_string(kMaxPeerChunks / per_block) +
                           " (one descriptor per layer, K|V and block) are accepted");
  }
  auto md = xfer::DecodeMetadata(peer.agent_metadata);
  if (!md.ok()) return md.status().WithContext("peer '" + peer.engine_id + "' agent metadata");
  for (const xfer::RegionInfo& r : md->regions) {
    if (r.id.index != peer.kv_region_index || r.id.generation != peer.kv_region_generation) {
      continue;
    }
    if (r.length < l.total_bytes()) {
      return InvalidArgument("num_blocks: peer '" + peer.engine_id + "' declares a " +
                             std::to_string(l.total_bytes()) + "-byte KV arena in a " +
                             std::to_string(r.length) + "-byte region");
    }
    return Status::Ok();
  }
  return InvalidArgument("kv_region: peer '" + peer.engine_id +
                         "' exports no region with the KV arena's index and generation");
}

}  // namespace kvpush::connector
