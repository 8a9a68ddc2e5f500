// The P/D handshake document (docs/pd_protocol.md §2): what an instance tells a peer about
// itself (transfer-agent metadata, KV layout, compatibility hash, incarnation), its JSON form,
// and the compatibility check that names the first difference.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/encoding.h"
#include "common/status.h"
#include "kv/layout.h"

namespace kvpush::connector {

/// Version of the P/D protocol implemented here; peers must match. 2: block lists as runs, in
/// parts; 3: KV_READY and PINNED carry the first token's binding.
inline constexpr int kConnectorVersion = 3;

struct HandshakeInfo {
  std::string engine_id;  ///< the peer's agent name
  uint64_t incarnation = 0;
  std::string role;  ///< "prefill", "decode" or "both"
  int connector_version = kConnectorVersion;
  std::string transfer_backend;
  uint64_t model_fingerprint = 0;
  KvLayout layout;
  uint32_t kv_region_index = 0;  ///< the arena's RegionId in the agent metadata
  uint32_t kv_region_generation = 0;
  int64_t lease_ms = 0;
  int64_t watchdog_ms = 0;
  std::vector<uint8_t> agent_metadata;

  /// XXH3-64 over (model fingerprint, layers, kv heads, head dim, block size, dtype, connector
  /// version, transfer backend): equal on compatible instances.
  uint64_t CompatHash() const;

  nlohmann::json ToJson() const;
  /// Parses and validates types and ranges (layout.Validate(), base64, hex fields, compat hash
  /// consistent with the fields). Errors: kInvalidArgument naming the field.
  static Result<HandshakeInfo> FromJson(const nlohmann::json& j);
};

/// Checks that `peer` can exchange KV with `self`. Errors: kFailedPrecondition whose message
/// names the first differing field ("block_size: 16 here, 32 on peer 'decode-0'").
Status CheckCompatible(const HandshakeInfo& self, const HandshakeInfo& peer);

/// At most this many (layer, K|V, block) chunk descriptors are built for one peer's KV arena
/// (2^26: 1.5 GiB of descriptors; a 140 GiB pool of 16-token blocks of a 24-layer model with
/// 4 KiB chunks needs 3.6e7).
inline constexpr uint64_t kMaxPeerChunks = uint64_t{1} << 26;

/// Checks a peer's declared pool before any per-block state is built for it: 1 <= num_blocks,
/// num_layers * 2 * num_blocks <= kMaxPeerChunks, and its agent metadata exports the KV region
/// (kv_region_index / generation) with at least layout.total_bytes() bytes. Errors:
/// kInvalidArgument naming the field (num_blocks, kv_region), or DecodeMetadata's. Pure.
Status CheckPeerPool(const HandshakeInfo& peer);

// The encodings moved to common/encoding.h (discovery uses them too); kept visible here.
using ::kvpush::Base64Decode;
using ::kvpush::Base64Encode;
using ::kvpush::Hex64;
using ::kvpush::ParseHex64;

}  // namespace kvpush::connector
