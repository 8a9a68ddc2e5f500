// TransferCore when P's engine admits a prefill request again after preempting it (a pull
// prefill may be preempted; a push one never is): the transfer goes on with the request's new
// blocks. Before, the second ProducerStartEvent was taken for a duplicate transfer id: the
// request was aborted and the transfer's producer, cut off from its engine's end, was never
// released nor expired (the chaos run with 64-block pools).
#include <gtest/gtest.h>

#include "connector/transfer_core.h"
#include "core_fakes.h"

namespace kvpush::connector::test {
namespace {

using Mode = pd::KvTransferParams::Mode;
using std::chrono::milliseconds;

class ReadmitTest : public CoreTest {};

TEST_F(ReadmitTest, APreemptedPullPrefillAdmittedAgainKeepsItsTransfer) {
  const std::string t = Tid(1);
  StartProducer(7, t, Mode::kPull, 10, {1, 2, 3});
  StartProducer(7, t, Mode::kPull, 10, {4, 5, 6});  // preempted, admitted again
  EXPECT_EQ(rec_.Count(Action::kAbort), 0u);
  EXPECT_EQ(core_->num_producers(), 1u);
  FinishProducer(7, true, {4, 5, 6});
  EXPECT_EQ(core_->producer_state(t), ProducerState::kHeld);
  Deliver(kD, Pin(t));
  auto pinned = rec_.Sent(MsgTag::kPinned);
  ASSERT_EQ(pinned.size(), 1u);
  EXPECT_EQ(pinned[0].msg.block_ids, std::vector<int32_t>({4, 5, 6}));  // the blocks it ended in
  Deliver(kD, Signal(MsgTag::kRelease, t));
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(core_->num_producers(), 0u);
}

TEST_F(ReadmitTest, ALeaseStillExpiresAfterTheRequestWasAdmittedAgain) {
  const std::string t = Tid(1);
  StartProducer(7, t, Mode::kPull);
  StartProducer(7, t, Mode::kPull);
  FinishProducer(7);
  Advance(milliseconds(1001));
  EXPECT_EQ(core_->stats().leases_expired, 1);
  EXPECT_EQ(rec_.Count(Action::kRelease), 1u);
  EXPECT_EQ(core_->num_producers(), 0u);
}

TEST_F(ReadmitTest, AnotherRequestWithTheSameTransferIdIsStillDropped) {
  const std::string t = Tid(1);
  StartProducer(7, t, Mode::kPull);
  StartProducer(8, t, Mode::kPull);  // a duplicate id: this one is aborted, the first goes on
  auto aborts = rec_.Of(Action::kAbort);
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts[0].seq_id, 8);
  FinishProducer(8, false);
  FinishProducer(7);
  EXPECT_EQ(core_->producer_state(t), ProducerState::kHeld);
  EXPECT_EQ(core_->num_producers(), 1u);
}

}  // namespace
}  // namespace kvpush::connector::test
