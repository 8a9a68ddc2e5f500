// The router over fake prefill (P) and decode (D) instances: httplib servers on free ports that
// record what they receive and answer per docs/pd_protocol.md §1.
#include "router/router.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "router_test_util.h"

namespace kvpush::router::test {
namespace {

bool IsHex32(const json& v) {
  if (!v.is_string()) return false;
  const std::string s = v.get<std::string>();
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST_F(RouterTest, PushSendsBothLegsAtOnceAndAnswersWithoutWaitingForPrefill) {
  StartRouter();
  p_[0]->delay_ms = 300;
  const json client = {{"model", "m"},
                       {"prompt", "hello"},
                       {"max_tokens", 5},
                       {"max_completion_tokens", 5},
                       {"stream_options", {{"include_usage", true}}}};
  auto res = Post(client, {{"x-request-id", "req-42"}});
  const int64_t answered_ns = NowNs();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["id"], "d");
  EXPECT_EQ(res->get_header_value("x-request-id"), "req-42");
  ASSERT_TRUE(WaitFor([&] { return p_[0]->answered_ns.load() != 0; }));
  // D's leg arrived, and the client had its answer, while P was still sleeping.
  const Received p = p_[0]->received().at(0);
  const Received d = d_[0]->received().at(0);
  EXPECT_LT(d.arrived_ns, p_[0]->answered_ns.load());
  EXPECT_LT(answered_ns, p_[0]->answered_ns.load());

  EXPECT_EQ(p.path, "/v1/completions");
  EXPECT_EQ(p.body["max_tokens"], 1);
  EXPECT_FALSE(p.body.contains("max_completion_tokens"));
  EXPECT_EQ(p.body["stream"], false);
  EXPECT_FALSE(p.body.contains("stream_options"));
  EXPECT_EQ(p.body["prompt"], "hello");
  const json& pk = p.body["kv_transfer_params"];
  EXPECT_EQ(pk["do_remote_decode"], true);
  EXPECT_EQ(pk["do_remote_prefill"], false);
  EXPECT_EQ(pk["transfer_mode"], "push");
  EXPECT_TRUE(IsHex32(pk["transfer_id"])) << pk.dump();

  EXPECT_EQ(d.body["max_tokens"], 5);
  EXPECT_EQ(d.body["stream_options"]["include_usage"], true);
  const json& dk = d.body["kv_transfer_params"];
  EXPECT_EQ(dk["do_remote_prefill"], true);
  EXPECT_EQ(dk["do_remote_decode"], false);
  EXPECT_EQ(dk["transfer_mode"], "push");
  EXPECT_EQ(dk["transfer_id"], pk["transfer_id"]);
  EXPECT_EQ(dk["remote_host"], "127.0.0.1");
  EXPECT_EQ(dk["remote_port"], p_[0]->port());

  ASSERT_TRUE(p.body["seed"].is_number_unsigned()) << p.body.dump();
  EXPECT_LT(p.body["seed"].get<uint64_t>(), uint64_t{1} << 53);
  EXPECT_EQ(d.body["seed"], p.body["seed"]);
  EXPECT_EQ(p.request_id, "req-42");
  EXPECT_EQ(d.request_id, "req-42");
}

TEST_F(RouterTest, ClientSeedAndMintedRequestIdReachBothLegs) {
  StartRouter();
  auto res = Post({{"messages", json::array()}, {"seed", 1234}}, {}, "/v1/chat/completions");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  ASSERT_TRUE(WaitFor([&] { return p_[0]->count() == 1; }));
  const Received p = p_[0]->received().at(0);
  const Received d = d_[0]->received().at(0);
  EXPECT_EQ(p.path, "/v1/chat/completions");
  EXPECT_EQ(d.path, "/v1/chat/completions");
  EXPECT_EQ(p.body["seed"], 1234);
  EXPECT_EQ(d.body["seed"], 1234);
  const std::string id = res->get_header_value("x-request-id");
  EXPECT_EQ(id.rfind("chatcmpl-", 0), 0u) << id;
  EXPECT_EQ(p.request_id, id);
  EXPECT_EQ(d.request_id, id);
}

TEST_F(RouterTest, PullSendsPrefillFirstThenDecodeWithItsParamsAndProfile) {
  StartRouter(1, 1, TransferMode::kPull, "fast");
  p_[0]->delay_ms = 50;
  auto res = Post({{"prompt", "hello"}, {"max_tokens", 4}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const Received p = p_[0]->received().at(0);
  const Received d = d_[0]->received().at(0);
  EXPECT_GT(d.arrived_ns, p_[0]->answered_ns.load());
  EXPECT_EQ(p.body["kv_transfer_params"]["transfer_mode"], "pull");
  EXPECT_EQ(p.body["max_tokens"], 1);
  json want = FakeInstance::KvParams(p.body["kv_transfer_params"]["transfer_id"]);
  want["pull_profile"] = "fast";
  EXPECT_EQ(d.body["kv_transfer_params"], want);
  EXPECT_EQ(d.body["max_tokens"], 4);
  EXPECT_EQ(d.body["seed"], p.body["seed"]);
  EXPECT_NE(Metrics().find("kvpush_router_requests_total{mode=\"pull\",outcome=\"ok\"} 1"),
            std::string::npos);
}

TEST_F(RouterTest, PullForwardsPrefillErrorsAndRejectsAnswersWithoutParams) {
  StartRouter(1, 1, TransferMode::kPull);
  p_[0]->status = 400;
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "prefill says no");
  p_[0]->status = 200;
  p_[0]->no_kv_params = true;
  res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 502);
  EXPECT_NE(json::parse(res->body)["error"]["message"].get<std::string>().find(
                "prefill instance returned no kv_transfer_params"),
            std::string::npos);
  EXPECT_EQ(d_[0]->count(), 0u);
}

// A parameter is honoured or refused, never silently replaced: kv_transfer_params belongs to the
// router (colocated instances refuse it with 400 too).
TEST_F(RouterTest, ClientKvTransferParamsAreRefused) {
  StartRouter(1, 1, TransferMode::kPush);
  for (const json& kv : {json(5), json::object(), json{{"do_remote_decode", true}}}) {
    auto res = Post({{"prompt", "x"}, {"kv_transfer_params", kv}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << kv.dump();
    const json e = json::parse(res->body)["error"];
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_NE(e["message"].get<std::string>().find("kv_transfer_params"), std::string::npos);
    EXPECT_EQ(e["param"], "kv_transfer_params");
  }
  EXPECT_EQ(p_[0]->count(), 0u);
  EXPECT_EQ(d_[0]->count(), 0u);
}

TEST_F(RouterTest, ModeHeaderOverridesTheRouterMode) {
  StartRouter(1, 1, TransferMode::kPush);
  auto res = Post({{"prompt", "x"}}, {{"x-kvpush-mode", "pull-vllm"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(p_[0]->received().at(0).body["kv_transfer_params"]["transfer_mode"], "pull");
  EXPECT_EQ(d_[0]->received().at(0).body["kv_transfer_params"]["pull_profile"], "vllm");

  res = Post({{"prompt", "x"}}, {{"x-kvpush-mode", "sideways"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_NE(e["message"].get<std::string>().find("sideways"), std::string::npos);
  EXPECT_EQ(p_[0]->count(), 1u);
  EXPECT_EQ(d_[0]->count(), 1u);
}

TEST_F(RouterTest, StreamIsRelayedChunkByChunkAsItArrives) {
  StartRouter();
  d_[0]->chunks = 4;
  d_[0]->chunk_delay_ms = 100;
  StreamSeen s = PostStream({{"prompt", "x"}});
  ASSERT_TRUE(s.ok);
  EXPECT_EQ(s.status, 200);
  EXPECT_LT(s.first_chunk_ns, d_[0]->last_chunk_ns.load());  // no buffering of the answer
  EXPECT_NE(s.body.find("\"t0\""), std::string::npos);
  EXPECT_NE(s.body.find("\"t3\""), std::string::npos);
  EXPECT_EQ(s.body.size() - s.body.rfind("data: [DONE]\n\n"), 14u);  // [DONE] last
  EXPECT_EQ(d_[0]->received().at(0).body["stream"], true);
  // The client-side histograms: one TTFT, a gap per later data event (D waits 100 ms before
  // each chunk), one e2e. The e2e is recorded when the stream's releaser runs, which may be just
  // after the client read [DONE]: wait for it.
  const std::string e2e_count = "kvpush_router_e2e_request_latency_seconds_count{mode=\"push\"} 1";
  ASSERT_TRUE(kvpush::testing::WaitUntil(
      [&] { return Metrics().find(e2e_count) != std::string::npos; }));
  const std::string m = Metrics();
  auto value = [&](const std::string& series) {
    const size_t at = m.find(series + " ");
    EXPECT_NE(at, std::string::npos) << series;
    return at == std::string::npos ? -1.0 : std::stod(m.substr(at + series.size() + 1));
  };
  EXPECT_EQ(value("kvpush_router_time_to_first_token_seconds_count{mode=\"push\"}"), 1);
  EXPECT_EQ(value("kvpush_router_inter_token_latency_seconds_count{mode=\"push\"}"), 3);
  EXPECT_GE(value("kvpush_router_inter_token_latency_seconds_sum{mode=\"push\"}"), 0.25);
  EXPECT_EQ(value("kvpush_router_e2e_request_latency_seconds_count{mode=\"push\"}"), 1);
  EXPECT_GE(value("kvpush_router_e2e_request_latency_seconds_sum{mode=\"push\"}"),
            value("kvpush_router_time_to_first_token_seconds_sum{mode=\"push\"}"));
  EXPECT_EQ(value("kvpush_router_e2e_request_latency_seconds_count{mode=\"pull\"}"), 0);
}

TEST_F(RouterTest, LeastOutstandingDecodeIsPicked) {
  StartRouter(1, 2);
  // A held stream occupies one D...
  std::thread held([&] { PostStream({{"prompt", "hold"}}); });
  ASSERT_TRUE(WaitFor([&] { return d_[0]->count() + d_[1]->count() == 1; }));
  FakeInstance& busy = d_[0]->count() == 1 ? *d_[0] : *d_[1];
  FakeInstance& idle = d_[0]->count() == 1 ? *d_[1] : *d_[0];
  // ... so the next requests go to the other one, every time.
  for (int i = 0; i < 3; ++i) {
    auto res = Post({{"prompt", "x"}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
  }
  EXPECT_EQ(busy.count(), 1u);
  EXPECT_EQ(idle.count(), 3u);
  const std::string m = Metrics();
  EXPECT_NE(
      m.find("kvpush_router_instance_outstanding{role=\"decode\",url=\"" + busy.url() + "\"} 1"),
      std::string::npos)
      << m;
  busy.Release();
  held.join();
  // Both idle now: ties rotate.
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& i : router_->Snapshot()) {
      if (i.outstanding != 0) return false;
    }
    return true;
  }));
  ASSERT_TRUE(Post({{"prompt", "x"}}));
  ASSERT_TRUE(Post({{"prompt", "x"}}));
  EXPECT_EQ(busy.count() + idle.count(), 6u);
  EXPECT_EQ(busy.count(), 2u);
}

TEST_F(RouterTest, UnhealthyDecodeIsExcludedThenReincluded) {
  StartRouter(1, 2);
  auto healthy = [&](int i) {
    for (const auto& s : router_->Snapshot()) {
      if (s.url == d_[i]->url()) return s.healthy;
    }
    return false;
  };
  d_[0]->health_status = 503;
  ASSERT_TRUE(WaitFor([&] { return !healthy(0); }));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Post({{"prompt", "x"}}));
  EXPECT_EQ(d_[0]->count(), 0u);
  EXPECT_EQ(d_[1]->count(), 4u);
  auto h = Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_EQ(json::parse(h->body)["decode"]["healthy"], 1);
  EXPECT_NE(Metrics().find("kvpush_router_instance_healthy{role=\"decode\",url=\"" + d_[0]->url() +
                           "\"} 0"),
            std::string::npos);

  d_[0]->health_status = 200;
  ASSERT_TRUE(WaitFor([&] { return healthy(0); }));
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Post({{"prompt", "x"}}));
  EXPECT_EQ(d_[0]->count(), 2u);
  EXPECT_EQ(d_[1]->count(), 6u);
}

TEST_F(RouterTest, DecodeDownGives502ThenIsExcludedAnd503) {
  StartRouter(1, 1, TransferMode::kPush, "", /*health_interval_ms=*/60000);
  const std::string d_url = d_[0]->url();
  d_[0]->Stop();
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 502);
  json e = json::parse(res->body)["error"];
  EXPECT_NE(e["message"].get<std::string>().find(d_url), std::string::npos) << e.dump();
  EXPECT_EQ(e["type"], "server_error");
  // The connection failure marked D unhealthy at once (no health round in between).
  res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "no healthy decode instance");
  auto h = Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  const json hb = json::parse(h->body);
  EXPECT_EQ(hb["status"], "unavailable");
  EXPECT_NE(hb["error"]["message"].get<std::string>().find("no healthy decode instance"),
            std::string::npos);
  EXPECT_NE(hb["error"]["message"].get<std::string>().find(d_url), std::string::npos);
  EXPECT_NE(Metrics().find("kvpush_router_leg_failures_total{leg=\"decode\"} 1"),
            std::string::npos);
  auto m = Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 503);
}

TEST_F(RouterTest, DecodeErrorStatusAndBodyAreForwarded) {
  StartRouter();
  d_[0]->status = 400;
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "bad prompt");
  StreamSeen s = PostStream({{"prompt", "x"}});
  EXPECT_EQ(s.status, 400);
  EXPECT_EQ(json::parse(s.body)["error"]["param"], "prompt");
}

TEST_F(RouterTest, BrokenDecodeStreamEndsWithAnErrorEventAndNoDone) {
  StartRouter();
  d_[0]->chunks = 5;
  d_[0]->drop_after = 2;
  StreamSeen s = PostStream({{"prompt", "x"}});
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("\"t1\""), std::string::npos);
  EXPECT_EQ(s.body.find("[DONE]"), std::string::npos) << s.body;
  const size_t err = s.body.rfind("data: {\"error\"");
  ASSERT_NE(err, std::string::npos) << s.body;
  const json e = json::parse(s.body.substr(err + 6));
  EXPECT_EQ(e["error"]["type"], "server_error");
  EXPECT_NE(e["error"]["message"].get<std::string>().find(d_[0]->url()), std::string::npos);
  ASSERT_TRUE(WaitFor([&] {
    return Metrics().find("kvpush_router_requests_total{mode=\"push\",outcome=\"error\"} 1") !=
           std::string::npos;
  }));
}

TEST_F(RouterTest, ClientDisconnectClosesTheDecodeLeg) {
  StartRouter();
  d_[0]->chunks = 500;
  d_[0]->chunk_delay_ms = 10;
  StreamSeen s = PostStream({{"prompt", "x"}}, /*cancel_after_first=*/true);
  EXPECT_FALSE(s.ok);
  ASSERT_TRUE(WaitFor([&] { return d_[0]->write_failed.load(); }, 4000));
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& i : router_->Snapshot()) {
      if (i.outstanding != 0) return false;
    }
    return true;
  }));
}

TEST_F(RouterTest, PrefillFailureInPushIsCountedAndAnsweredToTheClient) {
  StartRouter();
  p_[0]->status = 500;
  d_[0]->delay_ms = 2000;  // D would answer 200 much later
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "prefill says no");
  EXPECT_TRUE(HasMetric("kvpush_router_leg_failures_total{leg=\"prefill\"} 1"));
  EXPECT_TRUE(HasMetric("kvpush_router_requests_total{mode=\"push\",outcome=\"error\"} 1"));
}

TEST_F(RouterTest, HealthMetricsAndModels) {
  StartRouter();
  auto h = Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  const json hb = json::parse(h->body);
  EXPECT_EQ(hb["status"], "ok");
  EXPECT_EQ(hb["prefill"]["healthy"], 1);
  EXPECT_EQ(hb["decode"]["total"], 1);

  ASSERT_TRUE(Post({{"prompt", "x"}}));
  ASSERT_TRUE(WaitFor([&] { return p_[0]->count() == 1; }));
  const std::string m = Metrics();
  for (const std::string& line :
       {std::string("kvpush_router_requests_total{mode=\"push\",outcome=\"ok\"} 1"),
        std::string("kvpush_router_requests_total{mode=\"pull\",outcome=\"error\"} 0"),
        std::string("kvpush_router_leg_failures_total{leg=\"decode\"} 0"),
        "kvpush_router_instance_healthy{role=\"prefill\",url=\"" + p_[0]->url() + "\"} 1",
        "kvpush_router_instance_healthy{role=\"decode\",url=\"" + d_[0]->url() + "\"} 1",
        "kvpush_router_instance_outstanding{role=\"decode\",url=\"" + d_[0]->url() + "\"} 0"}) {
    EXPECT_NE(m.find(line + "\n"), std::string::npos) << line << "\n" << m;
  }

  auto models = Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "fake-model");

  d_[0]->health_status = 500;
  ASSERT_TRUE(WaitFor([&] {
    auto r = Get("/health");
    return r && r->status == 503;
  }));
}

TEST_F(RouterTest, BadRequestsGetOpenAiErrors) {
  StartRouter();
  httplib::Client cli("127.0.0.1", router_->port());
  auto res = cli.Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_TRUE(e.contains("param"));
  EXPECT_TRUE(e.contains("code"));
  res = cli.Post("/v1/completions", "[1, 2]", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  res = cli.Get("/v1/nowhere");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_TRUE(json::parse(res->body)["error"].is_object());
  res = cli.Get("/v1/completions");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
  EXPECT_TRUE(json::parse(res->body)["error"].is_object());
  EXPECT_EQ(p_[0]->count() + d_[0]->count(), 0u);
}

TEST(RouterOptionsTest, ValidateNamesTheBadField) {
  RouterOptions o;
  o.prefill_urls = {"http://127.0.0.1:1"};
  EXPECT_NE(o.Validate().message().find("--decode"), std::string::npos);
  o.decode_urls = {"ftp://x:1"};
  EXPECT_NE(o.Validate().message().find("ftp://x:1"), std::string::npos);
  o.decode_urls = {"http://127.0.0.1:2"};
  o.pull_profile = "slow";
  EXPECT_NE(o.Validate().message().find("--pull-profile"), std::string::npos);
  o.pull_profile = "fast";
  EXPECT_TRUE(o.Validate().ok());
  o.port = -1;
  EXPECT_EQ(Router(o).Start().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpush::router::test
