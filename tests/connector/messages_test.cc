// docs/pd_protocol.md §3: the P <-> D notification messages (EncodeMessage / DecodeMessage).
#include "connector/messages.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "pd/ids.h"

namespace kvpush::connector {
namespace {

const std::string kTid = "0123456789abcdef0123456789abcdef";

std::vector<uint8_t> Enc(const PdMessage& m) {
  auto r = EncodeMessage(m);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r.value() : std::vector<uint8_t>{};
}

Result<PdMessage> Dec(const std::vector<uint8_t>& b) {
  return DecodeMessage(std::span<const uint8_t>(b.data(), b.size()));
}

PdMessage PushTarget() {
  PdMessage m;
  m.tag = MsgTag::kPushTarget;
  m.transfer_id = kTid;
  m.num_prompt_tokens = 37;
  m.prompt_hash = 0x0123456789abcdefull;
  m.first_block = 2;
  m.num_blocks = 5;
  m.block_ids = {3, 4, 5, 0x7fffffff, 0};
  return m;
}

PdMessage KvReady() {
  PdMessage m;
  m.tag = MsgTag::kKvReady;
  m.transfer_id = kTid;
  m.token_id = 42;
  m.logprob = -0.125f;
  m.kv_digest = 0x0123456789abcdefull;
  m.first_token_binding = 0x0badc0ffee0ddf00ull;
  m.top_logprobs = {{42, -0.125f}, {7, -2.5f}, {0x7fffffff, -30.0f}};
  return m;
}

void PutU32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// A PUSH_TARGET built by hand from the table in §3: header, then the part's `count` ids as
// runs (start, length), each varint a single byte unless given as raw bytes in `tail`.
std::vector<uint8_t> RawPushTarget(uint32_t count, const std::vector<std::pair<uint8_t, uint8_t>>& runs,
                                   uint32_t num_blocks = 0, uint32_t part_offset = 0,
                                   const std::vector<uint8_t>& tail = {}) {
  std::vector<uint8_t> b{1};
  b.insert(b.end(), kTid.begin(), kTid.end());
  PutU32(b, 10);                               // num_prompt_tokens
  for (int i = 0; i < 8; ++i) b.push_back(0);  // prompt_hash
  PutU32(b, 0);                                // first_block
  PutU32(b, num_blocks == 0 ? count : num_blocks);
  PutU32(b, part_offset);
  PutU32(b, count);
  PutU32(b, static_cast<uint32_t>(runs.size() + (tail.empty() ? 0 : 1)));
  for (auto [start, len] : runs) {
    b.push_back(start);
    b.push_back(len);
  }
  b.insert(b.end(), tail.begin(), tail.end());
  return b;
}

TEST(Messages, PushTargetRoundTripAndWireLayout) {
  const PdMessage m = PushTarget();
  const auto b = Enc(m);
  // tag + id + u32 + u64 + first u32 + num_blocks u32 + part_offset u32 + count u32 + runs:
  // nruns u32, (3, 3) (0x7fffffff, 1) (0, 1) as varints 1+1, 5+1, 1+1.
  ASSERT_EQ(b.size(), 1u + 32 + 4 + 8 + 4 + 4 + 4 + 4 + 4 + 2 + 6 + 2);
  EXPECT_EQ(b[0], 1);
  EXPECT_EQ(std::string(b.begin() + 1, b.begin() + 33), kTid);
  EXPECT_EQ(b[33], 37);  // num_prompt_tokens little-endian
  EXPECT_EQ(b[34], 0);
  EXPECT_EQ(b[37], 0xef);  // prompt_hash low byte first
  EXPECT_EQ(b[44], 0x01);
  EXPECT_EQ(b[49], 5);  // num_blocks
  EXPECT_EQ(b[57], 5);  // ids in this part
  EXPECT_EQ(b[61], 3);  // runs
  EXPECT_EQ(b[65], 3);  // first run: start 3, length 3
  EXPECT_EQ(b[66], 3);
  auto d = Dec(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->tag, MsgTag::kPushTarget);
  EXPECT_EQ(d->transfer_id, kTid);
  EXPECT_EQ(d->num_prompt_tokens, 37u);
  EXPECT_EQ(d->prompt_hash, 0x0123456789abcdefull);
  EXPECT_EQ(d->first_block, 2u);
  EXPECT_EQ(d->num_blocks, 5u);
  EXPECT_EQ(d->part_offset, 0u);
  EXPECT_EQ(d->block_ids, m.block_ids);
}

TEST(Messages, PushTargetPartsAndLimits) {
  PdMessage m = PushTarget();
  m.block_ids.clear();  // a part names at least one block
  EXPECT_FALSE(EncodeMessage(m).ok());
  // A part of a longer list: [3, 8) of 8.
  m = PushTarget();
  m.num_blocks = 8;
  m.part_offset = 3;
  auto d = Dec(Enc(m));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->num_blocks, 8u);
  EXPECT_EQ(d->part_offset, 3u);
  EXPECT_EQ(d->block_ids, m.block_ids);
  m.part_offset = 4;  // [4, 9) of 8: beyond the list
  EXPECT_FALSE(EncodeMessage(m).ok());
  // The whole 128k-token target of a fresh pool (8,192 contiguous blocks) is one small frame.
  m = PushTarget();
  m.num_blocks = 8192;
  m.block_ids.resize(8192);
  for (int32_t i = 0; i < 8192; ++i) m.block_ids[static_cast<size_t>(i)] = 100 + i;
  auto b = Enc(m);
  EXPECT_EQ(b.size(), 1u + 32 + 4 + 8 + 4 + 4 + 4 + 4 + 4 + 1 + 2);
  d = Dec(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->block_ids, m.block_ids);
  // The largest list and part the limits allow encode; one more block does not.
  m.num_blocks = kMaxTransferBlocks;
  m.block_ids.resize(kMaxPartBlocks);
  for (uint32_t i = 0; i < kMaxPartBlocks; ++i) m.block_ids[i] = static_cast<int32_t>(i);
  m.part_offset = kMaxTransferBlocks - kMaxPartBlocks;
  ASSERT_TRUE(Dec(Enc(m)).ok());
  m.num_blocks = kMaxTransferBlocks + 1;
  m.part_offset = 0;
  EXPECT_FALSE(EncodeMessage(m).ok());
  m.num_blocks = kMaxTransferBlocks;
  m.block_ids.push_back(static_cast<int32_t>(kMaxPartBlocks));
  EXPECT_FALSE(EncodeMessage(m).ok());
  // A block named twice in one part cannot be encoded.
  m = PushTarget();
  m.block_ids = {3, 4, 3, 9, 1};
  auto r = EncodeMessage(m);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("twice"), std::string::npos) << r.status().message();
}

TEST(Messages, KvReadyRoundTrip) {
  const PdMessage m = KvReady();
  const auto b = Enc(m);
  // tag + id + digest u64 + binding u64 + token u32 + logprob f32 + count u32 + 3 x (u32, f32)
  ASSERT_EQ(b.size(), 1u + 32 + 8 + 8 + 4 + 4 + 4 + 3 * 8);
  EXPECT_EQ(b[0], 2);
  auto d = Dec(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->tag, MsgTag::kKvReady);
  EXPECT_EQ(d->transfer_id, kTid);
  EXPECT_EQ(d->token_id, 42);
  EXPECT_EQ(d->logprob, -0.125f);
  EXPECT_EQ(d->kv_digest, 0x0123456789abcdefull);
  EXPECT_EQ(d->first_token_binding, 0x0badc0ffee0ddf00ull);
  EXPECT_EQ(d->top_logprobs, m.top_logprobs);

  PdMessage none = KvReady();
  none.top_logprobs.clear();
  none.token_id = 0;
  d = Dec(Enc(none));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->token_id, 0);
  EXPECT_TRUE(d->top_logprobs.empty());

  PdMessage max = KvReady();
  max.top_logprobs.assign(kMaxTopLogprobs, {1, -1.0f});
  d = Dec(Enc(max));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->top_logprobs.size(), kMaxTopLogprobs);
}

TEST(Messages, TransferFailedRoundTrip) {
  PdMessage m;
  m.tag = MsgTag::kTransferFailed;
  m.transfer_id = kTid;
  m.code = 14;
  m.message = "write failed: peer gone";
  const auto b = Enc(m);
  ASSERT_EQ(b.size(), 1u + 32 + 1 + m.message.size());
  EXPECT_EQ(b[0], 3);
  auto d = Dec(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->tag, MsgTag::kTransferFailed);
  EXPECT_EQ(d->transfer_id, kTid);
  EXPECT_EQ(d->code, 14);
  EXPECT_EQ(d->message, m.message);

  m.message.clear();  // an empty message is allowed
  d = Dec(Enc(m));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->message, "");
  EXPECT_EQ(d->code, 14);
}

TEST(Messages, TransferFailedMessageIsCappedAt1024Bytes) {
  PdMessage m;
  m.tag = MsgTag::kTransferFailed;
  m.transfer_id = kTid;
  m.code = 1;
  m.message = std::string(5000, 'x');
  auto d = Dec(Enc(m));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->message, std::string(1024, 'x'));
}

TEST(Messages, IdOnlyTagsRoundTrip) {
  for (MsgTag tag : {MsgTag::kNotNeeded, MsgTag::kCancel, MsgTag::kCancelAck, MsgTag::kRelease}) {
    PdMessage m;
    m.tag = tag;
    m.transfer_id = kTid;
    const auto b = Enc(m);
    ASSERT_EQ(b.size(), 33u);
    EXPECT_EQ(b[0], static_cast<uint8_t>(tag));
    auto d = Dec(b);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_EQ(d->tag, tag);
    EXPECT_EQ(d->transfer_id, kTid);
    EXPECT_TRUE(d->block_ids.empty());
    EXPECT_TRUE(d->message.empty());
  }
  EXPECT_EQ(static_cast<int>(MsgTag::kPushTarget), 1);
  EXPECT_EQ(static_cast<int>(MsgTag::kKvReady), 2);
  EXPECT_EQ(static_cast<int>(MsgTag::kTransferFailed), 3);
  EXPECT_EQ(static_cast<int>(MsgTag::kNotNeeded), 4);
  EXPECT_EQ(static_cast<int>(MsgTag::kCancel), 5);
  EXPECT_EQ(static_cast<int>(MsgTag::kCancelAck), 6);
  EXPECT_EQ(static_cast<int>(MsgTag::kRelease), 7);
}

TEST(Messages, DecodeRefusesEmptyAndUnknownTags) {
  auto d = DecodeMessage({});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  for (int tag : {0, 11, 12, 127, 255}) {
    std::vector<uint8_t> b{static_cast<uint8_t>(tag)};
    b.insert(b.end(), kTid.begin(), kTid.end());
    d = Dec(b);
    ASSERT_FALSE(d.ok()) << "tag " << tag;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("tag"), std::string::npos) << d.status().message();
  }
}

// Every strict prefix of `m`'s encoding is refused with kInvalidArgument.
static void ExpectEveryTruncationRefused(const PdMessage& m) {
  const auto full = Enc(m);
  ASSERT_TRUE(Dec(full).ok());
  for (size_t len = 0; len < full.size(); ++len) {
    std::vector<uint8_t> p(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
    auto d = Dec(p);
    EXPECT_FALSE(d.ok()) << "prefix of " << len << " bytes decoded";
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(Messages, DecodeRefusesEveryTruncationOfPushTarget) {
  ExpectEveryTruncationRefused(PushTarget());
}

TEST(Messages, DecodeRefusesEveryTruncationOfKvReady) {
  ExpectEveryTruncationRefused(KvReady());
}

TEST(Messages, DecodeRefusesTruncatedIdOnlyAndTransferFailed) {
  PdMessage m;
  m.tag = MsgTag::kCancel;
  m.transfer_id = kTid;
  const auto c = Enc(m);
  for (size_t len = 1; len < c.size(); ++len) {
    EXPECT_FALSE(
        Dec(std::vector<uint8_t>(c.begin(), c.begin() + static_cast<std::ptrdiff_t>(len))).ok())
        << len;
  }
  m.tag = MsgTag::kTransferFailed;
  m.code = 3;
  const auto f = Enc(m);
  ASSERT_EQ(f.size(), 34u);
  EXPECT_FALSE(Dec(std::vector<uint8_t>(f.begin(), f.begin() + 33)).ok());  // no code byte
}

TEST(Messages, DecodeRefusesTrailingBytes) {
  for (const PdMessage& base : {PushTarget(), KvReady()}) {
    auto b = Enc(base);
    b.push_back(0);
    EXPECT_FALSE(Dec(b).ok()) << static_cast<int>(base.tag);
  }
  for (MsgTag tag : {MsgTag::kNotNeeded, MsgTag::kCancel, MsgTag::kCancelAck, MsgTag::kRelease}) {
    PdMessage m;
    m.tag = tag;
    m.transfer_id = kTid;
    auto b = Enc(m);
    b.push_back('x');
    auto d = Dec(b);
    ASSERT_FALSE(d.ok()) << static_cast<int>(tag);
    EXPECT_NE(d.status().message().find("trailing"), std::string::npos) << d.status().message();
  }
  // KV_READY: 4 extra bytes (half a top-logprob pair) do not match ntop.
  auto b = Enc(KvReady());
  PutU32(b, 1);
  EXPECT_FALSE(Dec(b).ok());
}

TEST(Messages, DecodeRefusesBlockCountThatDisagreesWithPayload) {
  EXPECT_TRUE(Dec(RawPushTarget(2, {{1, 2}})).ok());
  EXPECT_TRUE(Dec(RawPushTarget(3, {{1, 2}, {7, 1}})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(3, {{1, 2}})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(1, {{1, 2}})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(0, {{1, 1}})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(0xffffffffu, {{1, 2}})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(2, {{1, 0}, {2, 2}})).ok());  // an empty run
  // The part must lie inside the list: [1, 3) of 2, [0xffffffff, +2) of 2.
  EXPECT_FALSE(Dec(RawPushTarget(2, {{1, 2}}, 2, 1)).ok());
  EXPECT_FALSE(Dec(RawPushTarget(2, {{1, 2}}, 2, 0xffffffffu)).ok());
  EXPECT_TRUE(Dec(RawPushTarget(2, {{1, 2}}, 3, 1)).ok());
}

TEST(Messages, DecodeRefusesMalformedRuns) {
  // Overlapping runs (block 2 named twice), in either order, and runs that continue each other
  // (not canonical: one run).
  EXPECT_FALSE(Dec(RawPushTarget(4, {{1, 2}, {2, 2}})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(4, {{2, 2}, {0, 3}})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(4, {{1, 2}, {3, 2}})).ok());
  EXPECT_TRUE(Dec(RawPushTarget(4, {{3, 2}, {1, 2}})).ok());  // adjacent, out of order: two runs
  // Varints: not shortest (0x81 0x00 is 1), longer than 5 bytes, above 2^32 - 1, a start whose
  // run passes 2^31 - 1.
  EXPECT_FALSE(Dec(RawPushTarget(1, {}, 0, 0, {0x81, 0x00, 0x01})).ok());
  EXPECT_TRUE(Dec(RawPushTarget(1, {}, 0, 0, {0x81, 0x01, 0x01})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(1, {}, 0, 0, {0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0x01})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(1, {}, 0, 0, {0xff, 0xff, 0xff, 0xff, 0x1f, 0x01})).ok());
  EXPECT_TRUE(Dec(RawPushTarget(1, {}, 0, 0, {0xff, 0xff, 0xff, 0xff, 0x07, 0x01})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(2, {}, 0, 0, {0xff, 0xff, 0xff, 0xff, 0x07, 0x02})).ok());
  EXPECT_FALSE(Dec(RawPushTarget(1, {}, 0, 0, {0x80, 0x80, 0x80, 0x80, 0x08, 0x01})).ok());
}

TEST(Messages, DecodeRefusesCountAboveLimit) {
  auto d = Dec(RawPushTarget(kMaxPartBlocks + 1, {{0, 1}}));
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Dec(RawPushTarget(1, {{0, 1}}, kMaxTransferBlocks + 1)).ok());
  EXPECT_TRUE(Dec(RawPushTarget(1, {{0, 1}}, kMaxTransferBlocks, kMaxTransferBlocks - 1)).ok());

  // KV_READY with more than kMaxTopLogprobs pairs, hand-built.
  std::vector<uint8_t> b{2};
  b.insert(b.end(), kTid.begin(), kTid.end());
  PutU32(b, 1);
  PutU32(b, 0);
  PutU32(b, kMaxTopLogprobs + 1);
  for (uint32_t i = 0; i < kMaxTopLogprobs + 1; ++i) {
    PutU32(b, i);
    PutU32(b, 0);
  }
  EXPECT_FALSE(Dec(b).ok());
}

TEST(Messages, PinAndPinnedRoundTrip) {
  PdMessage pin;
  pin.tag = MsgTag::kPin;
  pin.transfer_id = kTid;
  pin.first_block = 3;
  pin.num_blocks = 5;
  auto b = Enc(pin);
  ASSERT_EQ(b.size(), 1u + 32 + 4 + 4);
  EXPECT_EQ(b[0], 8);
  auto d = Dec(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->tag, MsgTag::kPin);
  EXPECT_EQ(d->first_block, 3u);
  EXPECT_EQ(d->num_blocks, 5u);
  // Nothing to pin, or more than a PINNED answer can carry: refused both ways.
  for (uint32_t bad : {0u, kMaxTransferBlocks + 1}) {
    pin.num_blocks = bad;
    EXPECT_FALSE(EncodeMessage(pin).ok()) << bad;
  }
  std::vector<uint8_t> raw(b.begin(), b.begin() + 37);  // tag, id, first_block
  for (uint32_t bad : {0u, kMaxTransferBlocks + 1}) {
    std::vector<uint8_t> x = raw;
    for (int i = 0; i < 4; ++i) x.push_back(static_cast<uint8_t>(bad >> (8 * i)));
    EXPECT_FALSE(Dec(x).ok()) << bad;
  }

  PdMessage a;
  a.tag = MsgTag::kPinned;
  a.transfer_id = kTid;
  a.num_prompt_tokens = 37;
  a.prompt_hash = 0xfeedfacecafebeefull;
  a.token_id = 99;
  a.logprob = -1.5f;
  a.kv_digest = 0x1122334455667788ull;
  a.first_token_binding = 0x99aabbccddeeff00ull;
  a.top_logprobs = {{99, -1.5f}, {5, -2.25f}};
  a.first_block = 1;
  a.num_blocks = 3;
  a.block_ids = {9, 4, 7};
  b = Enc(a);
  // tag + id + tokens u32 + hash u64 + token u32 + logprob f32 + digest u64 + binding u64 +
  // ntop u32 + 2 x (u32, f32) + first u32 + num_blocks u32 + part_offset u32 + count u32 +
  // nruns u32 + 3 runs of 2 one-byte varints
  ASSERT_EQ(b.size(),
            1u + 32 + 4 + 8 + 4 + 4 + 8 + 8 + 4 + 2 * 8 + 4 + 4 + 4 + 4 + 4 + 3 * 2);
  EXPECT_EQ(b[0], 9);
  d = Dec(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->tag, MsgTag::kPinned);
  EXPECT_EQ(d->num_prompt_tokens, 37u);
  EXPECT_EQ(d->prompt_hash, 0xfeedfacecafebeefull);
  EXPECT_EQ(d->token_id, 99);
  EXPECT_EQ(d->logprob, -1.5f);
  EXPECT_EQ(d->kv_digest, 0x1122334455667788ull);
  EXPECT_EQ(d->first_token_binding, 0x99aabbccddeeff00ull);
  EXPECT_EQ(d->top_logprobs, a.top_logprobs);
  EXPECT_EQ(d->first_block, 1u);
  EXPECT_EQ(d->block_ids, a.block_ids);
  // Every truncation is refused, and so is a trailing byte.
  for (size_t len = 1; len < b.size(); ++len) {
    EXPECT_FALSE(Dec(std::vector<uint8_t>(b.begin(), b.begin() + static_cast<ptrdiff_t>(len))).ok())
        << len;
  }
  b.push_back(0);
  EXPECT_FALSE(Dec(b).ok());
  a.block_ids.clear();  // a pinned answer names at least one block
  EXPECT_FALSE(EncodeMessage(a).ok());
  a.block_ids = {9, 4, 7, 8};  // more ids than the list has
  EXPECT_FALSE(EncodeMessage(a).ok());
}

TEST(Messages, LayerReadyRoundTrip) {
  PdMessage m;
  m.tag = MsgTag::kLayerReady;
  m.transfer_id = kTid;
  m.layer = 63;
  m.first_block = 2;
  m.num_blocks = 7;
  auto b = Enc(m);
  ASSERT_EQ(b.size(), 1u + 32 + 4 + 4 + 4);
  EXPECT_EQ(b[0], 10);
  auto d = Dec(b);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->tag, MsgTag::kLayerReady);
  EXPECT_EQ(d->layer, 63u);
  EXPECT_EQ(d->first_block, 2u);
  EXPECT_EQ(d->num_blocks, 7u);
  for (size_t len = 1; len < b.size(); ++len) {
    EXPECT_FALSE(Dec(std::vector<uint8_t>(b.begin(), b.begin() + static_cast<ptrdiff_t>(len))).ok());
  }
  std::vector<uint8_t> raw(b.begin(), b.begin() + 41);
  for (uint32_t bad : {0u, kMaxTransferBlocks + 1}) {
    m.num_blocks = bad;
    EXPECT_FALSE(EncodeMessage(m).ok()) << bad;
    std::vector<uint8_t> x = raw;
    for (int i = 0; i < 4; ++i) x.push_back(static_cast<uint8_t>(bad >> (8 * i)));
    EXPECT_FALSE(Dec(x).ok()) << bad;
  }
}

TEST(Messages, DecodeRefusesNegativeIds) {
  // A run starting at 2^31 (varint 80 80 80 80 08).
  auto d = Dec(RawPushTarget(2, {{5, 1}}, 0, 0, {0x80, 0x80, 0x80, 0x80, 0x08, 0x01}));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("negative"), std::string::npos) << d.status().message();
  PdMessage neg = PushTarget();
  neg.block_ids[1] = -1;
  EXPECT_FALSE(EncodeMessage(neg).ok());

  // KV_READY token id and top token id.
  std::vector<uint8_t> b{2};
  b.insert(b.end(), kTid.begin(), kTid.end());
  PutU32(b, 0);  // digest (u64)
  PutU32(b, 0);
  PutU32(b, 0);  // first token binding (u64)
  PutU32(b, 0);
  PutU32(b, 0x80000000u);
  PutU32(b, 0);
  PutU32(b, 0);
  EXPECT_FALSE(Dec(b).ok());
  b.resize(49);
  PutU32(b, 1);
  PutU32(b, 0);
  PutU32(b, 1);
  PutU32(b, 0xffffffffu);
  PutU32(b, 0);
  EXPECT_FALSE(Dec(b).ok());
}

TEST(Messages, DecodeRefusesMalformedTransferIds) {
  for (const std::string& bad : std::vector<std::string>{
           "0123456789ABCDEF0123456789abcdef", "0123456789abcdeg0123456789abcdef",
           "0123456789abcdef0123456789abcde ", std::string(32, '\0'),
           "0123456789abcdef0123456789abcde-"}) {
    ASSERT_EQ(bad.size(), 32u);
    std::vector<uint8_t> b{static_cast<uint8_t>(MsgTag::kCancel)};
    b.insert(b.end(), bad.begin(), bad.end());
    auto d = Dec(b);
    ASSERT_FALSE(d.ok()) << bad;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(d.status().message().find("transfer id"), std::string::npos);
  }
}

TEST(Messages, EncodeRefusesBadTransferIdAndTooManyBlocks) {
  for (std::string bad : {std::string(), std::string("abc"), std::string(31, 'a'),
                          std::string(33, 'a'), std::string("0123456789ABCDEF0123456789abcdef"),
                          std::string("0123456789abcdef0123456789abcdez")}) {
    for (MsgTag tag : {MsgTag::kPushTarget, MsgTag::kKvReady, MsgTag::kTransferFailed,
                       MsgTag::kNotNeeded, MsgTag::kCancel, MsgTag::kCancelAck, MsgTag::kRelease,
                       MsgTag::kPin, MsgTag::kPinned, MsgTag::kLayerReady}) {
      PdMessage m;
      m.tag = tag;
      m.transfer_id = bad;
      auto r = EncodeMessage(m);
      ASSERT_FALSE(r.ok()) << "'" << bad << "' tag " << static_cast<int>(tag);
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
  PdMessage m = PushTarget();
  m.num_blocks = kMaxTransferBlocks + 1;
  auto r = EncodeMessage(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(std::to_string(kMaxTransferBlocks)), std::string::npos);

  PdMessage k = KvReady();
  k.top_logprobs.assign(kMaxTopLogprobs + 1, {1, -1.0f});
  EXPECT_FALSE(EncodeMessage(k).ok());

  PdMessage u;
  u.transfer_id = kTid;
  u.tag = static_cast<MsgTag>(0);
  EXPECT_FALSE(EncodeMessage(u).ok());
  u.tag = static_cast<MsgTag>(11);
  EXPECT_FALSE(EncodeMessage(u).ok());
}

// Random payloads: DecodeMessage returns an error or a valid message and never crashes; every
// message it accepts re-encodes to the same bytes.
TEST(Messages, RandomPayloadsNeverCrash) {
  std::mt19937_64 rng(20261129);
  const std::vector<std::vector<uint8_t>> seeds = {Enc(PushTarget()), Enc(KvReady())};
  int accepted = 0;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> p;
    if (i % 2 == 0) {
      // Pure random bytes, random length 0..200, tag biased into 0..9.
      p.resize(rng() % 201);
      for (auto& x : p) x = static_cast<uint8_t>(rng());
      if (!p.empty()) p[0] = static_cast<uint8_t>(rng() % 10);
    } else {
      // A valid message with a few random byte flips and a random cut / extension.
      p = seeds[rng() % seeds.size()];
      const int flips = static_cast<int>(rng() % 4);
      for (int f = 0; f < flips; ++f) p[33 + rng() % (p.size() - 33)] = static_cast<uint8_t>(rng());
      if (rng() % 3 == 0) p.resize(rng() % (p.size() + 16));
    }
    auto d = DecodeMessage(p);
    if (!d.ok()) {
      EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument);
      continue;
    }
    ++accepted;
    EXPECT_TRUE(pd::IsValidTransferId(d->transfer_id));
    EXPECT_LE(d->block_ids.size(), kMaxPartBlocks);
    EXPECT_LE(d->top_logprobs.size(), kMaxTopLogprobs);
    for (int32_t id : d->block_ids) EXPECT_GE(id, 0);
    auto again = EncodeMessage(*d);
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again.value(), p) << "iteration " << i;
  }
  EXPECT_GT(accepted, 100);  // the mutated half must also exercise the success path
}

}  // namespace
}  // namespace kvpush::connector
