// The router's failure paths over fake instances (DESIGN.md §6 "legs fail together"): a failing
// leg closes the other and sends its instance POST /kv/abort; P's early error reaches the client
// as colocated serving would give it; legs to an instance marked unhealthy are cut, slow but
// healthy ones are not.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "router_test_util.h"

namespace kvpush::router::test {
namespace {

/// The transfer id of the first leg `inst` received.
std::string TransferIdOf(FakeInstance& inst) {
  return inst.received().at(0).body["kv_transfer_params"]["transfer_id"].get<std::string>();
}

/// Waits until `inst` got POST /kv/abort of `tid` (and returns true), at most `timeout_ms`.
bool AbortArrives(FakeInstance& inst, const std::string& tid, int timeout_ms = 2000) {
  return WaitFor(
      [&] {
        for (const auto& a : inst.aborts()) {
          if (a == tid) return true;
        }
        return false;
      },
      timeout_ms);
}

/// The JSON of the last `data: {"error"...}` event of an SSE body (null if none).
json LastErrorEvent(const std::string& body) {
  const size_t at = body.rfind("data: {\"error\"");
  if (at == std::string::npos) return nullptr;
  return json::parse(body.substr(at + 6, body.find("\n\n", at) - at - 6), nullptr, false);
}

TEST_F(RouterTest, PushPrefillErrorBeatsASlowDecodeAndAbortsIt) {
  StartRouter();
  p_[0]->status = 400;
  d_[0]->delay_ms = 60000;  // D answers only when the test ends
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(d_[0]->decode_answers.load(), 0) << "the client waited for D";
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "prefill says no");
  ASSERT_EQ(p_[0]->count(), 1u);
  EXPECT_TRUE(AbortArrives(*d_[0], TransferIdOf(*p_[0])));
  EXPECT_TRUE(p_[0]->aborts().empty()) << "P failed: nothing to abort there";
  // The outcome is counted once D's answer to the abort reached the router: after D saw it.
  EXPECT_TRUE(WaitFor([&] {
    return HasMetric("kvpush_router_transfer_aborts_total{role=\"decode\",outcome=\"ok\"} 1");
  }));
}

TEST_F(RouterTest, PushPrefillErrorBeforeDecodeOutputIsAPlainHttpErrorWhenStreamed) {
  StartRouter();
  p_[0]->status = 400;
  p_[0]->delay_ms = 100;
  d_[0]->preamble = true;  // D's 200 and its chat role chunk come at once
  d_[0]->chunk_delay_ms = 3000;
  StreamSeen s = PostStream({{"prompt", "x"}});
  EXPECT_EQ(s.status, 400) << s.body;
  EXPECT_EQ(json::parse(s.body)["error"]["message"], "prefill says no") << s.body;
  EXPECT_TRUE(AbortArrives(*d_[0], TransferIdOf(*p_[0])));
}

TEST_F(RouterTest, PushPrefillErrorAfterTheStreamStartedEndsItWithAnErrorEvent) {
  StartRouter();
  p_[0]->status = 500;
  p_[0]->delay_ms = 400;
  d_[0]->chunks = 50;
  d_[0]->chunk_delay_ms = 100;
  StreamSeen s = PostStream({{"prompt", "x"}});
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("\"t0\""), std::string::npos) << s.body;
  EXPECT_EQ(s.body.find("[DONE]"), std::string::npos) << s.body;
  const json e = LastErrorEvent(s.body);
  ASSERT_TRUE(e.is_object()) << s.body;
  EXPECT_EQ(e["error"]["message"], "prefill says no");
  EXPECT_TRUE(AbortArrives(*d_[0], TransferIdOf(*p_[0])));
  // D's connection was closed: its next write failed.
  EXPECT_TRUE(WaitFor([&] { return d_[0]->write_failed.load(); }, 3000));
}

TEST_F(RouterTest, PushDroppedPrefillLeavesTheAnswerToDecode) {
  StartRouter();
  p_[0]->aborted_answer = true;  // D told P its prefill was not needed (full prefix hit)
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["id"], "d");
  StreamSeen s = PostStream({{"prompt", "x"}});
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("data: [DONE]"), std::string::npos) << s.body;
  EXPECT_TRUE(d_[0]->aborts().empty());
}

TEST_F(RouterTest, PushDecodeErrorAbortsPrefill) {
  StartRouter();
  d_[0]->status = 400;
  p_[0]->delay_ms = 60000;  // P answers only when the test ends
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(p_[0]->answered_ns.load(), 0) << "the client waited for P";
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "bad prompt");
  // P's leg may be stopped before it reached P (D failed at once); the abort reaches P either way.
  EXPECT_TRUE(AbortArrives(*p_[0], TransferIdOf(*d_[0]), 3000));
  EXPECT_TRUE(d_[0]->aborts().empty());
}

TEST_F(RouterTest, PullDecodeFailuresAbortPrefill) {
  StartRouter(1, 1, TransferMode::kPull);
  d_[0]->status = 400;  // D rejects
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_TRUE(AbortArrives(*p_[0], TransferIdOf(*p_[0]), 1000));

  d_[0]->status = 200;  // the client leaves mid-stream
  d_[0]->chunks = 500;
  d_[0]->chunk_delay_ms = 10;
  StreamSeen s = PostStream({{"prompt", "x"}}, /*cancel_after_first=*/true);
  EXPECT_FALSE(s.ok);
  const std::string tid2 =
      p_[0]->received().at(1).body["kv_transfer_params"]["transfer_id"].get<std::string>();
  EXPECT_TRUE(AbortArrives(*p_[0], tid2, 2000));

  d_[0]->Stop();  // D unreachable
  res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  if (res->status == 503 && p_[0]->count() == 2u) {
    // The health checker saw D go first: no leg was sent, so there is nothing to abort.
    return;
  }
  // D unreachable (502), or marked unhealthy while P's leg ran (its leg is cut at creation: 503
  // decode_unhealthy): either way P's part is aborted.
  EXPECT_TRUE(res->status == 502 || (res->status == 503 && res->body.find("decode_unhealthy") !=
                                                               std::string::npos))
      << res->body;
  ASSERT_EQ(p_[0]->count(), 3u);
  const std::string tid3 =
      p_[0]->received().at(2).body["kv_transfer_params"]["transfer_id"].get<std::string>();
  EXPECT_TRUE(AbortArrives(*p_[0], tid3, 3000));
}

TEST_F(RouterTest, PullLegToAnInstanceMarkedUnhealthyIsCut) {
  StartRouter(1, 1, TransferMode::kPull, "", /*health_interval_ms=*/100);
  p_[0]->delay_ms = 60000;  // P answers only when the test ends: only a cut ends the leg
  std::thread stall([&] {
    WaitFor([&] { return p_[0]->count() == 1; });  // the leg is in flight
    p_[0]->health_delay_ms = 60000;  // like SIGSTOP: /health times out (500 ms here)
  });
  auto res = Post({{"prompt", "x"}});
  stall.join();
  ASSERT_TRUE(res);
  EXPECT_EQ(p_[0]->answered_ns.load(), 0) << "the leg waited for P";
  EXPECT_EQ(res->status, 503);
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "prefill_unhealthy");
  EXPECT_EQ(e["type"], "server_error");
  EXPECT_NE(e["message"].get<std::string>().find(p_[0]->url()), std::string::npos) << e.dump();
  EXPECT_EQ(d_[0]->count(), 0u);
  EXPECT_TRUE(HasMetric("kvpush_router_legs_cut_total{leg=\"prefill\"} 1"));
}

TEST_F(RouterTest, SlowButHealthyPrefillIsNotCut) {
  StartRouter(1, 1, TransferMode::kPull, "", /*health_interval_ms=*/20);
  p_[0]->delay_ms = 1500;  // a long prefill; P keeps answering /health
  auto res = Post({{"prompt", "x"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(d_[0]->count(), 1u);
  EXPECT_TRUE(HasMetric("kvpush_router_legs_cut_total{leg=\"prefill\"} 0"));
}

TEST_F(RouterTest, PushPrefillMarkedUnhealthyFailsTheRequestAndAbortsDecode) {
  StartRouter(1, 1, TransferMode::kPush, "", /*health_interval_ms=*/100);
  p_[0]->delay_ms = 60000;  // neither answers before the test ends: only a cut ends the request
  d_[0]->delay_ms = 60000;
  std::thread stall([&] {
    WaitFor([&] { return p_[0]->count() == 1 && d_[0]->count() == 1; });  // both legs in flight
    p_[0]->health_status = 503;
  });
  auto res = Post({{"prompt", "x"}});
  stall.join();
  ASSERT_TRUE(res);
  EXPECT_EQ(p_[0]->answered_ns.load(), 0);
  EXPECT_EQ(d_[0]->decode_answers.load(), 0);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "prefill_unhealthy") << res->body;
  EXPECT_TRUE(AbortArrives(*d_[0], TransferIdOf(*p_[0])));
}

TEST_F(RouterTest, DecodeMarkedUnhealthyMidStreamEndsItAndAbortsPrefill) {
  StartRouter(1, 1, TransferMode::kPush, "", /*health_interval_ms=*/100);
  d_[0]->chunks = 100;
  d_[0]->chunk_delay_ms = 100;  // 10 s of stream: the cut ends it long before
  std::thread stall([&] {
    WaitFor([&] { return d_[0]->last_chunk_ns.load() != 0; });  // the stream is running
    d_[0]->health_status = 503;
  });
  StreamSeen s = PostStream({{"prompt", "x"}});
  stall.join();
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(s.body.find("[DONE]"), std::string::npos) << s.body;
  const json e = LastErrorEvent(s.body);
  ASSERT_TRUE(e.is_object()) << s.body;
  EXPECT_EQ(e["error"]["code"], "decode_unhealthy");
  EXPECT_NE(e["error"]["message"].get<std::string>().find(d_[0]->url()), std::string::npos);
  EXPECT_TRUE(AbortArrives(*p_[0], TransferIdOf(*p_[0])));
}

}  // namespace
}  // namespace kvpush::router::test
