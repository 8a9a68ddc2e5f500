// The router's continuation (docs/reliability.md, "Continuation") and migration ("Migration")
// over fake P and D instances (router_test_util.h): a broken stream goes on on the other D, a
// stream without resume comments is not continued, and an operator's move takes its context
// from the source while the stream goes on.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "router/router.h"
#include "router_test_util.h"

namespace kvpush::router::test {
namespace {

// Continuation (docs/reliability.md): a D whose stream breaks after 2 chunks; the other D gets
// the request with kvpush_resume (what the client got: 2 tokens, their text) and streams the
// rest; the client sees one stream, every chunk once, no comment, one [DONE].
TEST_F(RouterTest, ABrokenDecodeStreamGoesOnOnTheOtherDecode) {
  StartRouter(1, 2);
  for (auto& d : d_) {
    d->resume_comments = true;
    d->chunks = 5;
  }
  // Whichever D the router picks first breaks after 2 chunks; the other serves the rest.
  d_[0]->drop_after = 2;
  d_[1]->drop_after = 2;
  StreamSeen s = PostStream({{"prompt", "x"}});
  EXPECT_EQ(s.status, 200);
  for (const char* t : {"\"t0\"", "\"t1\"", "\"t2\"", "\"t3\"", "\"t4\""}) {
    const size_t at = s.body.find(t);
    EXPECT_NE(at, std::string::npos) << t << " in " << s.body;
    EXPECT_EQ(s.body.find(t, at + 1), std::string::npos) << t << " twice in " << s.body;
  }
  EXPECT_EQ(s.body.find("kvpush-resume"), std::string::npos) << s.body;
  EXPECT_NE(s.body.find("[DONE]"), std::string::npos) << s.body;
  EXPECT_EQ(s.body.find("\"error\""), std::string::npos) << s.body;
  // The continuation: the other D, with the ledger (a colocated request on D).
  std::vector<Received> all;
  for (auto& d : d_) {
    for (const Received& r : d->received()) all.push_back(r);
  }
  ASSERT_EQ(all.size(), 2u);
  const Received& cont = all[0].body.contains("kvpush_resume") ? all[0] : all[1];
  ASSERT_TRUE(cont.body.contains("kvpush_resume")) << cont.body.dump();
  EXPECT_EQ(cont.body["kvpush_resume"]["choices"][0]["token_ids"], json::array({100, 101}));
  EXPECT_EQ(cont.body["kvpush_resume"]["choices"][0]["text_bytes"], 4);
  EXPECT_FALSE(cont.body.contains("kv_transfer_params"));
  EXPECT_TRUE(cont.resume_info);
  EXPECT_EQ(cont.request_id, all[0].request_id);  // one request id on both instances
  ASSERT_TRUE(WaitFor([&] {
    return Metrics().find(
               "kvpush_router_continuations_total{failed=\"decode\",kind=\"stream\"} 1") !=
           std::string::npos;
  }));
}

/// A P/D stream of `chunks` chunks (5 ms apart, with resume comments) through the router as
/// request `rid`, read on its own thread, which an operator may move (POST /admin/migrate).
class RouterMoveTest : public RouterTest {
 protected:
  ~RouterMoveTest() override {
    if (client_.joinable()) client_.join();
  }
  /// Starts the stream; returns the D serving it (null when none did within 3 s).
  FakeInstance* StartStream(int chunks, const std::string& rid) {
    StartRouter(1, 2);
    for (auto& d : d_) {
      d->resume_comments = true;
      d->chunks = chunks;
      d->chunk_delay_ms = 5;
    }
    client_ = std::thread([this, rid] {
      seen_ = PostStream({{"prompt", "x"}, {"max_tokens", 100}}, false, {{"x-request-id", rid}});
    });
    FakeInstance* source = nullptr;
    WaitFor([&] {
      for (auto& d : d_) {
        if (d->count() == 1 && d->last_chunk_ns.load() != 0) source = d.get();
      }
      return source != nullptr;
    });
    return source;
  }
  /// POST /admin/migrate of `rid`, asked again while it answers 404: D's first chunk can be out
  /// before the router registered the stream (a 404 moves nothing, so asking again is safe).
  httplib::Result Move(const std::string& rid) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    for (;;) {
      auto moved = Post(json{{"request_id", rid}}, {}, "/admin/migrate");
      if (!moved || moved->status != 404 || std::chrono::steady_clock::now() > until) return moved;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  /// Moves it; waits for the client's stream to end and checks it carries chunks 0..chunks-1
  /// once each. Returns the move's answer.
  httplib::Result MoveAndFinish(const std::string& rid, int chunks) {
    auto moved = Move(rid);
    Finish(chunks);
    return moved;
  }
  /// Waits for the client's stream to end and checks it carries chunks 0..chunks-1 once each.
  void Finish(int chunks) {
    client_.join();
    EXPECT_EQ(seen_.status, 200);
    for (int k = 0; k < chunks; ++k) {
      const std::string t = "\"t" + std::to_string(k) + "\"";
      const size_t at = seen_.body.find(t);
      EXPECT_NE(at, std::string::npos) << t << " in " << seen_.body;
      EXPECT_EQ(seen_.body.find(t, at + 1), std::string::npos) << t << " twice";
    }
    EXPECT_EQ(seen_.body.find("kvpush-resume"), std::string::npos);
  }
  FakeInstance* Other(const FakeInstance* d) {
    return d == d_[0].get() ? d_[1].get() : d_[0].get();
  }

 private:
  std::thread client_;
  StreamSeen seen_;
};

// Migration by push (docs/reliability.md, *Migration*): POST /admin/migrate of a P/D stream.
// First round: the source D gets a push P leg of the continuation (kvpush_resume = what the
// client got, max_tokens k0 + 1, x-kvpush-migration-source) and the target a push D leg naming
// the source, answered whole; the stream goes on meanwhile. The switch: the target gets the
// continuation at k1 >= k0 (it holds the context up to k0 and computes the rest), streamed and
// relayed. The client sees every chunk once.
TEST_F(RouterMoveTest, AMovedStreamTakesItsContextFromTheSourceWhileItGoesOn) {
  FakeInstance* source = StartStream(60, "mv-1");
  ASSERT_NE(source, nullptr);
  WaitFor([&] { return false; }, 60);  // a few chunks out
  auto moved = MoveAndFinish("mv-1", 60);
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved->status, 200) << moved->body;
  FakeInstance* target = Other(source);
  EXPECT_EQ(json::parse(moved->body)["to"], target->url());
  const std::vector<Received> src = source->received();
  const std::vector<Received> tgt = target->received();
  ASSERT_EQ(src.size(), 2u);  // the stream's leg, then the first round's P leg
  ASSERT_EQ(tgt.size(), 2u);  // the first round's D leg, then the continuation (streamed)
  const Received& p = src[1];
  const Received& d = tgt[0];
  EXPECT_TRUE(p.migration_source);
  EXPECT_FALSE(d.migration_source);
  const json& pk = p.body["kv_transfer_params"];
  const json& dk = d.body["kv_transfer_params"];
  EXPECT_EQ(pk["do_remote_decode"], true);
  EXPECT_EQ(pk["transfer_mode"], "push");
  EXPECT_EQ(dk["do_remote_prefill"], true);
  EXPECT_EQ(dk["remote_port"], source->port());
  EXPECT_EQ(pk["transfer_id"], dk["transfer_id"]);
  const json& first = p.body["kvpush_resume"]["choices"][0]["token_ids"];
  EXPECT_EQ(first, d.body["kvpush_resume"]["choices"][0]["token_ids"]);
  const auto k0 = static_cast<int64_t>(first.size());
  EXPECT_GE(k0, 1);
  EXPECT_EQ(p.body["max_tokens"], k0 + 1);
  EXPECT_EQ(p.body["stream"], false);
  EXPECT_EQ(d.body["max_tokens"], k0 + 1);
  EXPECT_EQ(d.body["stream"], false);
  EXPECT_EQ(p.request_id, "mv-1");
  EXPECT_EQ(d.request_id, "mv-1");
  const Received& cont = tgt[1];
  EXPECT_EQ(cont.body["stream"], true);
  EXPECT_EQ(cont.body["max_tokens"], 100);
  EXPECT_FALSE(cont.body.contains("kv_transfer_params"));
  const json& k1 = cont.body["kvpush_resume"]["choices"][0]["token_ids"];
  ASSERT_GE(k1.size(), first.size());
  EXPECT_EQ(json(std::vector<json>(k1.begin(), k1.begin() + k0)), first);
  ASSERT_TRUE(WaitFor([&] {
    return Metrics().find(
               "kvpush_router_continuations_total{failed=\"decode\",kind=\"stream_pushed\"} "
               "1") != std::string::npos;
  }));
}

// A move whose first round the target refuses: the source is told to drop that transfer (POST
// /kv/abort), the stream goes on there meanwhile, and the switch pushes the whole context (the
// streamed push pair naming the source). The client still sees every chunk once.
TEST_F(RouterMoveTest, AMoveWhoseFirstRoundFailsPushesTheWholeContextAtTheSwitch) {
  FakeInstance* source = StartStream(40, "mv-2");
  ASSERT_NE(source, nullptr);
  FakeInstance* target = Other(source);
  target->refuse_first_round = true;
  auto moved = MoveAndFinish("mv-2", 40);
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved->status, 200) << moved->body;
  const std::vector<Received> src = source->received();
  const std::vector<Received> tgt = target->received();
  ASSERT_EQ(src.size(), 3u);  // the stream, the first round's P leg, the switch's P leg
  ASSERT_EQ(tgt.size(), 2u);  // the refused first round, the switch's streamed push leg
  const std::string first_tid = src[1].body["kv_transfer_params"]["transfer_id"];
  ASSERT_TRUE(WaitFor([&] {
    const auto a = source->aborts();
    return std::find(a.begin(), a.end(), first_tid) != a.end();
  }));
  const Received& sw = tgt[1];
  EXPECT_EQ(sw.body["stream"], true);
  EXPECT_EQ(sw.body["kv_transfer_params"]["do_remote_prefill"], true);
  EXPECT_EQ(sw.body["kv_transfer_params"]["remote_port"], source->port());
  EXPECT_EQ(sw.body["kv_transfer_params"]["transfer_id"],
            src[2].body["kv_transfer_params"]["transfer_id"]);
  EXPECT_TRUE(src[2].migration_source);
  EXPECT_EQ(src[2].body["max_tokens"],
            static_cast<int64_t>(sw.body["kvpush_resume"]["choices"][0]["token_ids"].size()) + 1);
}

// A whole answer whose D began draining: D hands the answer so far back (503
// draining_handback, kvpush_resume whole); the router continues it on the other D — that
// kvpush_resume, the request's seed — and the client gets the other D's answer. With no other D
// the one that handed it back finishes it (x-kvpush-migration-source: it admits the
// continuation while draining).
class RouterHandBackTest : public RouterTest {
 protected:
  void Run(int decodes) {
    StartRouter(1, decodes);
    for (auto& d : d_) d->hand_back = true;
    auto r = Post(json{{"prompt", "x"}, {"max_tokens", 10}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_NE(r->body.find("ABC"), std::string::npos) << r->body;
    std::vector<Received> legs;
    for (auto& d : d_) {
      for (const Received& x : d->received()) legs.push_back(x);
    }
    std::sort(legs.begin(), legs.end(),
              [](const Received& a, const Received& b) { return a.arrived_ns < b.arrived_ns; });
    ASSERT_EQ(legs.size(), 2u);
    EXPECT_TRUE(legs[0].resume_info);
    EXPECT_FALSE(legs[0].body.contains("kvpush_resume"));
    const json& cont = legs[1].body;
    ASSERT_TRUE(cont.contains("kvpush_resume")) << cont;
    EXPECT_EQ(cont["kvpush_resume"]["whole"], true);
    EXPECT_EQ(cont["kvpush_resume"]["choices"][0]["text"], "t0t1");
    EXPECT_EQ(cont["kvpush_resume"]["choices"][0]["token_ids"], json({100, 101}));
    EXPECT_EQ(cont["seed"], legs[0].body["seed"]);  // the router's seed, on both legs
    EXPECT_EQ(cont["max_tokens"], 10);
    EXPECT_EQ(cont.value("stream", false), false);
    EXPECT_EQ(legs[1].migration_source, decodes == 1);
    EXPECT_NE(Metrics().find("kvpush_router_continuations_total{failed=\"decode\",kind="
                             "\"whole_resumed\"} 1"),
              std::string::npos);
  }
};

TEST_F(RouterHandBackTest, AWholeAnswerHandedBackGoesOnOnTheOtherDecode) {
  Run(2);
}
TEST_F(RouterHandBackTest, WithNoOtherDecodeTheOneThatHandedItBackFinishesIt) {
  Run(1);
}

// Output without a resume comment (an instance that writes none) is never continued past: the
// client gets the error event, never text twice.
TEST_F(RouterTest, AStreamWithoutResumeCommentsIsNotContinued) {
  StartRouter(1, 2);
  for (auto& d : d_) {
    d->chunks = 5;
    d->drop_after = 2;
  }
  StreamSeen s = PostStream({{"prompt", "x"}});
  EXPECT_EQ(s.status, 200);
  EXPECT_EQ(s.body.find("[DONE]"), std::string::npos) << s.body;
  EXPECT_NE(s.body.find("stream_broken"), std::string::npos) << s.body;
  EXPECT_EQ(d_[0]->count() + d_[1]->count(), 1u);
}

// A move is not a failure (docs/router.md, *Moves and failures*): a stream moved from D_a to
// D_b goes back to D_a when D_b is then cut by the health checker (SIGSTOP's look), and the
// client still sees every chunk once.
TEST_F(RouterMoveTest, AStreamMovedAwayFromADecodeGoesBackToItWhenTheNewOneFails) {
  FakeInstance* source = StartStream(200, "mv-3");
  ASSERT_NE(source, nullptr);
  FakeInstance* target = Other(source);
  auto moved = Move("mv-3");
  ASSERT_TRUE(moved);
  ASSERT_EQ(moved->status, 200) << moved->body;
  EXPECT_EQ(json::parse(moved->body)["to"], target->url());
  // The target streams the continuation now; cut it.
  ASSERT_TRUE(WaitFor([&] { return target->last_chunk_ns.load() != 0; }));
  target->health_status = 503;
  Finish(200);
  const std::vector<Received> src = source->received();
  ASSERT_GE(src.size(), 3u);  // the stream, the move's first round, and the stream again
  const Received& back = src.back();
  EXPECT_EQ(back.body["stream"], true);
  ASSERT_TRUE(back.body.contains("kvpush_resume")) << back.body.dump();
  EXPECT_FALSE(back.migration_source);
}

// A streamed request whose D stalls before its status line and is cut by the health checker is
// sent again to the other D (docs/router.md, *Retries*): no byte had reached the client, so the
// client gets the other D's whole stream, not 503 decode_unhealthy.
TEST_F(RouterTest, AStreamWhoseDecodeStallsBeforeItsStatusLineIsSentAgain) {
  StartRouter(1, 2, TransferMode::kPush, "", /*health_interval_ms=*/100);
  for (auto& d : d_) d->delay_ms = 60000;  // the first D to get the leg never answers it
  std::thread stall([&] {
    WaitFor([&] { return d_[0]->count() + d_[1]->count() == 1; });
    FakeInstance* stalled = d_[0]->count() == 1 ? d_[0].get() : d_[1].get();
    FakeInstance* other = stalled == d_[0].get() ? d_[1].get() : d_[0].get();
    other->delay_ms = 0;
    stalled->health_status = 503;  // like SIGSTOP: the health checker cuts its legs
  });
  StreamSeen s = PostStream({{"prompt", "x"}});
  stall.join();
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("[DONE]"), std::string::npos) << s.body;
  EXPECT_EQ(s.body.find("\"error\""), std::string::npos) << s.body;
  EXPECT_EQ(d_[0]->count(), 1u);
  EXPECT_EQ(d_[1]->count(), 1u);
  ASSERT_EQ(p_[0]->count(), 2u);  // a new attempt: a new P leg, a new transfer id
  EXPECT_NE(p_[0]->received()[0].body["kv_transfer_params"]["transfer_id"],
            p_[0]->received()[1].body["kv_transfer_params"]["transfer_id"]);
  EXPECT_TRUE(HasMetric("kvpush_router_retries_total{refused_by=\"decode\"} 1"));
}

// An instance that refuses the router's credentials (401 or 403: its --api-key is not the
// router's --instance-api-key) is a misconfigured deployment: 502 upstream_auth_failed naming
// it, never the client's 4xx; streamed or not, D or P.
TEST_F(RouterTest, AnInstanceRefusingTheRoutersKeyGives502UpstreamAuthFailed) {
  StartRouter(1, 1, TransferMode::kPull);
  for (int status : {401, 403}) {
    SCOPED_TRACE(status);
    d_[0]->status = status;
    for (bool stream : {false, true}) {
      int got = 0;
      std::string body;
      if (stream) {
        StreamSeen s = PostStream({{"prompt", "x"}});
        got = s.status;
        body = s.body;
      } else {
        auto r = Post({{"prompt", "x"}});
        ASSERT_TRUE(r);
        got = r->status;
        body = r->body;
      }
      EXPECT_EQ(got, 502) << body;
      const json e = json::parse(body, nullptr, false);
      ASSERT_TRUE(e.is_object()) << body;
      EXPECT_EQ(e["error"]["code"], "upstream_auth_failed");
      EXPECT_NE(e["error"]["message"].get<std::string>().find(d_[0]->url()), std::string::npos);
    }
    d_[0]->status = 200;
    p_[0]->status = status;
    auto r = Post({{"prompt", "x"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 502) << r->body;
    EXPECT_EQ(json::parse(r->body)["error"]["code"], "upstream_auth_failed");
    p_[0]->status = 200;
  }
}

}  // namespace
}  // namespace kvpush::router::test
