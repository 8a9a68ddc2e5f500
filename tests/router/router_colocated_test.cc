// The router's colocated mode (round robin over role-both instances) and its connection and
// thread reuse: keep-alive connections to instances, stale-connection handling, a cut leg's
// connection never reused, a bounded worker pool (docs/router.md, "Connections and threads").
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "router/router.h"
#include "router/worker_pool.h"
#include "router_test_util.h"

namespace kvpush::router::test {
namespace {

TEST_F(RouterTest, ColocatedRoundRobinSkipsUnhealthyInstances) {
  StartColocatedRouter(3);
  for (int i = 0; i < 6; ++i) {
    auto res = Post({{"prompt", "x"}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
  }
  for (auto& d : d_) EXPECT_EQ(d->count(), 2u);

  d_[1]->health_status = 503;
  ASSERT_TRUE(WaitFor([&] { return !router_->Snapshot()[1].healthy; }));
  for (int i = 0; i < 4; ++i) {
    auto res = Post({{"prompt", "x"}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
  }
  EXPECT_EQ(d_[0]->count(), 4u);
  EXPECT_EQ(d_[1]->count(), 2u);
  EXPECT_EQ(d_[2]->count(), 4u);
}

TEST_F(RouterTest, ColocatedForwardsTheBodyAsIsAndRelaysTheStream) {
  StartColocatedRouter(1);
  const json body = {{"prompt", "x"}, {"max_tokens", 3}};
  StreamSeen s = PostStream(body, false, {{"x-request-id", "my-req.1"}});
  EXPECT_TRUE(s.ok);
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("t0"), std::string::npos);
  EXPECT_NE(s.body.find("t2"), std::string::npos);
  EXPECT_NE(s.body.find("data: [DONE]"), std::string::npos);
  ASSERT_EQ(d_[0]->count(), 1u);
  const Received r = d_[0]->received()[0];
  json expected = body;
  expected["stream"] = true;
  EXPECT_EQ(r.body, expected);  // no seed, no kv_transfer_params: the client's request as-is
  EXPECT_EQ(r.request_id, "my-req.1");
  // Counted when the stream's releaser runs, which may be just after the client read [DONE].
  EXPECT_TRUE(WaitFor([&] {
    return HasMetric("kvpush_router_requests_total{mode=\"colocated\",outcome=\"ok\"} 1");
  }));
}

TEST_F(RouterTest, ColocatedHealthModelsAndMetrics) {
  StartColocatedRouter(2);
  auto h = Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  json hb = json::parse(h->body);
  EXPECT_EQ(hb["status"], "ok");
  EXPECT_EQ(hb["colocated"]["healthy"], 2);
  EXPECT_EQ(hb["colocated"]["total"], 2);
  EXPECT_FALSE(hb.contains("prefill"));
  auto models = Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "fake-model");
  const std::string m = Metrics();
  EXPECT_NE(
      m.find("kvpush_router_instance_healthy{role=\"colocated\",url=\"" + d_[0]->url() + "\"} 1\n"),
      std::string::npos)
      << m;
  EXPECT_EQ(m.find("kvpush_router_transfer_aborts_total"), std::string::npos);

  for (auto& d : d_) d->health_status = 500;
  ASSERT_TRUE(WaitFor([&] {
    auto r = Get("/health");
    return r && r->status == 503;
  }));
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "no_healthy_instance");
}

TEST_F(RouterTest, ColocatedErrorsAreForwardedAndADeadInstanceIs502) {
  StartColocatedRouter(1, /*health_interval_ms=*/60000);
  d_[0]->status = 400;
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "bad prompt");
  res = Post({{"prompt", "x"}, {"stream", true}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);

  d_[0]->Stop();
  res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 502);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "colocated_unreachable");
  EXPECT_TRUE(HasMetric("kvpush_router_leg_failures_total{leg=\"colocated\"} 3"));
  httplib::Client cli("127.0.0.1", router_->port());
  res = cli.Post("/v1/completions", "{oops", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
}

TEST(RouterOptionsTest, ColocatedExcludesPrefillAndDecode) {
  RouterOptions o;
  o.colocated_urls = {"http://127.0.0.1:1"};
  EXPECT_TRUE(o.Validate().ok());
  o.prefill_urls = {"http://127.0.0.1:2"};
  EXPECT_NE(o.Validate().message().find("--colocated"), std::string::npos);
  o.prefill_urls.clear();
  o.colocated_urls = {"http://127.0.0.1"};
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
}

TEST_F(RouterTest, LegsReuseKeepAliveConnections) {
  StartRouter(1, 1, TransferMode::kPull);  // pull: P's leg ends before the client's answer
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(Post({{"prompt", "x"}}));
    StreamSeen s = PostStream({{"prompt", "x"}});
    EXPECT_EQ(s.status, 200);
  }
  EXPECT_EQ(p_[0]->count(), 8u);
  EXPECT_EQ(d_[0]->count(), 8u);
  EXPECT_EQ(p_[0]->connections(), 1u);  // one connection each, reused by every leg
  EXPECT_EQ(d_[0]->connections(), 1u);
  const ConnectionPoolCounts c = router_->connection_counts();
  EXPECT_EQ(c.opened, 2);
  EXPECT_EQ(c.reused, 14);
}

TEST_F(RouterTest, AConnectionTheInstanceClosedIsNotReusedAndNothingIsSentTwice) {
  max_idle_s_ = 30;  // the idle connection is young enough: only the liveness check can drop it
  StartRouter(1, 1, TransferMode::kPull, "", /*health_interval_ms=*/60000);
  ASSERT_EQ(Post({{"prompt", "x"}})->status, 200);
  // D restarts on the same port: the router's idle connection to it is now closed by D.
  const int port = d_[0]->port();
  d_[0]->Stop();
  d_[0] = std::make_unique<FakeInstance>(false, port);
  ASSERT_EQ(d_[0]->port(), port);
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(d_[0]->count(), 1u);
  EXPECT_EQ(p_[0]->count(), 2u);
  EXPECT_GE(router_->connection_counts().discarded, 1);
}

TEST_F(RouterTest, AStoppedLegsConnectionIsClosedAndNotReused) {
  StartRouter(1, 1, TransferMode::kPull);
  d_[0]->chunk_delay_ms = 50;
  d_[0]->chunks = 50;
  StreamSeen s = PostStream({{"prompt", "x"}}, /*cancel_after_first=*/true);
  EXPECT_EQ(s.status, 200);
  // D sees its connection close (its stream write fails) although the connection was pooled.
  ASSERT_TRUE(WaitFor([&] { return d_[0]->write_failed.load(); }));
  d_[0]->chunk_delay_ms = 0;
  d_[0]->chunks = 2;
  s = PostStream({{"prompt", "x"}});
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(d_[0]->connections(), 2u);  // the cut connection was not reused
}

TEST(WorkerPoolTest, GrowsToThePeakOfTasksInFlightThenReusesItsThreads) {
  WorkerPool pool(/*initial_threads=*/0, /*max_threads=*/16);
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;
  bool release = false;
  std::atomic<int> done{0};
  auto wave = [&](int n) {
    {
      std::lock_guard<std::mutex> lock(mu);
      release = false;
    }
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(pool.Submit([&] {
        std::unique_lock<std::mutex> lock(mu);
        ++running;
        cv.notify_all();
        cv.wait(lock, [&] { return release; });
        --running;
        ++done;
      }));
    }
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return running == n; });  // all n run at once: n threads
    release = true;
    cv.notify_all();
  };
  wave(6);
  ASSERT_TRUE(WaitFor([&] { return done.load() == 6 && pool.idle_threads() == 6; }));
  EXPECT_EQ(pool.threads(), 6u);
  wave(6);
  ASSERT_TRUE(WaitFor([&] { return done.load() == 12; }));
  EXPECT_EQ(pool.threads(), 6u);  // the second wave reused them
  pool.Stop();
  EXPECT_FALSE(pool.Submit([] {}));
}

}  // namespace
}  // namespace kvpush::router::test
