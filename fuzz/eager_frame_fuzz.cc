// libFuzzer target: the eager WRITE frames (src/xfer/eager_frame.h), which a handshaken peer sends
// to land bytes in this instance's registered memory (Agent::OnEagerWrite decodes them before
// any range is checked against the regions). Input: one byte choosing the decoder (even: a write
// frame, with data and notification limits 64 KiB and 4 KiB; odd: an ack), then the frame.
// Asserted: a refusal is kDataLoss or kUnimplemented with a message; a decoded write has a
// 1..255-byte sender, at least one range, no empty range, range lengths that add up to its data,
// data and notification within the limits, and re-encodes to exactly the input bytes; a decoded
// ack re-encodes to exactly the input bytes (both formats are canonical).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "xfer/eager_frame.h"

using namespace kvpush;
using namespace kvpush::xfer;

namespace {

constexpr uint64_t kMaxData = 64 * 1024;
constexpr uint32_t kMaxNotification = 4096;

void CheckRefusal(const Status& s) {
  if (s.code() != StatusCode::kDataLoss && s.code() != StatusCode::kUnimplemented) std::abort();
  if (s.message().empty()) std::abort();
}

void CheckWrite(std::span<const uint8_t> frame) {
  auto w = DecodeEagerWrite(frame, kMaxData, kMaxNotification);
  if (!w.ok()) return CheckRefusal(w.status());
  if (w->sender.empty() || w->sender.size() > 255 || w->ranges.empty()) std::abort();
  uint64_t sum = 0;
  for (const EagerRange& r : w->ranges) {
    if (r.length == 0) std::abort();
    sum += r.length;
  }
  if (sum != w->data.size() || w->data.size() > kMaxData) std::abort();
  if (w->notification.size() > kMaxNotification) std::abort();
  std::vector<uint8_t> again;
  BeginEagerWrite(w->sender, w->sender_incarnation, w->target_incarnation, w->token, w->ranges,
                  static_cast<uint32_t>(w->notification.size()), &again);
  again.insert(again.end(), w->data.begin(), w->data.end());
  again.insert(again.end(), w->notification.begin(), w->notification.end());
  if (again.size() != frame.size() || !std::equal(again.begin(), again.end(), frame.begin())) {
    std::abort();
  }
}

void CheckAck(std::span<const uint8_t> frame) {
  auto a = DecodeEagerAck(frame);
  if (!a.ok()) return CheckRefusal(a.status());
  if (a->sender.empty() || a->sender.size() > 255) std::abort();
  const auto again = EncodeEagerAck(a->sender, a->sender_incarnation, a->token, a->code);
  if (again.size() != frame.size() || !std::equal(again.begin(), again.end(), frame.begin())) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::span<const uint8_t> frame(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    CheckWrite(frame);
  } else {
    CheckAck(frame);
  }
  return 0;
}
