#include "xfer/notification_frame.h"

#include "xfer/byte_io.h"

namespace kvpush::xfer {
namespace {
constexpr uint32_t kFrameMagic = 0x4e50564b;  // "KVPN" little-endian
constexpr uint16_t kFrameVersion = 1;
}  // namespace

std::vector<uint8_t> EncodeNotificationFrame(std::string_view sender, uint64_t incarnation,
                                             std::span<const uint8_t> payload) {
  std::vector<uint8_t> out;
  out.reserve(20 + sender.size() + payload.size());
  ByteWriter w(&out);
  w.U32(kFrameMagic);
  w.U16(kFrameVersion);
  w.U16(static_cast<uint16_t>(sender.size()));
  w.U64(incarnation);
  w.U32(static_cast<uint32_t>(payload.size()));
  w.Bytes(sender.data(), sender.size());
  w.Bytes(payload.data(), payload.size());
  return out;
}

Result<Notification> DecodeNotificationFrame(std::span<const uint8_t> frame, uint32_t max_payload) {
  ByteReader r(frame);
  uint32_t magic = 0, payload_len = 0;
  uint16_t version = 0, name_len = 0;
  Notification n;
  if (!r.U32(&magic) || !r.U16(&version) || !r.U16(&name_len) || !r.U64(&n.peer_incarnation) ||
      !r.U32(&payload_len))
    return DataLoss("notification frame: truncated header");
  if (magic != kFrameMagic) return DataLoss("notification frame: bad magic");
  if (version != kFrameVersion)
    return Unimplemented("notification frame: version " + std::to_string(version));
  if (payload_len > max_payload)
    return DataLoss("notification frame: payload " + std::to_string(payload_len) + " bytes > " +
                    std::to_string(max_payload));
  if (name_len == 0 || name_len > 255) return DataLoss("notification frame: bad name length");
  if (!r.String(name_len, &n.peer) || !r.Bytes(payload_len, &n.payload))
    return DataLoss("notification frame: truncated body");
  if (r.remaining() != 0) return DataLoss("notification frame: trailing bytes");
  return n;
}

}  // namespace kvpush::xfer
