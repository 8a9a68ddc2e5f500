// TransferCore and a broken but alive peer (issue 26; docs/reliability.md, *Quarantine*): D asks
// a quarantined transfer's P again and again — CANCEL over the transfer engine, and the
// liveness query over P's HTTP port (/kv/transfer_status) — and a definitive answer (CANCEL_ACK,
// TRANSFER_FAILED, a late KV_READY, "settled") ends the quarantine; P alive and silent for
// broken_peer_ms gets its connection fenced, once, and every quarantine of that connection ends
// only when the transport confirms the fence; a transport that cannot fence keeps the blocks
// until P answers or dies. P's side: a push target is written only over the connection it came
// over, and a status query cancels and answers. Fake clock, fake peers and transport, recorded
// actions.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "connector/transfer_core.h"
#include "core_fakes.h"

namespace kvpush::connector::test {
namespace {

using Mode = pd::KvTransferParams::Mode;
using std::chrono::milliseconds;

constexpr uint64_t kConn = 41;  // D's connection to P while the requests start

class BrokenPeerTest : public CoreTest {
 protected:
  BrokenPeerTest() {
    config_.broken_peer = milliseconds(1000);  // watchdog 500, cancel_ack 200 (CoreTest)
    Rebuild();
    peers_.peers[kP] = PeerView{16, 7, kConn};
    consumer_host_ = "10.0.0.2";  // P's HTTP address, from the D leg's kv_transfer_params
    consumer_port_ = 8100;
  }

  /// The liveness queries asked so far.
  std::vector<Action> Queries() const { return rec_.Of(Action::kQuery); }

  /// Answers the latest query: every id it asked `settled` (true) or "pending" (false); or,
  /// with `error`, no answer (P unreachable).
  void Answer(bool settled, const Status& error = Status::Ok()) {
    ASSERT_FALSE(Queries().empty());
    const Action q = Queries().back();
    TransferStatusEvent ev;
    ev.peer = q.peer;
    ev.query = q.query;
    if (error.ok()) {
      TransferStatusAnswer a;
      for (const std::string& id : q.query.transfer_ids) a.settled[id] = settled;
      ev.answer = a;
    } else {
      ev.answer = error;
    }
    core_->HandleEvent(ev);
  }

  /// Starts push consumer `seq` and runs the clock until it is quarantined (watchdog 500 ms,
  /// then the cancel deadline, 200 ms: 720 ms on the 10 ms tick).
  void StartAndQuarantine(int64_t seq, const std::string& tid) {
    StartConsumer(seq, tid, Mode::kPush);
    Advance(milliseconds(510));
    Advance(milliseconds(210));
    ASSERT_EQ(core_->consumer_state(tid), ConsumerState::kQuarantined);
  }

  /// The fences asked for so far.
  std::vector<Action> Fences() const { return rec_.Of(Action::kFence); }

  /// Release actions for request `seq`.
  size_t Releases(int64_t seq) const {
    size_t n = 0;
    for (const Action& a : rec_.Of(Action::kRelease)) n += a.seq_id == seq ? 1 : 0;
    return n;
  }
};

TEST_F(BrokenPeerTest, ADefinitiveAnswerBeforeTheBoundEndsTheQuarantineWithoutAFence) {
  struct Case {
    const char* name;
    MsgTag answer;
  };
  const Case cases[] = {{"CANCEL_ACK: no WRITE outstanding", MsgTag::kCancelAck},
                        {"TRANSFER_FAILED", MsgTag::kTransferFailed},
                        {"late KV_READY", MsgTag::kKvReady},
                        {"\"settled\" over HTTP", MsgTag::kRelease}};  // kRelease: the query
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    Rebuild();
    const std::string t = Tid(++n);
    StartAndQuarantine(n, t);
    // Asked over HTTP at once (the query stays in flight: P does not answer it here).
    ASSERT_EQ(Queries().size(), 1u);
    EXPECT_EQ(Queries()[0].peer, kP);
    EXPECT_EQ(Queries()[0].host, "10.0.0.2");
    EXPECT_EQ(Queries()[0].port, 8100);
    EXPECT_EQ(Queries()[0].query.transfer_ids, std::vector<std::string>{t});
    const size_t asked = rec_.Sent(MsgTag::kCancel).size();
    // D asks again over the transfer engine while P is silent: after 200 ms, then 400 more.
    Advance(milliseconds(210));
    Advance(milliseconds(400));
    EXPECT_EQ(rec_.Sent(MsgTag::kCancel).size(), asked + 2);
    EXPECT_EQ(rec_.Sent(MsgTag::kCancel).back().peer, kP);
    EXPECT_EQ(Queries().size(), 1u) << "a second query while one is in flight";
    Advance(milliseconds(300));  // 910 ms of quarantine: within the bound
    EXPECT_TRUE(Fences().empty());
    if (c.answer == MsgTag::kRelease) {
      Answer(true);
    } else {
      Deliver(kP, c.answer == MsgTag::kKvReady ? KvReady(t) : Signal(c.answer, t));
    }
    EXPECT_EQ(Releases(n), 1u);
    EXPECT_EQ(core_->num_consumers(), 0u);
    Advance(milliseconds(2000));  // past the bound: nothing left to fence
    EXPECT_TRUE(Fences().empty());
    auto s = core_->stats();
    EXPECT_EQ(s.peers_fenced, 0);
    EXPECT_EQ(s.quarantines_released, 1);
    EXPECT_EQ(s.blocks_quarantined, 0);
    EXPECT_EQ(s.status_queries, 1);
    EXPECT_EQ(s.status_settled, c.answer == MsgTag::kRelease ? 1 : 0);
  }
}

TEST_F(BrokenPeerTest, TheLivenessQueryAsksAgainUntilPAnswersSettled) {
  // The observed case's fix: P's posts all fail, so its CANCEL_ACKs never leave, but it
  // answers over HTTP. Two quarantines of one P are asked about in one query.
  const std::string t1 = Tid(11), t2 = Tid(12);
  StartConsumer(11, t1, Mode::kPush);
  StartConsumer(12, t2, Mode::kPush);
  Advance(milliseconds(510));
  Advance(milliseconds(210));  // 720: both quarantined
  ASSERT_EQ(Queries().size(), 1u);
  std::vector<std::string> ids = Queries()[0].query.transfer_ids;
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<std::string>{t1, t2}));
  EXPECT_TRUE(Queries()[0].query.engine_id.empty()) << "the shell names itself";
  Answer(false, Unavailable("connection refused"));  // no answer: asked again after 200 ms
  Advance(milliseconds(100));
  EXPECT_EQ(Queries().size(), 1u);
  Advance(milliseconds(110));
  ASSERT_EQ(Queries().size(), 2u);
  Answer(false);  // "pending": a WRITE of them has not settled; asked again after 400 ms
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  Advance(milliseconds(300));
  EXPECT_EQ(Queries().size(), 2u);
  Advance(milliseconds(110));
  ASSERT_EQ(Queries().size(), 3u);
  // An answer about an id of another peer's consumer, or from another peer, changes nothing.
  TransferStatusEvent other;
  other.peer = kD;
  other.query = Queries().back().query;
  TransferStatusAnswer all;
  for (const auto& id : other.query.transfer_ids) all.settled[id] = true;
  other.answer = all;
  core_->HandleEvent(other);
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  Answer(true);
  EXPECT_EQ(Releases(11), 1u);
  EXPECT_EQ(Releases(12), 1u);
  EXPECT_EQ(core_->num_consumers(), 0u);
  auto s = core_->stats();
  EXPECT_EQ(s.status_queries, 3);
  EXPECT_EQ(s.status_settled, 2);
  EXPECT_EQ(s.quarantines_released, 2);
  EXPECT_EQ(s.peers_fenced, 0);
  Advance(milliseconds(2000));
  EXPECT_EQ(Queries().size(), 3u);
  EXPECT_TRUE(Fences().empty());
}

TEST_F(BrokenPeerTest, NoLivenessQueryWithoutPsAddressOrWithAuthentication) {
  consumer_port_ = 0;  // a D leg that named P only by engine id
  StartAndQuarantine(13, Tid(13));
  Advance(milliseconds(500));
  EXPECT_TRUE(Queries().empty());
  // --kv-auth-key-file: the HTTP answer would not be authenticated.
  consumer_port_ = 8100;
  auto auth = PeerAuth::FromKey(std::vector<uint8_t>(32, 7));
  ASSERT_TRUE(auth.ok()) << auth.status().ToString();
  core_->set_auth(auth->get());
  StartAndQuarantine(14, Tid(14));
  Advance(milliseconds(500));
  EXPECT_TRUE(Queries().empty());
  core_->set_auth(nullptr);
}

TEST_F(BrokenPeerTest, APeerSilentPastTheBoundIsFencedOnceAndReleasedOnlyOnceTheFenceIsConfirmed) {
  // The observed case: P alive (its /health fine) but every post of it fails, so D's CANCELs
  // reach it and its CANCEL_ACKs never come back. Three quarantines on one connection, then a
  // request on P's next connection.
  const std::string t1 = Tid(1), t2 = Tid(2), t3 = Tid(3), t4 = Tid(4);
  StartConsumer(1, t1, Mode::kPush);  // 0 ms
  Advance(milliseconds(510));         // 510: t1's watchdog, CANCEL
  StartConsumer(2, t2, Mode::kPush);
  Advance(milliseconds(210));  // 720: t1 quarantined
  StartConsumer(3, t3, Mode::kPush);
  Advance(milliseconds(300));  // 1020: t2's watchdog
  Advance(milliseconds(210));  // 1230: t2 quarantined, t3's watchdog
  Advance(milliseconds(480));  // 1710: t3 quarantined; t1 990 ms into its quarantine
  EXPECT_TRUE(Fences().empty());
  EXPECT_EQ(core_->stats().consumers_quarantined, 3);
  Advance(milliseconds(20));  // 1730: t1's bound (1720) passed
  ASSERT_EQ(Fences().size(), 1u);
  EXPECT_EQ(Fences()[0].peer, kP);
  EXPECT_EQ(Fences()[0].token, kConn);
  EXPECT_EQ(core_->stats().peers_fenced, 1);
  // As the transport does: P dropped here (no evidence of its death), then the next request's
  // handshake connects again (connection 42).
  peers_.peers[kP].connection = 42;
  StartConsumer(4, t4, Mode::kPush);
  // Nothing is released before the transport confirms that nothing of P can land any more.
  Advance(milliseconds(300));
  Advance(milliseconds(5000));  // t4 cancelling meanwhile (its watchdog)
  EXPECT_EQ(Fences().size(), 1u) << "fenced once per connection, not per quarantine";
  EXPECT_EQ(rec_.Count(Action::kRelease), 0u);
  EXPECT_EQ(core_->consumer_state(t1), ConsumerState::kQuarantined);
  EXPECT_EQ(core_->consumer_state(t2), ConsumerState::kQuarantined);
  EXPECT_EQ(core_->consumer_state(t3), ConsumerState::kQuarantined);
  EXPECT_EQ(core_->stats().blocks_quarantined, 9);
  const size_t loads_before = Loads().size();
  EXPECT_EQ(loads_before, 3u);
  peers_.fenced.insert({kP, kConn});
  Advance(milliseconds(20));
  EXPECT_EQ(Releases(1), 1u);
  EXPECT_EQ(Releases(2), 1u);
  EXPECT_EQ(Releases(3), 1u);
  EXPECT_EQ(Loads().size(), loads_before) << "quarantined loads were answered long ago";
  EXPECT_FALSE(core_->consumer_state(t1).has_value());
  EXPECT_FALSE(core_->consumer_state(t3).has_value());
  Advance(milliseconds(200));  // t4's cancel deadline: quarantined
  auto s = core_->stats();
  EXPECT_EQ(s.quarantines_released, 3);
  EXPECT_EQ(s.consumers_quarantined, 1);  // t4, on connection 42: the old fence is not its
  EXPECT_EQ(s.blocks_quarantined, 3);
  EXPECT_EQ(core_->consumer_state(t4), ConsumerState::kQuarantined);
  // t4's own bound: its connection is fenced in turn.
  Advance(milliseconds(1000));
  ASSERT_EQ(Fences().size(), 2u);
  EXPECT_EQ(Fences()[1].token, 42u);
  peers_.fenced.insert({kP, 42});
  Advance(milliseconds(20));
  EXPECT_EQ(Releases(4), 1u);
  EXPECT_EQ(core_->num_consumers(), 0u);
  EXPECT_EQ(core_->stats().peers_fenced, 2);
}

TEST_F(BrokenPeerTest, ALoadStillWaitingOnAFencedConnectionFailsByPolicy) {
  // t2 started before t1's bound; the fence confirmed ends its wait with peer_gone at once
  // (recompute or fail), not at its own watchdog.
  for (FailurePolicy policy : {FailurePolicy::kRecompute, FailurePolicy::kFail}) {
    SCOPED_TRACE(policy == FailurePolicy::kRecompute ? "recompute" : "fail");
    config_.failure_policy = policy;
    Rebuild();
    rec_.Clear();
    peers_.fenced.clear();
    StartAndQuarantine(1, Tid(1));
    Advance(milliseconds(950));
    StartConsumer(2, Tid(2), Mode::kPush);
    Advance(milliseconds(60));  // t1's bound
    ASSERT_EQ(Fences().size(), 1u);
    peers_.fenced.insert({kP, kConn});
    Advance(milliseconds(20));
    auto loads = Loads();
    ASSERT_EQ(loads.size(), 2u);  // t1's quarantine, t2 now
    EXPECT_EQ(loads[1].seq_id, 2);
    EXPECT_EQ(loads[1].status.code(), StatusCode::kPeerGone);
    EXPECT_NE(loads[1].status.message().find("treated as broken"), std::string::npos)
        << loads[1].status.ToString();
    EXPECT_FALSE(loads[1].quarantined);
    EXPECT_EQ(loads[1].recompute, policy == FailurePolicy::kRecompute);
    EXPECT_EQ(core_->num_consumers(), 0u);
  }
}

TEST_F(BrokenPeerTest, AnAnswerWhileTheFenceIsPendingStillEndsTheQuarantine) {
  const std::string t = Tid(5);
  StartAndQuarantine(5, t);
  Advance(milliseconds(1010));
  ASSERT_EQ(Fences().size(), 1u);
  Deliver(kP, Signal(MsgTag::kCancelAck, t));  // over the next connection, say
  EXPECT_EQ(Releases(5), 1u);
  EXPECT_EQ(core_->num_consumers(), 0u);
}

TEST_F(BrokenPeerTest, ATransportThatCannotFenceKeepsTheBlocksUntilPAnswersOrDies) {
  rec_.fence_error = Unimplemented("the ucx backend cannot fence a peer");
  const std::string t = Tid(6);
  StartAndQuarantine(6, t);
  Advance(milliseconds(1010));
  ASSERT_EQ(Fences().size(), 1u);
  for (int i = 0; i < 10; ++i) Advance(milliseconds(1000));
  EXPECT_EQ(Fences().size(), 1u) << "asked again after a refusal";
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kQuarantined);
  EXPECT_EQ(core_->stats().peers_fenced, 0);
  const size_t asked = rec_.Sent(MsgTag::kCancel).size();
  Advance(milliseconds(30000));
  EXPECT_GT(rec_.Sent(MsgTag::kCancel).size(), asked) << "D keeps asking P";
  peers_.failures[kP] = "process exited";
  Advance(milliseconds(20));
  EXPECT_EQ(Releases(6), 1u);
}

TEST_F(BrokenPeerTest, AConsumerWhoseConnectionIsUnknownIsNeverReleasedByAFence) {
  // No connection alive when the target went out (or it changed meanwhile): a fence of the
  // current one would not cover the WRITEs P may make for it.
  peers_.peers[kP].connection = 0;
  const std::string t = Tid(7);
  StartAndQuarantine(7, t);
  peers_.peers[kP].connection = kConn;
  Advance(milliseconds(1010));
  EXPECT_TRUE(Fences().empty());
  peers_.fenced.insert({kP, 0});
  peers_.fenced.insert({kP, kConn});
  Advance(milliseconds(5000));
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kQuarantined);
  Deliver(kP, Signal(MsgTag::kCancelAck, t));
  EXPECT_EQ(Releases(7), 1u);
}

TEST_F(BrokenPeerTest, AnUnsettledPullReadOfAFencedConnectionEndsWhenItSettles) {
  // Pull: D's own READ is what may still land; the fence (which cancels it in the transport)
  // does not end the quarantine by itself, the READ's settled end does.
  const std::string t = Tid(8);
  StartConsumer(8, t, Mode::kPull, 0, 10, 10, {8, 9, 10}, pd::PullProfile::kFast);
  Deliver(kP, Pinned(t));
  const TransferToken read = rec_.Of(Action::kPost).at(0).token;
  Advance(milliseconds(510));
  Advance(milliseconds(210));
  ASSERT_EQ(core_->consumer_state(t), ConsumerState::kQuarantined);
  Advance(milliseconds(1010));
  ASSERT_EQ(Fences().size(), 1u);
  peers_.fenced.insert({kP, kConn});
  Advance(milliseconds(20));
  EXPECT_EQ(core_->consumer_state(t), ConsumerState::kQuarantined);
  EXPECT_EQ(Releases(8), 0u);
  Done(read, false);
  EXPECT_EQ(Releases(8), 1u);
  EXPECT_EQ(rec_.Sent(MsgTag::kRelease).size(), 1u);
}

TEST_F(BrokenPeerTest, AStatusQueryCancelsAndAnswersSettledOnlyOnceNoWriteIsOutstanding) {
  const std::string t = Tid(30), unknown = Tid(31);
  StartProducer(30, t, Mode::kPush);
  Deliver(kD, Target(t));
  Step(30, 6);
  Layer(0);  // a WRITE in flight
  ASSERT_EQ(rec_.Count(Action::kPost), 1u);
  TransferStatusQuery q;
  q.engine_id = kD;
  q.transfer_ids = {t, unknown};
  TransferStatusAnswer a = core_->AnswerTransferStatus(q);
  EXPECT_EQ(a.settled, (std::map<std::string, bool>{{t, false}, {unknown, true}}));
  EXPECT_EQ(core_->producer_state(t), ProducerState::kDropping);
  EXPECT_EQ(rec_.Count(Action::kAbort), 1u) << "the prefill nobody needs is aborted";
  EXPECT_TRUE(core_->IsTombstoned(unknown));
  Done(rec_.Of(Action::kPost)[0].token);
  EXPECT_EQ(rec_.Sent(MsgTag::kCancelAck).size(), 2u);  // the unknown one at once, t now
  a = core_->AnswerTransferStatus(q);
  EXPECT_EQ(a.settled, (std::map<std::string, bool>{{t, true}, {unknown, true}}));
  // Nothing of either is written later: a target for the unknown id is refused.
  StartProducer(31, unknown, Mode::kPush);
  Deliver(kD, Target(unknown));
  Step(31, 10);
  Layer(0);
  FinishProducer(30);
  EXPECT_EQ(rec_.Count(Action::kPost), 1u);
}

TEST_F(BrokenPeerTest, AProducerWritesATargetOnlyOverTheConnectionItCameOver) {
  // P's side: D fenced the connection a target came over, then connected again; D may have
  // reused those blocks. A WRITE of that target over the new connection could land in them.
  peers_.peers[kD] = PeerView{16, 9, 5};
  struct Case {
    const char* name;
    int when;  // 0: target attached, D reconnects mid-prefill; 1: target waiting for its
               // request; 2: parts over two connections
  };
  const Case cases[] = {{"reconnect mid-prefill", 0},
                        {"reconnect before the request", 1},
                        {"parts over two connections", 2}};
  int n = 20;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rec_.Clear();
    Rebuild();
    peers_.peers[kD].connection = 5;
    const std::string t = Tid(++n);
    if (c.when == 0) {
      StartProducer(n, t, Mode::kPush);
      DeliverOver(kD, Target(t), 5);
      Step(n, 6);
      Layer(0);
      ASSERT_EQ(rec_.Count(Action::kPost), 1u) << "the target's own connection: written";
      Done(rec_.Of(Action::kPost)[0].token);
    } else if (c.when == 1) {
      DeliverOver(kD, Target(t), 5);
    } else {
      PdMessage part = Target(t);
      part.num_blocks = 3;
      part.block_ids = {5, 6};
      DeliverOver(kD, part, 5);
      part.part_offset = 2;
      part.block_ids = {7};
      DeliverOver(kD, part, 6);
      peers_.peers[kD].connection = 6;
    }
    if (c.when != 2) peers_.peers[kD].connection = 6;  // D fenced 5 and connected again
    if (c.when != 0) StartProducer(n, t, Mode::kPush);
    Step(n, 10);
    Layer(0);
    Layer(1);
    FinishProducer(n);
    EXPECT_EQ(rec_.Count(Action::kPost), c.when == 0 ? 1u : 0u)
        << "a WRITE went over another connection than the target's";
    auto failed = rec_.Sent(MsgTag::kTransferFailed);
    ASSERT_EQ(failed.size(), 1u);
    EXPECT_EQ(failed[0].msg.code, static_cast<uint8_t>(StatusCode::kPeerGone));
    EXPECT_NE(failed[0].msg.message.find("reconnected"), std::string::npos)
        << failed[0].msg.message;
    EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
    EXPECT_EQ(core_->num_producers(), 0u);
  }
}

}  // namespace
}  // namespace kvpush::connector::test
