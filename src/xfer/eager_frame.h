// Eager WRITE frames: a small WRITE and its notification carried in one message, and the
// target's acknowledgement (docs/xfer.md, "Eager WRITEs").
//
// Over a transport whose one-sided WRITE needs a round trip before its notification may follow
// (UCX over tcp: put, flush, then the notification's AM; libfabric: FI_DELIVERY_COMPLETE, then
// fi_send), a WRITE of a few KiB costs a flush round trip and two more thread wake-ups than the
// one message it could be. The agent therefore sends a WRITE with a notification of at most
// AgentOptions::eager_write_max_bytes as one frame holding the target ranges, the bytes and the
// notification; the target's agent checks every range against its own registered regions, copies
// the bytes there, then queues the notification (so it still follows its data), and answers an
// acknowledgement, on which the initiator's transfer is done (the data is visible at the target:
// the same promise as a flushed WRITE).
//
// Layouts (little-endian; every count and length is checked against the bytes present before
// anything is used, and a frame must be consumed exactly):
//   write: u32 magic 'KVPE' | u16 version=1 | u16 name_len | u64 sender incarnation |
//          u64 target incarnation | u64 token | u32 nranges | u32 notification_len |
//          u64 data_len | name | nranges x (u32 region index, u32 region generation,
//          u64 offset, u64 length) | data (the ranges' bytes, in order) | notification
//   ack:   u32 magic 'KVPA' | u16 version=1 | u16 name_len | u64 sender incarnation |
//          u64 token | u8 code (StatusCode; 0: copied) | name
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpush::xfer {

/// One target range of an eager WRITE: `length` bytes at `offset` in the target's region
/// (index, generation), as the target exported it in its metadata.
struct EagerRange {
  uint32_t region_index = 0;
  uint32_t region_generation = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

/// A decoded eager WRITE frame. `data` and `notification` point into the decoded frame.
struct EagerWrite {
  std::string sender;
  uint64_t sender_incarnation = 0;
  uint64_t target_incarnation = 0;
  uint64_t token = 0;  ///< the initiator's post token, echoed in the ack
  std::vector<EagerRange> ranges;
  std::span<const uint8_t> data;
  std::span<const uint8_t> notification;
};

/// A decoded acknowledgement.
struct EagerAck {
  std::string sender;
  uint64_t sender_incarnation = 0;
  uint64_t token = 0;
  StatusCode code = StatusCode::kOk;
};

/// What kind of frame `frame` is, from its magic: a notification frame, an eager WRITE, an ack,
/// or none of them.
enum class FrameKind : uint8_t { kNotification, kEagerWrite, kEagerAck, kUnknown };
FrameKind PeekFrameKind(std::span<const uint8_t> frame);

/// Bytes of the fixed part of a write frame with `name_len` bytes of sender name and `nranges`
/// ranges (the frame is that plus the data and the notification).
size_t EagerWriteHeaderBytes(size_t name_len, size_t nranges);

/// Starts a write frame: header and ranges; the caller appends the data (the ranges' bytes, in
/// order, sum of lengths) and then `notification_len` bytes of notification. `out` is cleared and
/// reserved for the whole frame. Caller guarantees 1 <= sender.size() <= 255 and ranges not empty.
void BeginEagerWrite(std::string_view sender, uint64_t sender_incarnation,
                     uint64_t target_incarnation, uint64_t token,
                     std::span<const EagerRange> ranges, uint32_t notification_len,
                     std::vector<uint8_t>* out);

/// Parses a write frame. Errors (kDataLoss): truncated, trailing bytes, bad magic or name, no
/// range, a zero-length range, ranges whose lengths do not add up to the data, more than
/// `max_data` bytes of data or `max_notification` of notification; kUnimplemented: another
/// version. Nothing is allocated before the counts are checked against the frame's size.
Result<EagerWrite> DecodeEagerWrite(std::span<const uint8_t> frame, uint64_t max_data,
                                    uint32_t max_notification);

/// Builds an ack frame. Caller guarantees 1 <= sender.size() <= 255.
std::vector<uint8_t> EncodeEagerAck(std::string_view sender, uint64_t sender_incarnation,
                                    uint64_t token, StatusCode code);

/// Parses an ack frame. Errors: kDataLoss (truncated, trailing bytes, bad magic, name or code),
/// kUnimplemented (another version).
Result<EagerAck> DecodeEagerAck(std::span<const uint8_t> frame);

}  // namespace kvpush::xfer
