// The router and draining instances (docs/router.md "Retries", "Instance selection and health"):
// a request an instance refused unstarted (503 `draining`, connection refused) goes to another
// instance before the client saw a byte; an instance whose /health says `draining` gets no new
// legs but its legs in flight are not cut; an answer already under way is never retried.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/drain.h"
#include "router_test_util.h"

namespace kvpush::router::test {
namespace {

/// Sum of every sample of `name` in the router's /metrics text.
double MetricSum(const std::string& text, const std::string& name) {
  double sum = 0;
  size_t pos = 0;
  while ((pos = text.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || text[pos - 1] == '\n';  // not a # HELP / # TYPE line
    const size_t eol = text.find('\n', pos);
    const std::string line = text.substr(pos, eol - pos);
    pos = eol;
    if (!line_start || line.size() <= name.size() || (line[name.size()] != '{' && line[name.size()] != ' ')) {
      continue;
    }
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

using RouterDrain = RouterTest;

TEST_F(RouterDrain, DecodeAnsweringDrainingIsRetriedOnAnotherDecode) {
  // Health checks far apart: the refusal itself must steer the request elsewhere.
  StartRouter(1, 2, TransferMode::kPush, "", 60000);
  d_[0]->draining.store(true);
  for (int i = 0; i < 6; ++i) {
    const bool stream = i % 2 == 1;
    if (stream) {
      const StreamSeen s = PostStream({{"prompt", "hi"}, {"max_tokens", 4}});
      EXPECT_EQ(s.status, 200) << s.body;
      EXPECT_NE(s.body.find("[DONE]"), std::string::npos) << s.body;
    } else {
      auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
      ASSERT_TRUE(r);
      EXPECT_EQ(r->status, 200) << r->body;
    }
  }
  // D0 refused at most the first request (then it was excluded); P heard of that attempt.
  EXPECT_LE(d_[0]->count(), 1u);
  EXPECT_EQ(d_[1]->count(), 6u);
  const std::string m = Metrics();
  EXPECT_EQ(MetricSum(m, "kvpush_router_retries_total"), static_cast<double>(d_[0]->count()));
  EXPECT_EQ(MetricSum(m, "kvpush_router_requests_total{mode=\"push\",outcome=\"error\"}"), 0);
  if (d_[0]->count() == 1) {
    EXPECT_TRUE(WaitFor([&] { return p_[0]->aborts().size() == 1; }))
        << "P never got the refused attempt's abort";
    EXPECT_TRUE(HasMetric("kvpush_router_instance_draining{role=\"decode\",url=\"" +
                          d_[0]->url() + "\"} 1"));
  }
}

TEST_F(RouterDrain, PrefillAnsweringDrainingIsRetriedOnAnotherPrefill) {
  StartRouter(2, 1, TransferMode::kPush, "", 60000);
  p_[0]->draining.store(true);
  p_[1]->draining.store(false);
  for (int i = 0; i < 4; ++i) {
    auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  // P0 got at most the first request. Its refusal is retried, unless the fake D (which needs
  // no KV) answered that attempt first: D's complete answer then stands.
  EXPECT_LE(p_[0]->count(), 1u);
  const double retries =
      MetricSum(Metrics(), "kvpush_router_retries_total{refused_by=\"prefill\"}");
  EXPECT_EQ(static_cast<double>(p_[0]->count() + p_[1]->count()), 4 + retries);
}

TEST_F(RouterDrain, PullPrefillAnsweringDrainingIsRetried) {
  StartRouter(2, 1, TransferMode::kPull, "", 60000);
  p_[0]->draining.store(true);
  for (int i = 0; i < 4; ++i) {
    auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_LE(p_[0]->count(), 1u);
}

TEST_F(RouterDrain, RefusedConnectionIsRetriedOnAnotherDecode) {
  StartRouter(1, 2, TransferMode::kPush, "", 60000);
  d_[0]->Stop();  // its port refuses connections; the health checker has not noticed
  for (int i = 0; i < 4; ++i) {
    auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_EQ(d_[1]->count(), 4u);
}

TEST_F(RouterDrain, ColocatedInstanceAnsweringDrainingIsRetried) {
  StartColocatedRouter(2, 60000);
  d_[1]->draining.store(true);
  for (int i = 0; i < 4; ++i) {
    auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
  }
  EXPECT_EQ(MetricSum(Metrics(), "kvpush_router_retries_total{refused_by=\"colocated\"}"),
            static_cast<double>(d_[1]->count()));
}

TEST_F(RouterDrain, EveryInstanceDrainingGivesTheClientAnError) {
  StartRouter(1, 2, TransferMode::kPush, "", 60000);
  d_[0]->draining.store(true);
  d_[1]->draining.store(true);
  auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503) << r->body;  // the last refusal, or no healthy decode left
  EXPECT_EQ(d_[0]->count() + d_[1]->count(), 2u) << "each D tried once";
}

TEST_F(RouterDrain, OtherErrorsAreNotRetried) {
  StartRouter(1, 2, TransferMode::kPush, "", 60000);
  d_[0]->status.store(503);  // a 503 that is not `draining`: D may have done work
  d_[1]->status.store(503);
  auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(d_[0]->count() + d_[1]->count(), 1u);
  EXPECT_EQ(MetricSum(Metrics(), "kvpush_router_retries_total"), 0);
}

TEST_F(RouterDrain, DrainingHealthExcludesTheInstanceButDoesNotCutItsLegs) {
  StartRouter(1, 1, TransferMode::kPush, "", 50);
  StreamSeen held;
  std::thread client([&] { held = PostStream({{"prompt", "hold"}, {"max_tokens", 4}}); });
  ASSERT_TRUE(WaitFor([&] { return d_[0]->count() == 1; }));
  d_[0]->draining.store(true);  // /health: 503 draining
  ASSERT_TRUE(WaitFor([&] {
    return HasMetric("kvpush_router_instance_draining{role=\"decode\",url=\"" + d_[0]->url() +
                     "\"} 1");
  })) << Metrics();
  auto refused = Post({{"prompt", "hi"}, {"max_tokens", 4}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503) << refused->body;  // no healthy decode: not sent to D
  EXPECT_EQ(d_[0]->count(), 1u);
  auto health = Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_NE(health->body.find("\"draining\":true"), std::string::npos) << health->body;
  d_[0]->Release();  // the held stream finishes
  client.join();
  EXPECT_EQ(held.status, 200);
  EXPECT_NE(held.body.find("[DONE]"), std::string::npos) << held.body;
  EXPECT_TRUE(HasMetric("kvpush_router_legs_cut_total{leg=\"decode\"} 0"));
  d_[0]->draining.store(false);  // it came back (a restart): selectable again
  ASSERT_TRUE(WaitFor([&] {
    auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
    return r && r->status == 200;
  }));
}

TEST_F(RouterDrain, ADrainingRouterRefusesNewRequestsAndEndsOpenStreamsWithAnErrorEvent) {
  StartRouter(1, 1, TransferMode::kPush, "", 50);
  StreamSeen held;
  std::thread client([&] { held = PostStream({{"prompt", "hold"}, {"max_tokens", 4}}); });
  ASSERT_TRUE(WaitFor([&] { return d_[0]->count() == 1; }));
  router_->BeginDrain();
  EXPECT_GE(router_->inflight(), 1u);
  auto health = Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_NE(health->body.find("\"draining\""), std::string::npos) << health->body;
  auto refused = Post({{"prompt", "hi"}, {"max_tokens", 4}});
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_EQ(json::parse(refused->body)["error"]["code"], "draining") << refused->body;
  EXPECT_EQ(d_[0]->count(), 1u);
  router_->Stop();  // the drain timed out: the held stream ends with an error event
  client.join();
  EXPECT_EQ(held.status, 200);
  // After a drain the cut is the drain timeout's, in an instance's words (common/drain.h).
  EXPECT_NE(held.body.find("\"code\":\"draining_timeout\""), std::string::npos)
      << held.status << " [" << held.body << "] ok=" << held.ok;
  EXPECT_NE(held.body.find(kDrainTimeoutMessage), std::string::npos) << held.body;
  EXPECT_EQ(held.body.find("[DONE]"), std::string::npos) << held.body;
}

}  // namespace
}  // namespace kvpush::router::test
