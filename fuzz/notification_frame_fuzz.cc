// libFuzzer target: the notification frame (src/xfer/notification_frame.h), the bytes a peer's
// backend delivers for every notification (Agent::OnMessage decodes them before anything else).
// Input: one byte choosing the payload limit (0..255 -> 0, 16, ..., 4096 and 4 KiB: the agent's
// default), then the frame. Asserted: a refusal is kDataLoss or kUnimplemented with a message; a
// decoded frame has a 1..255-byte sender name and a payload within the limit, and re-encodes to
// exactly the input bytes (the format is canonical).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "xfer/notification_frame.h"

using namespace kvpush;
using namespace kvpush::xfer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint32_t max_payload = data[0] >= 0xf0 ? 4096u : 16u * data[0];
  const std::span<const uint8_t> frame(data + 1, size - 1);
  auto n = DecodeNotificationFrame(frame, max_payload);
  if (!n.ok()) {
    const StatusCode c = n.status().code();
    if (c != StatusCode::kDataLoss && c != StatusCode::kUnimplemented) std::abort();
    if (n.status().message().empty()) std::abort();
    return 0;
  }
  if (n->peer.empty() || n->peer.size() > 255) std::abort();
  if (n->payload.size() > max_payload) std::abort();
  const auto again = EncodeNotificationFrame(n->peer, n->peer_incarnation, n->payload);
  if (again.size() != frame.size() || !std::equal(again.begin(), again.end(), frame.begin())) {
    std::abort();
  }
  return 0;
}
