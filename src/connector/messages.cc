#include "connector/messages.h"

#include <algorithm>
#include <cstring>

#include "connector/block_list.h"
#include "pd/ids.h"

namespace kvpush::connector {
namespace {

void PutU32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutF32(std::vector<uint8_t>& b, float f) {
  uint32_t v;
  std::memcpy(&v, &f, 4);
  PutU32(b, v);
}

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> b) : b_(b) {}
  bool U8(uint8_t& v) {
    if (b_.size() - pos_ < 1) return false;
    v = b_[pos_++];
    return true;
  }
  bool U32(uint32_t& v) {
    if (b_.size() - pos_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b_[pos_ + i]) << (8 * i);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t& v) {
    if (b_.size() - pos_ < 8) return false;
    v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return true;
  }
  bool F32(float& f) {
    uint32_t v;
    if (!U32(v)) return false;
    std::memcpy(&f, &v, 4);
    return true;
  }
  bool Bytes(size_t n, std::string& out) {
    if (b_.size() - pos_ < n) return false;
    out.assign(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  size_t left() const { return b_.size() - pos_; }
  void Skip(size_t n) { pos_ += std::min(n, left()); }

 private:
  std::span<const uint8_t> b_;
  size_t pos_ = 0;
};

/// The limits of a PUSH_TARGET or PINNED part of `n` ids at `part_offset` in a list of
/// `num_blocks`, the same for the encoder and the decoder.
Status CheckBlockPart(uint32_t num_blocks, uint32_t part_offset, uint64_t n, const char* what) {
  if (num_blocks == 0 || num_blocks > kMaxTransferBlocks || n == 0 || n > kMaxPartBlocks ||
      static_cast<uint64_t>(part_offset) + n > num_blocks) {
    return InvalidArgument(std::string(what) + ": part [" + std::to_string(part_offset) + ", +" +
                           std::to_string(n) + ") of a " + std::to_string(num_blocks) +
                           "-block list is outside the limits (list <= " +
                           std::to_string(kMaxTransferBlocks) + ", part <= " +
                           std::to_string(kMaxPartBlocks) + ")");
  }
  return Status::Ok();
}

/// Writes `num_blocks u32 | part_offset u32 | part_count u32 | runs` of a PUSH_TARGET or PINNED
/// part; checks the limits the decoder checks.
Status PutBlockPart(std::vector<uint8_t>& b, const PdMessage& m, const char* what) {
  const size_t n = m.block_ids.size();
  KVP_RETURN_IF_ERROR(CheckBlockPart(m.num_blocks, m.part_offset, n, what));
  for (int32_t id : m.block_ids) {
    if (id < 0) return InvalidArgument(std::string(what) + ": negative block id");
  }
  if (HasDuplicateBlocks(m.block_ids)) {
    return InvalidArgument(std::string(what) + ": a block is named twice");
  }
  PutU32(b, m.num_blocks);
  PutU32(b, m.part_offset);
  PutU32(b, static_cast<uint32_t>(n));
  AppendBlockRuns(b, m.block_ids);
  return Status::Ok();
}

/// Reads the trailing block part of a PUSH_TARGET or PINNED: its header, then runs that fill the
/// rest of the payload exactly.
Status ReadBlockPart(Reader& r, std::span<const uint8_t> payload, const char* what,
                     PdMessage& m) {
  uint32_t n = 0;
  if (!r.U32(m.num_blocks) || !r.U32(m.part_offset) || !r.U32(n)) {
    return InvalidArgument(std::string(what) + ": truncated block list header");
  }
  KVP_RETURN_IF_ERROR(CheckBlockPart(m.num_blocks, m.part_offset, n, what));
  Status s = DecodeBlockRuns(payload.subspan(payload.size() - r.left()), n, m.block_ids);
  if (!s.ok()) return InvalidArgument(std::string(what) + ": " + s.message());
  r.Skip(r.left());
  return Status::Ok();
}

void PutTopLogprobs(std::vector<uint8_t>& b, const std::vector<std::pair<int32_t, float>>& top) {
  PutU32(b, static_cast<uint32_t>(top.size()));
  for (const auto& [id, lp] : top) {
    PutU32(b, static_cast<uint32_t>(id));
    PutF32(b, lp);
  }
}

/// Reads `ntop u32, (id i32, logprob f32) x ntop`; with `exact`, they must end the payload.
Status ReadTopLogprobs(Reader& r, const char* what, bool exact,
                      std::vector<std::pair<int32_t, float>>& out) {
  uint32_t n = 0;
  if (!r.U32(n)) return InvalidArgument(std::string(what) + ": truncated");
  if (n > kMaxTopLogprobs || (exact ? r.left() != static_cast<size_t>(n) * 8
                                    : r.left() < static_cast<size_t>(n) * 8)) {
    return InvalidArgument(std::string(what) + ": top logprob count does not match the payload");
  }
  for (uint32_t i = 0; i < n; ++i) {
    uint32_t id = 0;
    float lp = 0;
    r.U32(id);
    r.F32(lp);
    if (id > 0x7fffffffu) return InvalidArgument(std::string(what) + ": negative top token id");
    out.emplace_back(static_cast<int32_t>(id), lp);
  }
  return Status::Ok();
}

}  // namespace

bool IsWholeList(const PdMessage& m) {
  return m.part_offset == 0 && m.block_ids.size() == m.num_blocks;
}

Result<std::vector<uint8_t>> EncodeMessage(const PdMessage& m) {
  if (!pd::IsValidTransferId(m.transfer_id)) {
    return InvalidArgument("message: transfer id must be 32 lowercase hex chars");
  }
  std::vector<uint8_t> b;
  b.reserve(256 + (m.block_ids.empty() ? 0 : BlockRunsBytes(m.block_ids)));
  b.push_back(static_cast<uint8_t>(m.tag));
  b.insert(b.end(), m.transfer_id.begin(), m.transfer_id.end());
  switch (m.tag) {
    case MsgTag::kPushTarget:
      PutU32(b, m.num_prompt_tokens);
      PutU64(b, m.prompt_hash);
      PutU32(b, m.first_block);
      KVP_RETURN_IF_ERROR(PutBlockPart(b, m, "push target"));
      break;
    case MsgTag::kKvReady:
      if (m.top_logprobs.size() > kMaxTopLogprobs) return InvalidArgument("too many top logprobs");
      PutU64(b, m.kv_digest);
      PutU64(b, m.first_token_binding);
      PutU32(b, static_cast<uint32_t>(m.token_id));
      PutF32(b, m.logprob);
      PutTopLogprobs(b, m.top_logprobs);
      break;
    case MsgTag::kPin:
    case MsgTag::kLayerReady:
      if (m.num_blocks == 0 || m.num_blocks > kMaxTransferBlocks) {
        return InvalidArgument("block count " + std::to_string(m.num_blocks) + " outside [1, " +
                               std::to_string(kMaxTransferBlocks) + "]");
      }
      if (m.tag == MsgTag::kPin) {
        PutU32(b, m.first_block);
        PutU32(b, m.num_blocks);
        break;
      }
      PutU32(b, m.layer);
      PutU32(b, m.first_block);
      PutU32(b, m.num_blocks);
      break;
    case MsgTag::kPinned:
      if (m.top_logprobs.size() > kMaxTopLogprobs) return InvalidArgument("too many top logprobs");
      PutU32(b, m.num_prompt_tokens);
      PutU64(b, m.prompt_hash);
      PutU32(b, static_cast<uint32_t>(m.token_id));
      PutF32(b, m.logprob);
      PutU64(b, m.kv_digest);
      PutU64(b, m.first_token_binding);
      PutTopLogprobs(b, m.top_logprobs);
      PutU32(b, m.first_block);
      KVP_RETURN_IF_ERROR(PutBlockPart(b, m, "pinned"));
      break;
    case MsgTag::kTransferFailed:
      b.push_back(m.code);
      b.insert(b.end(), m.message.begin(), m.message.begin() + std::min<size_t>(m.message.size(), 1024));
      break;
    case MsgTag::kNotNeeded:
    case MsgTag::kCancel:
    case MsgTag::kCancelAck:
    case MsgTag::kRelease:
      break;
    default:
      return InvalidArgument("message: unknown tag");
  }
  return b;
}

Result<PdMessage> DecodeMessage(std::span<const uint8_t> payload) {
  Reader r(payload);
  PdMessage m;
  uint8_t tag = 0;
  if (!r.U8(tag)) return InvalidArgument("message: empty");
  if (tag < 1 || tag > 10) return InvalidArgument("message: unknown tag " + std::to_string(tag));
  m.tag = static_cast<MsgTag>(tag);
  if (!r.Bytes(32, m.transfer_id)) return InvalidArgument("message: truncated transfer id");
  if (!pd::IsValidTransferId(m.transfer_id))
    return InvalidArgument("message: malformed transfer id");
  switch (m.tag) {
    case MsgTag::kPushTarget: {
      if (!r.U32(m.num_prompt_tokens) || !r.U64(m.prompt_hash) || !r.U32(m.first_block)) {
        return InvalidArgument("push target: truncated header");
      }
      KVP_RETURN_IF_ERROR(ReadBlockPart(r, payload, "push target", m));
      break;
    }
    case MsgTag::kKvReady: {
      uint32_t tok = 0;
      if (!r.U64(m.kv_digest) || !r.U64(m.first_token_binding) || !r.U32(tok) ||
          !r.F32(m.logprob)) {
        return InvalidArgument("kv ready: truncated");
      }
      if (tok > 0x7fffffffu) return InvalidArgument("kv ready: negative token id");
      m.token_id = static_cast<int32_t>(tok);
      KVP_RETURN_IF_ERROR(ReadTopLogprobs(r, "kv ready", true, m.top_logprobs));
      break;
    }
    case MsgTag::kPin:
      if (!r.U32(m.first_block) || !r.U32(m.num_blocks)) return InvalidArgument("pin: truncated");
      if (m.num_blocks == 0 || m.num_blocks > kMaxTransferBlocks) {
        return InvalidArgument("pin: block count " + std::to_string(m.num_blocks) +
                               " outside [1, " + std::to_string(kMaxTransferBlocks) + "]");
      }
      break;
    case MsgTag::kLayerReady:
      if (!r.U32(m.layer) || !r.U32(m.first_block) || !r.U32(m.num_blocks)) {
        return InvalidArgument("layer ready: truncated");
      }
      if (m.num_blocks == 0 || m.num_blocks > kMaxTransferBlocks) {
        return InvalidArgument("layer ready: block count " + std::to_string(m.num_blocks) +
                               " outside [1, " + std::to_string(kMaxTransferBlocks) + "]");
      }
      break;
    case MsgTag::kPinned: {
      uint32_t tok = 0;
      if (!r.U32(m.num_prompt_tokens) || !r.U64(m.prompt_hash) || !r.U32(tok) ||
          !r.F32(m.logprob) || !r.U64(m.kv_digest) || !r.U64(m.first_token_binding)) {
        return InvalidArgument("pinned: truncated header");
      }
      if (tok > 0x7fffffffu) return InvalidArgument("pinned: negative token id");
      m.token_id = static_cast<int32_t>(tok);
      KVP_RETURN_IF_ERROR(ReadTopLogprobs(r, "pinned", false, m.top_logprobs));
      if (!r.U32(m.first_block)) return InvalidArgument("pinned: truncated header");
      KVP_RETURN_IF_ERROR(ReadBlockPart(r, payload, "pinned", m));
      break;
    }
    case MsgTag::kTransferFailed:
      if (!r.U8(m.code)) return InvalidArgument("transfer failed: truncated");
      r.Bytes(r.left(), m.message);
      break;
    default:
      break;
  }
  if (r.left() != 0) return InvalidArgument("message: trailing bytes");
  return m;
}

}  // namespace kvpush::connector
