// Messages P and D exchange through transfer-engine notifications (docs/pd_protocol.md §3).
// Encoding: one tag byte, then the fields little-endian; a transfer id is 32 lowercase hex chars.
// Decode validates everything (length, tag, id format, counts) and never trusts a length field.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpush::connector {

enum class MsgTag : uint8_t {
  kPushTarget = 1,
  kKvReady = 2,
  kTransferFailed = 3,
  kNotNeeded = 4,
  kCancel = 5,
  kCancelAck = 6,
  kRelease = 7,
  kPin = 8,
  kPinned = 9,
  kLayerReady = 10,
};

/// Wire bound on the blocks one transfer names (a PUSH_TARGET's or PINNED's whole list, a PIN,
/// a LAYER_READY): 2^20 blocks, 16M tokens at 16 per block, far above any model's context. The
/// real bound is checked where it is known: a target must cover exactly the prompt's blocks
/// that P computed, a PINNED exactly the range D asked for (docs/pd_protocol.md §3).
inline constexpr uint32_t kMaxTransferBlocks = 1u << 20;
/// Bound on the block ids one PUSH_TARGET or PINNED part carries (what a decoder expands).
inline constexpr uint32_t kMaxPartBlocks = 1u << 16;
/// Byte budget of one part's encoded block list (block_list.h): with the largest header (a
/// PINNED with 20 top logprobs, 249 bytes) and the MAC trailer it stays under the 4 KiB
/// notification frame.
inline constexpr size_t kMaxBlockListBytes = 3072;
/// Upper bound on top-logprob pairs in a KV_READY.
inline constexpr uint32_t kMaxTopLogprobs = 20;

/// One decoded message; which fields are meaningful depends on `tag`.
struct PdMessage {
  MsgTag tag = MsgTag::kPushTarget;
  std::string transfer_id;
  // kPushTarget
  uint32_t num_prompt_tokens = 0;
  uint64_t prompt_hash = 0;
  uint32_t first_block = 0;  ///< index in the request's block table of the first target block
  // kPin, kLayerReady: blocks [first_block, first_block + num_blocks) of the request's block
  // table; kPushTarget, kPinned: the whole list has num_blocks ids, sent in one or more parts.
  uint32_t num_blocks = 0;
  // kPushTarget, kPinned: this part's ids are the list's [part_offset, part_offset + size).
  uint32_t part_offset = 0;
  std::vector<int32_t> block_ids;  ///< kPushTarget: D's targets; kPinned: P's leased blocks
  // kLayerReady: the layer whose K/V of those blocks landed
  uint32_t layer = 0;
  // kKvReady, kPinned: KvDigest (kv/block_checksum.h) of the blocks the transfer moves
  uint64_t kv_digest = 0;
  // kKvReady, kPinned (also num_prompt_tokens, prompt_hash, first_block, block_ids): P's first
  // token, and the FirstTokenBinding (engine/first_token_binding.h) of the request that sampled
  // it; D takes the token only when its own request's binding is the same.
  uint64_t first_token_binding = 0;
  int32_t token_id = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  // kTransferFailed
  uint8_t code = 0;  ///< StatusCode of the failure
  std::string message;
};

/// True when the PUSH_TARGET or PINNED `m` carries its whole block list (one part).
bool IsWholeList(const PdMessage& m);

/// Encodes `m`. Errors: kInvalidArgument (bad transfer id, block counts outside the limits, a
/// part beyond its list or naming a block twice, too many top logprobs).
Result<std::vector<uint8_t>> EncodeMessage(const PdMessage& m);

/// Decodes and validates a payload. Errors: kInvalidArgument with the reason (truncated, unknown
/// tag, bad id, counts beyond limits, trailing bytes, negative block ids).
Result<PdMessage> DecodeMessage(std::span<const uint8_t> payload);

}  // namespace kvpush::connector
