// TransferCore, decode (D) side: push targets and KV_READY, LAYER_READY checksums, pull PIN /
// PINNED / READ / RELEASE in both profiles, the watchdog and CANCEL/CANCEL_ACK, aborts, peer
// death, checksum mismatches and duplicate ids. No processes, threads or sleeps.
#include <gtest/gtest.h>

#include "connector/transfer_core.h"
#include "core_fakes.h"
#include "kv/block_checksum.h"

namespace kvpush::connector::test {
namespace {

using Mode = pd::KvTransferParams::Mode;
using std::chrono::milliseconds;

class ConsumerTest : public CoreTest {};

TEST_F(ConsumerTest, PushTargetThenKvReadyLoadsTheKvWithPsFirstToken) {
  const std::string t = Tid(1);
  StartConsumer(1, t, Mode::kPush, 4, 6);  // block 0 cached locally
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kAwaitingKv);
  auto targets = rec_.Sent(MsgTag::kPushTarget);
  ASSERT_EQ(targets.size(), 1u);
  EXPECT_EQ(targets[0].peer, kP);
  EXPECT_EQ(targets[0].msg.first_block, 1u);
  EXPECT_EQ(targets[0].msg.block_ids, (std::vector<int32_t>{9, 10}));
  EXPECT_EQ(targets[0].msg.num_prompt_tokens, 10u);
  PdMessage landed = Signal(MsgTag::kLayerReady, t);
  landed.layer = 0;
  landed.first_block = 1;
  landed.num_blocks = 2;
  Deliver(kP, landed);
  EXPECT_GT(core_->stats().verify_early_ns_sum, -1);
  Deliver(kP, KvReady(t, {9, 10}));
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_TRUE(loads[0].status.ok()) << loads[0].status.ToString();
  ASSERT_TRUE(loads[0].first_token.has_value());
  EXPECT_EQ(loads[0].first_token->id, 42);
  EXPECT_EQ(core_->num_consumers(), 0u);
  auto s = core_->stats();
  EXPECT_EQ(s.blocks_verified, 2);
  EXPECT_EQ(s.checksum_mismatches, 0);
  EXPECT_EQ(s.push_targets_sent, 1);
  EXPECT_EQ(s.kv_ready_received, 1);
}

TEST_F(ConsumerTest, AFirstTokenSampledUnderOtherSettingsLoadsTheKvWithoutTheToken) {
  // A client that sends the legs itself can run P at temperature 0 and D at 0.9 with a seed:
  // P's token is not D's to emit. The KV is the prompt's (verified as usual); the load ends
  // without the token, so the engine computes the last prompt token for its own logits.
  struct Case {
    const char* name;
    Mode mode;
  };
  for (const Case& k :
       {Case{"push: KV_READY", Mode::kPush}, Case{"pull fast: PINNED", Mode::kPull}}) {
    SCOPED_TRACE(k.name);
    Rebuild();
    rec_.Clear();
    const std::string t = Tid(5);
    StartConsumer(1, t, k.mode);  // this request's binding: binding_
    PdMessage m = k.mode == Mode::kPush ? KvReady(t) : Pinned(t);
    m.first_token_binding = binding_ ^ 1;  // P's request sampled otherwise
    Deliver(kP, m);
    if (k.mode == Mode::kPull) Done(rec_.Of(Action::kPost).at(0).token);
    auto loads = Loads();
    ASSERT_EQ(loads.size(), 1u);
    EXPECT_TRUE(loads[0].status.ok()) << loads[0].status.ToString();
    EXPECT_FALSE(loads[0].first_token.has_value());
    EXPECT_EQ(core_->stats().first_tokens_unbound, 1);
    EXPECT_EQ(core_->stats().blocks_verified, 3);
    EXPECT_EQ(core_->num_consumers(), 0u);
  }
}

TEST_F(ConsumerTest, ChecksumMismatchDiscardsTheKv) {
  struct Case {
    const char* name;
    FailurePolicy policy;
    bool verify;
    bool early_layer;  // a LAYER_READY hashed layer 0 before the corruption was noticed
  };
  const Case cases[] = {
      {"recompute", FailurePolicy::kRecompute, true, false},
      {"fail", FailurePolicy::kFail, true, true},
      {"verification off: accepted (measurements only)", FailurePolicy::kRecompute, false, false},
  };
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    config_.failure_policy = c.policy;
    config_.verify_checksums = c.verify;
    Rebuild();
    rec_.Clear();
    const std::string t = Tid(++n);
    StartConsumer(n, t, Mode::kPush);
    if (c.early_layer) {
      PdMessage landed = Signal(MsgTag::kLayerReady, t);
      landed.num_blocks = 3;
      Deliver(kP, landed);
    }
    PdMessage ready = KvReady(t);
    ready.kv_digest ^= 1;  // what P sent is not what landed
    Deliver(kP, ready);
    auto loads = Loads();
    ASSERT_EQ(loads.size(), 1u);
    if (!c.verify) {
      EXPECT_TRUE(loads[0].status.ok());
      continue;
    }
    EXPECT_EQ(loads[0].status.code(), StatusCode::kDataLoss);
    EXPECT_FALSE(loads[0].first_token.has_value());
    EXPECT_EQ(loads[0].recompute, c.policy == FailurePolicy::kRecompute);
    EXPECT_EQ(core_->stats().checksum_mismatches, 1);
  }
}

TEST_F(ConsumerTest, LayerReadyOutsideTheTargetIsABadMessage) {
  const std::string t = Tid(2);
  StartConsumer(1, t, Mode::kPush, 4, 6);
  PdMessage landed = Signal(MsgTag::kLayerReady, t);
  landed.first_block = 0;  // before the target
  landed.num_blocks = 1;
  Deliver(kP, landed);
  landed.first_block = 1;
  landed.num_blocks = 3;  // past it
  Deliver(kP, landed);
  landed.num_blocks = 1;
  landed.layer = 2;  // no such layer
  Deliver(kP, landed);
  EXPECT_EQ(core_->stats().bad_messages, 3);
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kAwaitingKv);
}

TEST_F(ConsumerTest, WatchdogCancelsAndTheAckEndsTheLoad) {
  const std::string t = Tid(3);
  StartConsumer(1, t, Mode::kPush);
  Advance(milliseconds(490));
  EXPECT_TRUE(rec_.Sent(MsgTag::kCancel).empty());
  Advance(milliseconds(20));
  ASSERT_EQ(rec_.Sent(MsgTag::kCancel).size(), 1u);
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kCancelling);
  EXPECT_EQ(core_->stats().watchdog_expired, 1);
  PdMessage landed = Signal(MsgTag::kLayerReady, t);
  landed.num_blocks = 1;
  Deliver(kP, landed);  // a late layer is not hashed any more
  EXPECT_TRUE(Loads().empty());
  Deliver(kD, Signal(MsgTag::kCancelAck, t));  // from someone else: ignored
  EXPECT_TRUE(Loads().empty());
  Deliver(kP, Signal(MsgTag::kCancelAck, t));
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(loads[0].recompute);
  Deliver(kP, Signal(MsgTag::kCancelAck, t));  // a duplicate ack finds nothing
  EXPECT_EQ(Loads().size(), 1u);
}

TEST_F(ConsumerTest, PushWatchdogCountsFromTheLastLayerThatBroughtNewKv) {
  // A long prefill pushed layer by layer: every LAYER_READY with chunks not seen before restarts
  // the watchdog (500 ms); a repeated one does not, and neither does progress once it expired.
  const std::string t = Tid(5);
  StartConsumer(1, t, Mode::kPush);
  PdMessage landed = Signal(MsgTag::kLayerReady, t);
  landed.num_blocks = 1;
  for (int32_t layer = 0; layer < 2; ++layer) {
    Advance(milliseconds(400));
    landed.layer = static_cast<uint32_t>(layer);
    Deliver(kP, landed);
  }
  Advance(milliseconds(400));  // 1,200 ms since arrival, 400 since the last new chunk
  EXPECT_TRUE(rec_.Sent(MsgTag::kCancel).empty());
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kAwaitingKv);
  Deliver(kP, landed);  // the same chunk again: no progress
  Advance(milliseconds(110));
  ASSERT_EQ(rec_.Sent(MsgTag::kCancel).size(), 1u);
  EXPECT_EQ(core_->stats().watchdog_expired, 1);
  landed.first_block = 1;  // new KV after the cancel began changes nothing
  landed.layer = 0;
  Deliver(kP, landed);
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kCancelling);
}

TEST_F(ConsumerTest, KvReadyThatCrossesTheCancelStillLoads) {
  const std::string t = Tid(4);
  StartConsumer(1, t, Mode::kPush);
  Advance(milliseconds(510));
  ASSERT_EQ(rec_.Sent(MsgTag::kCancel).size(), 1u);
  Deliver(kP, KvReady(t));  // P had finished before the CANCEL reached it
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_TRUE(loads[0].status.ok());
  Deliver(kP, Signal(MsgTag::kCancelAck, t));
  EXPECT_EQ(Loads().size(), 1u);
}

TEST_F(ConsumerTest, NoCancelAckQuarantinesTheBlocksUntilNothingCanLand) {
  // P stopped with WRITEs queued: D cannot stop them (invalidating P does not), so at the cancel
  // deadline the request goes on without its target blocks (recompute into fresh ones), which
  // stay out of use until P says none of its WRITEs can land any more.
  struct Case {
    const char* name;
    int end;  // 0: late CANCEL_ACK, 1: TRANSFER_FAILED, 2: late KV_READY, 3: P dies, 4: P restarts
  };
  const Case cases[] = {{"CANCEL_ACK", 0},
                        {"TRANSFER_FAILED", 1},
                        {"late KV_READY", 2},
                        {"P dies", 3},
                        {"P restarts", 4}};
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    peers_.failures.clear();
    peers_.peers[kP] = PeerView{16, 7};
    Rebuild();
    const std::string t = Tid(++n);
    StartConsumer(n, t, Mode::kPush);
    Advance(milliseconds(510));
    Advance(milliseconds(190));
    EXPECT_TRUE(Loads().empty());
    Advance(milliseconds(20));
    EXPECT_EQ(rec_.Count(Action::kFence), 0u);
    auto loads = Loads();
    ASSERT_EQ(loads.size(), 1u);
    EXPECT_EQ(loads[0].status.code(), StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(loads[0].quarantined);
    EXPECT_TRUE(loads[0].recompute);
    EXPECT_EQ(core_->consumer_state(t), ConsumerState::kQuarantined);
    EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
    auto s = core_->stats();
    EXPECT_EQ(s.quarantines, 1);
    EXPECT_EQ(s.consumers_quarantined, 1);
    EXPECT_EQ(s.blocks_quarantined, 3);
    // The CANCEL is asked again with backoff (200 ms, then 400 ms) in case the first was lost.
    const size_t cancels = rec_.Sent(MsgTag::kCancel).size();
    Advance(milliseconds(210));
    EXPECT_EQ(rec_.Sent(MsgTag::kCancel).size(), cancels + 1);
    Advance(milliseconds(210));
    EXPECT_EQ(rec_.Sent(MsgTag::kCancel).size(), cancels + 1);
    Advance(milliseconds(210));
    EXPECT_EQ(rec_.Sent(MsgTag::kCancel).size(), cancels + 2);
    // A late LAYER_READY changes nothing; a CANCEL_ACK from another instance neither.
    PdMessage landed = Signal(MsgTag::kLayerReady, t);
    landed.num_blocks = 1;
    Deliver(kP, landed);
    Deliver(kD, Signal(MsgTag::kCancelAck, t));
    EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
    switch (c.end) {
      case 0:
        Deliver(kP, Signal(MsgTag::kCancelAck, t));
        break;
      case 1:
        Deliver(kP, Signal(MsgTag::kTransferFailed, t));
        break;
      case 2:
        Deliver(kP, KvReady(t));
        break;
      case 3:
        peers_.failures[kP] = "connection reset";
        Advance(milliseconds(20));
        break;
      default:
        peers_.peers[kP] = PeerView{16, 8};
        Advance(milliseconds(20));
    }
    ASSERT_EQ(rec_.Of(Action::kRelease).size(), 1u);
    EXPECT_EQ(rec_.Of(Action::kRelease)[0].seq_id, n);
    EXPECT_EQ(Loads().size(), 1u);  // no second load result: the engine moved on long ago
    EXPECT_EQ(core_->num_consumers(), 0u);
    s = core_->stats();
    EXPECT_EQ(s.quarantines_released, 1);
    EXPECT_EQ(s.consumers_quarantined, 0);
    EXPECT_EQ(s.blocks_quarantined, 0);
  }
}

TEST_F(ConsumerTest, AnAbortedRequestsBlocksStayHeldWithoutAnAck) {
  // The engine finished the request while its KV was on the way (client gone): CANCEL, no ack:
  // the blocks the engine holds for it are released only once P acknowledges.
  const std::string t = Tid(6);
  StartConsumer(6, t, Mode::kPush);
  ConsumerAbortEvent ab;
  ab.seq_id = 6;
  ab.transfer_id = t;
  core_->HandleEvent(ab);
  ASSERT_EQ(rec_.Sent(MsgTag::kCancel).size(), 1u);
  Advance(milliseconds(300));
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kQuarantined);
  EXPECT_TRUE(Loads().empty());
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  core_->HandleEvent(ab);  // a second abort changes nothing
  Deliver(kP, Signal(MsgTag::kCancelAck, t));
  ASSERT_EQ(rec_.Of(Action::kRelease).size(), 1u);
  EXPECT_TRUE(Loads().empty());
}

TEST_F(ConsumerTest, AnUnsettledPullReadQuarantinesItsBlocksUntilItEnds) {
  // D's own READ was cancelled but the transfer engine has not settled it (its data could still
  // arrive): the request goes on, the blocks wait for the READ's end.
  const std::string t = Tid(7);
  StartConsumer(7, t, Mode::kPull, 0, 10, 10, {8, 9, 10}, pd::PullProfile::kFast);
  Deliver(kP, Pinned(t));
  const TransferToken read = rec_.Of(Action::kPost)[0].token;
  Advance(milliseconds(510));
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kCancelling);
  Advance(milliseconds(210));
  ASSERT_EQ(Loads().size(), 1u);
  EXPECT_TRUE(Loads()[0].quarantined);
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kQuarantined);
  EXPECT_TRUE(rec_.Sent(MsgTag::kRelease).empty());
  Advance(milliseconds(1000));
  EXPECT_TRUE(rec_.Sent(MsgTag::kCancel).empty());  // pull: nothing to ask P
  Done(read, false);
  ASSERT_EQ(rec_.Of(Action::kRelease).size(), 1u);
  EXPECT_EQ(rec_.Sent(MsgTag::kRelease).size(), 1u);  // P's lease goes too
  EXPECT_EQ(core_->num_consumers(), 0u);
}

TEST_F(ConsumerTest, FailuresEndTheLoadAtOnce) {
  struct Case {
    const char* name;
    Mode mode;
    int what;  // 0: TRANSFER_FAILED from P, 1: P dies, 2: the PIN's completion failed
    StatusCode code;
  };
  const Case cases[] = {
      {"push: P refused", Mode::kPush, 0, StatusCode::kUnavailable},
      {"pull: P refused the PIN", Mode::kPull, 0, StatusCode::kUnavailable},
      {"push: P died", Mode::kPush, 1, StatusCode::kPeerGone},
      {"pull: P died", Mode::kPull, 1, StatusCode::kPeerGone},
      {"pull: PIN undeliverable", Mode::kPull, 2, StatusCode::kPeerGone},
  };
  int n = 10;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    peers_.failures.clear();
    const std::string t = Tid(++n);
    StartConsumer(n, t, c.mode);
    if (c.what == 0) {
      PdMessage f = Signal(MsgTag::kTransferFailed, t);
      f.message = "no";
      Deliver(kP, f);
    } else if (c.what == 1) {
      peers_.failures[kP] = "connection reset";
      Advance(milliseconds(20));
    } else {
      // Pull: D's blocks are written only by its own READ, not posted yet: nothing can land.
      Done(rec_.Sent(MsgTag::kPin)[0].token, false);
    }
    auto loads = Loads();
    ASSERT_EQ(loads.size(), 1u);
    EXPECT_EQ(loads[0].status.code(), c.code);
    EXPECT_EQ(rec_.Sent(MsgTag::kRelease).size(), c.mode == Mode::kPull ? 1u : 0u);
    EXPECT_EQ(core_->num_consumers(), 0u);
  }
}

TEST_F(ConsumerTest, APushTargetOfUnknownFateIsCancelledNotReleased) {
  // The PUSH_TARGET's completion failed, but a failed completion does not mean the message did
  // not arrive: P may WRITE into the targets. Found by chaos_test (link cuts and injected
  // completion failures): the blocks went back to the pool at once, P's WRITEs landed in the next
  // request's KV, HTTP 200 with wrong tokens. The consumer cancels as the watchdog does.
  struct Case {
    const char* name;
    int end;  // 0: CANCEL_ACK, 1: KV_READY crossed the cancel, 2: no answer (quarantine), then ack
  };
  const Case cases[] = {{"CANCEL_ACK", 0}, {"KV_READY crossed the cancel", 1}, {"no answer", 2}};
  int n = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    const std::string t = Tid(++n);
    StartConsumer(n, t, Mode::kPush);
    Done(rec_.Sent(MsgTag::kPushTarget)[0].token, false);
    EXPECT_TRUE(Loads().empty());
    EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
    EXPECT_EQ(core_->consumer_state(t), ConsumerState::kCancelling);
    ASSERT_EQ(rec_.Sent(MsgTag::kCancel).size(), 1u);
    // The CANCEL's own completion failing releases nothing either.
    Done(rec_.Sent(MsgTag::kCancel)[0].token, false);
    EXPECT_EQ(core_->consumer_state(t), ConsumerState::kCancelling);
    EXPECT_TRUE(Loads().empty());
    if (c.end == 0) {
      Deliver(kP, Signal(MsgTag::kCancelAck, t));
      auto loads = Loads();
      ASSERT_EQ(loads.size(), 1u);
      EXPECT_EQ(loads[0].status.code(), StatusCode::kPeerGone);
      EXPECT_NE(loads[0].status.message().find("could not reach the prefill instance"),
                std::string::npos);
      EXPECT_FALSE(loads[0].quarantined);
    } else if (c.end == 1) {
      Deliver(kP, KvReady(t));  // P got the target and finished: the KV is whole and verified
      auto loads = Loads();
      ASSERT_EQ(loads.size(), 1u);
      EXPECT_TRUE(loads[0].status.ok());
    } else {
      Advance(milliseconds(210));
      auto loads = Loads();
      ASSERT_EQ(loads.size(), 1u);
      EXPECT_TRUE(loads[0].quarantined);
      EXPECT_EQ(loads[0].status.code(), StatusCode::kPeerGone);
      EXPECT_EQ(core_->consumer_state(t), ConsumerState::kQuarantined);
      EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
      Deliver(kP, Signal(MsgTag::kCancelAck, t));
      ASSERT_EQ(rec_.Of(Action::kRelease).size(), 1u);
      EXPECT_EQ(Loads().size(), 1u);
    }
    EXPECT_EQ(core_->num_consumers(), 0u);
  }
}

TEST_F(ConsumerTest, DuplicateTransferIdIsRefusedWithoutTouchingTheFirst) {
  const std::string t = Tid(20);
  StartConsumer(1, t, Mode::kPush);
  StartConsumer(2, t, Mode::kPush, 0, 10, 10, {11, 12, 13});
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].seq_id, 2);
  EXPECT_EQ(loads[0].status.code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(rec_.Sent(MsgTag::kPushTarget).size(), 1u);  // only the first announced targets
  Deliver(kP, KvReady(t));
  ASSERT_EQ(Loads().size(), 2u);
  EXPECT_EQ(Loads()[1].seq_id, 1);
  EXPECT_TRUE(Loads()[1].status.ok());
}

TEST_F(ConsumerTest, RequestsThatCannotAskForKvEndAtOnce) {
  // No handshake with P (empty engine id, unknown endpoint).
  ConsumerStartEvent ev;
  ev.seq_id = 1;
  ev.params.mode = Mode::kPush;
  ev.params.transfer_id = Tid(30);
  ev.params.remote_host = "10.0.0.9";
  ev.params.remote_port = 8100;
  ev.num_prompt_tokens = 10;
  ev.blocks = {8, 9, 10};
  ev.external_tokens = 10;
  ev.arrival_ns = clock_.NowNanos();
  core_->HandleEvent(ev);
  ASSERT_EQ(Loads().size(), 1u);
  EXPECT_EQ(Loads()[0].status.code(), StatusCode::kFailedPrecondition);
  // Known endpoint: resolved to P's engine id.
  peers_.endpoints["10.0.0.9:8100"] = kP;
  ev.seq_id = 2;
  ev.params.transfer_id = Tid(31);
  ev.blocks = {8, 9, 10};
  core_->HandleEvent(ev);
  ASSERT_EQ(rec_.Sent(MsgTag::kPushTarget).size(), 1u);
  EXPECT_EQ(rec_.Sent(MsgTag::kPushTarget)[0].peer, kP);
  // More blocks than one transfer may name (kMaxTransferBlocks), push and pull: refused before
  // anything is sent. Any fewer go in parts (transfer_core_long_test.cc).
  const int32_t over = static_cast<int32_t>(kMaxTransferBlocks) + 1;
  std::vector<BlockId> many(static_cast<size_t>(over), 1);
  StartConsumer(3, Tid(32), Mode::kPush, 0, over * 4, over * 4, many);
  StartConsumer(4, Tid(33), Mode::kPull, 0, over * 4, over * 4, many);
  EXPECT_EQ(rec_.Sent(MsgTag::kPushTarget).size(), 1u);
  EXPECT_EQ(rec_.Sent(MsgTag::kPin).size(), 0u);
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 3u);
  EXPECT_EQ(loads[1].status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(loads[2].status.code(), StatusCode::kInvalidArgument);
}

TEST_F(ConsumerTest, ARequestThatWaitedOutTheWatchdogInTheQueueAsksForNothing) {
  for (Mode mode : {Mode::kPush, Mode::kPull}) {
    rec_.Clear();
    ConsumerStartEvent ev;
    ev.seq_id = 1;
    ev.params.mode = mode;
    ev.params.transfer_id = Tid(mode == Mode::kPush ? 40 : 41);
    ev.params.remote_engine_id = kP;
    ev.num_prompt_tokens = 10;
    ev.blocks = {8, 9, 10};
    ev.external_tokens = 10;
    ev.arrival_ns = clock_.NowNanos() - 600'000'000;  // arrived 600 ms ago; watchdog 500 ms
    core_->HandleEvent(ev);
    ASSERT_EQ(Loads().size(), 1u);
    EXPECT_EQ(Loads()[0].status.code(), StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(rec_.Sent(MsgTag::kPushTarget).empty());
    EXPECT_TRUE(rec_.Sent(MsgTag::kPin).empty());
    // Push tells P to drop the transfer; pull frees P's lease.
    EXPECT_EQ(rec_.Sent(MsgTag::kTransferFailed).size(), mode == Mode::kPush ? 1u : 0u);
    EXPECT_EQ(rec_.Sent(MsgTag::kRelease).size(), mode == Mode::kPull ? 1u : 0u);
  }
  EXPECT_EQ(core_->stats().watchdog_expired, 2);
}

TEST_F(ConsumerTest, AbortWhileWaitingReleasesTheBlocksOnlyWhenNothingCanLand) {
  const std::string t = Tid(50);
  StartConsumer(1, t, Mode::kPush);
  AbortConsumer(1, t);
  EXPECT_EQ(rec_.Sent(MsgTag::kCancel).size(), 1u);
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  AbortConsumer(1, t);  // twice: nothing more
  EXPECT_EQ(rec_.Sent(MsgTag::kCancel).size(), 1u);
  Deliver(kP, Signal(MsgTag::kCancelAck, t));
  ASSERT_EQ(rec_.Of(Action::kRelease).size(), 1u);
  EXPECT_EQ(rec_.Of(Action::kRelease)[0].seq_id, 1);
  EXPECT_TRUE(Loads().empty());  // an aborted request gets no load result
  AbortConsumer(2, Tid(51));     // its load already ended: released at once
  EXPECT_EQ(rec_.Count(Action::kRelease), 2u);
}

TEST_F(ConsumerTest, NotNeededAndRejectedTellTheProducer) {
  struct Case {
    const char* name;
    bool rejected;  ///< ConsumerRejectedEvent, else ConsumerNotNeededEvent
    Mode mode;
    const char* engine;
    MsgTag expect;
    bool sent;
  };
  const Case cases[] = {
      {"full prefix hit, push", false, Mode::kPush, kP, MsgTag::kNotNeeded, true},
      {"full prefix hit, pull", false, Mode::kPull, kP, MsgTag::kRelease, true},
      {"refused at admission, push", true, Mode::kPush, kP, MsgTag::kTransferFailed, true},
      {"refused at admission, pull", true, Mode::kPull, kP, MsgTag::kRelease, true},
      {"never handshaken: nobody to tell", true, Mode::kPush, "nobody", MsgTag::kTransferFailed,
       false},
  };
  int n = 60;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    pd::KvTransferParams params;
    params.mode = c.mode;
    params.transfer_id = Tid(++n);
    params.remote_engine_id = c.engine;
    if (c.rejected) {
      core_->HandleEvent(ConsumerRejectedEvent{params});
    } else {
      core_->HandleEvent(ConsumerNotNeededEvent{params});
    }
    auto sent = rec_.Sent(c.expect);
    ASSERT_EQ(sent.size(), c.sent ? 1u : 0u);
    if (c.sent) {
      EXPECT_EQ(sent[0].msg.transfer_id, Tid(n));
    }
  }
  EXPECT_EQ(core_->stats().not_needed, 2);
}

// ---- pull ----

TEST_F(ConsumerTest, FastPullReadsWhatPPinnedVerifiesAndReleases) {
  const std::string t = Tid(70);
  StartConsumer(1, t, Mode::kPull);
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kPinSent);
  auto pins = rec_.Sent(MsgTag::kPin);
  ASSERT_EQ(pins.size(), 1u);
  EXPECT_EQ(pins[0].msg.first_block, 0u);
  EXPECT_EQ(pins[0].msg.num_blocks, 3u);
  Deliver(kP, Pinned(t));
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kReading);
  auto posts = rec_.Of(Action::kPost);
  ASSERT_EQ(posts.size(), 1u);
  EXPECT_EQ(posts[0].order.op, xfer::Op::kRead);
  ASSERT_EQ(posts[0].order.local_indices.size(), 12u);  // 3 blocks x 2 layers x K,V
  EXPECT_EQ(posts[0].order.local_indices[0], TransferCore::EntryIndex(16, 0, KvKind::kKey, 8));
  EXPECT_EQ(posts[0].order.remote_indices[0], TransferCore::EntryIndex(16, 0, KvKind::kKey, 1));
  EXPECT_TRUE(rec_.Sent(MsgTag::kRelease).empty());  // not while the READ runs
  Done(posts[0].token);
  ASSERT_EQ(rec_.Sent(MsgTag::kRelease).size(), 1u);
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_TRUE(loads[0].status.ok());
  ASSERT_TRUE(loads[0].first_token.has_value());  // fast: P's token from PINNED
  EXPECT_EQ(loads[0].first_token->logprob, -0.25f);
  auto s = core_->stats();
  EXPECT_EQ(s.reads_completed, 1);
  EXPECT_EQ(s.pins_sent, 1);
  EXPECT_EQ(s.blocks_verified, 3);
}

TEST_F(ConsumerTest, VllmPullHandsTheReadToTheEngineThread) {
  const std::string t = Tid(71);
  StartConsumer(1, t, Mode::kPull, 0, 9, 10, {8, 9, 10},
                pd::PullProfile::kVllm);  // vllm: last token recomputed
  Deliver(kP, Pinned(t));
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kReadHanded);
  auto handed = rec_.Of(Action::kHandRead);
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(handed[0].read.local, (std::vector<BlockId>{8, 9, 10}));
  EXPECT_EQ(handed[0].read.remote, (std::vector<int32_t>{1, 2, 3}));
  ReadPostedEvent ev;
  ev.transfer_id = t;
  ev.transfer = 555;
  core_->HandleEvent(ev);
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kReading);
  Done(555);
  auto loads = Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_TRUE(loads[0].status.ok());
  EXPECT_FALSE(loads[0].first_token.has_value());  // vllm: D recomputes the last token
  ev.transfer = 556;
  core_->HandleEvent(ev);  // a READ posted for a consumer that is gone is cancelled
  ASSERT_EQ(rec_.Of(Action::kCancel).size(), 1u);
  EXPECT_EQ(rec_.Of(Action::kCancel)[0].token, 556u);
}

TEST_F(ConsumerTest, PullFailurePaths) {
  struct Case {
    const char* name;
    int what;
    StatusCode code;
  };
  // 0: PINNED names another range; 1: READ fails; 2: READ lands corrupt; 3: READ cannot be
  // posted; 4: the engine thread could not post it (vllm); 5: P forgotten before the READ.
  const Case cases[] = {
      {"pinned range differs", 0, StatusCode::kDataLoss},
      {"READ failed", 1, StatusCode::kPeerGone},
      {"checksum mismatch", 2, StatusCode::kDataLoss},
      {"READ not posted", 3, StatusCode::kUnavailable},
      {"engine thread could not post", 4, StatusCode::kInternal},
      {"prefill instance forgotten", 5, StatusCode::kNotFound},
  };
  int n = 80;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    rec_.post_error = Status::Ok();
    peers_.peers[kP] = PeerView{16};
    const std::string t = Tid(++n);
    StartConsumer(n, t, Mode::kPull, 0, 10, 10, {8, 9, 10},
                  c.what == 4 ? pd::PullProfile::kVllm : pd::PullProfile::kFast);
    PdMessage pinned = Pinned(t);
    if (c.what == 0) pinned.block_ids = {1, 2};
    if (c.what == 2) pinned.kv_digest ^= 1;
    if (c.what == 3) rec_.post_error = Unavailable("no");
    if (c.what == 5) peers_.peers.erase(kP);
    Deliver(kP, pinned);
    if (c.what == 1 || c.what == 2) DrainPosts(c.what == 2);
    if (c.what == 4) {
      ReadPostedEvent ev;
      ev.transfer_id = t;
      ev.error = Internal("post");
      core_->HandleEvent(ev);
    }
    auto loads = Loads();
    ASSERT_EQ(loads.size(), 1u);
    EXPECT_EQ(loads[0].status.code(), c.code) << loads[0].status.ToString();
    EXPECT_FALSE(loads[0].first_token.has_value());
    EXPECT_EQ(rec_.Sent(MsgTag::kRelease).size(), 1u);  // P frees its lease whatever happened
  }
}

TEST_F(ConsumerTest, UnexpectedPinnedIsABadMessage) {
  const std::string t = Tid(90);
  StartConsumer(1, t, Mode::kPush);
  Deliver(kP, Pinned(t));  // push consumer
  const std::string u = Tid(91);
  StartConsumer(2, u, Mode::kPull);
  Deliver(kP, Pinned(u));
  Deliver(kP, Pinned(u));   // a second one while reading
  Deliver(kP, KvReady(u));  // KV_READY for a pull consumer: ignored
  EXPECT_EQ(core_->stats().bad_messages, 2);
  EXPECT_EQ(core_->consumer_state(u), ConsumerState::kReading);
}

TEST_F(ConsumerTest, PullWatchdog) {
  struct Case {
    const char* name;
    pd::PullProfile profile;
    int stage;  // 0: no PINNED yet; 1: READ posted; 2: READ handed, posted after the watchdog
  };
  const Case cases[] = {
      {"PIN unanswered: ends at once", pd::PullProfile::kFast, 0},
      {"READ running: cancelled, ends when it ends", pd::PullProfile::kFast, 1},
      {"READ handed to the engine: cancelled once posted", pd::PullProfile::kVllm, 2},
  };
  int n = 100;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    const std::string t = Tid(++n);
    StartConsumer(n, t, Mode::kPull, 0, 10, 10, {8, 9, 10}, c.profile);
    if (c.stage >= 1) Deliver(kP, Pinned(t));
    Advance(milliseconds(510));
    if (c.stage == 0) {
      ASSERT_EQ(Loads().size(), 1u);
      EXPECT_EQ(Loads()[0].status.code(), StatusCode::kDeadlineExceeded);
      EXPECT_EQ(rec_.Sent(MsgTag::kRelease).size(), 1u);
      continue;
    }
    EXPECT_EQ(core_->consumer_state(t), ConsumerState::kCancelling);
    EXPECT_TRUE(Loads().empty());
    TransferToken read = 0;
    if (c.stage == 1) {
      ASSERT_EQ(rec_.Of(Action::kCancel).size(), 1u);
      read = rec_.Of(Action::kPost)[0].token;
    } else {
      ReadPostedEvent ev;
      ev.transfer_id = t;
      ev.transfer = read = 900 + static_cast<TransferToken>(n);
      core_->HandleEvent(ev);
      ASSERT_EQ(rec_.Of(Action::kCancel).size(), 1u);
      EXPECT_EQ(rec_.Of(Action::kCancel)[0].token, read);
    }
    Done(read, false);
    ASSERT_EQ(Loads().size(), 1u);
    EXPECT_FALSE(Loads()[0].status.ok());
    EXPECT_EQ(rec_.Sent(MsgTag::kRelease).size(), 1u);
  }
}

TEST_F(ConsumerTest, PullAbort) {
  for (int stage = 0; stage < 2; ++stage) {
    SCOPED_TRACE(stage == 0 ? "before the READ" : "during the READ");
    rec_.Clear();
    const std::string t = Tid(110 + stage);
    StartConsumer(1, t, Mode::kPull);
    if (stage == 1) Deliver(kP, Pinned(t));
    AbortConsumer(1, t);
    if (stage == 0) {
      EXPECT_EQ(rec_.Count(Action::kRelease), 1u);  // nothing can land: released at once
    } else {
      EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
      EXPECT_EQ(rec_.Count(Action::kCancel), 1u);
      DrainPosts(false);
      EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
    }
    EXPECT_TRUE(Loads().empty());
    EXPECT_EQ(rec_.Sent(MsgTag::kRelease).size(), 1u);
  }
}

TEST_F(ConsumerTest, MessagesForUnknownTransfersAreIgnored) {
  Deliver(kP, KvReady(Tid(120)));
  Deliver(kP, Signal(MsgTag::kCancelAck, Tid(120)));
  Deliver(kP, Pinned(Tid(120)));
  EXPECT_TRUE(rec_.log.empty());
  EXPECT_TRUE(Loads().empty());
  EXPECT_FALSE(core_->busy());
}

TEST(MakeReadOrder, PairsEveryLayerKAndVAndRefusesBadBlockLists) {
  KvLayout L;
  L.num_layers = 2;
  L.num_kv_heads = 1;
  L.head_dim = 4;
  L.block_size = 4;
  L.num_blocks = 16;
  const std::vector<BlockId> local = {3, 4};
  auto ok = MakeReadOrder(L, kP, 8, local, std::vector<int32_t>{7, 0});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->op, xfer::Op::kRead);
  ASSERT_EQ(ok->local_indices.size(), 8u);
  EXPECT_EQ(ok->local_indices[7], TransferCore::EntryIndex(16, 1, KvKind::kValue, 4));
  EXPECT_EQ(ok->remote_indices[7], TransferCore::EntryIndex(8, 1, KvKind::kValue, 0));
  EXPECT_EQ(MakeReadOrder(L, kP, 8, local, std::vector<int32_t>{7}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeReadOrder(L, kP, 8, {}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeReadOrder(L, kP, 8, local, std::vector<int32_t>{7, 8}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeReadOrder(L, kP, 8, local, std::vector<int32_t>{-1, 0}).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpush::connector::test
