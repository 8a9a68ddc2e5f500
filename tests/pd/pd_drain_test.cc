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

/// A prompt of `n` token ids (BOS first) from a fixed pseudo-random sequence.
Req Prompt(int n, int max_tokens, uint32_t salt) {
  Req r;
  r.label = std::to_string(n) + "-token prompt #" + std::to_string(salt);
  r.prompt = {1};
  uint32_t x = 2463534242u ^ (salt * 2654435761u);
  for (int i = 1; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    r.prompt.push_back(static_cast<int32_t>(3 + x % 500));
  }
  r.max_tokens = max_tokens;
  return r;
}

json ErrorOf(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  return j.is_object() && j.contains("error") ? j["error"] : json(nullptr);
}

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

  Proc* Router(const std::vector<Proc*>& ps, const std::vector<Proc*>& ds, int health_ms) {
    const int port = Port();
    std::vector<std::string> a = {"router", "--mode", "push", "--host", host_, "--port",
                                  std::to_string(port), "--health-interval-ms",
                                  std::to_string(health_ms)};
    for (Proc* p : ps) a.insert(a.end(), {"--prefill", p->url()});
    for (Proc* d : ds) a.insert(a.end(), {"--decode", d->url()});
    return Spawn("router", a, host_, port);
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
        Req r = Prompt(24 + static_cast<int>(i % 5) * 8, 48, static_cast<uint32_t>(c * 1000) + i);
        r.stream = (i + static_cast<uint32_t>(c)) % 2 == 0;
        out[static_cast<size_t>(c)].push_back(Send(router->host, router->port, r, {}, nullptr, 60));
        reqs[static_cast<size_t>(c)].push_back(r);
        sent.fetch_add(1);
      }
    });
  }
  // SIGTERM while D1 has legs in flight.
  ASSERT_TRUE(WaitFor([&] { return Metric(router->host, router->port, d1_outstanding) >= 1; },
                      20000))
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
        ADD_FAILURE() << reqs[c][i].label << (reqs[c][i].stream ? " (stream)" : "")
                      << ": HTTP " << r.status << " " << r.error << " " << r.raw.substr(0, 300);
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
  std::printf("drain under traffic (health every %d ms): %d requests (%d completed before "
              "SIGTERM), %d failed, %.0f retried%s\n",
              health_ms, n, sent_before, failed, retries, drain_line.c_str());
  EXPECT_EQ(failed, 0);
  double used = -1;
  EXPECT_TRUE(BlocksBack(d2, 5000, &used)) << "D2 still uses " << used << " blocks";
  EXPECT_TRUE(BlocksBack(p, 5000, &used)) << "P still uses " << used << " blocks";
}

TEST_F(PdDrain, SigtermedDecodeUnderTrafficLosesNoRequest) { DrainDecodeUnderTraffic(200); }

// The router learns of the drain only from D1's own 503 `draining` answers and, once D1 is gone,
// from refused connections: every such request is retried on D2.
TEST_F(PdDrain, SigtermedDecodeLearntFromItsRefusalsLosesNoRequest) {
  DrainDecodeUnderTraffic(600000);
}

TEST_F(PdDrain, RequestsOpenPastTheTimeoutEndWithAnError) {
  // The sim executor decodes at a modelled ~20 ms per token: a 2000-token answer outlives the
  // 2 s drain timeout.
  const int port = Port();
  Proc* colo = Spawn("colocated",
                     {"serve", "--executor", "sim", "--sim-model", "qwen3-32b", "--sim-hw", "h200",
                      "--host", host_, "--port", std::to_string(port), "--drain-timeout-s", "2",
                      "--log-level", "info"},
                     host_, port);
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo}));
  const json long_answer = {{"ignore_eos", true}};
  Req r;
  r.label = "long answer";
  r.prompt = {1, 300, 301, 302, 303, 304, 305, 306};
  r.max_tokens = 2000;
  Res streamed, whole;
  std::thread ts([&] {
    Req s = r;
    s.stream = true;
    streamed = Send(colo->host, colo->port, s, {}, &long_answer, 60);
  });
  std::thread tw([&] { whole = Send(colo->host, colo->port, r, {}, &long_answer, 60); });
  ASSERT_TRUE(WaitFor([&] { return Metric(host_, port, "kvpush_num_requests_running") >= 2; },
                      20000));
  ASSERT_EQ(::kill(colo->child.pid(), SIGTERM), 0);
  // Draining: /health and new requests get 503 `draining`.
  std::pair<int, std::string> health;
  ASSERT_TRUE(WaitFor(
      [&] {
        health = GetFrom(*colo, "/health");
        return health.first == 503;
      },
      1500))
      << "HTTP " << health.first << " " << health.second;
  EXPECT_EQ(ErrorOf(health.second)["code"], "draining") << health.second;
  const Res refused = Send(colo->host, colo->port, Prompt(8, 4, 1), {}, nullptr, 10);
  EXPECT_EQ(refused.status, 503) << refused.raw;
  EXPECT_EQ(ErrorOf(refused.raw)["code"], "draining") << refused.raw;
  ts.join();
  tw.join();
  // The stream got tokens, then an error event (never a silent cut).
  EXPECT_EQ(streamed.status, 200);
  EXPECT_FALSE(streamed.ids.empty());
  EXPECT_NE(streamed.error.find("drain timeout"), std::string::npos) << streamed.error;
  EXPECT_EQ(whole.status, 503) << whole.raw;
  EXPECT_EQ(ErrorOf(whole.raw)["code"], "draining_timeout") << whole.raw;
  ASSERT_TRUE(WaitFor([&] { return !colo->child.Running(); }, 10000)) << "did not exit";
  const int status = colo->child.Stop(0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
}

TEST_F(PdDrain, KilledPrefillGetsTheClientAnErrorAndFreesDecodeBlocks) {
  Proc* p = Serve("prefill", "prefill", {});
  Proc* d = Serve("decode", "decode", {});
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({p, d}));
  // Health checks far apart: the failure must be seen on the legs themselves.
  Proc* router = Router({p}, {d}, 600000);
  ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({router}));
  ASSERT_EQ(Send(router->host, router->port, Prompt(40, 4, 7)).status, 200);  // warm (handshake)

  // P stopped: the request's legs are accepted by its kernel, D reserves blocks and waits; then
  // P dies (SIGKILL) with the request in flight.
  ASSERT_EQ(::kill(p->child.pid(), SIGSTOP), 0);
  Res got;
  Req r = Prompt(60, 8, 11);
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
  const Req a = Prompt(100, 4, 21);
  Req b = a;  // shares a's first 64 tokens
  b.label = "a's first 64 tokens + 36 others";
  const Req tail = Prompt(37, 4, 22);
  b.prompt.resize(64);
  b.prompt.insert(b.prompt.end(), tail.prompt.begin() + 1, tail.prompt.end());
  for (const Req& r : {a, a, b}) {
    const Res ref = Send(colo->host, colo->port, r);
    const Res got = Send(router->host, router->port, r);
    ASSERT_EQ(ref.status, 200) << ref.raw;
    ASSERT_EQ(got.status, 200) << got.raw;
    EXPECT_EQ(got.ids, ref.ids) << r.label;
    EXPECT_EQ(cached(got), cached(ref)) << r.label << ": D " << got.raw << "\ncolocated "
                                        << ref.raw;
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
