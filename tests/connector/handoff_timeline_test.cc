// The handoff timeline (connector/handoff_timeline.h): what TransferCore records per transfer on
// P and D, in push and pull, with an injected clock; and the log's ring, JSON and histograms.
#include "connector/handoff_timeline.h"

#include <gtest/gtest.h>

#include "connector/transfer_core.h"
#include "core_fakes.h"

namespace kvpush::connector::test {
namespace {

using Mode = pd::KvTransferParams::Mode;
using P = HandoffPhase;
using std::chrono::microseconds;

class TimelineTest : public CoreTest {
 protected:
  int64_t Us(const HandoffRecord& r, P from, P to) const { return (r.at(to) - r.at(from)) / 1000; }
  void Tick(int us) { clock_.Advance(microseconds(us)); }
};

TEST_F(TimelineTest, LateTargetPushProducerRecordsEveryPhaseOnce) {
  const std::string t = Tid(1);
  StartProducer(1, t, Mode::kPush);
  Tick(300);
  FinishProducer(1);  // prefill done before the target
  Tick(50);
  Deliver(kD, Target(t));  // one WRITE, KV_READY as its notification
  Tick(20);
  EXPECT_TRUE(core_->TakeFinishedRecords().empty());
  Done(rec_.Of(Action::kPost)[0].token);
  auto records = core_->TakeFinishedRecords();
  ASSERT_EQ(records.size(), 1u);
  const HandoffRecord& r = records[0];
  EXPECT_EQ(r.transfer_id, t);
  EXPECT_TRUE(r.producer);
  EXPECT_TRUE(r.push);
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(Us(r, P::kProducerStart, P::kPrefillDone), 300);
  EXPECT_EQ(Us(r, P::kPrefillDone, P::kTargetAttached), 50);
  EXPECT_EQ(r.at(P::kFirstWritePosted), r.at(P::kLastWritePosted));
  EXPECT_EQ(r.at(P::kKvReadyPosted), r.at(P::kTargetAttached));
  EXPECT_EQ(Us(r, P::kFirstWritePosted, P::kWritesDone), 20);
  EXPECT_EQ(r.at(P::kWritesDone), r.at(P::kProducerEnd));
  EXPECT_EQ(r.writes, 1);
  EXPECT_EQ(r.write_notifications, 1);
  EXPECT_EQ(r.messages_sent, 0);      // nothing but the WRITE went to D
  EXPECT_EQ(r.messages_received, 1);  // the PUSH_TARGET
  EXPECT_EQ(r.blocks, 3);
  EXPECT_EQ(r.at(P::kConsumerStart), 0);  // D's phases are D's
  EXPECT_TRUE(core_->TakeFinishedRecords().empty());
}

TEST_F(TimelineTest, PushConsumerRecordsRequestArrivalAndVerification) {
  const std::string t = Tid(2);
  StartConsumer(1, t, Mode::kPush);
  Tick(400);
  Deliver(kP, KvReady(t));
  auto records = core_->TakeFinishedRecords();
  ASSERT_EQ(records.size(), 1u);
  const HandoffRecord& r = records[0];
  EXPECT_FALSE(r.producer);
  EXPECT_TRUE(r.push);
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.at(P::kConsumerStart), r.at(P::kRequestSent));
  EXPECT_EQ(Us(r, P::kRequestSent, P::kKvArrived), 400);
  EXPECT_NE(r.at(P::kVerified), 0);
  EXPECT_NE(r.at(P::kLoadFinished), 0);
  EXPECT_EQ(r.messages_sent, 1);  // PUSH_TARGET
  EXPECT_EQ(r.messages_received, 1);
  EXPECT_EQ(r.blocks, 3);
}

TEST_F(TimelineTest, FailedConsumerIsRecordedNotOk) {
  const std::string t = Tid(3);
  StartConsumer(1, t, Mode::kPush);
  PdMessage bad = KvReady(t);
  bad.kv_digest ^= 1;
  Deliver(kP, bad);
  auto records = core_->TakeFinishedRecords();
  ASSERT_EQ(records.size(), 1u);
  EXPECT_FALSE(records[0].ok);
  EXPECT_NE(records[0].at(P::kKvArrived), 0);
  EXPECT_EQ(records[0].at(P::kVerified), 0);
}

TEST_F(TimelineTest, PullFastConsumerAndProducer) {
  const std::string t = Tid(4);
  StartConsumer(1, t, Mode::kPull);
  Tick(100);
  Deliver(kP, Pinned(t));
  Tick(200);
  DrainPosts();  // the READ
  auto d = core_->TakeFinishedRecords();
  ASSERT_EQ(d.size(), 1u);
  EXPECT_FALSE(d[0].push);
  EXPECT_TRUE(d[0].ok);
  EXPECT_EQ(Us(d[0], P::kRequestSent, P::kPinnedReceived), 100);
  EXPECT_EQ(d[0].at(P::kPinnedReceived), d[0].at(P::kReadPosted));
  EXPECT_EQ(Us(d[0], P::kReadPosted, P::kKvArrived), 200);
  EXPECT_EQ(d[0].reads, 1);
  EXPECT_EQ(d[0].messages_sent, 2);  // PIN, RELEASE
  const std::string u = Tid(5);
  StartProducer(2, u, Mode::kPull);
  FinishProducer(2);
  Deliver(kD, Pin(u));
  Deliver(kD, Signal(MsgTag::kRelease, u));
  auto p = core_->TakeFinishedRecords();
  ASSERT_EQ(p.size(), 1u);
  EXPECT_TRUE(p[0].producer);
  EXPECT_TRUE(p[0].ok);
  EXPECT_NE(p[0].at(P::kPinAnswered), 0);
  EXPECT_EQ(p[0].messages_sent, 1);      // PINNED
  EXPECT_EQ(p[0].messages_received, 2);  // PIN, RELEASE
}

TEST(HandoffTimelineLog, KeepsTheNewestRecordsAndHistogramsOkOnes) {
  HandoffTimelineLog log(2);
  for (int i = 0; i < 3; ++i) {
    HandoffRecord r;
    r.transfer_id = Tid(i);
    r.producer = true;
    r.ok = i != 1;
    r.Mark(P::kProducerStart, 1'000'000);
    r.Mark(P::kPrefillDone, 1'000'000 + 300'000 * (i + 1));
    r.Mark(P::kTargetAttached, 500'000);  // before the prefill's end: no target_after_prefill
    log.Add(r);
  }
  const auto recent = log.Recent(10);
  ASSERT_EQ(recent.size(), 2u);
  EXPECT_EQ(recent[0]["transfer_id"], Tid(1));
  EXPECT_EQ(recent[1]["transfer_id"], Tid(2));
  EXPECT_EQ(recent[1]["role"], "prefill");
  EXPECT_EQ(recent[1]["mode"], "push");
  EXPECT_EQ(recent[1]["t_ns"]["prefill_done"], 1'900'000);
  EXPECT_FALSE(recent[1]["t_ns"].contains("kv_arrived"));
  EXPECT_EQ(log.Recent(1).size(), 1u);
  const auto series = log.Histograms();
  // Every interval and mode (empty ones too); only prefill_compute/push has observations:
  // records 0 and 2 (1 failed).
  ASSERT_EQ(series.size(), HandoffIntervals().size() * 2);
  for (const auto& sr : series) {
    if (sr.interval == "prefill_compute" && sr.mode == "push") {
      EXPECT_EQ(sr.histogram.count(), 2u);
      EXPECT_NEAR(sr.histogram.sum(), 0.0003 + 0.0009, 1e-12);
    } else {
      EXPECT_EQ(sr.histogram.count(), 0u) << sr.interval << " " << sr.mode;
    }
  }
}

TEST(HandoffTimelineLog, XferHistogramsCountTheOpsThisInstancePosted) {
  HandoffTimelineLog log(8);
  HandoffRecord p;  // P, push: its WRITEs count
  p.producer = true;
  p.push = true;
  p.ok = true;
  p.Mark(P::kFirstWritePosted, 1'000'000);
  p.Mark(P::kWritesDone, 3'000'000);
  p.descriptors = 16;
  p.bytes = 16 * 4096;
  p.post_ns = 40'000;
  log.Add(p);
  HandoffRecord d_push;  // D in push posted nothing: not counted
  d_push.producer = false;
  d_push.push = true;
  d_push.ok = true;
  d_push.Mark(P::kReadPosted, 1);
  d_push.Mark(P::kKvArrived, 2);
  log.Add(d_push);
  HandoffRecord d_pull;  // D, pull: its READ counts
  d_pull.producer = false;
  d_pull.push = false;
  d_pull.ok = true;
  d_pull.Mark(P::kReadPosted, 5'000'000);
  d_pull.Mark(P::kKvArrived, 5'500'000);
  d_pull.descriptors = 4;
  d_pull.bytes = 4 * 4096;
  log.Add(d_pull);
  HandoffRecord failed = d_pull;  // failed transfers are not histogrammed
  failed.ok = false;
  log.Add(failed);
  const HandoffTimelineLog::XferHistograms x = log.Xfers();
  EXPECT_EQ(x.xfer_time.count(), 2u);
  EXPECT_NEAR(x.xfer_time.sum(), 0.002 + 0.0005, 1e-12);
  EXPECT_NEAR(x.post_time.sum(), 0.00004, 1e-12);
  EXPECT_EQ(x.bytes.sum(), 20 * 4096);
  EXPECT_EQ(x.descriptors.sum(), 20);
  EXPECT_EQ(x.bytes.bounds().front(), 2048);
  EXPECT_EQ(x.bytes.bounds().back(), 8589934592.0);  // 2^33
}

TEST(HandoffTimelineLog, EveryPhaseHasAName) {
  for (size_t i = 0; i < kNumHandoffPhases; ++i) {
    EXPECT_STRNE(HandoffPhaseName(static_cast<HandoffPhase>(i)), "?");
  }
}

}  // namespace
}  // namespace kvpush::connector::test
