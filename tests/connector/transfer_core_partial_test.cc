// TransferCore with a push target announced in parts over time (docs/pd_protocol.md §3, *A
// target in parts*): D reserves what its pool holds now and announces the rest as blocks free;
// P writes each part's blocks as they are computed, and KV_READY only once it had every part.
// Layout of CoreTest: 2 layers, 4-token blocks; a 10-token prompt has 3 blocks.
#include <gtest/gtest.h>

#include <algorithm>

#include "connector/transfer_core.h"
#include "core_fakes.h"

namespace kvpush::connector::test {
namespace {

using Mode = pd::KvTransferParams::Mode;
using std::chrono::milliseconds;

class PartialTargetTest : public CoreTest {
 protected:
  /// Part [offset, offset + ids.size()) of the 3-block target of a 10-token prompt.
  static PdMessage Part(const std::string& tid, uint32_t offset, std::vector<int32_t> ids) {
    PdMessage m = Target(tid, 0, std::move(ids));
    m.num_blocks = 3;
    m.part_offset = offset;
    return m;
  }
  /// D's blocks named by a post's remote chunk list (every layer, K and V), sorted, unique.
  std::vector<int32_t> RemoteBlocks(const Action& post) const {
    std::vector<int32_t> out;
    for (uint32_t e : post.order.remote_indices) {
      out.push_back(static_cast<int32_t>(e % static_cast<uint32_t>(layout_.num_blocks)));
    }
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
};

TEST_F(PartialTargetTest, ProducerWritesEachPartAsItComesAndKvReadyAfterTheLast) {
  const std::string t = Tid(1);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Part(t, 0, {5}));
  EXPECT_EQ(core_->num_pending_targets(), 0u);
  Step(1, 10);
  Layer(0);
  Layer(1);
  // Each layer's WRITE covers only the first block: the only one D announced.
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 2u);
  for (const Action& a : posts) {
    EXPECT_EQ(RemoteBlocks(a), std::vector<int32_t>({5}));
    EXPECT_EQ(a.msg.tag, MsgTag::kLayerReady);
  }
  FinishProducer(1);
  EXPECT_EQ(rec_.Count(Action::kPost), 2u);  // nothing more is covered
  EXPECT_EQ(core_->producer_state(t), ProducerState::kHeld);
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  DrainPosts();
  // Past the first lease: the part renews it.
  Advance(milliseconds(900));
  rec_.Clear();
  Deliver(kD, Part(t, 1, {6, 7}));
  posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(RemoteBlocks(posts[0]), std::vector<int32_t>({6, 7}));
  ASSERT_EQ(posts[0].msg.tag, MsgTag::kKvReady);
  // The digest covers every block, the ones written with the first part too.
  EXPECT_EQ(posts[0].msg.kv_digest, KvBlocksDigest(layout_, arena_, std::vector<BlockId>{1, 2, 3}));
  Advance(milliseconds(900));
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 0u);
  DrainPosts();
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(core_->num_producers(), 0u);
  EXPECT_EQ(core_->stats().push_targets_received, 1);
  EXPECT_EQ(core_->stats().bad_messages, 0);
}

TEST_F(PartialTargetTest, PartsBeforeThePrefillRequestAreAttachedWithIt) {
  const std::string t = Tid(1);
  Deliver(kD, Part(t, 1, {6, 7}));  // not a prefix: nothing can be written from it alone
  EXPECT_EQ(core_->num_pending_targets(), 1u);
  StartProducer(1, t, Mode::kPush);
  EXPECT_EQ(core_->num_pending_targets(), 0u);
  FinishProducer(1);
  EXPECT_EQ(rec_.Count(Action::kPost), 0u);
  Deliver(kD, Part(t, 0, {5}));
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(RemoteBlocks(posts[0]), std::vector<int32_t>({5, 6, 7}));
  EXPECT_EQ(posts[0].msg.tag, MsgTag::kKvReady);
}

TEST_F(PartialTargetTest, ARestThatNeverComesEndsWithTheLease) {
  const std::string t = Tid(1);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Part(t, 0, {5}));
  FinishProducer(1);
  ASSERT_EQ(rec_.Count(Action::kPost), 1u);  // block 0, every layer, after the prefill
  Advance(milliseconds(1001));
  // Not while the WRITE is outstanding: D is told only once nothing of P can land.
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 0u);
  DrainPosts();
  Advance(milliseconds(20));
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].peer, kD);
  EXPECT_NE(failed[0].msg.message.find("lease"), std::string::npos) << failed[0].msg.message;
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  // The rest arriving now is refused: the transfer is over.
  rec_.Clear();
  Deliver(kD, Part(t, 1, {6, 7}));
  EXPECT_EQ(rec_.Count(Action::kPost), 0u);
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 1u);
}

TEST_F(PartialTargetTest, MalformedLaterPartsDropTheTransferOnceItsWritesEnded) {
  struct Case {
    const char* name;
    const char* why;
    PdMessage part;
    uint64_t connection = 7;
  };
  const std::string t = Tid(1);
  PdMessage other_prompt = Part(t, 1, {6, 7});
  other_prompt.prompt_hash ^= 1;
  const Case cases[] = {
      {"a block named twice", "twice", Part(t, 1, {6, 5})},
      {"overlapping parts", "overlaps", Part(t, 0, {6, 7})},
      {"a block outside the pool", "outside", Part(t, 1, {6, 99})},
      {"another prompt", "disagree", other_prompt},
      {"another connection", "another connection", Part(t, 1, {6, 7}), 8},
  };
  peers_.peers[kD].connection = 7;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Rebuild();
    rec_.Clear();
    StartProducer(1, t, Mode::kPush);
    DeliverOver(kD, Part(t, 0, {5}), 7);
    FinishProducer(1);
    ASSERT_EQ(rec_.Count(Action::kPost), 1u);
    DeliverOver(kD, c.part, c.connection);
    EXPECT_EQ(rec_.Count(Action::kPost), 1u);  // nothing written into the bad part's blocks
    EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 0u);  // the first WRITE may land
    EXPECT_EQ(core_->stats().bad_messages, 1);
    DrainPosts();
    auto failed = rec_.Sent(MsgTag::kTransferFailed);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_NE(failed[0].msg.message.find(c.why), std::string::npos) << failed[0].msg.message;
    EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  }
}

TEST_F(PartialTargetTest, APartFromAnotherInstanceOrAfterTheWholeTargetChangesNothing) {
  const std::string t = Tid(1);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Part(t, 0, {5}));
  Deliver(kD2, Part(t, 1, {6, 7}));  // refused to kD2 alone
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].peer, kD2);
  Deliver(kD, Part(t, 1, {6, 7}));
  Deliver(kD, Part(t, 1, {6, 7}));  // repeated after the whole: ignored, the WRITEs go on
  FinishProducer(1);
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(RemoteBlocks(posts[0]), std::vector<int32_t>({5, 6, 7}));
  EXPECT_EQ(posts[0].msg.tag, MsgTag::kKvReady);
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 1u);
  EXPECT_EQ(core_->stats().bad_messages, 2);
}

TEST_F(PartialTargetTest, ConsumerAnnouncesItsBlocksAsTheEngineReservesThem) {
  const std::string t = Tid(1);
  StartConsumer(1, t, Mode::kPush, 0, 10, 10, {8});  // 1 of the 3 blocks reserved
  auto sent = rec_.Sent(MsgTag::kPushTarget);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].msg.num_blocks, 3u);
  EXPECT_EQ(sent[0].msg.part_offset, 0u);
  EXPECT_EQ(sent[0].msg.block_ids, std::vector<int32_t>({8}));
  EXPECT_EQ(core_->stats().push_targets_partial, 1);
  // P cannot have written blocks it was not told: such a LAYER_READY is refused.
  PdMessage landed = Signal(MsgTag::kLayerReady, t);
  landed.first_block = 0;
  landed.num_blocks = 2;
  Deliver(kP, landed);
  EXPECT_EQ(core_->stats().bad_messages, 1);
  // The watchdog (500 ms) counts from the last announcement: the wait was D's own pool.
  Advance(milliseconds(400));
  ConsumerBlocksEvent more;
  more.seq_id = 1;
  more.transfer_id = t;
  more.blocks = {9, 10};
  core_->HandleEvent(more);
  sent = rec_.Sent(MsgTag::kPushTarget);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[1].msg.part_offset, 1u);
  EXPECT_EQ(sent[1].msg.num_blocks, 3u);
  EXPECT_EQ(sent[1].msg.block_ids, std::vector<int32_t>({9, 10}));
  Advance(milliseconds(400));
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kAwaitingKv);
  Deliver(kP, KvReady(t));
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_TRUE(loads[0].status.ok()) << loads[0].status.ToString();
  EXPECT_EQ(core_->stats().push_targets_sent, 1);
}

TEST_F(PartialTargetTest, ConsumerRefusesKvReadyBeforeItsWholeTargetWasAnnounced) {
  const std::string t = Tid(1);
  StartConsumer(1, t, Mode::kPush, 0, 10, 10, {8, 9});
  Deliver(kP, KvReady(t));
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].status.code(), StatusCode::kDataLoss);
  // Blocks reserved after the load ended are not announced.
  rec_.Clear();
  ConsumerBlocksEvent more;
  more.seq_id = 1;
  more.transfer_id = t;
  more.blocks = {10};
  core_->HandleEvent(more);
  EXPECT_EQ(rec_.Sent(MsgTag::kPushTarget).size(), 0u);
}

TEST_F(PartialTargetTest, AWatchdogThatFiresMidReservationCancelsAsAnyPushDoes) {
  const std::string t = Tid(1);
  StartConsumer(1, t, Mode::kPush, 0, 10, 10, {8});
  Advance(milliseconds(501));
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kCancelling);
  ASSERT_EQ(rec_.Sent(MsgTag::kCancel).size(), 1u);
  rec_.Clear();
  ConsumerBlocksEvent more;
  more.seq_id = 1;
  more.transfer_id = t;
  more.blocks = {9, 10};
  core_->HandleEvent(more);
  EXPECT_EQ(rec_.Sent(MsgTag::kPushTarget).size(), 0u);  // never announced after the cancel
  Deliver(kP, Signal(MsgTag::kCancelAck, t));
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].status.code(), StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace kvpush::connector::test
