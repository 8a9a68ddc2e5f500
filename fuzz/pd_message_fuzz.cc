// libFuzzer target: the P/D peer messages (src/connector/messages.h), the bytes any handshaken
// peer can put in a notification. Every input must either be refused with kInvalidArgument or
// decode to a message that satisfies the documented limits and re-encodes to exactly the same
// bytes (the format is canonical), except a TRANSFER_FAILED text longer than the 1,024 bytes the
// encoder keeps. Nothing may crash, leak or hit UB.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "connector/messages.h"
#include "pd/ids.h"

using namespace kvpush::connector;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = DecodeMessage(std::span<const uint8_t>(data, size));
  if (!m.ok()) {
    if (m.status().code() != kvpush::StatusCode::kInvalidArgument) std::abort();
    if (m.status().message().empty()) std::abort();
    return 0;
  }
  if (!kvpush::pd::IsValidTransferId(m->transfer_id)) std::abort();
  if (m->block_ids.size() > kMaxPartBlocks || m->top_logprobs.size() > kMaxTopLogprobs) {
    std::abort();
  }
  for (int32_t b : m->block_ids) {
    if (b < 0) std::abort();
  }
  if (m->token_id < -1) std::abort();
  auto again = EncodeMessage(*m);
  if (!again.ok()) std::abort();
  const bool truncated = m->tag == MsgTag::kTransferFailed && m->message.size() > 1024;
  if (!truncated && (again->size() != size || !std::equal(again->begin(), again->end(), data))) {
    std::abort();
  }
  return 0;
}
