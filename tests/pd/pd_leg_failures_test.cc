// P/D legs fail together (DESIGN.md §6), with real processes: kvpush serve (colocated, P, D) and
// kvpush router over ucx:tcp.
//   (a) push, P refuses the prompt (max-model-len 64 vs D's 512): the client gets P's 400 at once,
//       as colocated serving gives it, and D's blocks come back (no 10 s watchdog);
//   (b) D refuses a request P accepted: P's blocks come back within a round trip, not at lease
//       expiry (lease 30 s), in push and in pull;
//   (c) pull and push with P stopped (SIGSTOP): the request fails with a 5xx within about one
//       health interval, and after SIGCONT requests succeed again;
//   (d) POST /kv/abort itself: bad ids, no connector, unknown ids, a D request in flight;
//   (e) an instance whose HTTP workers are all busy (requests waiting for KV) still answers
//       /health at once, so the router keeps it healthy and cuts nothing.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <string>
#include <thread>
#include <vector>

#include "pd_fixture.h"

namespace kvpush::pd_test {
namespace {

constexpr const char* kAborted = "kvpush_kv_transfer_aborted_total";
constexpr const char* kBlocksTotal = "kvpush_kv_blocks_total";
constexpr const char* kBlocksFree = "kvpush_kv_blocks_free";
constexpr const char* kBlocksCached = "kvpush_kv_blocks_cached";

/// POST `path` with a raw body; {status, body} (status 0 on a transport failure).
std::pair<int, std::string> PostTo(const Proc& p, const std::string& path,
                                   const std::string& body) {
  httplib::Client cli(p.host, p.port);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(10, 0);
  auto r = cli.Post(path, body, "application/json");
  if (!r) return {0, httplib::to_string(r.error())};
  return {r->status, r->body};
}


/// Seconds one GET /health on `p` takes; -1 when it fails.
double HealthSeconds(const Proc& p) {
  httplib::Client cli(p.host, p.port);
  cli.set_read_timeout(5, 0);
  const auto t0 = Clock::now();
  auto r = cli.Get("/health");
  return r && r->status == 200 ? SecondsSince(t0) : -1;
}

class PdLegs : public PdFixture {
 protected:
  /// A serve process of `role` with `extra` flags; P/D instances use ucx:tcp and `kv`.
  Proc* Serve(const std::string& name, const std::string& role,
              const std::vector<std::string>& extra, const json& kv = json::object()) {
    const int port = Port();
    const std::string cfg = role == "both" ? "" : KvCfg("ucx:tcp", kv);
    return Spawn(name, ServeArgs(model_, role, host_, port, cfg, extra), host_, port);
  }

  Proc* Router(Proc* p, Proc* d, const std::string& mode) {
    const int port = Port();
    return Spawn("router",
                 {"router", "--prefill", p->url(), "--decode", d->url(), "--mode", mode, "--host",
                  host_, "--port", std::to_string(port), "--health-interval-ms", "500"},
                 host_, port);
  }

  /// Polls until `p` uses no KV block and all of them are free or cached; false after `ms`.
  bool BlocksBack(Proc* p, int ms, double* used) {
    return WaitFor(
        [&] {
          *used = Metric(p->host, p->port, kBlocksUsed);
          const double back =
              Metric(p->host, p->port, kBlocksFree) + Metric(p->host, p->port, kBlocksCached);
          return *used == 0 && back == Metric(p->host, p->port, kBlocksTotal);
        },
        ms);
  }

  void SetUp() override {
    PdFixture::SetUp();
    model_ = ModelOrGenerated();
    ASSERT_FALSE(model_.empty());
  }

  std::string model_;
  const std::string host_ = "127.0.0.1";
};

TEST_F(PdLegs, PushPrefillRefusalReachesTheClientAtOnceAndDecodeFreesItsBlocks) {
  Proc* colo = Serve("colocated", "both", {"--max-model-len", "64"});
  Proc* p = Serve("prefill", "prefill", {"--max-model-len", "64"});
  Proc* d = Serve("decode", "decode", {"--max-model-len", "512"});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo, p, d}));
  Proc* router = Router(p, d, "push");
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router}));

  Req r = RandomPrompt(70, 8, 1);
  const Res ref = Send(colo->host, colo->port, r);
  ASSERT_EQ(ref.status, 400) << ref.raw;
  ASSERT_EQ(ErrorOf(ref.raw)["code"], "context_length_exceeded") << ref.raw;
  for (bool stream : {false, true}) {
    r.stream = stream;
    const auto t0 = Clock::now();
    const Res got = Send(router->host, router->port, r, {}, nullptr, 30.0);
    const double s = SecondsSince(t0);
    const std::string what = stream ? "streamed" : "not streamed";
    EXPECT_LT(s, 2.0) << what << ": the client waited for D";
    EXPECT_EQ(got.status, 400) << what << ": " << got.raw << " " << got.error;
    if (!stream) {
      EXPECT_EQ(ErrorOf(got.raw), ErrorOf(ref.raw)) << got.raw;
    }
    EXPECT_EQ(got.error, ErrorOf(ref.raw)["message"]) << what;
    EXPECT_TRUE(got.ids.empty()) << what;
    std::printf("push, P refuses (%s): HTTP %d after %.3f s\n", what.c_str(), got.status, s);
  }
  // D's request was aborted (POST /kv/abort), not left to its 10 s watchdog.
  double used = -1;
  EXPECT_TRUE(BlocksBack(d, 3000, &used)) << "D still uses " << used << " blocks";
  EXPECT_EQ(Metric(d->host, d->port, kWaitingForKv), 0);
  EXPECT_EQ(Metric(d->host, d->port, kWatchdog), 0) << "D's watchdog fired: D was not aborted";
}

TEST_F(PdLegs, DecodeRefusalFreesPrefillBlocksWithinARoundTrip) {
  const json kv = {{"lease_ms", 30000}};
  Proc* p = Serve("prefill", "prefill", {}, kv);
  Proc* d = Serve("decode", "decode", {"--max-model-len", "64"}, kv);
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({p, d}));
  Proc* router = Router(p, d, "push");
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router}));

  for (const char* mode : {"pull-fast", "push"}) {
    const double aborted0 = Metric(p->host, p->port, kAborted);
    const int n = 5;
    for (int i = 0; i < n; ++i) {
      const Req r =
          RandomPrompt(70 + i, 8, 100 + static_cast<uint32_t>(i) + (mode[1] == 'u' ? 0 : 50));
      const Res got = Send(router->host, router->port, r, {{"x-kvpush-mode", mode}}, nullptr, 30);
      ASSERT_EQ(got.status, 400) << mode << ": " << got.raw;
      EXPECT_EQ(ErrorOf(got.raw)["code"], "context_length_exceeded") << got.raw;
    }
    const auto t0 = Clock::now();
    double used = -1;
    EXPECT_TRUE(BlocksBack(p, 1500, &used))
        << mode << ": P still holds " << used << " blocks (lease 30 s)";
    const double aborted = Metric(p->host, p->port, kAborted) - aborted0;
    std::printf("%s, D refuses: P's blocks back %.3f s after the last answer; %s +%.0f\n", mode,
                SecondsSince(t0), kAborted, aborted);
    if (std::string(mode) == "pull-fast") {
      EXPECT_EQ(aborted, n) << "every leased pull prefill is aborted";
    } else {
      EXPECT_GE(aborted, 1) << "no push prefill was aborted while P held it";
    }
  }
}

TEST_F(PdLegs, StoppedPrefillFailsTheRequestWithinAHealthInterval) {
  Proc* p = Serve("prefill", "prefill", {});
  Proc* d = Serve("decode", "decode", {});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({p, d}));
  Proc* router = Router(p, d, "pull");
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router}));
  const Req r = RandomPrompt(40, 8, 7);
  const Res before = Send(router->host, router->port, r);
  ASSERT_EQ(before.status, 200) << before.raw;

  struct Resume {  // SIGCONT however the test ends
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{p->child.pid()};
  uint32_t salt = 70;
  for (const char* mode : {"pull", "push"}) {
    // A prompt D has not cached (a full prefix hit on D needs no P). Stop P, then send at once:
    // the leg is in flight when the router marks P unhealthy.
    const Req fresh = RandomPrompt(40, 8, ++salt);
    ASSERT_TRUE(StopProcess(p->child.pid()));
    const auto t0 = Clock::now();
    const Res got = Send(router->host, router->port, fresh, {{"x-kvpush-mode", mode}}, nullptr, 60);
    const double s = SecondsSince(t0);
    std::printf("%s, P stopped: HTTP %d after %.3f s: %s\n", mode, got.status, s,
                got.error.c_str());
    EXPECT_GE(got.status, 500) << mode << ": " << got.raw;
    EXPECT_LT(s, 4.0) << mode << ": the leg was not cut within a health interval";
    EXPECT_EQ(ErrorOf(got.raw)["code"], "prefill_unhealthy") << mode << ": " << got.raw;
    EXPECT_NE(got.error.find(p->url()), std::string::npos) << mode << ": " << got.raw;
    EXPECT_TRUE(got.ids.empty());
    double used = -1;
    const bool push = std::string(mode) == "push";
    if (push) {
      // D announced its blocks to P, and a stopped P may still write into them when it resumes:
      // D keeps them quarantined (out of use) until P acknowledges the cancel, never before.
      ASSERT_TRUE(WaitFor(
          [&] { return Metric(d->host, d->port, "kvpush_kv_blocks_quarantined") > 0; }, 5000))
          << "push: D did not quarantine the blocks announced to the stopped P";
      EXPECT_EQ(Metric(d->host, d->port, "kvpush_kv_blocks_used"),
                Metric(d->host, d->port, "kvpush_kv_blocks_quarantined"))
          << "push: D uses blocks other than the quarantined ones";
    } else {
      EXPECT_TRUE(BlocksBack(d, 5000, &used)) << mode << ": D still uses " << used << " blocks";
    }

    ASSERT_EQ(::kill(p->child.pid(), SIGCONT), 0);
    if (push) {
      EXPECT_TRUE(BlocksBack(d, 5000, &used))
          << "push: D still uses " << used << " blocks after P resumed and acknowledged";
      EXPECT_EQ(Metric(d->host, d->port, "kvpush_kv_blocks_quarantined"), 0);
    }
    ASSERT_TRUE(WaitFor(
        [&] { return PostTo(*router, "/v1/completions", r.Body().dump()).first == 200; }, 5000))
        << mode << ": the router did not take P back after SIGCONT";
    const Res again = Send(router->host, router->port, r, {{"x-kvpush-mode", mode}});
    EXPECT_EQ(again.status, 200) << mode << " after SIGCONT: " << again.raw;
    EXPECT_EQ(again.ids, before.ids) << mode << " after SIGCONT";
  }
}

TEST_F(PdLegs, KvAbortEndpoint) {
  Proc* colo = Serve("colocated", "both", {});
  Proc* p = Serve("prefill", "prefill", {});
  Proc* d = Serve("decode", "decode", {}, {{"watchdog_ms", 20000}});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo, p, d}));
  const std::string tid = NewTransferId();
  const std::string ok_body = json{{"transfer_id", tid}}.dump();

  auto [status, body] = PostTo(*colo, "/kv/abort", ok_body);
  EXPECT_EQ(status, 404) << body;
  EXPECT_EQ(ErrorOf(body)["code"], "not_pd_instance") << body;
  for (const std::string& bad :
       {std::string("{not json"), std::string("[]"), std::string("{}"),
        json{{"transfer_id", 7}}.dump(), json{{"transfer_id", "abc"}}.dump(),
        json{{"transfer_id", std::string(32, 'A')}}.dump()}) {
    std::tie(status, body) = PostTo(*p, "/kv/abort", bad);
    EXPECT_EQ(status, 400) << bad << " -> " << body;
    EXPECT_EQ(ErrorOf(body)["type"], "invalid_request_error") << body;
  }
  for (int i = 0; i < 2; ++i) {  // unknown id, then the same again: idempotent
    std::tie(status, body) = PostTo(*p, "/kv/abort", ok_body);
    EXPECT_EQ(status, 200) << body;
    EXPECT_EQ(json::parse(body), json({{"transfer_id", tid}, {"aborted_requests", 0}}));
  }
  // A P leg of an aborted transfer is refused.
  const Req r = RandomPrompt(40, 8, 3);
  std::tie(status, body) = PostTo(*p, "/v1/completions", PLegBody(r, "push", tid).dump());
  EXPECT_EQ(status, 409) << body;
  EXPECT_EQ(ErrorOf(body)["code"], "transfer_aborted") << body;

  // A D leg waiting for KV that never comes (no P leg was sent) is aborted in flight.
  const std::string tid2 = NewTransferId();
  const json extra = PushDExtra(tid2, *p);
  Res out;
  std::thread leg([&] { out = Send(d->host, d->port, r, {}, &extra, 60.0); });
  const bool waiting = WaitFor([&] { return Metric(d->host, d->port, kWaitingForKv) == 1; }, 10000);
  EXPECT_TRUE(waiting) << "D never waited for KV";
  std::tie(status, body) = PostTo(*d, "/kv/abort", json{{"transfer_id", tid2}}.dump());
  leg.join();
  EXPECT_EQ(status, 200) << body;
  EXPECT_EQ(json::parse(body)["aborted_requests"], 1) << body;
  // Ended by the abort, not by D's watchdog (which would have given up on the KV later).
  EXPECT_EQ(Metric(d->host, d->port, "kvpush_kv_transfer_watchdog_expired_total"), 0)
      << "D's request was not ended by the abort";
  EXPECT_GE(out.status, 500) << out.raw;
  EXPECT_TRUE(out.ids.empty());
  double used = -1;
  EXPECT_TRUE(BlocksBack(d, 3000, &used)) << "D still uses " << used << " blocks";
}

TEST_F(PdLegs, BusyInstanceAnswersHealthAndKeepsItsLegs) {
  Proc* p = Serve("prefill", "prefill", {});
  // 16 HTTP workers (max(16, max_num_seqs + 8)); requests wait 2 s for KV that never comes.
  Proc* d = Serve("decode", "decode", {"--max-num-seqs", "1"}, {{"watchdog_ms", 2000}});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({p, d}));
  Proc* router = Router(p, d, "push");
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router}));
  const std::string healthy_d =
      "kvpush_router_instance_healthy{role=\"decode\",url=\"" + d->url() + "\"}";

  const int n = 24;  // more than D's HTTP workers
  std::vector<Res> out(n);
  std::vector<std::thread> legs;
  legs.reserve(n);
  for (int i = 0; i < n; ++i) {
    legs.emplace_back([&, i] {
      const json extra = PushDExtra(NewTransferId(), *p);
      out[static_cast<size_t>(i)] = Send(
          d->host, d->port, RandomPrompt(40, 4, 500 + static_cast<uint32_t>(i)), {}, &extra, 60);
    });
  }
  double worst = 0;
  for (int k = 0; k < 10; ++k) {  // 1.5 s while every worker is taken
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    const double s = HealthSeconds(*d);
    EXPECT_GE(s, 0) << "D's /health failed while busy";
    worst = std::max(worst, s);
    EXPECT_EQ(Metric(router->host, router->port, healthy_d), 1) << "the router lost D";
  }
  for (auto& t : legs) t.join();
  std::printf("D busy with %d legs: slowest /health %.3f s\n", n, worst);
  EXPECT_LT(worst, 0.5) << "D's /health waited behind its busy workers";
  for (const Res& r : out) EXPECT_NE(r.status, 0) << "a leg got no answer: " << r.error;
  EXPECT_EQ(Metric(router->host, router->port, "kvpush_router_legs_cut_total"), 0);
}

}  // namespace
}  // namespace kvpush::pd_test
