// TransferCore with long prompts (docs/pd_protocol.md §3, *Block lists*): PUSH_TARGET and PINNED
// lists longer than one notification go in parts, and are put back together before use. The
// boundaries are those of the old single-frame limit (899, 900, 901 blocks) and a 128k-token
// prompt; lists are contiguous (a fresh pool) or scattered (every block a run of its own).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>

#include "connector/peer_auth.h"
#include "connector/transfer_core.h"
#include "core_fakes.h"

namespace kvpush::connector::test {
namespace {

using Mode = pd::KvTransferParams::Mode;
using std::chrono::milliseconds;

constexpr int32_t kPool = 1 << 16;  // blocks: ids need 3-byte varints when scattered

class LongPromptTest : public CoreTest {
 protected:
  LongPromptTest() {
    layout_.num_blocks = kPool;
    arena_.assign(layout_.total_bytes(), std::byte{0});
    for (size_t i = 0; i < arena_.size(); i += 61) arena_[i] = static_cast<std::byte>(i >> 3);
    for (const char* p : {kP, kD, kD2}) peers_.peers[p] = PeerView{kPool};
    Rebuild();
  }
  /// `n` block ids: consecutive (from 1000 where the pool allows), or scattered (no two consecutive) over the pool.
  static std::vector<BlockId> Blocks(int32_t n, bool scattered) {
    std::vector<BlockId> b(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      b[static_cast<size_t>(i)] = scattered ? 20000 + ((i * 37) % n) * 2 : std::min(1000, kPool - n) + i;
    }
    return b;
  }
  /// The messages sent with `tag`, each checked to fit a sealed notification frame, and their
  /// lists concatenated in part order.
  std::vector<PdMessage> Parts(MsgTag tag, std::vector<int32_t>* joined) const {
    std::vector<PdMessage> parts;
    for (const Action& a : rec_.Sent(tag)) {
      auto bytes = EncodeMessage(a.msg);
      EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
      if (bytes.ok()) {
        EXPECT_LE(bytes->size() + PeerAuth::kTrailerBytes, 4096u);
      }
      EXPECT_EQ(a.msg.part_offset, joined->size());
      joined->insert(joined->end(), a.msg.block_ids.begin(), a.msg.block_ids.end());
      parts.push_back(a.msg);
    }
    return parts;
  }
  /// The remote chunk indices a WRITE (or READ) of every layer, K and V, of `blocks` names.
  std::vector<uint32_t> Chunks(const std::vector<int32_t>& blocks) const {
    std::vector<uint32_t> out;
    for (int32_t layer = 0; layer < layout_.num_layers; ++layer) {
      for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
        for (int32_t b : blocks) out.push_back(TransferCore::EntryIndex(kPool, layer, kind, b));
      }
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  static std::vector<uint32_t> Sorted(std::vector<uint32_t> v) {
    std::sort(v.begin(), v.end());
    return v;
  }
};

TEST_F(LongPromptTest, PushTargetsInPartsAtTheOldLimitAndAt128kTokens) {
  struct Case {
    int32_t blocks;
    bool scattered;
    size_t parts;
  };
  // Scattered ids of a 2^16-block pool take 4 bytes each: 767 per 3,072-byte part.
  const Case cases[] = {{899, false, 1},  {900, false, 1},  {901, false, 1}, {899, true, 2},
                        {900, true, 2},   {901, true, 2},   {8192, false, 1}, {8192, true, 11},
                        {kPool, false, 1}};
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.blocks) + (c.scattered ? " scattered" : " contiguous"));
    const std::string t = Tid(++n);
    const int32_t tokens = c.blocks * layout_.block_size;
    // D announces its blocks.
    Rebuild();
    rec_.Clear();
    const std::vector<BlockId> dst = Blocks(c.blocks, c.scattered);
    StartConsumer(n, t, Mode::kPush, 0, tokens, tokens, dst);
    std::vector<int32_t> joined;
    std::vector<PdMessage> parts = Parts(MsgTag::kPushTarget, &joined);
    ASSERT_EQ(parts.size(), c.parts);
    EXPECT_EQ(joined, dst);
    for (const PdMessage& m : parts) EXPECT_EQ(m.num_blocks, static_cast<uint32_t>(c.blocks));
    EXPECT_EQ(core_->stats().push_targets_sent, 1);
    // P gets the parts last first: what they cover is no prefix of the list (the first block
    // has no target yet), so nothing is written before the first part arrived.
    Rebuild();
    rec_.Clear();
    std::vector<BlockId> src(static_cast<size_t>(c.blocks));
    std::iota(src.begin(), src.end(), 0);
    StartProducer(n, t, Mode::kPush, tokens, src);
    for (size_t i = parts.size(); i-- > 1;) Deliver(kD, parts[i]);
    FinishProducer(n, true, src);
    EXPECT_EQ(rec_.Count(Action::kPost), 0u);
    EXPECT_EQ(core_->num_pending_targets(), 0u);  // attached to the prefill as they came
    Deliver(kD, parts[0]);
    // One WRITE of every chunk into exactly D's blocks, whose notification is KV_READY.
    auto posts = rec_.Of(Action::kPost);
    ASSERT_EQ(posts.size(), 1u);
    EXPECT_EQ(posts[0].msg.tag, MsgTag::kKvReady);
    EXPECT_EQ(Sorted(posts[0].order.remote_indices), Chunks(dst));
    EXPECT_EQ(core_->stats().push_targets_received, 1);
    EXPECT_EQ(core_->stats().bad_messages, 0);
    EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 0u);
  }
}

TEST_F(LongPromptTest, MalformedTargetPartsAreRefusedAndNothingIsWritten) {
  const int32_t blocks = 2000;
  const int32_t tokens = blocks * layout_.block_size;
  StartConsumer(1, Tid(1), Mode::kPush, 0, tokens, tokens, Blocks(blocks, true));
  std::vector<int32_t> joined;
  const std::vector<PdMessage> parts = Parts(MsgTag::kPushTarget, &joined);
  ASSERT_EQ(parts.size(), 3u);
  std::vector<BlockId> src(static_cast<size_t>(blocks));
  std::iota(src.begin(), src.end(), 0);

  struct Case {
    const char* name;
    const char* why;  // in the TRANSFER_FAILED text
    std::function<void()> deliver;
    bool first_part_written = false;  // the genuine first part stays attached and is written
  };
  const Case cases[] = {
      {"a part twice", "overlaps",
       [&] {
         Deliver(kD, parts[0]);
         Deliver(kD, parts[0]);
       }},
      {"parts of two prompts", "disagree",
       [&] {
         Deliver(kD, parts[0]);
         PdMessage other = parts[1];
         other.prompt_hash ^= 1;
         Deliver(kD, other);
       }},
      {"a part from another decode instance", "came from",
       [&] {
         Deliver(kD, parts[0]);
         Deliver(kD2, parts[1]);
       },
       true},
      {"a target longer than any prompt here", "longer than",
       [&] {
         PdMessage huge = parts[0];
         huge.num_blocks = kPool + 1;
         Deliver(kD, huge);
       }},
      {"a decode block named in two parts", "twice",
       [&] {
         PdMessage dup = parts[2];
         dup.block_ids[0] = parts[0].block_ids[0];
         Deliver(kD, parts[0]);
         Deliver(kD, parts[1]);
         Deliver(kD, dup);
       }},
  };
  int n = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Rebuild();
    rec_.Clear();
    // Every part names transfer Tid(1); a fresh core sees it anew.
    StartProducer(++n, Tid(1), Mode::kPush, tokens, src);
    c.deliver();
    FinishProducer(n, true, src);
    if (c.first_part_written) {
      // Only into the blocks of the genuine first part, without KV_READY (the rest is missing).
      auto posts = rec_.Of(Action::kPost);
      ASSERT_EQ(posts.size(), 1u);
      EXPECT_EQ(posts[0].peer, kD);
      EXPECT_TRUE(posts[0].order.notification.empty());
      EXPECT_EQ(Sorted(posts[0].order.remote_indices), Chunks(parts[0].block_ids));
    } else {
      EXPECT_EQ(rec_.Count(Action::kPost), 0u);  // nothing written anywhere
    }
    auto failed = rec_.Sent(MsgTag::kTransferFailed);
    ASSERT_GE(failed.size(), 1u);
    EXPECT_NE(failed[0].msg.message.find(c.why), std::string::npos) << failed[0].msg.message;
  }
  // A part from another instance does not spoil the genuine target: its other parts complete it.
  Rebuild();
  rec_.Clear();
  StartProducer(1, Tid(1), Mode::kPush, tokens, src);
  Deliver(kD, parts[0]);
  Deliver(kD2, parts[1]);
  Deliver(kD, parts[1]);
  Deliver(kD, parts[2]);
  FinishProducer(1, true, src);
  ASSERT_EQ(rec_.Count(Action::kPost), 1u);
  EXPECT_EQ(rec_.Of(Action::kPost)[0].peer, kD);
}

TEST_F(LongPromptTest, MissingTargetPartsExpireWithTheLease) {
  const int32_t blocks = 2000;
  const int32_t tokens = blocks * layout_.block_size;
  StartConsumer(1, Tid(1), Mode::kPush, 0, tokens, tokens, Blocks(blocks, true));
  std::vector<int32_t> joined;
  const std::vector<PdMessage> parts = Parts(MsgTag::kPushTarget, &joined);
  Rebuild();
  rec_.Clear();
  Deliver(kD, parts[0]);
  Deliver(kD, parts[2]);
  EXPECT_EQ(core_->num_pending_targets(), 1u);
  EXPECT_TRUE(core_->wants_layer_events());
  Advance(milliseconds(1001));
  EXPECT_EQ(core_->num_pending_targets(), 0u);
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].peer, kD);
  EXPECT_NE(failed[0].msg.message.find("last parts"), std::string::npos);
  EXPECT_TRUE(core_->IsTombstoned(Tid(1)));
}

TEST_F(LongPromptTest, PinnedInPartsIsReadWhole) {
  for (int32_t blocks : {899, 900, 901, 8192}) {
    SCOPED_TRACE(blocks);
    const std::string t = Tid(blocks);
    const int32_t tokens = blocks * layout_.block_size;
    // P pins a scattered lease.
    Rebuild();
    rec_.Clear();
    const std::vector<BlockId> src = Blocks(blocks, true);
    StartProducer(1, t, Mode::kPull, tokens, src);
    FinishProducer(1, true, src);
    Deliver(kD, Pin(t, 0, static_cast<uint32_t>(blocks)));
    std::vector<int32_t> joined;
    std::vector<PdMessage> parts = Parts(MsgTag::kPinned, &joined);
    EXPECT_EQ(parts.size(), static_cast<size_t>((blocks + 766) / 767));
    EXPECT_EQ(joined, src);
    // D gets them out of order and reads every block in one READ.
    Rebuild();
    rec_.Clear();
    std::vector<BlockId> dst(static_cast<size_t>(blocks));
    std::iota(dst.begin(), dst.end(), 0);
    StartConsumer(1, t, Mode::kPull, 0, tokens, tokens, dst);
    std::rotate(parts.begin(), parts.begin() + 1, parts.end());
    for (size_t i = 0; i + 1 < parts.size(); ++i) Deliver(kP, parts[i]);
    EXPECT_EQ(rec_.Count(Action::kPost), 0u);
    Deliver(kP, parts.back());
    auto posts = rec_.Of(Action::kPost);
    ASSERT_EQ(posts.size(), 1u);
    EXPECT_EQ(posts[0].order.op, xfer::Op::kRead);
    EXPECT_EQ(Sorted(posts[0].order.remote_indices), Chunks(src));
    EXPECT_EQ(core_->consumer_state(t), ConsumerState::kReading);
  }
}

TEST_F(LongPromptTest, PinnedPartsThatDisagreeFailTheLoad) {
  const int32_t blocks = 2000;
  const int32_t tokens = blocks * layout_.block_size;
  const std::vector<BlockId> src = Blocks(blocks, true);
  StartProducer(1, Tid(1), Mode::kPull, tokens, src);
  FinishProducer(1, true, src);
  Deliver(kD, Pin(Tid(1), 0, static_cast<uint32_t>(blocks)));
  std::vector<int32_t> joined;
  const std::vector<PdMessage> parts = Parts(MsgTag::kPinned, &joined);
  ASSERT_EQ(parts.size(), 3u);
  for (int what = 0; what < 3; ++what) {
    SCOPED_TRACE(what);
    Rebuild();
    rec_.Clear();
    std::vector<BlockId> dst(static_cast<size_t>(blocks));
    std::iota(dst.begin(), dst.end(), 0);
    StartConsumer(1, Tid(1), Mode::kPull, 0, tokens, tokens, dst);
    PdMessage bad = parts[1];
    if (what == 0) bad.kv_digest ^= 1;                          // another lease's digest
    if (what == 1) bad = parts[0];                              // a part twice
    if (what == 2) bad.block_ids[0] = parts[0].block_ids[0];    // a P block named twice
    Deliver(kP, parts[0]);
    Deliver(kP, bad);
    if (what == 2) Deliver(kP, parts[2]);
    auto loads = Loads();
    ASSERT_EQ(loads.size(), 1u);
    EXPECT_EQ(loads[0].status.code(), StatusCode::kDataLoss) << loads[0].status.ToString();
    EXPECT_EQ(rec_.Count(Action::kPost), 0u);
    EXPECT_EQ(core_->stats().bad_messages, 1);
  }
}

}  // namespace
}  // namespace kvpush::connector::test
