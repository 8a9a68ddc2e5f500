// The notification frame: the bytes a backend carries from initiator to target for a notification.
// Layout (little-endian; docs/xfer.md "Notification frame"):
//   u32 magic 'KVPN' (0x4e50564b) | u16 version=1 | u16 name_len | u64 sender incarnation |
//   u32 payload_len | name bytes | payload bytes
// Decoding refuses (kDataLoss / kUnimplemented) anything truncated, padded or oversized.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "xfer/types.h"

namespace kvpush::xfer {

/// Builds a frame. Caller guarantees name <= 255 bytes.
std::vector<uint8_t> EncodeNotificationFrame(std::string_view sender, uint64_t incarnation,
                                             std::span<const uint8_t> payload);

/// Parses a frame whose payload is at most `max_payload` bytes.
Result<Notification> DecodeNotificationFrame(std::span<const uint8_t> frame, uint32_t max_payload);

}  // namespace kvpush::xfer
