// Agent behaviour over the in-process loopback backend (and the fault decorator): data integrity,
// coalescing, index lists, notification-after-data, stall deadline, cancel, peer death and restart,
// malformed metadata and out-of-range descriptors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "test_util.h"
#include "xfer/agent.h"
#include "xfer/backend_factory.h"
#include "xfer/fault_backend.h"
#include "xfer/loopback_backend.h"

namespace kvpush::xfer {
namespace {

using std::chrono::milliseconds;

TimePoint In(milliseconds ms) {
  return SteadyClock::now() + ms;
}

std::unique_ptr<Agent> MakeAgent(const std::string& name, std::unique_ptr<Backend> backend,
                                 milliseconds stall = milliseconds(5000)) {
  AgentOptions o;
  o.name = name;
  o.stall_timeout = stall;
  auto a = Agent::Create(o, std::move(backend));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return std::move(a).value();
}

void Connect(Agent& from, Agent& to) {
  auto blob = to.ExportMetadata();
  ASSERT_TRUE(blob.ok());
  auto r = from.LoadRemoteMetadata(*blob);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

void FillRandom(std::byte* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
  }
}

struct Pair {
  std::unique_ptr<Agent> init, target;
  AllocatedRegion src, dst;
};

Pair MakePair(size_t bytes, std::unique_ptr<Backend> init_backend = MakeLoopbackBackend(),
              milliseconds stall = milliseconds(5000)) {
  Pair p;
  p.init = MakeAgent("prefill", std::move(init_backend), stall);
  p.target = MakeAgent("decode", MakeLoopbackBackend());
  p.src = p.init->AllocateRegion(bytes, MemoryType::kHost).value();
  p.dst = p.target->AllocateRegion(bytes, MemoryType::kHost).value();
  Connect(*p.init, *p.target);
  return p;
}

TEST(AgentLoopbackTest, WriteAndReadMoveRandomBytesExactly) {
  constexpr size_t kBytes = 1 << 20;
  Pair p = MakePair(kBytes);
  FillRandom(p.src.data, kBytes, 1);
  FillRandom(p.dst.data, kBytes, 2);
  // 64 scattered 4 KiB chunks: local chunk i -> remote chunk (i * 37) % 256.
  std::vector<Desc> l, r;
  for (uint32_t i = 0; i < 64; ++i) {
    l.push_back({p.src.id, i * 4096ull, 4096});
    r.push_back({p.dst.id, ((i * 37) % 256) * 4096ull, 4096});
  }
  auto ll = p.init->PrepareLocal(l).value();
  auto rl = p.init->PrepareRemote("decode", r).value();
  auto w = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}).value();
  ASSERT_TRUE(p.init->Post(w).ok());
  auto st = p.init->Wait(w, In(milliseconds(5000))).value();
  ASSERT_EQ(st.state, TransferState::kDone) << st.error.ToString();
  for (uint32_t i = 0; i < 64; ++i)
    ASSERT_EQ(std::memcmp(p.src.data + i * 4096, p.dst.data + ((i * 37) % 256) * 4096, 4096), 0);

  // READ back into a cleared source, via the same lists.
  std::memset(p.src.data, 0, kBytes);
  auto rd = p.init->CreateTransfer({Op::kRead, ll, {}, rl, {}, {}}).value();
  ASSERT_TRUE(p.init->Post(rd).ok());
  ASSERT_EQ(p.init->Wait(rd, In(milliseconds(5000)))->state, TransferState::kDone);
  for (uint32_t i = 0; i < 64; ++i)
    ASSERT_EQ(std::memcmp(p.src.data + i * 4096, p.dst.data + ((i * 37) % 256) * 4096, 4096), 0);
}

TEST(AgentLoopbackTest, AdjacentDescriptorsCoalesceAndIndexListsSelect) {
  Pair p = MakePair(1 << 20);
  std::vector<Desc> l, r;
  for (uint32_t i = 0; i < 100; ++i) {
    l.push_back({p.src.id, i * 1024ull, 1024});
    r.push_back({p.dst.id, 4096 + i * 1024ull, 1024});
  }
  auto ll = p.init->PrepareLocal(l).value();
  auto rl = p.init->PrepareRemote("decode", r).value();
  auto info = p.init->GetListInfo(ll).value();
  EXPECT_EQ(info.descriptors, 100u);
  EXPECT_EQ(info.coalesced, 1u);
  EXPECT_EQ(info.bytes, 100u * 1024);
  auto all = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}).value();
  EXPECT_EQ(p.init->TransferOpCount(all).value(), 1u);
  // Entries {0,1,2,50}: two runs locally, two remotely -> 2 ops.
  auto some = p.init->CreateTransfer({Op::kWrite, ll, {0, 1, 2, 50}, rl, {10, 11, 12, 90}, {}});
  ASSERT_TRUE(some.ok()) << some.status().ToString();
  EXPECT_EQ(p.init->TransferOpCount(*some).value(), 2u);
  FillRandom(p.src.data, 1 << 20, 3);
  ASSERT_TRUE(p.init->Post(*some).ok());
  ASSERT_EQ(p.init->Wait(*some, In(milliseconds(5000)))->state, TransferState::kDone);
  EXPECT_EQ(std::memcmp(p.src.data, p.dst.data + 4096 + 10 * 1024, 3 * 1024), 0);
  EXPECT_EQ(std::memcmp(p.src.data + 50 * 1024, p.dst.data + 4096 + 90 * 1024, 1024), 0);
  // A byte-stream mismatch and a bad index are refused.
  EXPECT_EQ(p.init->CreateTransfer({Op::kWrite, ll, {0, 1}, rl, {0}, {}}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(p.init->CreateTransfer({Op::kWrite, ll, {100}, rl, {0}, {}}).status().code(),
            StatusCode::kOutOfRange);
}

TEST(AgentLoopbackTest, OutOfRangeAndForgedHandlesAreRefused) {
  Pair p = MakePair(8192);
  auto bad = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, 4096, 4097}});
  EXPECT_EQ(bad.status().code(), StatusCode::kOutOfRange);
  auto wrap = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, ~0ull - 10, 20}});
  EXPECT_EQ(wrap.status().code(), StatusCode::kOutOfRange);
  auto far = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, 8192, 1}});
  EXPECT_EQ(far.status().code(), StatusCode::kOutOfRange);
  RegionId forged = p.dst.id;
  forged.generation += 1;
  EXPECT_EQ(p.init->PrepareRemote("decode", std::vector<Desc>{{forged, 0, 1}}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(p.init->PrepareRemote("nobody", std::vector<Desc>{{p.dst.id, 0, 1}}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(p.init->PrepareLocal(std::vector<Desc>{{p.src.id, 0, 0}}).status().code(),
            StatusCode::kInvalidArgument);
  TransferHandle t;
  t.index = 99;
  t.generation = 1;
  EXPECT_EQ(p.init->Post(t).code(), StatusCode::kNotFound);
  // A region used by a list cannot be deregistered.
  auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, 0, 8}}).value();
  EXPECT_EQ(p.init->DeregisterRegion(p.src.id).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(p.init->ReleaseList(ll).ok());
  EXPECT_TRUE(p.init->DeregisterRegion(p.src.id).ok());
  EXPECT_EQ(p.init->DeregisterRegion(p.src.id).code(), StatusCode::kNotFound);
}

TEST(AgentLoopbackTest, MalformedMetadataIsRefusedAndLeavesNoPeer) {
  auto a = MakeAgent("a", MakeLoopbackBackend());
  auto b = MakeAgent("b", MakeLoopbackBackend());
  auto blob = b->ExportMetadata().value();
  auto cut = std::vector<uint8_t>(blob.begin(), blob.end() - 3);
  EXPECT_EQ(a->LoadRemoteMetadata(cut).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(a->GetPeer("b").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a->LoadRemoteMetadata(a->ExportMetadata().value()).status().code(),
            StatusCode::kInvalidArgument);  // own name
}

TEST(AgentLoopbackTest, NotificationArrivesOnlyAfterItsDataUnderRandomDelays) {
  constexpr size_t kChunk = 4096, kSlots = 16;
  auto controls = std::make_shared<FaultControls>();
  FaultPlan plan;
  plan.max_post_delay = std::chrono::microseconds(200);
  plan.max_completion_delay = std::chrono::microseconds(200);
  plan.seed = 7;
  controls->Set(plan);
  Pair p = MakePair(kChunk * kSlots, MakeFaultBackend(MakeLoopbackBackend(), controls));
  std::vector<TransferHandle> ts;
  for (uint32_t s = 0; s < kSlots; ++s) {
    auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, s * kChunk, kChunk}}).value();
    auto rl =
        p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, s * kChunk, kChunk}}).value();
    ts.push_back(
        p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {static_cast<uint8_t>(s)}}).value());
  }
  // 2000 iterations: each stamps its slot with the iteration number; the target checks that the
  // slot holds exactly that stamp when the notification (slot, iteration) arrives.
  constexpr int kIters = 2000;
  int checked = 0;
  for (int it = 0; it < kIters; it += kSlots) {
    for (uint32_t s = 0; s < kSlots; ++s) {
      for (size_t w = 0; w < kChunk / 4; ++w) {
        uint32_t v = static_cast<uint32_t>(it) * 1000 + s;
        std::memcpy(p.src.data + s * kChunk + w * 4, &v, 4);
      }
      ASSERT_TRUE(p.init->Post(ts[s]).ok());
    }
    auto got = p.target->WaitNotifications(kSlots, In(milliseconds(5000)));
    ASSERT_EQ(got.size(), kSlots);
    for (const Notification& n : got) {
      ASSERT_EQ(n.peer, "prefill");
      uint32_t s = n.payload.at(0);
      uint32_t want = static_cast<uint32_t>(it) * 1000 + s;
      for (size_t w = 0; w < kChunk / 4; ++w) {
        uint32_t v;
        std::memcpy(&v, p.dst.data + s * kChunk + w * 4, 4);
        ASSERT_EQ(v, want) << "slot " << s << " word " << w;
      }
      ++checked;
    }
    for (auto t : ts)
      ASSERT_EQ(p.init->Wait(t, In(milliseconds(5000)))->state, TransferState::kDone);
  }
  EXPECT_EQ(checked, (kIters + kSlots - 1) / kSlots * kSlots);
}

TEST(AgentLoopbackTest, StalledTransferEndsInDeadlineExceededWithoutNotification) {
  auto controls = std::make_shared<FaultControls>();
  FaultPlan plan;
  plan.max_post_delay = std::chrono::microseconds(300000);  // data never starts before the deadline
  plan.seed = 3;
  controls->Set(plan);
  Pair p = MakePair(4096, MakeFaultBackend(MakeLoopbackBackend(), controls), milliseconds(100));
  auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, 0, 4096}}).value();
  auto rl = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, 0, 4096}}).value();
  auto t = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {1}}).value();
  plan.swallow_completions = true;
  plan.max_post_delay = std::chrono::microseconds(0);
  controls->Set(plan);
  ASSERT_TRUE(p.init->Post(t).ok());
  auto st = p.init->Wait(t, In(milliseconds(5000))).value();
  ASSERT_EQ(st.state, TransferState::kError);
  EXPECT_EQ(st.error.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(st.error.message().find("stall deadline"), std::string::npos);
  // The backend never reported the post's end: it may still land, so it is not settled and
  // cannot be posted again.
  EXPECT_FALSE(st.settled);
  EXPECT_EQ(p.init->Post(t).code(), StatusCode::kFailedPrecondition);
  // A fresh transfer works once completions flow again.
  plan.swallow_completions = false;
  controls->Set(plan);
  auto t2 = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {1}}).value();
  ASSERT_TRUE(p.init->Post(t2).ok());
  auto st2 = p.init->Wait(t2, In(milliseconds(5000))).value();
  EXPECT_EQ(st2.state, TransferState::kDone);
  EXPECT_TRUE(st2.settled);
}

TEST(AgentLoopbackTest, QueuedTransfersAreNotStalledWhileTheirPeerProgresses) {
  // 40 posts to one peer complete at random over ~1.2 s, three times the 400 ms stall deadline:
  // each completion is progress on the peer, so none of the later ones is stalled (counted from
  // its post alone, about two in three would have ended in kDeadlineExceeded).
  auto controls = std::make_shared<FaultControls>();
  FaultPlan plan;
  plan.max_completion_delay = std::chrono::microseconds(1200000);
  plan.seed = 5;
  controls->Set(plan);
  constexpr uint32_t kPosts = 40;
  Pair p = MakePair(kPosts * 4096, MakeFaultBackend(MakeLoopbackBackend(), controls),
                    milliseconds(400));
  std::vector<TransferHandle> ts;
  for (uint32_t i = 0; i < kPosts; ++i) {
    auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, i * 4096ull, 4096}}).value();
    auto rl = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, i * 4096ull, 4096}});
    ts.push_back(p.init->CreateTransfer({Op::kWrite, ll, {}, rl.value(), {}, {}}).value());
  }
  const TimePoint start = SteadyClock::now();
  for (auto t : ts) ASSERT_TRUE(p.init->Post(t).ok());
  for (auto t : ts) {
    auto st = p.init->Wait(t, In(milliseconds(10000))).value();
    EXPECT_EQ(st.state, TransferState::kDone) << st.error.ToString();
  }
  // The delays really did outlast the deadline (else the test proves nothing).
  EXPECT_GT(SteadyClock::now() - start, milliseconds(600));
  // Once nothing completes, the deadline fires again: one swallowed post stalls.
  plan.swallow_completions = true;
  controls->Set(plan);
  ASSERT_TRUE(p.init->Post(ts[0]).ok());
  auto st = p.init->Wait(ts[0], In(milliseconds(5000))).value();
  EXPECT_EQ(st.state, TransferState::kError);
  EXPECT_EQ(st.error.code(), StatusCode::kDeadlineExceeded);
}

TEST(AgentLoopbackTest, ALargeTransferGetsItsBytesTimeAtTheFloorBandwidth) {
  // 1 MiB at a floor of 1 MiB/s: a second more than the 100 ms stall deadline. With its
  // completion swallowed it is still in progress well after 100 ms, and ends after ~1.1 s.
  auto controls = std::make_shared<FaultControls>();
  FaultPlan plan;
  controls->Set(plan);
  constexpr size_t kBytes = 1 << 20;
  AgentOptions o;
  o.name = "prefill";
  o.stall_timeout = milliseconds(100);
  o.stall_floor_bytes_per_s = kBytes;
  auto init = Agent::Create(o, MakeFaultBackend(MakeLoopbackBackend(), controls)).value();
  auto target = MakeAgent("decode", MakeLoopbackBackend());
  auto src = init->AllocateRegion(kBytes, MemoryType::kHost).value();
  auto dst = target->AllocateRegion(kBytes, MemoryType::kHost).value();
  Connect(*init, *target);
  auto ll = init->PrepareLocal(std::vector<Desc>{{src.id, 0, kBytes}}).value();
  auto rl = init->PrepareRemote("decode", std::vector<Desc>{{dst.id, 0, kBytes}}).value();
  auto t = init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}).value();
  plan.swallow_completions = true;
  controls->Set(plan);
  const TimePoint start = SteadyClock::now();
  ASSERT_TRUE(init->Post(t).ok());
  EXPECT_EQ(init->Wait(t, In(milliseconds(400)))->state, TransferState::kInProgress);
  auto st = init->Wait(t, In(milliseconds(10000))).value();
  EXPECT_EQ(st.state, TransferState::kError);
  EXPECT_EQ(st.error.code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(SteadyClock::now() - start, milliseconds(1100));
}

TEST(AgentLoopbackTest, AnEarlyEndIsSettledOnlyWhenTheBackendReportsThePost) {
  // The stall deadline ends the transfer while the backend still holds its post (delayed):
  // it is kError at once but settled only when the backend reports, and only then can it be
  // posted again (its bytes could land until then).
  auto controls = std::make_shared<FaultControls>();
  FaultPlan plan;
  plan.max_post_delay = std::chrono::microseconds(400000);
  plan.seed = 3;  // its first draw is above 1/3 of the maximum (see the test above): > 50 ms
  controls->Set(plan);
  Pair p = MakePair(4096, MakeFaultBackend(MakeLoopbackBackend(), controls), milliseconds(50));
  auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, 0, 4096}}).value();
  auto rl = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, 0, 4096}}).value();
  auto t = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}).value();
  ASSERT_TRUE(p.init->Post(t).ok());
  auto st = p.init->Wait(t, In(milliseconds(5000))).value();
  ASSERT_EQ(st.state, TransferState::kError);
  EXPECT_EQ(st.error.code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(st.settled);
  EXPECT_EQ(p.init->Post(t).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(::kvpush::testing::WaitUntil([&] { return p.init->GetStatus(t)->settled; },
                                           milliseconds(5000)));
  auto after = p.init->GetStatus(t).value();
  EXPECT_EQ(after.state, TransferState::kError);  // the early end's cause stays
  EXPECT_EQ(after.error.code(), StatusCode::kDeadlineExceeded);
  plan.max_post_delay = std::chrono::microseconds(0);
  controls->Set(plan);
  ASSERT_TRUE(p.init->Post(t).ok());
  EXPECT_EQ(p.init->Wait(t, In(milliseconds(5000)))->state, TransferState::kDone);
}

TEST(AgentLoopbackTest, CancelEndsTransferAndSuppressesItsNotification) {
  auto controls = std::make_shared<FaultControls>();
  FaultPlan plan;
  plan.max_post_delay = std::chrono::microseconds(200000);
  plan.seed = 11;  // first draw is > 0 with this seed; the test checks the outcome either way
  controls->Set(plan);
  Pair p = MakePair(4096, MakeFaultBackend(MakeLoopbackBackend(), controls));
  auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, 0, 4096}}).value();
  auto rl = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, 0, 4096}}).value();
  auto t = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {5}}).value();
  ASSERT_TRUE(p.init->Post(t).ok());
  Status c = p.init->Cancel(t);
  auto st = p.init->Wait(t, In(milliseconds(5000))).value();
  if (c.ok()) {
    EXPECT_EQ(st.state, TransferState::kError);
    EXPECT_EQ(st.error.code(), StatusCode::kCancelled);
    EXPECT_TRUE(p.target->WaitNotifications(1, In(milliseconds(400))).empty());
  } else {
    EXPECT_EQ(c.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(st.state, TransferState::kDone);
  }
  EXPECT_EQ(p.init->Cancel(t).code(), StatusCode::kFailedPrecondition);  // not in progress
}

TEST(AgentLoopbackTest, InjectedFailuresKeepTheirCause) {
  auto controls = std::make_shared<FaultControls>();
  Pair p = MakePair(4096, MakeFaultBackend(MakeLoopbackBackend(), controls));
  auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, 0, 4096}}).value();
  auto rl = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, 0, 4096}}).value();
  auto t = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}).value();
  FaultPlan plan;
  plan.post_failure_rate = 1;
  controls->Set(plan);
  EXPECT_EQ(p.init->Post(t).code(), StatusCode::kUnavailable);
  EXPECT_EQ(p.init->GetStatus(t)->state, TransferState::kError);
  plan = {};
  plan.completion_failure_rate = 1;
  controls->Set(plan);
  ASSERT_TRUE(p.init->Post(t).ok());
  EXPECT_EQ(p.init->Wait(t, In(milliseconds(5000)))->error.code(), StatusCode::kInternal);
  plan = {};
  plan.peer_dead = true;
  controls->Set(plan);
  ASSERT_TRUE(p.init->Post(t).ok());
  auto st = p.init->Wait(t, In(milliseconds(5000))).value();
  EXPECT_EQ(st.error.code(), StatusCode::kPeerGone);
  EXPECT_FALSE(p.init->GetPeer("decode")->alive);
  EXPECT_EQ(p.init->Post(t).code(), StatusCode::kPeerGone);  // stale until reloaded
}

TEST(AgentLoopbackTest, DestroyedTargetIsPeerGoneAndRestartIsDetectedByIncarnation) {
  Pair p = MakePair(4096);
  auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, 0, 4096}}).value();
  auto rl = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, 0, 4096}}).value();
  auto t = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}).value();
  uint64_t old_inc = p.target->incarnation();
  p.target.reset();  // the target "process" dies
  ASSERT_TRUE(p.init->Post(t).ok());
  auto st = p.init->Wait(t, In(milliseconds(5000))).value();
  EXPECT_EQ(st.error.code(), StatusCode::kPeerGone);
  // A new "decode" starts: loading its metadata reports the restart and old lists are stale.
  auto fresh = MakeAgent("decode", MakeLoopbackBackend());
  auto dst = fresh->AllocateRegion(4096, MemoryType::kHost).value();
  auto load = p.init->LoadRemoteMetadata(fresh->ExportMetadata().value()).value();
  EXPECT_TRUE(load.restarted);
  EXPECT_EQ(load.previous_incarnation, old_inc);
  EXPECT_EQ(p.init->GetPeer("decode")->incarnation, fresh->incarnation());
  EXPECT_EQ(p.init->GetPeer("decode")->restarts, 1u);
  EXPECT_EQ(p.init->Post(t).code(), StatusCode::kPeerGone);
  EXPECT_EQ(p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}).status().code(),
            StatusCode::kPeerGone);
  auto rl2 = p.init->PrepareRemote("decode", std::vector<Desc>{{dst.id, 0, 4096}}).value();
  auto t2 = p.init->CreateTransfer({Op::kWrite, ll, {}, rl2, {}, {}}).value();
  ASSERT_TRUE(p.init->Post(t2).ok());
  EXPECT_EQ(p.init->Wait(t2, In(milliseconds(5000)))->state, TransferState::kDone);
}

TEST(AgentLoopbackTest, StandaloneNotificationAndConcurrentPostersFromManyThreads) {
  Pair p = MakePair(64 * 4096);
  constexpr int kThreads = 4, kPerThread = 200;
  std::vector<std::thread> threads;
  std::atomic<int> done{0};
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, th * 4096ull, 4096}}).value();
      auto rl = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, th * 4096ull, 4096}})
                    .value();
      auto t = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}).value();
      for (int i = 0; i < kPerThread; ++i) {
        if (!p.init->Post(t).ok()) return;
        if (p.init->Wait(t, In(milliseconds(5000)))->state != TransferState::kDone) return;
        done.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(done.load(), kThreads * kPerThread);
  std::vector<uint8_t> payload = {1, 2, 3};
  auto n = p.init->CreateNotification("decode", payload).value();
  ASSERT_TRUE(p.init->Post(n).ok());
  auto got = p.target->WaitNotifications(1, In(milliseconds(5000)));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload, payload);
  EXPECT_EQ(got[0].peer_incarnation, p.init->incarnation());
}

// `kvpush serve --xfer-fault-plan` (the chaos test): the plan's text form and the process-wide
// wrapping of every backend MakeBackend creates.
TEST(FaultPlanTest, ParsesEveryKeyAndRefusesBadOnesByName) {
  auto plan = ParseFaultPlan(
      "post_failure_rate=0.25,completion_failure_rate=1,max_post_delay_us=2000,"
      "max_completion_delay_us=0,seed=99");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->post_failure_rate, 0.25);
  EXPECT_EQ(plan->completion_failure_rate, 1.0);
  EXPECT_EQ(plan->max_post_delay, std::chrono::microseconds(2000));
  EXPECT_EQ(plan->max_completion_delay, std::chrono::microseconds(0));
  EXPECT_EQ(plan->seed, 99u);
  EXPECT_TRUE(plan->log_injections);
  auto again = ParseFaultPlan(FaultPlanToString(*plan));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->post_failure_rate, 0.25);
  EXPECT_EQ(again->max_post_delay, std::chrono::microseconds(2000));
  EXPECT_EQ(again->seed, 99u);
  EXPECT_TRUE(ParseFaultPlan("").ok());  // no faults
  for (const char* bad : {"post_failure_rate=1.5", "post_failure_rate=-0.1",
                          "post_failure_rate=", "completion_failure_rate=x", "max_post_delay_us=-1",
                          "max_post_delay_us=10000001", "seed=1x", "bogus=1", "seed"}) {
    auto r = ParseFaultPlan(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    const std::string key = std::string(bad).substr(0, std::string(bad).find('='));
    EXPECT_NE(r.status().message().find(key), std::string::npos) << r.status().message();
  }
}

TEST(FaultPlanTest, ProcessPlanWrapsEveryBackendMakeBackendCreates) {
  FaultPlan plan;
  plan.post_failure_rate = 1;
  SetProcessFaultPlan(plan);
  auto wrapped = MakeBackend("loopback");
  SetProcessFaultPlan(std::nullopt);
  ASSERT_TRUE(wrapped.ok()) << wrapped.status().ToString();
  EXPECT_EQ((*wrapped)->caps().name, MakeLoopbackBackend()->caps().name);  // peers still match
  Pair p = MakePair(4096, std::move(wrapped).value());
  auto ll = p.init->PrepareLocal(std::vector<Desc>{{p.src.id, 0, 4096}}).value();
  auto rl = p.init->PrepareRemote("decode", std::vector<Desc>{{p.dst.id, 0, 4096}}).value();
  auto t = p.init->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}).value();
  EXPECT_EQ(p.init->Post(t).code(), StatusCode::kUnavailable);  // injected post failure

  Pair plain = MakePair(4096, MakeBackend("loopback").value());  // plan cleared: no faults
  auto ll2 = plain.init->PrepareLocal(std::vector<Desc>{{plain.src.id, 0, 4096}}).value();
  auto rl2 =
      plain.init->PrepareRemote("decode", std::vector<Desc>{{plain.dst.id, 0, 4096}}).value();
  auto t2 = plain.init->CreateTransfer({Op::kWrite, ll2, {}, rl2, {}, {}}).value();
  ASSERT_TRUE(plain.init->Post(t2).ok());
  EXPECT_EQ(plain.init->Wait(t2, In(milliseconds(5000)))->state, TransferState::kDone);
}

}  // namespace
}  // namespace kvpush::xfer
