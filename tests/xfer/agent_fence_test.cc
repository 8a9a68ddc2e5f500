// Fencing a peer (docs/xfer.md, *Fencing a peer*): plain invalidation (InvalidatePeer) stops
// nothing on any backend; a target agent that fences an initiator's connection
// (Agent::FencePeer) gets nothing more of it into its memory once the backend confirmed the
// teardown (Agent::PeerFenced) — no WRITE posted later on that connection, no part of a WRITE
// that was in flight — and the initiator reaches it again over a new connection only. Backends
// that cannot fence say so (the peer maps the memory itself, or the transport applies its writes
// without a check this side controls). Two agents in this process over each backend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "xfer/agent.h"
#include "xfer/backend_factory.h"

namespace kvpush::xfer {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kRegion = 16u << 20;

TimePoint In(milliseconds ms) {
  return SteadyClock::now() + ms;
}

class AgentFenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    init_ = Make("prefill");
    target_ = Make("decode");
    if (init_ == nullptr || target_ == nullptr) GTEST_SKIP() << GetParam() << " unavailable here";
    src_ = init_->AllocateRegion(kRegion, MemoryType::kHost).value();
    dst_ = target_->AllocateRegion(kRegion, MemoryType::kHost).value();
    ASSERT_TRUE(init_->LoadRemoteMetadata(target_->ExportMetadata().value()).ok());
    ASSERT_TRUE(target_->LoadRemoteMetadata(init_->ExportMetadata().value()).ok());
  }

  std::unique_ptr<Agent> Make(const std::string& name) {
    auto b = MakeBackend(GetParam());
    if (!b.ok()) return nullptr;
    AgentOptions o;
    o.name = name;
    o.stall_timeout = milliseconds(1000);
    o.eager_write_max_bytes = 0;  // every WRITE by RMA: the path the target cannot check
    return Agent::Create(o, std::move(b).value()).value();
  }

  bool Fences() const { return target_->backend_caps().fences_peers; }

  /// A WRITE of the initiator's first `bytes` bytes to the target's first `bytes` bytes.
  TransferHandle Write(uint64_t bytes, std::vector<uint8_t> notification = {}) {
    auto ll = init_->PrepareLocal(std::vector<Desc>{{src_.id, 0, bytes}}).value();
    auto rl = init_->PrepareRemote("decode", std::vector<Desc>{{dst_.id, 0, bytes}}).value();
    return init_->CreateTransfer({Op::kWrite, ll, {}, rl, {}, std::move(notification)}).value();
  }

  /// Bytes of the target's region equal to `v`.
  uint64_t Count(std::byte v) const {
    return static_cast<uint64_t>(std::count(dst_.data, dst_.data + kRegion, v));
  }

  /// Fences the initiator's current connection and waits (5 s at most) for the confirmation.
  uint64_t FenceAndWait() {
    const uint64_t conn = target_->GetPeer("prefill")->connection;
    EXPECT_NE(conn, 0u);
    EXPECT_TRUE(target_->FencePeer("prefill", conn, "test").ok());
    const TimePoint until = In(milliseconds(5000));
    while (!target_->PeerFenced("prefill", conn) && SteadyClock::now() < until) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    EXPECT_TRUE(target_->PeerFenced("prefill", conn)) << "no confirmation within 5 s";
    return conn;
  }

  std::unique_ptr<Agent> init_, target_;
  AllocatedRegion src_, dst_;
};

TEST_P(AgentFenceTest, InvalidationAloneStopsNothing) {
  // On every backend: dropping a peer closes this side only; the peer's next WRITE still lands
  // (docs/reliability.md, *Quarantine*: never a reason to reuse blocks).
  std::memset(src_.data, 0x11, kRegion);
  ASSERT_TRUE(target_->InvalidatePeer("prefill", "test").ok());
  const PeerInfo dropped = target_->GetPeer("prefill").value();
  EXPECT_FALSE(dropped.alive);
  EXPECT_TRUE(dropped.dropped_here);
  EXPECT_EQ(dropped.connection, 0u);
  auto t = Write(1 << 20);
  ASSERT_TRUE(init_->Post(t).ok());
  ASSERT_EQ(init_->Wait(t, In(milliseconds(10000)))->state, TransferState::kDone);
  EXPECT_EQ(Count(std::byte{0x11}), 1u << 20) << "the invalidated peer's WRITE did not land";
  // Connected again: alive, a new connection id, not dropped here any more.
  const uint64_t before = dropped.connection;
  ASSERT_TRUE(target_->LoadRemoteMetadata(init_->ExportMetadata().value()).ok());
  const PeerInfo again = target_->GetPeer("prefill").value();
  EXPECT_TRUE(again.alive);
  EXPECT_FALSE(again.dropped_here);
  EXPECT_NE(again.connection, 0u);
  EXPECT_NE(again.connection, before);
}

TEST_P(AgentFenceTest, AFenceStopsEveryLaterWrite) {
  if (!Fences()) GTEST_SKIP() << GetParam() << " cannot fence (BackendsThatCannotFenceSaySo)";
  const uint64_t conn = FenceAndWait();
  const PeerInfo after = target_->GetPeer("prefill").value();
  EXPECT_FALSE(after.alive);
  EXPECT_TRUE(after.dropped_here);
  EXPECT_EQ(after.connection, 0u);
  std::memset(src_.data, 0x5a, kRegion);
  auto t = Write(4 << 20);
  auto n = Write(4096, {7, 7});
  ASSERT_TRUE(init_->Post(t).ok());
  ASSERT_TRUE(init_->Post(n).ok());
  auto st = init_->Wait(t, In(milliseconds(10000))).value();
  EXPECT_EQ(st.state, TransferState::kError) << "a WRITE to a peer that fenced us completed";
  EXPECT_EQ(init_->Wait(n, In(milliseconds(10000)))->state, TransferState::kError);
  std::this_thread::sleep_for(milliseconds(300));  // every chance for a late byte to land
  EXPECT_EQ(Count(std::byte{0x5a}), 0u);
  EXPECT_TRUE(target_->TakeNotifications().empty());
  EXPECT_TRUE(target_->PeerFenced("prefill", conn));
  EXPECT_FALSE(target_->PeerFenced("prefill", conn + 1000));
}

TEST_P(AgentFenceTest, AWriteInFlightAtTheFenceChangesNothingOnceItIsConfirmed) {
  if (!Fences()) GTEST_SKIP() << GetParam() << " cannot fence";
  // The WRITE's bytes may land up to the confirmation (one-sided RMA cannot be recalled); not
  // one byte after it.
  std::memset(src_.data, 0x5a, kRegion);
  auto t = Write(kRegion);
  ASSERT_TRUE(init_->Post(t).ok());
  FenceAndWait();
  const uint64_t at_fence = Count(std::byte{0x5a});
  (void)init_->Wait(t, In(milliseconds(10000)));
  std::this_thread::sleep_for(milliseconds(500));
  EXPECT_EQ(Count(std::byte{0x5a}), at_fence)
      << "bytes of the fenced connection landed after the fence was confirmed";
}

TEST_P(AgentFenceTest, TheInitiatorComesBackOnlyOverANewConnection) {
  if (!Fences()) GTEST_SKIP() << GetParam() << " cannot fence";
  const uint64_t old_conn = FenceAndWait();
  // The target connects again (its next handshake); the initiator drops its stale connection
  // and connects again (as after its own transport reported the connection broken).
  ASSERT_TRUE(target_->LoadRemoteMetadata(init_->ExportMetadata().value()).ok());
  const uint64_t new_conn = target_->GetPeer("prefill")->connection;
  EXPECT_NE(new_conn, 0u);
  EXPECT_NE(new_conn, old_conn);
  ASSERT_TRUE(init_->InvalidatePeer("decode", "test: the target reconnected").ok());
  ASSERT_TRUE(init_->LoadRemoteMetadata(target_->ExportMetadata().value()).ok());
  std::memset(src_.data, 0x33, kRegion);
  auto t = Write(1 << 20, {9});
  ASSERT_TRUE(init_->Post(t).ok());
  auto st = init_->Wait(t, In(milliseconds(10000))).value();
  EXPECT_EQ(st.state, TransferState::kDone) << st.error.ToString();
  EXPECT_EQ(Count(std::byte{0x33}), 1u << 20);
  EXPECT_EQ(target_->WaitNotifications(1, In(milliseconds(5000))).size(), 1u);
  EXPECT_TRUE(target_->PeerFenced("prefill", old_conn));
  EXPECT_FALSE(target_->PeerFenced("prefill", new_conn));
  // Fencing a connection that is no longer current does nothing.
  EXPECT_TRUE(target_->FencePeer("prefill", old_conn, "stale").ok());
  EXPECT_TRUE(target_->GetPeer("prefill")->alive);
}

TEST_P(AgentFenceTest, BackendsThatCannotFenceSaySo) {
  if (Fences()) GTEST_SKIP() << GetParam() << " fences";
  const uint64_t conn = target_->GetPeer("prefill")->connection;
  Status s = target_->FencePeer("prefill", conn, "test");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented) << s.ToString();
  EXPECT_TRUE(target_->GetPeer("prefill")->alive) << "a refused fence dropped the peer";
  EXPECT_FALSE(target_->PeerFenced("prefill", conn));
}

TEST(AgentFenceCaps, WhichBackendsFence) {
  // The P/D quarantine rule (docs/reliability.md) depends on it: keep the list in the docs.
  // ucx:tcp cannot: a forced close of this side's endpoint did not stop the peer's puts once
  // the endpoint had been replaced before (they arrived over a connection the new endpoint does
  // not own), and reconnecting after it tripped a UCX 1.13 assertion (remote_ep_id) that aborts
  // the process. UCX applies an emulated put at the address it names without checking a key,
  // so revoking keys cannot stop it either (docs/xfer.md, *Fencing a peer*).
  for (const auto& [spec, fences] : {std::pair<std::string, bool>{"loopback", true},
                                     {"ucx:tcp", false},
                                     {"ucx:shm", false},
                                     {"libfabric:tcp", false},
                                     {"libfabric:shm", false}}) {
    auto b = MakeBackend(spec);
    if (!b.ok()) continue;  // not on this machine
    EXPECT_EQ((*b)->caps().fences_peers, fences) << spec;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, AgentFenceTest,
                         ::testing::Values("loopback", "ucx:tcp", "ucx:shm", "libfabric:tcp"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) c = (c == ':') ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace kvpush::xfer
