#include "xfer/eager_frame.h"

#include "xfer/byte_io.h"

namespace kvpush::xfer {
namespace {

constexpr uint32_t kNotificationMagic = 0x4e50564b;  // "KVPN" little-endian
constexpr uint32_t kWriteMagic = 0x4550564b;         // "KVPE"
constexpr uint32_t kAckMagic = 0x4150564b;           // "KVPA"
constexpr uint16_t kVersion = 1;
constexpr size_t kWriteFixed = 4 + 2 + 2 + 8 + 8 + 8 + 4 + 4 + 8;
constexpr size_t kRangeBytes = 4 + 4 + 8 + 8;

}  // namespace

FrameKind PeekFrameKind(std::span<const uint8_t> frame) {
  ByteReader r(frame);
  uint32_t magic = 0;
  if (!r.U32(&magic)) return FrameKind::kUnknown;
  switch (magic) {
    case kNotificationMagic:
      return FrameKind::kNotification;
    case kWriteMagic:
      return FrameKind::kEagerWrite;
    case kAckMagic:
      return FrameKind::kEagerAck;
    default:
      return FrameKind::kUnknown;
  }
}

size_t EagerWriteHeaderBytes(size_t name_len, size_t nranges) {
  return kWriteFixed + name_len + nranges * kRangeBytes;
}

void BeginEagerWrite(std::string_view sender, uint64_t sender_incarnation,
                     uint64_t target_incarnation, uint64_t token,
                     std::span<const EagerRange> ranges, uint32_t notification_len,
                     std::vector<uint8_t>* out) {
  uint64_t data_len = 0;
  for (const EagerRange& e : ranges) data_len += e.length;
  out->clear();
  out->reserve(EagerWriteHeaderBytes(sender.size(), ranges.size()) + data_len + notification_len);
  ByteWriter w(out);
  w.U32(kWriteMagic);
  w.U16(kVersion);
  w.U16(static_cast<uint16_t>(sender.size()));
  w.U64(sender_incarnation);
  w.U64(target_incarnation);
  w.U64(token);
  w.U32(static_cast<uint32_t>(ranges.size()));
  w.U32(notification_len);
  w.U64(data_len);
  w.Bytes(sender.data(), sender.size());
  for (const EagerRange& e : ranges) {
    w.U32(e.region_index);
    w.U32(e.region_generation);
    w.U64(e.offset);
    w.U64(e.length);
  }
}

Result<EagerWrite> DecodeEagerWrite(std::span<const uint8_t> frame, uint64_t max_data,
                                    uint32_t max_notification) {
  ByteReader r(frame);
  uint32_t magic = 0, nranges = 0, notification_len = 0;
  uint16_t version = 0, name_len = 0;
  uint64_t data_len = 0;
  EagerWrite w;
  if (!r.U32(&magic) || !r.U16(&version) || !r.U16(&name_len) || !r.U64(&w.sender_incarnation) ||
      !r.U64(&w.target_incarnation) || !r.U64(&w.token) || !r.U32(&nranges) ||
      !r.U32(&notification_len) || !r.U64(&data_len))
    return DataLoss("eager write frame: truncated header");
  if (magic != kWriteMagic) return DataLoss("eager write frame: bad magic");
  if (version != kVersion)
    return Unimplemented("eager write frame: version " + std::to_string(version));
  if (name_len == 0 || name_len > 255) return DataLoss("eager write frame: bad name length");
  if (nranges == 0) return DataLoss("eager write frame: no range");
  if (data_len > max_data)
    return DataLoss("eager write frame: " + std::to_string(data_len) + " bytes of data > " +
                    std::to_string(max_data));
  if (notification_len > max_notification)
    return DataLoss("eager write frame: notification of " + std::to_string(notification_len) +
                    " bytes > " + std::to_string(max_notification));
  // Every count against the bytes present before anything is allocated.
  const uint64_t body = uint64_t{name_len} + uint64_t{nranges} * kRangeBytes;
  if (body > r.remaining() || data_len > r.remaining() - body ||
      notification_len != r.remaining() - body - data_len)
    return DataLoss("eager write frame: lengths do not match the frame's size");
  if (!r.String(name_len, &w.sender)) return DataLoss("eager write frame: truncated name");
  w.ranges.resize(nranges);
  uint64_t sum = 0;
  for (EagerRange& e : w.ranges) {
    if (!r.U32(&e.region_index) || !r.U32(&e.region_generation) || !r.U64(&e.offset) ||
        !r.U64(&e.length))
      return DataLoss("eager write frame: truncated range");
    if (e.length == 0 || e.length > data_len - sum)
      return DataLoss("eager write frame: range lengths do not add up to the data");
    sum += e.length;
  }
  if (sum != data_len)
    return DataLoss("eager write frame: range lengths do not add up to the data");
  const size_t at = r.position();
  w.data = frame.subspan(at, data_len);
  w.notification = frame.subspan(at + data_len, notification_len);
  return w;
}

std::vector<uint8_t> EncodeEagerAck(std::string_view sender, uint64_t sender_incarnation,
                                    uint64_t token, StatusCode code) {
  std::vector<uint8_t> out;
  out.reserve(4 + 2 + 2 + 8 + 8 + 1 + sender.size());
  ByteWriter w(&out);
  w.U32(kAckMagic);
  w.U16(kVersion);
  w.U16(static_cast<uint16_t>(sender.size()));
  w.U64(sender_incarnation);
  w.U64(token);
  w.U8(static_cast<uint8_t>(code));
  w.Bytes(sender.data(), sender.size());
  return out;
}

Result<EagerAck> DecodeEagerAck(std::span<const uint8_t> frame) {
  ByteReader r(frame);
  uint32_t magic = 0;
  uint16_t version = 0, name_len = 0;
  uint8_t code = 0;
  EagerAck a;
  if (!r.U32(&magic) || !r.U16(&version) || !r.U16(&name_len) || !r.U64(&a.sender_incarnation) ||
      !r.U64(&a.token) || !r.U8(&code))
    return DataLoss("eager ack frame: truncated header");
  if (magic != kAckMagic) return DataLoss("eager ack frame: bad magic");
  if (version != kVersion)
    return Unimplemented("eager ack frame: version " + std::to_string(version));
  if (name_len == 0 || name_len > 255) return DataLoss("eager ack frame: bad name length");
  if (code > static_cast<uint8_t>(StatusCode::kIoError))
    return DataLoss("eager ack frame: unknown code " + std::to_string(code));
  if (!r.String(name_len, &a.sender)) return DataLoss("eager ack frame: truncated name");
  if (r.remaining() != 0) return DataLoss("eager ack frame: trailing bytes");
  a.code = static_cast<StatusCode>(code);
  return a;
}

}  // namespace kvpush::xfer
