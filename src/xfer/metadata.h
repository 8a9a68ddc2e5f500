// Agent metadata: what a peer needs to reach an agent and address its regions, as a versioned,
// checksummed, little-endian binary blob. Exchanged out of band (HTTP, a pipe, a file); the format
// is documented byte by byte in docs/xfer.md ("Metadata format").
//
// Decoding validates everything and refuses with a reason: kDataLoss for a truncated, oversized or
// corrupted blob (bad magic, length, checksum, trailing bytes); kUnimplemented for an unknown
// version; kInvalidArgument for an inconsistent one (empty name, zero-length or duplicate region,
// base + length overflow, unknown memory type). Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "xfer/types.h"

namespace kvpush::xfer {

/// One exported region.
struct RegionInfo {
  RegionId id;  ///< the exporting agent's handle for it
  MemoryType memory_type = MemoryType::kHost;
  uint64_t length = 0;       ///< bytes, > 0
  uint64_t base = 0;         ///< virtual address at the owner (used by kVirtualAddress backends)
  std::vector<uint8_t> key;  ///< backend key blob (may be empty)
};

/// Everything an agent exports.
struct AgentMetadata {
  std::string name;              ///< 1..255 bytes
  uint64_t incarnation = 0;      ///< != 0
  std::string backend;           ///< BackendCaps::name of the exporting agent's backend
  std::vector<uint8_t> address;  ///< Backend::LocalAddress, <= 64 KiB
  std::vector<RegionInfo> regions;
};

inline constexpr uint16_t kMetadataVersion = 1;
inline constexpr size_t kMaxMetadataBytes = 16u << 20;  ///< 16 MiB
inline constexpr size_t kMaxRegions = 65536;
inline constexpr size_t kMaxAddressBytes = 64u << 10;
inline constexpr size_t kMaxKeyBytes = 4096;

/// Serializes metadata. Errors: kInvalidArgument if a field exceeds the format's limits.
Result<std::vector<uint8_t>> EncodeMetadata(const AgentMetadata& md);

/// Parses and validates a blob (see file comment for the error codes).
Result<AgentMetadata> DecodeMetadata(std::span<const uint8_t> blob);

}  // namespace kvpush::xfer
