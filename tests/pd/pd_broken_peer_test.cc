// A broken but alive prefill instance (issue 26 item 3; docs/reliability.md, *Quarantine*), with
// real processes: kvpush serve (colocated, P, D) and kvpush router over ucx:tcp, push.
//   (a) the observed case: P started with `--xfer-fault-plan post_failure_rate=1.0` (every post
//       fails, for good; its /health stays fine), so D's CANCELs reach it and its CANCEL_ACKs
//       never leave. Every answer is the colocated one (D recomputes after its watchdog), D asks
//       P over HTTP (POST /kv/transfer_status) and P's "settled" ends every quarantine well
//       within broken_peer_ms of the last answer; D's and P's pools whole; twice in a row;
//   (b) P broken for a while (SIGUSR1 ... SIGUSR2, the fault plan's broken switch): the same
//       while it is broken, then its KV is pushed again (KV_READY received, nothing recomputed).
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include "pd_fixture.h"

namespace kvpush::pd_test {
namespace {

constexpr const char* kQuarantined = "kvpush_kv_blocks_quarantined";
constexpr const char* kQuarantines = "kvpush_kv_transfer_quarantines_total";
constexpr const char* kReleased = "kvpush_kv_transfer_quarantines_released_total";
constexpr const char* kAsked = "kvpush_kv_transfer_status_queries_total";
constexpr const char* kSettled = "kvpush_kv_transfer_status_settled_total";
constexpr const char* kBlocksTotal = "kvpush_kv_blocks_total";
constexpr const char* kBlocksFree = "kvpush_kv_blocks_free";
constexpr const char* kBlocksCached = "kvpush_kv_blocks_cached";
constexpr const char* kConsumers = "kvpush_kv_transfer_consumers_waiting";
constexpr const char* kProducers = "kvpush_kv_transfer_producers_active";

constexpr int kBrokenPeerMs = 1500;
// D: watchdog 1 s, cancel deadline 0.3 s, a broken peer after 1.5 s of quarantine.
const json kDecodeKv = {{"watchdog_ms", 1000},
                        {"cancel_ack_ms", 300},
                        {"broken_peer_ms", kBrokenPeerMs},
                        {"lease_ms", 3000}};

class PdBrokenPeer : public PdFixture {
 protected:
  void SetUp() override {
    PdFixture::SetUp();
    model_ = ModelOrGenerated();
    ASSERT_FALSE(model_.empty());
  }

  Proc* Serve(const std::string& name, const std::string& role,
              const std::vector<std::string>& extra, const json& kv = json::object()) {
    const int port = Port();
    const std::string cfg = role == "both" ? "" : KvCfg("ucx:tcp", kv);
    return Spawn(name, ServeArgs(model_, role, host_, port, cfg, extra), host_, port);
  }

  /// colocated, P (with `fault_plan`), D, router (push).
  void Start(const std::string& fault_plan) {
    colo_ = Serve("colocated", "both", {});
    p_ = Serve("prefill", "prefill", {"--xfer-fault-plan", fault_plan});
    d_ = Serve("decode", "decode", {}, kDecodeKv);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo_, p_, d_}));
    const int port = Port();
    router_ = Spawn("router",
                    {"router", "--prefill", p_->url(), "--decode", d_->url(), "--mode", "push",
                     "--host", host_, "--port", std::to_string(port)},
                    host_, port);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router_}));
  }

  double M(Proc* p, const char* name) const { return Metric(p->host, p->port, name); }

  /// `n` fresh prompts (D has none of them cached) through the router, 3 at a time; each must
  /// return the colocated tokens. Returns when the last one answered.
  void Batch(int n, uint32_t salt, const std::string& what) {
    std::vector<Req> reqs;
    std::vector<Res> want;
    for (int i = 0; i < n; ++i) {
      reqs.push_back(RandomPrompt(40 + i, 8, salt + static_cast<uint32_t>(i)));
      want.push_back(Send(colo_->host, colo_->port, reqs.back()));
      ASSERT_EQ(want.back().status, 200) << want.back().raw;
    }
    std::vector<Res> got(static_cast<size_t>(n));
    for (int at = 0; at < n; at += 3) {
      std::vector<std::thread> ts;
      for (int i = at; i < std::min(n, at + 3); ++i) {
        ts.emplace_back([&, i] {
          got[static_cast<size_t>(i)] =
              Send(router_->host, router_->port, reqs[static_cast<size_t>(i)], {}, nullptr, 60);
        });
      }
      for (auto& t : ts) t.join();
    }
    for (int i = 0; i < n; ++i) {
      const auto& g = got[static_cast<size_t>(i)];
      EXPECT_EQ(g.status, 200) << what << " request " << i << ": " << g.raw << " " << g.error;
      EXPECT_EQ(g.ids, want[static_cast<size_t>(i)].ids) << what << " request " << i;
    }
  }

  /// D's quarantined blocks back to 0 within broken_peer_ms (+ 1.5 s of slack: a health round,
  /// ticks, the metric scrape) of the last answer; returns the seconds it took.
  double QuarantinesEnd(const std::string& what) {
    const auto t0 = Clock::now();
    double held = -1;
    const bool ok = WaitFor(
        [&] {
          held = M(d_, kQuarantined);
          return held == 0;
        },
        kBrokenPeerMs + 1500);
    const double s = SecondsSince(t0);
    EXPECT_TRUE(ok) << what << ": D still holds " << held << " quarantined blocks " << s
                    << " s after the last answer (broken_peer_ms " << kBrokenPeerMs << ")";
    EXPECT_EQ(M(d_, kReleased), M(d_, kQuarantines)) << what;
    return s;
  }

  /// Every block of `p` free or cached, nothing in flight.
  void ExpectPoolWhole(Proc* p) {
    double used = -1, back = -1, total = -1;
    const bool ok = WaitFor(
        [&] {
          used = M(p, kBlocksUsed);
          back = M(p, kBlocksFree) + M(p, kBlocksCached);
          total = M(p, kBlocksTotal);
          return used == 0 && back == total && M(p, kConsumers) == 0 && M(p, kProducers) == 0 &&
                 M(p, kWaitingForKv) == 0;
        },
        5000);
    EXPECT_TRUE(ok) << p->name << ": used " << used << ", free+cached " << back << " of " << total
                    << ", consumers " << M(p, kConsumers) << ", producers " << M(p, kProducers);
  }

  std::string model_;
  const std::string host_ = "127.0.0.1";
  Proc *colo_ = nullptr, *p_ = nullptr, *d_ = nullptr, *router_ = nullptr;
};

TEST_F(PdBrokenPeer, PostsFailingForGoodQuarantinesEndWithinTheBoundAndPoolsAreWhole) {
  ASSERT_NO_FATAL_FAILURE(Start("post_failure_rate=1.0,seed=1"));
  for (int phase = 0; phase < 2; ++phase) {
    const std::string what = phase == 0 ? "first batch" : "second batch";
    const double quarantines0 = M(d_, kQuarantines);
    const double settled0 = M(d_, kSettled);
    ASSERT_NO_FATAL_FAILURE(Batch(6, 500 + 100 * static_cast<uint32_t>(phase), what));
    const double quarantines = M(d_, kQuarantines) - quarantines0;
    EXPECT_GT(quarantines, 0) << what << ": nothing was quarantined";
    const double s = QuarantinesEnd(what);
    EXPECT_EQ(M(d_, kSettled) - settled0, quarantines)
        << what << ": not every quarantine was ended by P's answer to the liveness query";
    std::printf(
        "%s: %g quarantines, ended by P's answers (%g queries in all); the last %.2f s "
        "after the last answer\n",
        what.c_str(), quarantines, M(d_, kAsked), s);
  }
  EXPECT_EQ(M(d_, kReady), 0) << "KV arrived from a P whose every post fails";
  const Status alive = apps::WaitHealthy(p_->host, p_->port, p_->child, 2000);
  EXPECT_TRUE(alive.ok()) << "P is alive and healthy all along: " << alive.ToString();
  ExpectPoolWhole(d_);
  ExpectPoolWhole(p_);
}

TEST_F(PdBrokenPeer, APrefillBrokenForAWhileIsAnsweredForThenPushesAgain) {
  ASSERT_NO_FATAL_FAILURE(Start("seed=1"));  // no injected failure until SIGUSR1
  ASSERT_NO_FATAL_FAILURE(Batch(1, 900, "healthy"));
  ASSERT_EQ(M(d_, kReady), 1) << "the healthy P's KV was not pushed";
  struct Heal {  // SIGUSR2 however the test ends
    pid_t pid;
    ~Heal() { ::kill(pid, SIGUSR2); }
  } heal{p_->child.pid()};
  ASSERT_EQ(::kill(p_->child.pid(), SIGUSR1), 0);
  ASSERT_NO_FATAL_FAILURE(Batch(4, 1000, "broken"));
  EXPECT_EQ(M(d_, kReady), 1) << "KV arrived from a P whose every post fails";
  EXPECT_GT(M(d_, kQuarantines), 0);
  const double s = QuarantinesEnd("broken");
  EXPECT_EQ(M(d_, kSettled), M(d_, kQuarantines));
  std::printf("broken: quarantines ended %.2f s after the last answer\n", s);
  ASSERT_EQ(::kill(p_->child.pid(), SIGUSR2), 0);
  const double recomputes = M(d_, kRecomputes);
  ASSERT_NO_FATAL_FAILURE(Batch(3, 1100, "healed"));
  EXPECT_EQ(M(d_, kReady), 4) << "the healed P's KV did not arrive";
  EXPECT_EQ(M(d_, kRecomputes), recomputes) << "a healed P's request was recomputed on D";
  EXPECT_EQ(M(d_, kQuarantined), 0);
  ExpectPoolWhole(d_);
  ExpectPoolWhole(p_);
}

}  // namespace
}  // namespace kvpush::pd_test
