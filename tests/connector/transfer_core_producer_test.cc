// TransferCore, prefill (P) side: every transition and failure path of the push producer (layer
// WRITEs, KV_READY, targets before requests, tombstones, NOT_NEEDED, CANCEL, failures, aborts)
// and of the pull lease (PIN, PINNED, RELEASE, expiry). No processes, threads or sleeps.
#include <gtest/gtest.h>

#include "connector/transfer_core.h"
#include "core_fakes.h"
#include "kv/block_checksum.h"

namespace kvpush::connector::test {
namespace {

using Mode = pd::KvTransferParams::Mode;
using std::chrono::milliseconds;

class ProducerTest : public CoreTest {
 protected:
  /// With layerwise_min_bytes = `threshold`, a pushed 10-token prompt (3 blocks, 2 layers: 12
  /// chunks) stays under it: nothing is written during its prefill, then one WRITE of every
  /// chunk with KV_READY as its notification.
  void ExpectOneWriteAfterThePrefill(uint64_t threshold, int64_t seq, const std::string& tid) {
    config_.layerwise_min_bytes = threshold;
    Rebuild();
    rec_.Clear();
    StartProducer(seq, tid, Mode::kPush);
    Deliver(kD, Target(tid));
    Step(seq, 10);
    Layer(0);
    Layer(1);
    EXPECT_EQ(rec_.Count(Action::kPost), 0u);
    FinishProducer(seq);
    auto posts = rec_.Of(Action::kPost);
    ASSERT_EQ(posts.size(), 1u);
    EXPECT_EQ(posts[0].order.local_indices.size(), 12u);
    EXPECT_EQ(posts[0].msg.tag, MsgTag::kKvReady);
  }
};

TEST_F(ProducerTest, TargetAfterPrefillGetsOneWriteOfEveryLayerWhoseNotificationIsKvReady) {
  const std::string t = Tid(1);
  StartProducer(1, t, Mode::kPush);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kPrefilling);
  FinishProducer(1);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kHeld);
  EXPECT_EQ(rec_.Count(Action::kPost), 0u);
  Deliver(kD, Target(t));
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);  // one WRITE: every layer, K and V, every block
  const auto& o = posts[0].order;
  EXPECT_EQ(o.op, xfer::Op::kWrite);
  EXPECT_EQ(o.peer, kD);
  ASSERT_EQ(o.local_indices.size(), 12u);  // 2 layers x K,V x 3 blocks
  ASSERT_EQ(o.remote_indices.size(), 12u);
  size_t k = 0;
  for (int layer = 0; layer < 2; ++layer) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      for (int i = 0; i < 3; ++i, ++k) {
        EXPECT_EQ(o.local_indices[k], TransferCore::EntryIndex(16, layer, kind, 1 + i));
        EXPECT_EQ(o.remote_indices[k], TransferCore::EntryIndex(16, layer, kind, 5 + i));
      }
    }
  }
  // Its notification is KV_READY (delivered only after the WRITE's data): no message of its own.
  EXPECT_TRUE(rec_.Sent(MsgTag::kKvReady).empty());
  auto ready = rec_.Delivered(MsgTag::kKvReady);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].token, posts[0].token);
  EXPECT_EQ(ready[0].msg.transfer_id, t);
  EXPECT_EQ(ready[0].msg.token_id, 42);
  EXPECT_EQ(ready[0].msg.first_token_binding, binding_);  // the request's, with its token
  EXPECT_EQ(ready[0].msg.top_logprobs.size(), 2u);
  const std::vector<BlockId> src = {1, 2, 3};
  EXPECT_EQ(ready[0].msg.kv_digest, KvBlocksDigest(layout_, arena_, src));
  EXPECT_EQ(core_->producer_state(t), ProducerState::kReadyPosted);
  // P's blocks are read by the WRITE until it ends.
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  Done(posts[0].token);
  ASSERT_EQ(rec_.Of(Action::kRelease).size(), 1u);
  EXPECT_FALSE(core_->producer_state(t).has_value());
  EXPECT_TRUE(core_->IsTombstoned(t));
  EXPECT_TRUE(rec_.Of(Action::kSend).empty());  // nothing but the one WRITE went to D
  auto s = core_->stats();
  EXPECT_EQ(s.writes_posted, 1);
  EXPECT_EQ(s.kv_ready_sent, 1);
  EXPECT_EQ(s.kv_ready_on_write, 1);
  EXPECT_EQ(s.bytes_written, static_cast<int64_t>(2 * 3 * 2 * layout_.chunk_bytes()));
  EXPECT_EQ(s.push_targets_received, 1);
  EXPECT_EQ(s.descriptors_posted, 12);
}

TEST_F(ProducerTest, FailureOfTheOneWriteTellsDecodeAndReleasesOnlyAfterItEnded) {
  const std::string t = Tid(40);
  StartProducer(1, t, Mode::kPush);
  FinishProducer(1);
  Deliver(kD, Target(t));
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  Done(posts[0].token, false);  // its KV_READY was not delivered (notification after data)
  EXPECT_FALSE(core_->producer_state(t).has_value());
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].peer, kD);
  EXPECT_EQ(failed[0].msg.code, static_cast<uint8_t>(StatusCode::kPeerGone));
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_TRUE(core_->IsTombstoned(t));
}

TEST_F(ProducerTest, AbortBetweenThePostOfTheOneWriteAndItsEndCancelsItAndWaits) {
  const std::string t = Tid(41);
  StartProducer(1, t, Mode::kPush);
  FinishProducer(1);
  Deliver(kD, Target(t));
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  AbortTransferEvent ev;
  ev.transfer_id = t;
  core_->HandleEvent(ev);
  ASSERT_EQ(rec_.Of(Action::kCancel).size(), 1u);  // its KV_READY is never sent if this wins
  EXPECT_EQ(rec_.Of(Action::kCancel)[0].token, posts[0].token);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kDropping);
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);  // its data may still land on D
  EXPECT_TRUE(rec_.Sent(MsgTag::kTransferFailed).empty());
  Done(posts[0].token, false);
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 1u);
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(core_->num_producers(), 0u);
}

TEST_F(ProducerTest, LayerwiseWritesFollowTheComputedBlocksAndThePartialBlockGoesLast) {
  const std::string t = Tid(2);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  EXPECT_TRUE(core_->wants_layer_events());
  EXPECT_EQ(rec_.Count(Action::kPost), 0u);  // nothing computed yet
  Step(1, 6);                                // a 6-token chunk: one full block
  Layer(0);
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(posts[0].order.local_indices.size(), 2u);  // block 0, K and V
  auto landed = DecodeMessage(posts[0].order.notification);
  ASSERT_TRUE(landed.ok());
  EXPECT_EQ(landed->tag, MsgTag::kLayerReady);
  EXPECT_EQ(landed->layer, 0u);
  EXPECT_EQ(landed->first_block, 0u);
  EXPECT_EQ(landed->num_blocks, 1u);
  Layer(1);
  EXPECT_EQ(rec_.Count(Action::kPost), 2u);
  Layer(7);  // out of range: ignored
  EXPECT_EQ(rec_.Count(Action::kPost), 2u);
  Step(1, 10);
  Layer(0);  // the rest, including the partial block (prompt complete)
  posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 3u);
  EXPECT_EQ(posts[2].order.local_indices.size(), 4u);
  Layer(1);  // the last layer's completing WRITE waits for the first token
  EXPECT_EQ(rec_.Count(Action::kPost), 3u);
  FinishProducer(1);  // layer 1's tail goes now; three WRITEs are in flight, so no KV_READY on it
  posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 4u);
  EXPECT_EQ(posts[3].order.local_indices.size(), 4u);
  EXPECT_TRUE(posts[3].order.notification.empty());
  EXPECT_FALSE(core_->wants_layer_events());
  DrainPosts();
  EXPECT_EQ(rec_.Sent(MsgTag::kKvReady).size(), 1u);  // a message once every WRITE ended
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(core_->stats().kv_ready_on_write, 0);
}

TEST_F(ProducerTest, LayerwiseLastLayerCarriesKvReadyWhenTheEarlierWritesEnded) {
  const std::string t = Tid(42);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  Step(1, 10);
  Layer(0);
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(posts[0].order.local_indices.size(), 6u);
  Done(posts[0].token);
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  Layer(1);
  EXPECT_EQ(rec_.Count(Action::kPost), 1u);  // waits for the first token
  FinishProducer(1);
  posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 2u);
  EXPECT_EQ(posts[1].order.local_indices.size(), 6u);  // layer 1, K and V, 3 blocks
  EXPECT_EQ(posts[1].order.local_indices[0], TransferCore::EntryIndex(16, 1, KvKind::kKey, 1));
  auto ready = rec_.Delivered(MsgTag::kKvReady);
  ASSERT_EQ(ready.size(), 1u);
  EXPECT_EQ(ready[0].token, posts[1].token);
  const std::vector<BlockId> src = {1, 2, 3};
  EXPECT_EQ(ready[0].msg.kv_digest, KvBlocksDigest(layout_, arena_, src));
  Done(posts[1].token);
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_TRUE(rec_.Of(Action::kSend).empty());
  EXPECT_EQ(core_->num_producers(), 0u);
}

TEST_F(ProducerTest, LayerWritesDuringThePrefillStartAtTheThreshold) {
  config_.layerwise_min_bytes = 2 * layout_.chunk_bytes() + 1;  // more than one block's K,V
  Rebuild();
  const std::string t = Tid(43);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  Step(1, 6);
  Layer(0);  // one block computed: below the threshold, it waits
  Layer(1);
  EXPECT_EQ(rec_.Count(Action::kPost), 0u);
  Step(1, 10);
  Layer(0);  // three blocks: written, with LAYER_READY
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(posts[0].order.local_indices.size(), 6u);
  EXPECT_EQ(posts[0].msg.tag, MsgTag::kLayerReady);
  Done(posts[0].token);
  Layer(1);  // the last layer waits for the first token
  FinishProducer(1);
  posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 2u);
  EXPECT_EQ(posts[1].order.local_indices.size(), 6u);
  EXPECT_EQ(posts[1].msg.tag, MsgTag::kKvReady);
  // At the default (256 KiB) a short prompt of this layout goes in one WRITE after the prefill.
  ExpectOneWriteAfterThePrefill(KvTransferConfig{}.layerwise_min_bytes, 2, Tid(44));
}

// In the prompt's last chunk a layer below the threshold is still written at once when every
// layer waiting would leave the threshold or more for after the prefill: the WRITE that carries
// KV_READY then holds only the last layer (it held every layer's share, whatever the alignment
// of the last chunk, before).
TEST_F(ProducerTest, TheLastChunksLayersGoAtOnceWhenWaitingWouldLeaveTheThresholdForTheEnd) {
  config_.layerwise_min_bytes = 8 * layout_.chunk_bytes();  // 4 blocks' K,V
  Rebuild();
  const std::string t = Tid(45);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  Step(1, 6);
  Layer(0);  // one block of an unfinished prompt: below the threshold, it waits
  Layer(1);
  EXPECT_EQ(rec_.Count(Action::kPost), 0u);
  Step(1, 10);
  Layer(0);  // 3 blocks (6 chunks) < 8, but 2 layers of them would wait: 12 >= 8
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(posts[0].order.local_indices.size(), 6u);
  EXPECT_EQ(posts[0].msg.tag, MsgTag::kLayerReady);
  Done(posts[0].token);
  Layer(1);  // the last layer waits for the first token
  EXPECT_EQ(rec_.Count(Action::kPost), 1u);
  FinishProducer(1);
  posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 2u);
  EXPECT_EQ(posts[1].order.local_indices.size(), 6u);  // layer 1 only
  EXPECT_EQ(posts[1].order.local_indices[0], TransferCore::EntryIndex(16, 1, KvKind::kKey, 1));
  EXPECT_EQ(posts[1].msg.tag, MsgTag::kKvReady);
  // 13 chunks of a threshold: both layers together (12) stay below it, so one WRITE at the end.
  ExpectOneWriteAfterThePrefill(13 * layout_.chunk_bytes(), 2, Tid(46));
}

TEST_F(ProducerTest, LayerEventsAreWantedOnlyWhileATargetIsAttachedOrWaiting) {
  EXPECT_FALSE(core_->wants_layer_events());
  const std::string t = Tid(45);
  StartProducer(1, t, Mode::kPush);
  EXPECT_FALSE(core_->wants_layer_events());  // no target: layers post nothing
  const std::string u = Tid(46);
  Deliver(kD, Target(u));  // a target waiting for its request
  EXPECT_TRUE(core_->wants_layer_events());
  StartProducer(2, u, Mode::kPush);
  EXPECT_TRUE(core_->wants_layer_events());  // attached while prefilling
  FinishProducer(2);
  EXPECT_FALSE(core_->wants_layer_events());
  // Layer events of the untargeted prefill, applied late, still count when its target comes.
  Step(1, 10);
  Layer(0);
  Layer(1);
  EXPECT_EQ(rec_.Of(Action::kPost).size(), 1u);  // only request 2's one WRITE
  Deliver(kD, Target(t));
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 2u);  // layer 0 goes at once; layer 1 waits for the first token
  EXPECT_EQ(posts[1].order.local_indices.size(), 6u);
}

TEST_F(ProducerTest, WithoutLayerwiseNothingIsWrittenBeforeThePrefillEnds) {
  config_.layerwise = false;
  Rebuild();
  const std::string t = Tid(3);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  Step(1, 10);
  Layer(0);
  Layer(1);
  EXPECT_EQ(rec_.Count(Action::kPost), 0u);
  FinishProducer(1);
  EXPECT_EQ(rec_.Count(Action::kPost), 1u);
  EXPECT_EQ(rec_.Delivered(MsgTag::kKvReady).size(), 1u);
}

TEST_F(ProducerTest, TargetBeforeItsRequestIsKeptAndAttachedWhenTheRequestArrives) {
  const std::string t = Tid(4);
  Deliver(kD, Target(t, 1, {6, 7}));  // D had block 0 cached
  EXPECT_EQ(core_->num_pending_targets(), 1u);
  EXPECT_TRUE(core_->busy());
  StartProducer(1, t, Mode::kPush);
  EXPECT_EQ(core_->num_pending_targets(), 0u);
  FinishProducer(1);
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(posts[0].order.local_indices.size(), 8u);  // blocks 1 and 2 only, both layers
  EXPECT_EQ(posts[0].order.remote_indices[0], TransferCore::EntryIndex(16, 0, KvKind::kKey, 6));
  auto ready = rec_.Delivered(MsgTag::kKvReady);
  ASSERT_EQ(ready.size(), 1u);
  const std::vector<BlockId> sent = {2, 3};
  EXPECT_EQ(ready[0].msg.kv_digest, KvBlocksDigest(layout_, arena_, sent));
  DrainPosts();
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
}

TEST_F(ProducerTest, UnmatchedTargetExpiresAfterTheLeaseAndTheLateRequestIsDropped) {
  const std::string t = Tid(5);
  Deliver(kD, Target(t));
  Advance(milliseconds(999));
  EXPECT_EQ(core_->num_pending_targets(), 1u);
  Advance(milliseconds(11));
  EXPECT_EQ(core_->num_pending_targets(), 0u);
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].msg.code, static_cast<uint8_t>(StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(core_->IsTombstoned(t));
  StartProducer(9, t, Mode::kPush);  // the P leg arrives after all: not computed
  ASSERT_EQ(rec_.Of(Action::kAbort).size(), 1u);
  EXPECT_EQ(rec_.Of(Action::kAbort)[0].seq_id, 9);
  FinishProducer(9, false);
  ASSERT_EQ(rec_.Of(Action::kRelease).size(), 1u);
  EXPECT_EQ(rec_.Of(Action::kRelease)[0].seq_id, 9);
  EXPECT_EQ(core_->num_producers(), 0u);
}

TEST_F(ProducerTest, LeaseExpiryFreesTheBlocksAndTheTombstoneRefusesALateTarget) {
  const std::string t = Tid(6);
  StartProducer(1, t, Mode::kPush);
  FinishProducer(1);
  Advance(milliseconds(990));
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  Advance(milliseconds(20));
  ASSERT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(core_->stats().leases_expired, 1);
  EXPECT_TRUE(rec_.Sent(MsgTag::kTransferFailed).empty());  // no D to tell
  EXPECT_TRUE(core_->IsTombstoned(t));
  Deliver(kD, Target(t));
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].peer, kD);
  EXPECT_EQ(failed[0].msg.code, static_cast<uint8_t>(StatusCode::kFailedPrecondition));
  EXPECT_EQ(rec_.Count(Action::kPost), 0u);  // never written from reused blocks
}

TEST_F(ProducerTest, TombstonesExpireAfterTwiceTheLeaseOrAMinute) {
  const std::string t = Tid(7);
  Deliver(kD, Signal(MsgTag::kNotNeeded, t));
  EXPECT_TRUE(core_->IsTombstoned(t));
  Advance(milliseconds(59000));
  EXPECT_TRUE(core_->IsTombstoned(t));
  Advance(milliseconds(1000));
  EXPECT_FALSE(core_->IsTombstoned(t));
}

TEST_F(ProducerTest, TimersRunAtMostEvery10ms) {
  const std::string t = Tid(8);
  StartProducer(1, t, Mode::kPush);
  FinishProducer(1);
  core_->Tick();
  clock_.Advance(milliseconds(1005));
  core_->Tick();  // 1005 ms after the previous check: runs
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  core_->Tick();
  EXPECT_EQ(core_->stats().leases_expired, 1);
}

TEST_F(ProducerTest, DuplicateTransferIdIsAbortedAndItsBlocksReleasedWhenItEnds) {
  const std::string t = Tid(9);
  StartProducer(1, t, Mode::kPush);
  StartProducer(2, t, Mode::kPush);
  ASSERT_EQ(rec_.Of(Action::kAbort).size(), 1u);
  EXPECT_EQ(rec_.Of(Action::kAbort)[0].seq_id, 2);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kPrefilling);  // the first is untouched
  FinishProducer(2, false);
  ASSERT_EQ(rec_.Of(Action::kRelease).size(), 1u);
  EXPECT_EQ(rec_.Of(Action::kRelease)[0].seq_id, 2);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kPrefilling);
}

TEST_F(ProducerTest, NotNeededBeforeTheRequestDropsThePrefill) {
  const std::string t = Tid(10);
  Deliver(kD, Target(t));
  Deliver(kD, Signal(MsgTag::kNotNeeded, t));
  EXPECT_EQ(core_->num_pending_targets(), 0u);
  StartProducer(1, t, Mode::kPush);
  EXPECT_EQ(rec_.Count(Action::kAbort), 1u);
}

TEST_F(ProducerTest, NotNeededAfterWritesStartedCancelsThemAndReleasesOnlyAfterTheyEnd) {
  const std::string t = Tid(11);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  Step(1, 10);
  Layer(0);
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  Deliver(kD, Signal(MsgTag::kNotNeeded, t));
  EXPECT_EQ(core_->producer_state(t), ProducerState::kDropping);
  ASSERT_EQ(rec_.Of(Action::kAbort).size(), 1u);  // the prefill is still running
  ASSERT_EQ(rec_.Of(Action::kCancel).size(), 1u);
  EXPECT_EQ(rec_.Of(Action::kCancel)[0].token, posts[0].token);
  Layer(1);  // computed anyway: nothing more is written
  EXPECT_EQ(rec_.Count(Action::kPost), 1u);
  FinishProducer(1, false);
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);  // the WRITE may still land
  Done(posts[0].token, false);
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_TRUE(rec_.Sent(MsgTag::kTransferFailed).empty());
  EXPECT_TRUE(rec_.Delivered(MsgTag::kKvReady).empty());
  EXPECT_EQ(core_->num_producers(), 0u);
}

TEST_F(ProducerTest, CancelFromTheTargetsDecodeIsAcknowledgedOnlyOnceNoWriteCanLand) {
  for (bool cancel_won : {true, false}) {
    SCOPED_TRACE(cancel_won ? "the cancel stopped the WRITE" : "the WRITE completed anyway");
    rec_.Clear();
    const std::string t = Tid(cancel_won ? 12 : 47);
    const int64_t seq = cancel_won ? 1 : 2;
    StartProducer(seq, t, Mode::kPush);
    FinishProducer(seq);
    Deliver(kD, Target(t));
    Deliver(kD, Signal(MsgTag::kCancel, t));
    EXPECT_EQ(rec_.Count(Action::kAbort), 0u);  // the prefill had finished
    EXPECT_EQ(rec_.Count(Action::kCancel), 1u);
    EXPECT_TRUE(rec_.Sent(MsgTag::kCancelAck).empty());
    EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
    auto posts = rec_.Of(Action::kPost);
    ASSERT_EQ(posts.size(), 1u);
    // Either way (KV_READY not sent, or delivered before the CANCEL_ACK) nothing lands after.
    Done(posts[0].token, !cancel_won);
    auto acks = rec_.Sent(MsgTag::kCancelAck);
    ASSERT_EQ(acks.size(), 1u);
    EXPECT_EQ(acks[0].peer, kD);
    EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
    EXPECT_TRUE(rec_.Sent(MsgTag::kTransferFailed).empty());
    EXPECT_TRUE(core_->IsTombstoned(t));
  }
  EXPECT_EQ(core_->num_producers(), 0u);
}

TEST_F(ProducerTest, CancelRaces) {
  struct Case {
    const char* name;
    bool start;        // P leg arrived
    bool target;       // kD's target attached
    const char* from;  // who cancels
    size_t acks_at_once;
  };
  const Case cases[] = {
      {"unknown transfer: acknowledged at once", false, false, kD, 1},
      {"no target yet: acknowledged at once", true, false, kD, 1},
      {"another decode cancels: acknowledged at once", true, true, kD2, 1},
      {"the target's decode, no WRITE posted: acknowledged at once", true, true, kD, 1},
  };
  int n = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    const std::string t = Tid(++n);
    if (c.start) StartProducer(n, t, Mode::kPush);
    if (c.target) Deliver(kD, Target(t));
    Deliver(c.from, Signal(MsgTag::kCancel, t));
    auto acks = rec_.Sent(MsgTag::kCancelAck);
    ASSERT_EQ(acks.size(), c.acks_at_once);
    EXPECT_EQ(acks[0].peer, c.from);
    EXPECT_TRUE(core_->IsTombstoned(t));
    EXPECT_EQ(rec_.Count(Action::kAbort), c.start ? 1u : 0u);
    if (c.start) {
      FinishProducer(n, false);
      EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
    }
  }
  EXPECT_EQ(core_->num_producers(), 0u);
}

TEST_F(ProducerTest, TargetsThatDoNotFitAreRefused) {
  struct Case {
    const char* name;
    Mode mode;
    const char* peer;
    PdMessage target;
  };
  PdMessage far = Target("", 0, {5, 6, 16});
  const Case cases[] = {
      {"prompt length differs", Mode::kPush, kD, Target("", 0, {5, 6, 7}, 11)},
      {"first block beyond the prompt", Mode::kPush, kD, Target("", 3, {5})},
      {"block count does not cover the prompt", Mode::kPush, kD, Target("", 0, {5, 6})},
      {"block outside the decode pool", Mode::kPush, kD, far},
      {"no handshake with the sender", Mode::kPush, "stranger", Target("")},
      {"pull-mode request", Mode::kPull, kD, Target("")},
  };
  int n = 200;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    const std::string t = Tid(++n);
    StartProducer(n, t, c.mode);
    FinishProducer(n);
    PdMessage m = c.target;
    m.transfer_id = t;
    Deliver(c.peer, m);
    auto failed = rec_.Sent(MsgTag::kTransferFailed);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0].peer, c.peer);
    EXPECT_EQ(failed[0].msg.code, static_cast<uint8_t>(StatusCode::kInvalidArgument));
    EXPECT_EQ(rec_.Count(Action::kPost), 0u);
    EXPECT_EQ(core_->producer_state(t), ProducerState::kHeld);  // still waiting for a good one
  }
}

TEST_F(ProducerTest, PromptHashMismatchAndSecondTargetAndDroppedTransferAreRefused) {
  const std::string t = Tid(300);
  StartProducer(1, t, Mode::kPush);
  PdMessage bad = Target(t);
  bad.prompt_hash ^= 1;
  Deliver(kD, bad);
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 1u);
  Deliver(kD, Target(t));
  Deliver(kD2, Target(t));  // a second target
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 2u);
  const std::string u = Tid(301);
  StartProducer(2, u, Mode::kPush);
  StartProducer(3, u, Mode::kPush);  // duplicate: tracked as dropped under another key
  Deliver(kD, Target(u));
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 2u);  // the first one takes it
}

TEST_F(ProducerTest, WriteFailureTellsDecodeOnlyAfterEveryOtherWriteEnded) {
  const std::string t = Tid(13);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  Step(1, 10);
  Layer(0);
  Layer(1);
  FinishProducer(1);  // layer 0 in flight: layer 1 goes without KV_READY
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 2u);
  EXPECT_TRUE(rec_.Delivered(MsgTag::kKvReady).empty());
  Done(posts[0].token, false);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kDropping);
  EXPECT_TRUE(rec_.Sent(MsgTag::kTransferFailed).empty());
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  Done(posts[1].token);
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].peer, kD);
  EXPECT_EQ(failed[0].msg.code, static_cast<uint8_t>(StatusCode::kPeerGone));
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_TRUE(rec_.Delivered(MsgTag::kKvReady).empty());
  EXPECT_EQ(core_->stats().transfers_failed, 1);
}

TEST_F(ProducerTest, AWriteThatCannotBePostedFailsTheTransferAtOnce) {
  const std::string t = Tid(14);
  StartProducer(1, t, Mode::kPush);
  FinishProducer(1);
  rec_.post_error = Unavailable("backend down");
  Deliver(kD, Target(t));
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].msg.message.find("posting the WRITE of the prompt's KV"), std::string::npos);
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(core_->num_producers(), 0u);
}

TEST_F(ProducerTest, DecodeForgottenOrBlockTableTooShortDropsTheTransfer) {
  const std::string t = Tid(15);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  peers_.peers.erase(kD);
  FinishProducer(1);
  EXPECT_TRUE(rec_.Sent(MsgTag::kTransferFailed).empty());  // nobody to tell
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  peers_.peers[kD] = PeerView{16};
  const std::string u = Tid(16);
  StartProducer(2, u, Mode::kPush);
  Deliver(kD, Target(u));
  FinishProducer(2, true, {1});  // fewer blocks than the prompt needs
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].msg.code, static_cast<uint8_t>(StatusCode::kInternal));
}

TEST_F(ProducerTest, FailedPrefillTellsItsDecodeOrTombstonesForALateTarget) {
  const std::string t = Tid(17);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  FinishProducer(1, false, {1, 2, 3}, Internal("executor"));
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].msg.message.find("prefill failed"), std::string::npos);
  const std::string u = Tid(18);
  StartProducer(2, u, Mode::kPush);
  FinishProducer(2, false);  // aborted, no target yet
  EXPECT_TRUE(core_->IsTombstoned(u));
  Deliver(kD, Target(u));
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 2u);
  EXPECT_EQ(rec_.Count(Action::kRelease), 2u);
}

TEST_F(ProducerTest, TransferFailedFromDecodeIsAcceptedOnlyFromTheTargetsDecode) {
  const std::string t = Tid(19);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  PdMessage f = Signal(MsgTag::kTransferFailed, t);
  f.message = "gave up";
  Deliver(kD2, f);
  EXPECT_EQ(core_->stats().bad_messages, 1);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kPrefilling);
  Deliver(kD, f);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kDropping);
  EXPECT_EQ(rec_.Count(Action::kAbort), 1u);
  FinishProducer(1, false);
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  Deliver(kD, f);  // unknown by now: only tombstoned
  EXPECT_TRUE(core_->IsTombstoned(t));
}

TEST_F(ProducerTest, AbortTransferFreesTheBlocksAndTellsTheDecode) {
  const std::string t = Tid(20);
  Deliver(kD, Target(t));
  AbortTransferEvent ev;
  ev.transfer_id = t;
  core_->HandleEvent(ev);  // only a pending target: refused
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0].msg.code, static_cast<uint8_t>(StatusCode::kCancelled));
  const std::string u = Tid(21);
  StartProducer(2, u, Mode::kPush);
  FinishProducer(2);
  Deliver(kD, Target(u));
  ev.transfer_id = u;
  core_->HandleEvent(ev);
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);  // WRITEs outstanding
  DrainPosts(false);
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 2u);
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  ev.transfer_id = Tid(22);  // unknown: nothing but a tombstone
  core_->HandleEvent(ev);
  EXPECT_EQ(core_->stats().transfers_aborted, 2);
  const std::string v = Tid(23);
  StartProducer(3, v, Mode::kPull);
  ev.transfer_id = v;
  core_->HandleEvent(ev);  // still prefilling: the engine is asked to abort
  EXPECT_EQ(rec_.Of(Action::kAbort).back().seq_id, 3);
}

TEST_F(ProducerTest, KvReadyThatCannotBeSentEndsTheTransfer) {
  const std::string t = Tid(24);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  Step(1, 10);
  Layer(0);
  FinishProducer(1);  // two WRITEs in flight: KV_READY is a message of its own, after them
  ASSERT_EQ(rec_.Count(Action::kPost), 2u);
  rec_.send_error = Unavailable("peer gone");
  DrainPosts();
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(core_->num_producers(), 0u);
  EXPECT_TRUE(core_->IsTombstoned(t));
  EXPECT_EQ(core_->stats().kv_ready_sent, 0);
}

TEST_F(ProducerTest, CancelAfterKvReadyPostedAcknowledgesAtOnce) {
  const std::string t = Tid(25);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Target(t));
  Step(1, 10);
  Layer(0);
  FinishProducer(1);
  DrainPosts();
  ASSERT_EQ(rec_.Sent(MsgTag::kKvReady).size(), 1u);
  Deliver(kD, Signal(MsgTag::kCancel, t));
  EXPECT_EQ(rec_.Sent(MsgTag::kCancelAck).size(), 1u);
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);  // not twice
  EXPECT_EQ(core_->num_producers(), 0u);
  Done(rec_.Sent(MsgTag::kKvReady)[0].token);  // its end finds nothing
  // The one-WRITE path: once that WRITE ended the transfer is over and a CANCEL is answered.
  const std::string u = Tid(48);
  StartProducer(2, u, Mode::kPush);
  FinishProducer(2);
  Deliver(kD, Target(u));
  Done(rec_.Of(Action::kPost).back().token);
  EXPECT_EQ(core_->num_producers(), 0u);
  Deliver(kD, Signal(MsgTag::kCancel, u));
  EXPECT_EQ(rec_.Sent(MsgTag::kCancelAck).size(), 2u);
  EXPECT_EQ(rec_.Count(Action::kRelease), 2u);
}

TEST_F(ProducerTest, FinishOfAnUnannouncedRequestReleasesAtOnce) {
  FinishProducer(77);
  ASSERT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(rec_.Of(Action::kRelease)[0].seq_id, 77);
}

// ---- pull: the pinned lease ----

TEST_F(ProducerTest, PinIsAnsweredWithTheLeasedBlocksAndReleaseFreesThem) {
  const std::string t = Tid(30);
  StartProducer(1, t, Mode::kPull);
  FinishProducer(1);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kHeld);
  Advance(milliseconds(900));
  Deliver(kD, Pin(t, 1, 2));
  EXPECT_EQ(core_->producer_state(t), ProducerState::kPinned);
  auto pinned = rec_.Sent(MsgTag::kPinned);
  ASSERT_EQ(pinned.size(), 1u);
  EXPECT_EQ(pinned[0].peer, kD);
  EXPECT_EQ(pinned[0].msg.block_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(pinned[0].msg.num_prompt_tokens, 10u);
  EXPECT_EQ(pinned[0].msg.token_id, 42);
  EXPECT_EQ(pinned[0].msg.first_token_binding, binding_);
  const std::vector<BlockId> leased = {2, 3};
  EXPECT_EQ(pinned[0].msg.kv_digest, KvBlocksDigest(layout_, arena_, leased));
  Advance(milliseconds(900));  // the pin restarted the lease
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  Deliver(kD2, Signal(MsgTag::kRelease, t));  // not the D that pinned it
  EXPECT_EQ(core_->stats().bad_messages, 1);
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  Deliver(kD, Signal(MsgTag::kRelease, t));
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(core_->num_producers(), 0u);
  Deliver(kD, Pin(t));
  EXPECT_EQ(core_->stats().pins_refused, 1);
}

TEST_F(ProducerTest, PinRefusals) {
  struct Case {
    const char* name;
    Mode mode;
    bool finish_ok;
    const char* pinned_by;  // a D that pinned first, or null
    PdMessage pin;
  };
  const Case cases[] = {
      {"push-mode request", Mode::kPush, true, nullptr, Pin("")},
      {"range beyond the prompt", Mode::kPull, true, nullptr, Pin("", 2, 2)},
      {"pinned by another decode", Mode::kPull, true, kD2, Pin("")},
      {"prefill failed", Mode::kPull, false, nullptr, Pin("")},
  };
  int n = 400;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    const std::string t = Tid(++n);
    StartProducer(n, t, c.mode);
    FinishProducer(n, c.finish_ok);
    if (c.pinned_by != nullptr) Deliver(c.pinned_by, Pin(t));
    PdMessage m = c.pin;
    m.transfer_id = t;
    Deliver(kD, m);
    auto failed = rec_.Sent(MsgTag::kTransferFailed);
    ASSERT_FALSE(failed.empty());
    EXPECT_EQ(failed.back().peer, kD);
    EXPECT_EQ(failed.back().msg.code, static_cast<uint8_t>(StatusCode::kFailedPrecondition));
  }
  rec_.Clear();
  Deliver(kD, Pin(Tid(499)));  // never heard of
  ASSERT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 1u);
  EXPECT_NE(rec_.Sent(MsgTag::kTransferFailed)[0].msg.message.find("unknown transfer"),
            std::string::npos);
}

TEST_F(ProducerTest, PinBeforeThePrefillEndsIsAnsweredWhenItEnds) {
  const std::string t = Tid(31);
  StartProducer(1, t, Mode::kPull);
  Deliver(kD, Pin(t));
  EXPECT_TRUE(rec_.Sent(MsgTag::kPinned).empty());
  Deliver(kD, Pin(t));  // a second early PIN is refused
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 1u);
  FinishProducer(1);
  EXPECT_EQ(rec_.Sent(MsgTag::kPinned).size(), 1u);
  const std::string u = Tid(32);
  StartProducer(2, u, Mode::kPull);
  Deliver(kD, Pin(u));
  FinishProducer(2, false);  // the prefill failed: the early PIN is refused
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 2u);
  EXPECT_EQ(rec_.Sent(MsgTag::kPinned).size(), 1u);
}

TEST_F(ProducerTest, ExpiredLeaseIsNeverReadPinnedOrNot) {
  const std::string t = Tid(33);
  StartProducer(1, t, Mode::kPull);
  FinishProducer(1);
  Advance(milliseconds(1010));
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  Deliver(kD, Pin(t));
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].msg.message.find("lease expired"), std::string::npos);
  EXPECT_TRUE(rec_.Sent(MsgTag::kPinned).empty());
  const std::string u = Tid(34);
  StartProducer(2, u, Mode::kPull);
  FinishProducer(2);
  Deliver(kD, Pin(u));
  Advance(milliseconds(1010));  // pinned, never released
  EXPECT_EQ(rec_.Count(Action::kRelease), 2u);
  EXPECT_EQ(core_->stats().leases_expired, 2);
  EXPECT_TRUE(rec_.Sent(MsgTag::kTransferFailed).size() == 1u);  // pull: D's watchdog decides
}

TEST_F(ProducerTest, ReleaseOfAPushTransferIsABadMessage) {
  const std::string t = Tid(35);
  StartProducer(1, t, Mode::kPush);
  Deliver(kD, Signal(MsgTag::kRelease, t));
  EXPECT_EQ(core_->stats().bad_messages, 1);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kPrefilling);
  const std::string u = Tid(36);
  StartProducer(2, u, Mode::kPull);
  Deliver(kD, Signal(MsgTag::kRelease, u));  // before any PIN: anyone may release
  FinishProducer(2);
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
}

TEST_F(ProducerTest, MalformedMessagesAreCountedAndDropped) {
  const std::vector<uint8_t> junk = {99, 1, 2};
  core_->HandleMessage(kD, junk);
  core_->HandleMessage(kD, std::vector<uint8_t>{});
  EXPECT_EQ(core_->stats().bad_messages, 2);
  EXPECT_TRUE(rec_.log.empty());
}

TEST_F(ProducerTest, DroppedLeaseFailedKvReadyAndUnsendableMessages) {
  const std::string u = Tid(37);
  StartProducer(1, u, Mode::kPull);
  Deliver(kD, Signal(MsgTag::kRelease, u));  // released while the prefill still runs
  EXPECT_EQ(core_->producer_state(u), ProducerState::kDropping);
  Deliver(kD, Pin(u));
  auto failed = rec_.Sent(MsgTag::kTransferFailed);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_NE(failed[0].msg.message.find("dropped"), std::string::npos);
  const std::string t = Tid(38);
  StartProducer(2, t, Mode::kPush);
  FinishProducer(2);
  Deliver(kD, Target(t));
  auto ready = rec_.Delivered(MsgTag::kKvReady);
  ASSERT_EQ(ready.size(), 1u);
  Done(ready[0].token, false);  // the WRITE and its KV_READY failed: D is told, P is done
  EXPECT_FALSE(core_->producer_state(t).has_value());
  EXPECT_TRUE(core_->IsTombstoned(t));
  EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), 2u);
  rec_.Clear();
  rec_.send_error = Unavailable("no route");
  const size_t tracked = core_->OutstandingTokens().size();
  Deliver(kD, Signal(MsgTag::kCancel, Tid(39)));  // the CANCEL_ACK cannot be sent: logged
  EXPECT_TRUE(rec_.log.empty());
  EXPECT_EQ(core_->OutstandingTokens().size(), tracked);  // nothing tracked for it
}

TEST(TransferCoreNames, StatesHaveNames) {
  EXPECT_STREQ(ProducerStateName(ProducerState::kPrefilling), "prefilling");
  EXPECT_STREQ(ProducerStateName(ProducerState::kHeld), "held");
  EXPECT_STREQ(ProducerStateName(ProducerState::kPinned), "pinned");
  EXPECT_STREQ(ProducerStateName(ProducerState::kReadyPosted), "ready_posted");
  EXPECT_STREQ(ProducerStateName(ProducerState::kDropping), "dropping");
  EXPECT_STREQ(ConsumerStateName(ConsumerState::kAwaitingKv), "awaiting_kv");
  EXPECT_STREQ(ConsumerStateName(ConsumerState::kPinSent), "pin_sent");
  EXPECT_STREQ(ConsumerStateName(ConsumerState::kReadHanded), "read_handed");
  EXPECT_STREQ(ConsumerStateName(ConsumerState::kReading), "reading");
  EXPECT_STREQ(ConsumerStateName(ConsumerState::kCancelling), "cancelling");
}

}  // namespace
}  // namespace kvpush::connector::test
