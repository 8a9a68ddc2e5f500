// Graceful drain, retries and P/D metrics with real processes (issue 14; docs/server.md
// "Graceful drain", docs/router.md "Retries", docs/reliability.md):
//   (a) a D stopped with SIGTERM under concurrent traffic through the router (1 P, 2 D, push,
//       ucx:tcp): no request fails, D exits 0;
//   (b) a colocated instance draining with streams and non-streamed requests open past
//       --drain-timeout-s: new requests and /health get 503 `draining`, open streams end with an
//       SSE error event (`draining_timeout`) and [DONE], non-streamed ones with 503, exit 0;
//   (c) push, P killed (SIGKILL) while D holds the request's KV reservation: the client gets an
//       error and D's blocks all come back;
//   (d) usage.prompt_tokens_details.cached_tokens on D equals colocated's (the instance's own
//       prefix-cache hit, never transferred tokens), and D counts transferred prompt tokens
//       apart from computed ones.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "pd_fixture.h"

namespace kvpush::pd_test {
namespace {

constexpr const char* kBlocksTotal = "kvpush_kv_blocks_total";
constexpr const char* kBlocksFree = "kvpush_kv_blocks_free";
constexpr const char* kBlocksCached = "kvpush_kv_blocks_cached";

/// GET path on p: {status, body}; status 0 on a transport failure.
std::pair<int, std::string> GetFrom(const Proc& p, const std::string& path) {
  httplib::Client cli(p.host, p.port);
  cli.set_connection_timeout(2, 0);
  cli.set_read_timeout(5, 0);
  auto r = cli.Get(path);
  if (!r) return {0, httplib::to_string(r.error())};
  return {r->status, r->body};
}

class PdDrain : public PdFixture {
 protected:
  Proc* Serve(const std::string& name, const std::string& role,
              const std::vector<std::string>& extra) {
    const int port = Port();
    const std::string cfg = role == "both" ? "" : KvCfg("ucx:tcp");
    return Spawn(name, ServeArgs(model_, role, host_, port, cfg, extra), host_, port);
  }

  /// A serve process of `role` on the sim executor (Qwen3-32B on an H200, modelled: ~20 ms per
  /// decoded token, so a 2000-token answer outlives a 2 s drain timeout).
  Proc* ServeSim(const std::string& name, const std::string& role,
                 const std::vector<std::string>& extra) {
    std::vector<std::string> sim = {"--executor", "sim",      "--sim-model",
                                    "qwen3-32b",  "--sim-hw", "h200"};
    sim.insert(sim.end(), extra.begin(), extra.end());
    const int port = Port();
    const std::string cfg = role == "both" ? "" : KvCfg("ucx:tcp");
    return Spawn(name, ServeArgs("", role, host_, port, cfg, sim), host_, port);
  }

  Proc* Router(const std::vector<Proc*>& ps, const std::vector<Proc*>& ds, int health_ms,
               const std::vector<std::string>& extra = {"--mode", "push"},
               const std::string& name = "router") {
    const int port = Port();
    std::vector<std::string> a = {"router",
                                  "--host",
                                  host_,
                                  "--port",
                                  std::to_string(port),
                                  "--health-interval-ms",
                                  std::to_string(health_ms)};
    for (Proc* p : ps) a.insert(a.end(), {"--prefill", p->url()});
    for (Proc* d : ds) a.insert(a.end(), {"--decode", d->url()});
    a.insert(a.end(), extra.begin(), extra.end());
    return Spawn(name, a, host_, port);
  }

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

  /// Sends SIGTERM to `p` and waits (at most `ms`) for it to exit; its wait status, or -1.
  static int TermAndWait(Proc* p, int ms) {
    if (::kill(p->child.pid(), SIGTERM) != 0) return -1;
    if (!WaitFor([&] { return !p->child.Running(); }, ms)) return -1;
    return p->child.Stop(0);  // not running: returns the status it exited with
  }

  void DrainDecodeUnderTraffic(int health_ms);

  /// What a client saw of a drain (DrainWithRequestsOpen).
  struct DrainSeen {
    std::pair<int, std::string> health;  ///< GET /health once draining: {status, body}
    Res refused;                         ///< a new request once draining
    Res streamed, whole;   ///< 2000-token answers, streamed and not, open past the timeout
    int exit_status = -1;  ///< `front`'s wait status; -1 when it did not exit within 10 s
  };
  /// Sends a 2000-token answer streamed and one not to `front` (started with
  /// --drain-timeout-s 2), waits until both run on `engine`, sends `front` SIGTERM and records
  /// what a client sees until `front` exits.
  DrainSeen DrainWithRequestsOpen(Proc* front, Proc* engine);

  void SetUp() override {
    PdFixture::SetUp();
    model_ = ModelOrGenerated();
    ASSERT_FALSE(model_.empty());
  }

  std::string model_;
  const std::string host_ = "127.0.0.1";
};

/// 1 P, 2 D, a push router checking health every `health_ms`; D1 gets SIGTERM while traffic
/// runs (6 clients, streamed and not); checks that no request failed and D1 exited 0.
void PdDrain::DrainDecodeUnderTraffic(int health_ms) {
  Proc* p = Serve("prefill", "prefill", {});
  Proc* d1 = Serve("decode1", "decode", {"--drain-timeout-s", "20"});
  Proc* d2 = Serve("decode2", "decode", {});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({p, d1, d2}));
  Proc* router = Router({p}, {d1, d2}, health_ms);
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router}));
  const std::string d1_outstanding =
      "kvpush_router_instance_outstanding{role=\"decode\",url=\"" + d1->url() + "\"}";

  std::atomic<bool> d1_gone{false};
  std::atomic<int> sent{0};
  const int kThreads = 6;
  std::vector<std::vector<Res>> out(kThreads);
  std::vector<std::vector<Req>> reqs(kThreads);
  std::vector<std::thread> clients;
  for (int c = 0; c < kThreads; ++c) {
    clients.emplace_back([&, c] {
      // Until D1 is gone, then 4 more each (they must all go to D2).
      int after = 0;
      for (uint32_t i = 0; after < 4; ++i) {
        if (d1_gone.load()) ++after;
        Req r =
            RandomPrompt(24 + static_cast<int>(i % 5) * 8, 48, static_cast<uint32_t>(c * 1000) + i);
        r.stream = (i + static_cast<uint32_t>(c)) % 2 == 0;
        out[static_cast<size_t>(c)].push_back(Send(router->host, router->port, r, {}, nullptr, 60));
        reqs[static_cast<size_t>(c)].push_back(r);
        sent.fetch_add(1);
      }
    });
  }
  // SIGTERM while D1 has legs in flight.
  ASSERT_TRUE(
      WaitFor([&] { return Metric(router->host, router->port, d1_outstanding) >= 1; }, 20000))
      << "D1 never had a request in flight";
  const int sent_before = sent.load();
  const int status = TermAndWait(d1, 30000);
  d1_gone.store(true);
  for (auto& t : clients) t.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "D1's wait status " << status;

  int n = 0, failed = 0;
  for (size_t c = 0; c < out.size(); ++c) {
    for (size_t i = 0; i < out[c].size(); ++i) {
      ++n;
      const Res& r = out[c][i];
      if (r.status != 200 || !r.error.empty() || r.ids.empty()) {
        ++failed;
        ADD_FAILURE() << reqs[c][i].label << (reqs[c][i].stream ? " (stream)" : "") << ": HTTP "
                      << r.status << " " << r.error << " " << r.raw.substr(0, 300);
      }
    }
  }
  const double retries = Metric(router->host, router->port, "kvpush_router_retries_total");
  std::string drain_line;
  {
    std::ifstream log(d1->log);
    for (std::string line; std::getline(log, line);) {
      if (line.find("kvpush serve: draining") != std::string::npos ||
          line.find("kvpush serve: drained") != std::string::npos) {
        drain_line += "\n  D1: " + line;
      }
    }
  }
  std::printf(
      "drain under traffic (health every %d ms): %d requests (%d completed before "
      "SIGTERM), %d failed, %.0f retried%s\n",
      health_ms, n, sent_before, failed, retries, drain_line.c_str());
  EXPECT_EQ(failed, 0);
  double used = -1;
  EXPECT_TRUE(BlocksBack(d2, 5000, &used)) << "D2 still uses " << used << " blocks";
  EXPECT_TRUE(BlocksBack(p, 5000, &used)) << "P still uses " << used << " blocks";
}

TEST_F(PdDrain, SigtermedDecodeUnderTrafficLosesNoRequest) {
  DrainDecodeUnderTraffic(200);
}

// The router learns of the drain only from D1's own 503 `draining` answers and, once D1 is gone,
// from refused connections: every such request is retried on D2.
TEST_F(PdDrain, SigtermedDecodeLearntFromItsRefusalsLosesNoRequest) {
  DrainDecodeUnderTraffic(600000);
}

PdDrain::DrainSeen PdDrain::DrainWithRequestsOpen(Proc* front, Proc* engine) {
  DrainSeen seen;
  const json long_answer = {{"ignore_eos", true}};
  Req r;
  r.label = "long answer";
  r.prompt = {1, 300, 301, 302, 303, 304, 305, 306};
  r.max_tokens = 2000;
  std::thread ts([&] {
    Req s = r;
    s.stream = true;
    seen.streamed = Send(front->host, front->port, s, {}, &long_answer, 60);
  });
  std::thread tw([&] { seen.whole = Send(front->host, front->port, r, {}, &long_answer, 60); });
  const bool running = WaitFor(
      [&] { return Metric(engine->host, engine->port, "vllm:num_requests_running") >= 2; },
      20000);
  EXPECT_TRUE(running) << "the two long answers never ran on " << engine->name;
  EXPECT_EQ(::kill(front->child.pid(), SIGTERM), 0);
  // Draining: /health and new requests get 503 `draining`.
  EXPECT_TRUE(WaitFor(
      [&] {
        seen.health = GetFrom(*front, "/health");
        return seen.health.first == 503;
      },
      1500))
      << "HTTP " << seen.health.first << " " << seen.health.second;
  seen.refused = Send(front->host, front->port, RandomPrompt(8, 4, 1), {}, nullptr, 10);
  ts.join();
  tw.join();
  if (WaitFor([&] { return !front->child.Running(); }, 10000)) {
    seen.exit_status = front->child.Stop(0);  // not running: the status it exited with
  }
  return seen;
}

TEST_F(PdDrain, RequestsOpenPastTheTimeoutEndWithAnError) {
  Proc* colo = ServeSim("colocated", "both", {"--drain-timeout-s", "2"});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo}));
  const DrainSeen seen = DrainWithRequestsOpen(colo, colo);
  EXPECT_EQ(ErrorOf(seen.health.second)["code"], "draining") << seen.health.second;
  EXPECT_EQ(seen.refused.status, 503) << seen.refused.raw;
  EXPECT_EQ(ErrorOf(seen.refused.raw)["code"], "draining") << seen.refused.raw;
  // The stream got tokens, then an error event (never a silent cut).
  EXPECT_EQ(seen.streamed.status, 200);
  EXPECT_FALSE(seen.streamed.ids.empty());
  EXPECT_NE(seen.streamed.error.find("drain timeout"), std::string::npos) << seen.streamed.error;
  EXPECT_EQ(seen.whole.status, 503) << seen.whole.raw;
  EXPECT_EQ(ErrorOf(seen.whole.raw)["code"], "draining_timeout") << seen.whole.raw;
  EXPECT_TRUE(WIFEXITED(seen.exit_status) && WEXITSTATUS(seen.exit_status) == 0)
      << "wait status " << seen.exit_status;
}

// The same drain seen through a router (push and pull, sim P and D) that gets the SIGTERM: the
// client gets what a draining colocated instance answers — the same status and error object for
// /health, a new request and the non-streamed request cut at the timeout, and the same error
// event in the stream. (The router writes no [DONE] after an error event; the instance does:
// docs/router.md "Shutdown".)
TEST_F(PdDrain, ADrainingRouterAnswersAsADrainingInstance) {
  Proc* colo = ServeSim("colocated", "both", {"--drain-timeout-s", "2"});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo}));
  const DrainSeen want = DrainWithRequestsOpen(colo, colo);
  ASSERT_EQ(want.whole.status, 503) << want.whole.raw;
  for (const std::string mode : {"push", "pull"}) {
    SCOPED_TRACE("router --mode " + mode);
    Proc* p = ServeSim("prefill-" + mode, "prefill", {});
    Proc* d = ServeSim("decode-" + mode, "decode", {});
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({p, d}));
    Proc* router =
        Router({p}, {d}, 200, {"--mode", mode, "--drain-timeout-s", "2"}, "router-" + mode);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router}));
    const DrainSeen got = DrainWithRequestsOpen(router, d);
    EXPECT_EQ(got.health.first, want.health.first) << got.health.second;
    EXPECT_EQ(ErrorOf(got.health.second), ErrorOf(want.health.second)) << got.health.second;
    EXPECT_EQ(got.refused.status, want.refused.status) << got.refused.raw;
    EXPECT_EQ(json::parse(got.refused.raw, nullptr, false), json::parse(want.refused.raw))
        << got.refused.raw;
    EXPECT_EQ(got.streamed.status, 200);
    EXPECT_FALSE(got.streamed.ids.empty());
    EXPECT_EQ(got.streamed.error, want.streamed.error);
    EXPECT_EQ(got.whole.status, want.whole.status) << got.whole.raw;
    EXPECT_EQ(json::parse(got.whole.raw, nullptr, false), json::parse(want.whole.raw))
        << got.whole.raw;
    EXPECT_TRUE(WIFEXITED(got.exit_status) && WEXITSTATUS(got.exit_status) == 0)
        << "router wait status " << got.exit_status;
  }
}

TEST_F(PdDrain, KilledPrefillGetsTheClientAnErrorAndFreesDecodeBlocks) {
  Proc* p = Serve("prefill", "prefill", {});
  Proc* d = Serve("decode", "decode", {});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({p, d}));
  // Health checks far apart: the failure must be seen on the legs themselves.
  Proc* router = Router({p}, {d}, 600000);
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router}));
  ASSERT_EQ(Send(router->host, router->port, RandomPrompt(40, 4, 7)).status,
            200);  // warm (handshake)

  // P stopped: the request's legs are accepted by its kernel, D reserves blocks and waits; then
  // P dies (SIGKILL) with the request in flight.
  ASSERT_TRUE(StopProcess(p->child.pid()));
  Res got;
  Req r = RandomPrompt(60, 8, 11);
  r.stream = true;
  std::atomic<bool> answered{false};
  std::thread client([&] {
    got = Send(router->host, router->port, r, {}, nullptr, 30);
    answered.store(true);
  });
  ASSERT_TRUE(WaitFor([&] { return Metric(d->host, d->port, kWaitingForKv) >= 1; }, 10000))
      << "D never reserved the request's blocks";
  ASSERT_EQ(::kill(p->child.pid(), SIGKILL), 0);
  const auto t0 = Clock::now();
  const bool in_time = WaitFor([&] { return answered.load(); }, 5000);
  const double s = SecondsSince(t0);
  client.join();
  EXPECT_TRUE(in_time) << "the client got no answer within 5 s of P's death";
  std::printf("push, P killed mid-request: HTTP %d after %.3f s: %s\n", got.status, s,
              got.error.c_str());
  EXPECT_GE(got.status, 500) << got.raw;
  EXPECT_TRUE(got.ids.empty());
  double used = -1;
  EXPECT_TRUE(BlocksBack(d, 5000, &used)) << "D still uses " << used << " blocks";
  EXPECT_EQ(Metric(d->host, d->port, kWaitingForKv), 0);
}

TEST_F(PdDrain, CachedTokensAreTheInstancesOwnHitAndTransferredTokensAreCountedApart) {
  Proc* colo = Serve("colocated", "both", {"--enable-prompt-tokens-details"});
  Proc* p = Serve("prefill", "prefill", {"--enable-prompt-tokens-details"});
  Proc* d = Serve("decode", "decode", {"--enable-prompt-tokens-details"});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo, p, d}));
  Proc* router = Router({p}, {d}, 500);
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router}));

  auto cached = [](const Res& r) {
    const json j = json::parse(r.raw, nullptr, false);
    return j.is_object() ? j["usage"]["prompt_tokens_details"]["cached_tokens"] : json(nullptr);
  };
  const Req a = RandomPrompt(100, 4, 21);
  Req b = a;  // shares a's first 64 tokens
  b.label = "a's first 64 tokens + 36 others";
  const Req tail = RandomPrompt(37, 4, 22);
  b.prompt.resize(64);
  b.prompt.insert(b.prompt.end(), tail.prompt.begin() + 1, tail.prompt.end());
  for (const Req& r : {a, a, b}) {
    const Res ref = Send(colo->host, colo->port, r);
    const Res got = Send(router->host, router->port, r);
    ASSERT_EQ(ref.status, 200) << ref.raw;
    ASSERT_EQ(got.status, 200) << got.raw;
    EXPECT_EQ(got.ids, ref.ids) << r.label;
    EXPECT_EQ(cached(got), cached(ref))
        << r.label << ": D " << got.raw << "\ncolocated " << ref.raw;
  }
  // D: a's 100 prompt tokens came over the connector the first time (or all but a cached
  // prefix); what D computed itself is counted apart.
  const double transferred = Metric(d->host, d->port, "kvpush_prompt_tokens_transferred_total");
  const double computed = Metric(d->host, d->port, "kvpush_prompt_tokens_computed_total");
  const double p_computed = Metric(p->host, p->port, "kvpush_prompt_tokens_computed_total");
  std::printf("D: %.0f prompt tokens transferred, %.0f computed; P computed %.0f\n", transferred,
              computed, p_computed);
  EXPECT_GE(transferred, 99);
  EXPECT_LT(computed, transferred);
  EXPECT_EQ(Metric(d->host, d->port, "kvpush_pd_local_prefill_requests_total"), 0);
  EXPECT_TRUE(WaitFor(
      [&] {
        return Metric(p->host, p->port, "kvpush_kv_transfer_not_needed_received_total") ==
               Metric(d->host, d->port, "kvpush_kv_transfer_not_needed_total");
      },
      3000))
      << "NOT_NEEDED sent by D and received by P differ";
}

}  // namespace
}  // namespace kvpush::pd_test
