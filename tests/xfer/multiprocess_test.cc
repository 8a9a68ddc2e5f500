// Multi-process tests: this process is the initiator, a spawned xfer_test_peer is the target.
// Runs for every backend/transport that works across processes here (ucx:tcp, ucx:shm, ...).
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <set>
#include <thread>

#include "peer_channel.h"
#include "xfer/agent.h"
#include "xfer/backend_factory.h"
#include "xfer/fault_backend.h"

namespace kvpush::xfer {
namespace {

using std::chrono::milliseconds;
using testing::FillPattern;
using testing::PeerProcess;
using testing::RecvFrame;
using testing::SendFrame;

constexpr uint64_t kRegionBytes = 16u << 20;

TimePoint In(milliseconds ms) {
  return SteadyClock::now() + ms;
}

std::vector<uint8_t> Cmd(uint8_t c, std::initializer_list<uint64_t> args = {}) {
  std::vector<uint8_t> f{c};
  for (uint64_t a : args) {
    size_t at = f.size();
    f.resize(at + 8);
    std::memcpy(f.data() + at, &a, 8);
  }
  return f;
}

class MultiProcessTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Spawns a target named `name` and returns its metadata blob.
  std::vector<uint8_t> SpawnTarget(PeerProcess* p, const std::string& name = "decode") {
    *p = PeerProcess::Spawn({XFER_TEST_PEER, GetParam(), name, std::to_string(kRegionBytes)});
    auto md = RecvFrame(p->from);
    EXPECT_TRUE(md.ok()) << md.status().ToString();
    return md.ok() ? *md : std::vector<uint8_t>{};
  }

  void MakeInitiator(milliseconds stall, std::shared_ptr<FaultControls> faults = nullptr) {
    auto backend = MakeBackend(GetParam());
    ASSERT_TRUE(backend.ok()) << backend.status().ToString();
    std::unique_ptr<Backend> b = std::move(backend).value();
    if (faults) b = MakeFaultBackend(std::move(b), faults);
    AgentOptions o;
    o.name = "prefill";
    o.stall_timeout = stall;
    agent_ = Agent::Create(o, std::move(b)).value();
    local_ = agent_->AllocateRegion(kRegionBytes, MemoryType::kHost).value();
  }

  uint64_t TargetHash(PeerProcess& p, uint64_t off, uint64_t n) {
    EXPECT_TRUE(SendFrame(p.to, Cmd('H', {off, n})));
    auto r = RecvFrame(p.from);
    EXPECT_TRUE(r.ok() && r->size() == 9);
    uint64_t v = 0;
    if (r.ok() && r->size() == 9) std::memcpy(&v, r->data() + 1, 8);
    return v;
  }

  // Remote slot of local slot i among n in Scattered's permutation.
  static size_t Permuted(size_t i, size_t n) { return (i * 7919) % n; }

  // One transfer moving `n` slots `chunk` bytes apart between permuted slots of both regions;
  // each descriptor covers the first `length` bytes of its slot (0: the whole chunk).
  TransferHandle Scattered(Op op, RegionId remote, size_t n, uint64_t chunk,
                           std::vector<uint8_t> notif = {}, uint64_t length = 0) {
    if (length == 0) length = chunk;
    std::vector<Desc> l, r;
    for (size_t i = 0; i < n; ++i) {
      l.push_back({local_.id, i * chunk, length});
      r.push_back({remote, Permuted(i, n) * chunk, length});
    }
    auto ll = agent_->PrepareLocal(l).value();
    auto rl = agent_->PrepareRemote("decode", r).value();
    return agent_->CreateTransfer({op, ll, {}, rl, {}, std::move(notif)}).value();
  }

  // The target's first `bytes` after a Scattered WRITE of the local region's current contents
  // (zeros elsewhere), for a target region that was all zeros before.
  std::vector<uint8_t> WrittenImage(size_t n, uint64_t chunk, uint64_t length, uint64_t bytes) {
    std::vector<uint8_t> image(bytes, 0);
    const auto* local = reinterpret_cast<const uint8_t*>(local_.data);
    for (size_t i = 0; i < n; ++i)
      std::memcpy(image.data() + Permuted(i, n) * chunk, local + i * chunk, length);
    return image;
  }

  RegionId RemoteRegion(const std::vector<uint8_t>& blob) {
    auto md = DecodeMetadata(blob).value();
    return md.regions.at(0).id;
  }

  // Posts one notified 4-block WRITE to `remote` (kept in last_); any refusal is returned.
  Status WriteOnce(RegionId remote) {
    std::vector<Desc> l, r;
    for (uint64_t i = 0; i < 4; ++i) {
      l.push_back({local_.id, i * 4096, 4096});
      r.push_back({remote, i * 4096, 4096});
    }
    KVP_ASSIGN_OR_RETURN(auto ll, agent_->PrepareLocal(l));
    KVP_ASSIGN_OR_RETURN(auto rl, agent_->PrepareRemote("decode", r));
    KVP_ASSIGN_OR_RETURN(last_, agent_->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {1}}));
    return agent_->Post(last_);
  }

  std::unique_ptr<Agent> agent_;
  AllocatedRegion local_;
  TransferHandle last_;
};

TEST_P(MultiProcessTest, WriteDeliversRandomBytesExactly) {
  PeerProcess p;
  auto md = SpawnTarget(&p);
  MakeInitiator(milliseconds(10000));
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
  constexpr size_t kChunks = 512;
  constexpr uint64_t kChunk = 16384;
  FillPattern(reinterpret_cast<uint8_t*>(local_.data), kChunks * kChunk, 42);
  auto t = Scattered(Op::kWrite, RemoteRegion(md), kChunks, kChunk);
  ASSERT_TRUE(agent_->Post(t).ok());
  auto st = agent_->Wait(t, In(milliseconds(20000))).value();
  ASSERT_EQ(st.state, TransferState::kDone) << st.error.ToString();
  auto expect = WrittenImage(kChunks, kChunk, kChunk, kRegionBytes);
  EXPECT_EQ(TargetHash(p, 0, kRegionBytes), XXH64(expect.data(), kRegionBytes, 0));
  SendFrame(p.to, {'Q'});
  EXPECT_EQ(p.Join(5000), 0);
}

TEST_P(MultiProcessTest, ReadFetchesRandomBytesExactly) {
  PeerProcess p;
  auto md = SpawnTarget(&p);
  MakeInitiator(milliseconds(10000));
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
  ASSERT_TRUE(SendFrame(p.to, Cmd('F', {99})));
  ASSERT_TRUE(RecvFrame(p.from).ok());
  constexpr size_t kChunks = 256;
  constexpr uint64_t kChunk = 65536;
  auto t = Scattered(Op::kRead, RemoteRegion(md), kChunks, kChunk);
  ASSERT_TRUE(agent_->Post(t).ok());
  auto st = agent_->Wait(t, In(milliseconds(20000))).value();
  ASSERT_EQ(st.state, TransferState::kDone) << st.error.ToString();
  std::vector<uint8_t> remote(kRegionBytes);
  FillPattern(remote.data(), kRegionBytes, 99);
  for (size_t i = 0; i < kChunks; ++i)
    ASSERT_EQ(std::memcmp(reinterpret_cast<uint8_t*>(local_.data) + i * kChunk,
                          remote.data() + Permuted(i, kChunks) * kChunk, kChunk),
              0)
        << "chunk " << i;
  SendFrame(p.to, {'Q'});
  EXPECT_EQ(p.Join(5000), 0);
}

// The target verifies the data of every transfer when its notification arrives; the initiator
// posts through the fault backend with random delays so transfers overlap and reorder.
TEST_P(MultiProcessTest, NotificationIsVisibleOnlyAfterItsData) {
  PeerProcess p;
  auto md = SpawnTarget(&p);
  auto faults = std::make_shared<FaultControls>();
  FaultPlan plan;
  plan.max_post_delay = std::chrono::microseconds(100);
  plan.max_completion_delay = std::chrono::microseconds(50);
  plan.seed = 5;
  faults->Set(plan);
  MakeInitiator(milliseconds(10000), faults);
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
  RegionId remote = RemoteRegion(md);
  constexpr int kSlots = 8, kIters = 3000;
  constexpr uint64_t kChunk = 32768;
  std::vector<ListHandle> ll(kSlots), rl(kSlots);
  for (int s = 0; s < kSlots; ++s) {
    // Each slot is 4 scattered 8 KiB pieces on the target side.
    std::vector<Desc> rd;
    for (int k = 0; k < 4; ++k) rd.push_back({remote, (s + k * kSlots) * 8192ull, 8192});
    ll[s] = agent_->PrepareLocal(std::vector<Desc>{{local_.id, s * kChunk, kChunk}}).value();
    rl[s] = agent_->PrepareRemote("decode", rd).value();
  }
  ASSERT_TRUE(SendFrame(p.to, {'W', static_cast<uint8_t>(kIters & 0xff),
                               static_cast<uint8_t>((kIters >> 8) & 0xff), 0, 0}));
  std::vector<TransferHandle> inflight(kSlots);
  std::vector<bool> used(kSlots, false);
  std::set<uint64_t> acked;
  int bad = 0;
  auto ack_until = [&](uint64_t tag) -> bool {
    while (!acked.count(tag)) {
      auto r = RecvFrame(p.from, 10000);
      if (!r.ok()) {
        auto st = agent_->GetStatus(inflight[tag % kSlots]).value();
        ADD_FAILURE() << "waiting for the target's check of transfer " << tag << ": "
                      << r.status().ToString() << "; initiator sees it "
                      << TransferStateName(st.state) << " " << st.error.ToString();
        return false;
      }
      uint64_t t;
      std::memcpy(&t, r->data() + 1, 8);
      if ((*r)[0] != 'k') ++bad;
      acked.insert(t);
    }
    return true;
  };
  for (int it = 0; it < kIters; ++it) {
    int s = it % kSlots;
    if (used[s]) {
      ASSERT_TRUE(ack_until(static_cast<uint64_t>(it - kSlots)));
      auto st = agent_->Wait(inflight[s], In(milliseconds(10000))).value();
      ASSERT_EQ(st.state, TransferState::kDone) << st.error.ToString();
      ASSERT_TRUE(agent_->ReleaseTransfer(inflight[s]).ok());
    }
    uint8_t* src = reinterpret_cast<uint8_t*>(local_.data) + s * kChunk;
    FillPattern(src, kChunk, 1000 + it);
    // The target checks all 4 pieces (piece k at off + k * stride) against pattern(seed).
    std::vector<uint8_t> payload(48);
    uint64_t fields[6] = {s * 8192ull,      8192, 1000ull + it, static_cast<uint64_t>(it),
                          kSlots * 8192ull, 4};
    std::memcpy(payload.data(), fields, 48);
    inflight[s] = agent_->CreateTransfer({Op::kWrite, ll[s], {}, rl[s], {}, payload}).value();
    used[s] = true;
    ASSERT_TRUE(agent_->Post(inflight[s]).ok());
  }
  for (int it = kIters - kSlots; it < kIters; ++it)
    ASSERT_TRUE(ack_until(static_cast<uint64_t>(it)));
  EXPECT_EQ(bad, 0) << "notifications that overtook their data";
  EXPECT_EQ(acked.size(), static_cast<size_t>(kIters));
  SendFrame(p.to, {'Q'});
  EXPECT_EQ(p.Join(5000), 0);
}

// Small transfers take a backend's caller-thread fast path where it has one (ucx: issued inside
// Post when the worker is free; ucx:shm: plain copies into the peer's mapped region, finished
// before Post returns). They must be exactly as correct as the large ones.
TEST_P(MultiProcessTest, SmallTransfersAreExactOnTheCallersFastPath) {
  PeerProcess p;
  auto md = SpawnTarget(&p);
  MakeInitiator(milliseconds(10000));
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
  constexpr size_t kChunks = 16;
  constexpr uint64_t kChunk = 1024;
  constexpr uint64_t kBytes = kChunks * kChunk;
  auto* local = reinterpret_cast<uint8_t*>(local_.data);
  auto w = Scattered(Op::kWrite, RemoteRegion(md), kChunks, kChunk);
  // Rounds of 50 WRITEs, each checked exactly. ucx:shm: a WRITE finishes inside Post when the
  // worker is free. Right after Wait returns, the progress thread may still hold the worker
  // (lingering after the completion it reported): in one CI-like run under -j2 load, none of 250
  // back-to-back WRITEs found it free. So each WRITE waits 2 ms first (past the linger and a
  // 1 ms poll), and the test asserts the property: the fast path is taken at all. Rounds repeat
  // (at most 5) until one WRITE was.
  int done_inside_post = 0;
  const bool shm = GetParam() == "ucx:shm";
  for (int round = 0; round < 5 && (round == 0 || done_inside_post == 0); ++round) {
    for (int it = 0; it < 50; ++it) {
      FillPattern(local, kBytes, 1000 + it);
      if (shm) std::this_thread::sleep_for(milliseconds(2));
      ASSERT_TRUE(agent_->Post(w).ok());
      if (agent_->GetStatus(w)->state == TransferState::kDone) ++done_inside_post;
      auto st = agent_->Wait(w, In(milliseconds(10000))).value();
      ASSERT_EQ(st.state, TransferState::kDone) << st.error.ToString();
      auto expect = WrittenImage(kChunks, kChunk, kChunk, kBytes);
      ASSERT_EQ(TargetHash(p, 0, kBytes), XXH64(expect.data(), kBytes, 0)) << "iteration " << it;
    }
    if (!shm) break;
  }
  if (shm) {
    EXPECT_GT(done_inside_post, 0) << "no small WRITE to a mapped region finished inline";
  }
  ASSERT_TRUE(SendFrame(p.to, Cmd('F', {77})));
  ASSERT_TRUE(RecvFrame(p.from).ok());
  std::vector<uint8_t> remote(kRegionBytes);
  FillPattern(remote.data(), kRegionBytes, 77);
  auto r = Scattered(Op::kRead, RemoteRegion(md), kChunks, kChunk);
  for (int it = 0; it < 20; ++it) {
    std::memset(local, 0, kBytes);
    ASSERT_TRUE(agent_->Post(r).ok());
    auto st = agent_->Wait(r, In(milliseconds(10000))).value();
    ASSERT_EQ(st.state, TransferState::kDone) << st.error.ToString();
    for (size_t i = 0; i < kChunks; ++i)
      ASSERT_EQ(
          std::memcmp(local + i * kChunk, remote.data() + Permuted(i, kChunks) * kChunk, kChunk), 0)
          << "iteration " << it << " chunk " << i;
  }
  SendFrame(p.to, {'Q'});
  EXPECT_EQ(p.Join(5000), 0);
}

// Many tiny scattered descriptors in one post (the descriptor-overhead case of the posting-cost
// benchmark). libfabric shm once moved one such write per 1 ms target poll (4,000 took > 4 s);
// every backend must finish them well inside the stall deadline, with the bytes in place.
TEST_P(MultiProcessTest, ThousandsOfTinyScatteredWritesFinishWithinTheDeadline) {
  PeerProcess p;
  auto md = SpawnTarget(&p);
  MakeInitiator(milliseconds(5000));
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
  constexpr size_t kDescs = 4000;
  constexpr uint64_t kStride = 4096;  // one 8-byte write per page: nothing coalesces
  FillPattern(reinterpret_cast<uint8_t*>(local_.data), kDescs * kStride, 4242);
  auto t = Scattered(Op::kWrite, RemoteRegion(md), kDescs, kStride, {}, 8);
  ASSERT_EQ(agent_->TransferOpCount(t).value(), kDescs);
  ASSERT_TRUE(agent_->Post(t).ok());
  auto st = agent_->Wait(t, In(milliseconds(10000))).value();
  ASSERT_EQ(st.state, TransferState::kDone) << st.error.ToString();
  auto expect = WrittenImage(kDescs, kStride, 8, kDescs * kStride);
  EXPECT_EQ(TargetHash(p, 0, expect.size()), XXH64(expect.data(), expect.size(), 0));
  SendFrame(p.to, {'Q'});
  EXPECT_EQ(p.Join(5000), 0);
}

TEST_P(MultiProcessTest, StalledTargetHitsStallDeadlineNotAHang) {
  PeerProcess p;
  auto md = SpawnTarget(&p);
  MakeInitiator(milliseconds(500));
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
  auto t = Scattered(Op::kWrite, RemoteRegion(md), 256, 65536, {1});
  kill(p.pid, SIGSTOP);
  auto start = SteadyClock::now();
  ASSERT_TRUE(agent_->Post(t).ok());
  auto st = agent_->Wait(t, In(milliseconds(5000))).value();
  auto took = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start);
  kill(p.pid, SIGCONT);
  ASSERT_NE(st.state, TransferState::kInProgress);
  EXPECT_LT(took.count(), 2000);
  if (GetParam() == "ucx:tcp") {
    // RMA over tcp needs the (stopped) target to progress: the stall deadline must fire.
    EXPECT_EQ(st.error.code(), StatusCode::kDeadlineExceeded) << st.error.ToString();
  } else {
    // Truly one-sided transports may finish without the target; either way it ended in time.
    EXPECT_TRUE(st.state == TransferState::kDone ||
                st.error.code() == StatusCode::kDeadlineExceeded)
        << st.error.ToString();
  }
  SendFrame(p.to, {'Q'});
  EXPECT_EQ(p.Join(5000), 0);
}

TEST_P(MultiProcessTest, CancelSuppressesTheNotification) {
  PeerProcess p;
  auto md = SpawnTarget(&p);
  MakeInitiator(milliseconds(10000));
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
  auto t = Scattered(Op::kWrite, RemoteRegion(md), 256, 65536, {7});
  kill(p.pid, SIGSTOP);
  ASSERT_TRUE(agent_->Post(t).ok());
  Status c = agent_->Cancel(t);
  auto st = agent_->GetStatus(t).value();
  kill(p.pid, SIGCONT);
  if (c.ok()) {
    EXPECT_EQ(st.error.code(), StatusCode::kCancelled);
    ASSERT_TRUE(SendFrame(p.to, {'P'}));
    auto r = RecvFrame(p.from);
    ASSERT_TRUE(r.ok());
    uint32_t n = 0;
    std::memcpy(&n, r->data(), 4);
    EXPECT_EQ(n, 0u) << "a cancelled transfer's notification arrived";
  } else {
    EXPECT_EQ(c.code(), StatusCode::kFailedPrecondition);  // completed before we could cancel
  }
  SendFrame(p.to, {'Q'});
  EXPECT_EQ(p.Join(5000), 0);
}

TEST_P(MultiProcessTest, KilledTargetFailsInFlightTransfersWithinTheDeadline) {
  PeerProcess p;
  auto md = SpawnTarget(&p);
  MakeInitiator(milliseconds(1500));
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
  auto t = Scattered(Op::kWrite, RemoteRegion(md), 256, 65536, {3});
  // Keep transfers flowing, kill the target in the middle, and require an error, not a hang.
  Status last;
  auto start = SteadyClock::now();
  for (int i = 0; i < 10000; ++i) {
    if (i == 3) p.Kill();
    Status s = agent_->Post(t);
    if (!s.ok()) {
      last = s;
      break;
    }
    auto st = agent_->Wait(t, In(milliseconds(5000))).value();
    ASSERT_NE(st.state, TransferState::kInProgress) << "transfer hung past its stall deadline";
    if (st.state == TransferState::kError) {
      last = st.error;
      break;
    }
  }
  auto took = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start);
  ASSERT_FALSE(last.ok()) << "transfers to a killed target kept succeeding";
  std::printf("[   INFO   ] killed target reported after %lld ms as: %s\n",
              static_cast<long long>(took.count()), last.ToString().c_str());
  EXPECT_TRUE(last.code() == StatusCode::kPeerGone || last.code() == StatusCode::kDeadlineExceeded)
      << last.ToString();
  if (GetParam() == "ucx:tcp" || GetParam() == "ucx:shm") {
    // tcp: UCX's peer error mode; shm: the peer process's pidfd.
    EXPECT_EQ(last.code(), StatusCode::kPeerGone) << last.ToString();
  }
  EXPECT_LT(took.count(), 4000);
}

// Issue 49 item 4: two agents connect to each other nearly at once (as the two sides of a P/D
// handshake do) and one is SIGKILLed 0..2.7 ms later, while the connections may still wire up. The
// survivor (this process) must live and see an ordinary error: with ucx:tcp's old worker-address
// wire-up, UCX 1.13.1 aborted the survivor in a few percent of such rounds (docs/xfer.md
// "Wire-up").
//
// The rounds run in a child process (this test again, KVP_SURVIVOR_CHILD=1) so that the survivor's
// death is observed rather than taking the test binary with it: a death by the wire-up assertion
// ("got REP message") fails the test; UCX 1.13's other, rarer tcp race (its tcp_ep.c:478
// assertion when a peer dies during socket set-up, about 1 in 700 rounds here; docs/xfer.md "Not
// done") is reported as a skip naming it; any other death fails.
TEST_P(MultiProcessTest, PeerKilledWhileBothConnectLeavesTheSurvivorRunning) {
  if (GetParam() == "libfabric:shm") {
    GTEST_SKIP() << "libfabric:shm: a peer SIGKILLed here can leave the survivor's progress "
                    "thread spinning for good in fi_send (the shm provider's lock; docs/xfer.md "
                    "\"Not done\", found by this test, not fixed)";
  }
  if (std::getenv("KVP_SURVIVOR_CHILD") == nullptr) {
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    const std::string filter =
        std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
    char log_path[] = "/tmp/kvp-survivor-XXXXXX";
    const int log_fd = mkstemp(log_path);
    ASSERT_GE(log_fd, 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
    std::vector<std::string> env_text;
    for (char** e = environ; *e != nullptr; ++e) env_text.emplace_back(*e);
    env_text.emplace_back("KVP_SURVIVOR_CHILD=1");
    std::vector<char*> envp;
    for (std::string& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe";
    std::vector<char*> argv{self.data(), const_cast<char*>(filter.c_str()), nullptr};
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    close(log_fd);
    ASSERT_EQ(rc, 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    std::string out;
    if (FILE* f = std::fopen(log_path, "r")) {
      char buf[4096];
      size_t n = 0;
      while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
      std::fclose(f);
    }
    std::remove(log_path);
    const size_t info_at = out.find("[   INFO   ]");
    if (info_at != std::string::npos)
      std::printf("%s\n", out.substr(info_at, out.find('\n', info_at) - info_at).c_str());
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    const std::string tail = out.size() > 3000 ? out.substr(out.size() - 3000) : out;
    ASSERT_EQ(out.find("got REP message"), std::string::npos)
        << "the survivor died of UCX's wire-up assertion:\n"
        << tail;
    if (WIFSIGNALED(status) && out.find("tcp_ep.c:478") != std::string::npos) {
      GTEST_SKIP() << "the survivor hit UCX 1.13's tcp set-up race (tcp_ep.c:478, docs/xfer.md "
                      "\"Not done\"), not the wire-up fault this test is about";
    }
    FAIL() << "the survivor (child) ended with status " << status << ":\n" << tail;
  }
  MakeInitiator(milliseconds(500));
  const std::vector<uint8_t> self_md = agent_->ExportMetadata().value();
  std::vector<uint8_t> load{'L'};
  load.insert(load.end(), self_md.begin(), self_md.end());
  int failed = 0;
  constexpr int kRounds = 20;
  for (int i = 0; i < kRounds; ++i) {
    PeerProcess p;
    auto md = SpawnTarget(&p);
    ASSERT_FALSE(md.empty());
    // As in a handshake: the answering side connects, and the asking side as soon as it has the
    // answer, while the first connection still wires up; then the answering side dies.
    ASSERT_TRUE(SendFrame(p.to, load));
    auto loaded = RecvFrame(p.from);
    ASSERT_TRUE(loaded.ok() && loaded->size() == 1 && loaded->at(0) == 'k');
    ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
    Status s = WriteOnce(RemoteRegion(md));  // traffic queued behind the wire-up
    std::this_thread::sleep_for(std::chrono::microseconds(300 * (i % 10)));
    p.Kill();
    // The peer may already be known as failed here: then preparing or posting is refused.
    if (s.ok()) s = WriteOnce(RemoteRegion(md));
    if (s.ok()) {
      auto st = agent_->Wait(last_, In(milliseconds(5000))).value();
      ASSERT_NE(st.state, TransferState::kInProgress) << "round " << i << ": hung";
      if (st.state == TransferState::kError) s = st.error;
    }
    failed += !s.ok();
    if (!s.ok()) {
      EXPECT_TRUE(s.code() == StatusCode::kPeerGone || s.code() == StatusCode::kDeadlineExceeded)
          << "round " << i << ": " << s.ToString();
    }
  }
  std::printf("[   INFO   ] %d of %d WRITEs after the kill failed\n", failed, kRounds);
  // Over tcp a notified WRITE to a dead process cannot complete. (On shm one can, into the dead
  // process's mapping and FIFO, before its exit is seen: docs/xfer.md "Peer exit on shm".)
  if (GetParam().find(":tcp") != std::string::npos) {
    EXPECT_EQ(failed, kRounds);
  }
}

TEST_P(MultiProcessTest, RestartedTargetIsDetectedByIncarnation) {
  PeerProcess p1;
  auto md1 = SpawnTarget(&p1);
  MakeInitiator(milliseconds(2000));
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md1).ok());
  auto old_t = Scattered(Op::kWrite, RemoteRegion(md1), 16, 4096);
  ASSERT_TRUE(agent_->Post(old_t).ok());
  ASSERT_EQ(agent_->Wait(old_t, In(milliseconds(5000)))->state, TransferState::kDone);
  p1.Kill();
  PeerProcess p2;
  auto md2 = SpawnTarget(&p2);
  auto load = agent_->LoadRemoteMetadata(md2);
  ASSERT_TRUE(load.ok()) << load.status().ToString();
  EXPECT_TRUE(load->restarted);
  EXPECT_EQ(load->previous_incarnation, DecodeMetadata(md1)->incarnation);
  EXPECT_EQ(agent_->Post(old_t).code(), StatusCode::kPeerGone);
  // The old incarnation's metadata is refused from now on.
  EXPECT_EQ(agent_->LoadRemoteMetadata(md1).status().code(), StatusCode::kFailedPrecondition);
  FillPattern(reinterpret_cast<uint8_t*>(local_.data), 16 * 4096, 8);
  auto t = Scattered(Op::kWrite, RemoteRegion(md2), 16, 4096);
  ASSERT_TRUE(agent_->Post(t).ok());
  auto st = agent_->Wait(t, In(milliseconds(5000))).value();
  ASSERT_EQ(st.state, TransferState::kDone) << st.error.ToString();
  SendFrame(p2.to, {'Q'});
  EXPECT_EQ(p2.Join(5000), 0);
}

TEST_P(MultiProcessTest, MalformedMetadataAndOutOfRangeDescriptorsAreRefused) {
  PeerProcess p;
  auto md = SpawnTarget(&p);
  MakeInitiator(milliseconds(2000));
  auto cut = std::vector<uint8_t>(md.begin(), md.begin() + md.size() / 2);
  EXPECT_EQ(agent_->LoadRemoteMetadata(cut).status().code(), StatusCode::kDataLoss);
  auto bigger = md;
  bigger.resize(md.size() + 100, 0);
  EXPECT_EQ(agent_->LoadRemoteMetadata(bigger).status().code(), StatusCode::kDataLoss);
  auto flipped = md;
  flipped[flipped.size() / 2] ^= 1;
  EXPECT_EQ(agent_->LoadRemoteMetadata(flipped).status().code(), StatusCode::kDataLoss);
  ASSERT_TRUE(agent_->LoadRemoteMetadata(md).ok());
  RegionId r = RemoteRegion(md);
  EXPECT_EQ(agent_->PrepareRemote("decode", std::vector<Desc>{{r, kRegionBytes - 10, 11}})
                .status()
                .code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(
      agent_->PrepareRemote("decode", std::vector<Desc>{{r, kRegionBytes, 1}}).status().code(),
      StatusCode::kOutOfRange);
  SendFrame(p.to, {'Q'});
  EXPECT_EQ(p.Join(5000), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, MultiProcessTest,
                         ::testing::ValuesIn(MultiProcessBackendSpecs()),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           std::replace(n.begin(), n.end(), ':', '_');
                           return n;
                         });

}  // namespace
}  // namespace kvpush::xfer
