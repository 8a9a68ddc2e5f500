// Eager WRITEs (docs/xfer.md, "Eager WRITEs") between two agents in this process over a network
// backend that offers them (ucx:tcp, libfabric:tcp): exact data, the notification after it, the
// transfer done only once the target acknowledged the copy, the target's checks (a region it no
// longer has, a peer it dropped: nothing lands), and the size limit above which a WRITE goes by
// RMA as before.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "xfer/agent.h"
#include "xfer/backend_factory.h"
#include "xfer/fault_backend.h"

namespace kvpush::xfer {
namespace {

using std::chrono::milliseconds;

TimePoint In(milliseconds ms) {
  return SteadyClock::now() + ms;
}

constexpr uint64_t kRegion = 4u << 20;

class AgentEagerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { Connect(nullptr); }

  /// A new initiator and target (the target's transport behind `faults` when given), each with a
  /// region, that loaded each other's metadata.
  void Connect(const std::shared_ptr<FaultControls>& faults) {
    target_.reset();
    init_.reset();
    init_ = Make("prefill", milliseconds(10000));
    target_ = Make("decode", milliseconds(10000), faults);
    if (init_ == nullptr || target_ == nullptr) GTEST_SKIP() << GetParam() << " unavailable here";
    ASSERT_GT(init_->backend_caps().eager_write_max_bytes, 0u) << GetParam();
    src_ = init_->AllocateRegion(kRegion, MemoryType::kHost).value();
    dst_ = target_->AllocateRegion(kRegion, MemoryType::kHost).value();
    ASSERT_TRUE(init_->LoadRemoteMetadata(target_->ExportMetadata().value()).ok());
    ASSERT_TRUE(target_->LoadRemoteMetadata(init_->ExportMetadata().value()).ok());
    std::mt19937_64 rng(7);
    for (uint64_t i = 0; i < kRegion; i += 8) {
      const uint64_t v = rng();
      std::memcpy(src_.data + i, &v, 8);
    }
  }

  std::unique_ptr<Agent> Make(const std::string& name, milliseconds stall,
                              const std::shared_ptr<FaultControls>& faults = nullptr) {
    auto b = MakeBackend(GetParam());
    if (!b.ok()) return nullptr;
    std::unique_ptr<Backend> backend = std::move(b).value();
    if (faults != nullptr) backend = MakeFaultBackend(std::move(backend), faults);
    AgentOptions o;
    o.name = name;
    o.stall_timeout = stall;
    o.eager_write_max_bytes = 256 * 1024;
    return Agent::Create(o, std::move(backend)).value();
  }

  // A WRITE of `pieces` scattered pieces of `piece` bytes (local piece i -> remote slot 3i+1)
  // with `notification`.
  TransferHandle Write(int pieces, uint64_t piece, std::vector<uint8_t> notification) {
    std::vector<Desc> l, r;
    for (int i = 0; i < pieces; ++i) {
      l.push_back({src_.id, i * piece, piece});
      r.push_back({dst_.id, (3 * i + 1) * piece, piece});
    }
    auto ll = init_->PrepareLocal(l).value();
    auto rl = init_->PrepareRemote("decode", r).value();
    return init_->CreateTransfer({Op::kWrite, ll, {}, rl, {}, std::move(notification)}).value();
  }

  bool Landed(int pieces, uint64_t piece) const {
    for (int i = 0; i < pieces; ++i) {
      if (std::memcmp(dst_.data + (3 * i + 1) * piece, src_.data + i * piece, piece) != 0)
        return false;
    }
    return true;
  }

  bool TargetUntouched() const {
    for (uint64_t i = 0; i < kRegion; ++i) {
      if (dst_.data[i] != std::byte{0}) return false;
    }
    return true;
  }

  std::unique_ptr<Agent> init_, target_;
  AllocatedRegion src_, dst_;
};

TEST_P(AgentEagerTest, ASmallWriteIsOneExactFrameAndItsNotificationFollowsTheData) {
  const uint64_t ops_before = init_->backend_stats().ops;
  auto t = Write(10, 1024, {1, 2, 3});  // 10 KiB: under every backend's limit
  ASSERT_TRUE(init_->Post(t).ok());
  auto n = target_->WaitNotifications(1, In(milliseconds(10000)));
  ASSERT_EQ(n.size(), 1u);
  EXPECT_EQ(n[0].peer, "prefill");
  EXPECT_EQ(n[0].payload, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_TRUE(Landed(10, 1024)) << "the notification came before its data";
  auto st = init_->Wait(t, In(milliseconds(10000))).value();
  EXPECT_EQ(st.state, TransferState::kDone) << st.error.ToString();
  EXPECT_TRUE(st.settled);
  EXPECT_EQ(init_->backend_stats().ops, ops_before) << "an eager WRITE issues no RMA op";
  // Re-posting the same transfer works the same way.
  std::memset(dst_.data, 0, kRegion);
  ASSERT_TRUE(init_->Post(t).ok());
  ASSERT_EQ(target_->WaitNotifications(1, In(milliseconds(10000))).size(), 1u);
  EXPECT_TRUE(Landed(10, 1024));
  EXPECT_EQ(init_->Wait(t, In(milliseconds(10000)))->state, TransferState::kDone);
}

TEST_P(AgentEagerTest, AWriteAboveTheLimitOrWithoutANotificationGoesByRma) {
  const uint64_t limit = init_->backend_caps().eager_write_max_bytes;
  const uint64_t ops_before = init_->backend_stats().ops;
  auto big = Write(2, limit, {9});  // 2x the limit
  ASSERT_TRUE(init_->Post(big).ok());
  ASSERT_EQ(target_->WaitNotifications(1, In(milliseconds(10000))).size(), 1u);
  EXPECT_TRUE(Landed(2, limit));
  EXPECT_EQ(init_->Wait(big, In(milliseconds(10000)))->state, TransferState::kDone);
  EXPECT_GT(init_->backend_stats().ops, ops_before);
  const uint64_t ops_mid = init_->backend_stats().ops;
  auto silent = Write(1, 4096, {});  // no notification: nothing to carry
  ASSERT_TRUE(init_->Post(silent).ok());
  EXPECT_EQ(init_->Wait(silent, In(milliseconds(10000)))->state, TransferState::kDone);
  EXPECT_GT(init_->backend_stats().ops, ops_mid);
}

TEST_P(AgentEagerTest, ARegionTheTargetNoLongerHasFailsTheWriteWithTheTargetsAnswer) {
  auto t = Write(2, 1024, {5});
  ASSERT_TRUE(target_->DeregisterRegion(dst_.id).ok());
  ASSERT_TRUE(init_->Post(t).ok());
  auto st = init_->Wait(t, In(milliseconds(10000))).value();
  ASSERT_EQ(st.state, TransferState::kError);
  EXPECT_EQ(st.error.code(), StatusCode::kNotFound) << st.error.ToString();
  EXPECT_TRUE(st.settled);
  EXPECT_TRUE(target_->TakeNotifications().empty()) << "a refused frame delivered its notification";
  dst_.data = nullptr;  // freed with the region
}

TEST_P(AgentEagerTest, NothingLandsFromAPeerTheTargetDropped) {
  init_ = Make("prefill2", milliseconds(300));  // a fresh initiator with a short stall deadline
  auto src = init_->AllocateRegion(kRegion, MemoryType::kHost).value();
  ASSERT_TRUE(init_->LoadRemoteMetadata(target_->ExportMetadata().value()).ok());
  ASSERT_TRUE(target_->LoadRemoteMetadata(init_->ExportMetadata().value()).ok());
  std::memset(src.data, 0x5a, 4096);
  ASSERT_TRUE(target_->InvalidatePeer("prefill2", "test: dropped").ok());
  auto ll = init_->PrepareLocal(std::vector<Desc>{{src.id, 0, 4096}}).value();
  auto rl = init_->PrepareRemote("decode", std::vector<Desc>{{dst_.id, 0, 4096}}).value();
  auto t = init_->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {7}}).value();
  ASSERT_TRUE(init_->Post(t).ok());
  auto st = init_->Wait(t, In(milliseconds(10000))).value();
  EXPECT_EQ(st.state, TransferState::kError)
      << "the frame was acknowledged by a peer that dropped us";
  // Give a late frame every chance to land: it must not.
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE(target_->TakeNotifications().empty());
  EXPECT_TRUE(TargetUntouched());
}

// The target's ack cannot get out for a while (every post of its transport is refused: a broken
// but alive peer, as the chaos test makes one): the data and the notification landed, and the
// sender's WRITE stays in progress — never done without the ack — until the target's transport
// takes posts again, when the ack, tried again with a backoff, goes out and the WRITE is done.
// (Acks used to be given up after a few immediate retries: the WRITE then stayed in progress for
// good, its stall deadline moved on by the peer's other completions, and P's blocks with it.)
TEST_P(AgentEagerTest, AnAckTheTargetCannotPostForAWhileGoesOutOnceItCan) {
  auto faults = std::make_shared<FaultControls>();
  Connect(faults);
  faults->SetBroken(true);
  auto t = Write(4, 1024, {9});
  ASSERT_TRUE(init_->Post(t).ok());
  ASSERT_EQ(target_->WaitNotifications(1, In(milliseconds(10000))).size(), 1u);
  EXPECT_TRUE(Landed(4, 1024));
  std::this_thread::sleep_for(milliseconds(400));  // many retries refused meanwhile
  EXPECT_EQ(init_->GetStatus(t)->state, TransferState::kInProgress);
  faults->SetBroken(false);
  auto st = init_->Wait(t, In(milliseconds(3000))).value();
  EXPECT_EQ(st.state, TransferState::kDone) << st.error.ToString();
}

INSTANTIATE_TEST_SUITE_P(NetworkBackends, AgentEagerTest,
                         ::testing::Values("ucx:tcp", "libfabric:tcp"), [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) c = (c == ':') ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace kvpush::xfer
