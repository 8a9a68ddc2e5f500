// The router's routing policies over fake instances (docs/router.md, "Routing policies"): P chosen
// by the outstanding prefill tokens instances report in /health, D by the prompt's prefix blocks,
// and P legs skipped below --local-prefill-threshold (D then gets a plain request). The prompt's
// token ids come from a test tokenizer: a `prompt` of ids is taken as is.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "router/router.h"
#include "router_test_util.h"

namespace kvpush::router::test {
namespace {

std::optional<std::vector<int32_t>> IdsOf(const std::string&, const json& body) {
  const auto p = body.find("prompt");
  if (p == body.end() || !p->is_array()) return std::nullopt;
  return p->get<std::vector<int32_t>>();
}

json Prompt(int n, int32_t base = 1) {
  std::vector<int32_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(base + i);
  return {{"prompt", ids}, {"max_tokens", 2}};
}

class RoutingTest : public RouterTest {
 protected:
  void Start(int num_prefill, int num_decode, RoutingPolicy policy, int64_t threshold) {
    options_hook_ = [=](RouterOptions& o) {
      o.routing = policy;
      o.local_prefill_threshold = threshold;
      o.prompt_tokenizer = IdsOf;
    };
    ASSERT_NO_FATAL_FAILURE(StartRouter(num_prefill, num_decode));
    for (auto& d : d_) d->SetHealthBody(R"({"status":"ok","block_size":4})");
    // The router learns the block size from D's /health (50 ms rounds).
    ASSERT_TRUE(WaitFor([&] { return BlockSizeKnown(); }));
  }
  bool BlockSizeKnown() {
    // A 4-token prompt is one block once the size is known: no longer "unhashed".
    const int64_t before = router_->counters().decode_choices[3];
    Post(Prompt(4));
    return router_->counters().decode_choices[3] == before;
  }
};

TEST_F(RoutingTest, RefusesCacheAwareWithoutTokenizer) {
  RouterOptions o;
  o.prefill_urls = {"http://127.0.0.1:1"};
  o.decode_urls = {"http://127.0.0.1:2"};
  o.routing = RoutingPolicy::kCacheAware;
  EXPECT_FALSE(o.Validate().ok());
  o.routing = RoutingPolicy::kLeastOutstanding;
  o.local_prefill_threshold = 16;
  EXPECT_FALSE(o.Validate().ok());
  o.prompt_tokenizer = IdsOf;
  EXPECT_TRUE(o.Validate().ok());
  o.cache_aware.load_cap = 0.5;
  EXPECT_FALSE(o.Validate().ok());
}

TEST_F(RoutingTest, PrefillChosenByReportedOutstandingTokens) {
  ASSERT_NO_FATAL_FAILURE(Start(2, 1, RoutingPolicy::kCacheAware, 0));
  p_[0]->SetHealthBody(R"({"status":"ok","load":{"outstanding_prefill_tokens":5000}})");
  p_[1]->SetHealthBody(R"({"status":"ok","load":{"outstanding_prefill_tokens":0}})");
  ASSERT_TRUE(WaitFor([&] {
    return HasMetric("kvpush_router_instance_prefill_tokens{url=\"" + p_[0]->url() + "\"} 5000");
  }));
  const size_t p0 = p_[0]->count(), p1 = p_[1]->count();
  for (int i = 0; i < 6; ++i) {
    auto r = Post(Prompt(40, 100 * i));
    ASSERT_TRUE(r && r->status == 200);
  }
  EXPECT_EQ(p_[0]->count(), p0) << "the busy P got no leg";
  EXPECT_EQ(p_[1]->count(), p1 + 6);
}

TEST_F(RoutingTest, RepeatedPrefixGoesToTheSameDecode) {
  ASSERT_NO_FATAL_FAILURE(Start(1, 3, RoutingPolicy::kCacheAware, 0));
  for (int conv = 0; conv < 5; ++conv) {
    std::vector<size_t> before;
    for (auto& d : d_) before.push_back(d->count());
    int owner = -1;
    for (int turn = 1; turn <= 3; ++turn) {
      auto r = Post(Prompt(12 * turn, 1000 * conv));  // the history grows, its head stays
      ASSERT_TRUE(r && r->status == 200);
      int got = -1;
      for (size_t k = 0; k < d_.size(); ++k) {
        if (d_[k]->count() > before[k]) got = static_cast<int>(k);
        before[k] = d_[k]->count();
      }
      if (owner < 0) owner = got;
      EXPECT_EQ(got, owner) << "conversation " << conv << " turn " << turn;
    }
  }
  EXPECT_GE(router_->counters().decode_choices[0], 10) << "turns 2 and 3 are prefix hits";
}

TEST_F(RoutingTest, ThresholdSkipsPrefillAndSendsDAPlainRequest) {
  ASSERT_NO_FATAL_FAILURE(Start(1, 1, RoutingPolicy::kLeastOutstanding, 10));
  const size_t p0 = p_[0]->count(), d0 = d_[0]->count();
  const RouterCounters c0 = router_->counters();
  auto r = Post(Prompt(6, 500));  // 6 < 10: no P leg
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(p_[0]->count(), p0);
  ASSERT_EQ(d_[0]->count(), d0 + 1);
  const json d_body = d_[0]->received().back().body;
  EXPECT_FALSE(d_body.contains("kv_transfer_params")) << d_body.dump();
  EXPECT_EQ(d_body["prompt"], Prompt(6, 500)["prompt"]);
  EXPECT_EQ(router_->counters().prefill_skipped[0], c0.prefill_skipped[0] + 1);

  r = Post(Prompt(20, 700));  // 20 uncached tokens: a P leg
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(p_[0]->count(), p0 + 1);
  r = Post(Prompt(22, 700));  // 20 of 22 predicted cached on D (5 blocks of 4): no P leg
  ASSERT_TRUE(r && r->status == 200);
  EXPECT_EQ(p_[0]->count(), p0 + 1);
  EXPECT_EQ(router_->counters().prefill_skipped[1], 1);
  EXPECT_TRUE(HasMetric("kvpush_router_prefill_legs_skipped_total{reason=\"cached\"} 1"));
  // Streamed too: D's stream is relayed as is.
  const StreamSeen s = PostStream(Prompt(5, 900));
  EXPECT_EQ(s.status, 200) << s.body;
  EXPECT_NE(s.body.find("[DONE]"), std::string::npos) << s.body;
  EXPECT_EQ(p_[0]->count(), p0 + 1);
}

}  // namespace
}  // namespace kvpush::router::test
