// Routing policies and conditional disaggregation through real processes (issue 14): a router
// with --routing cache-aware over 1 P + 2 D answers what a colocated instance answers, token for
// token; a conversation resending its growing history keeps landing on the same D; with
// --local-prefill-threshold the router sends no P leg for short (or cached) prompts and the
// answers stay identical.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "pd_fixture.h"

namespace kvpush::pd_test {
namespace {

constexpr const char* kSuccess = "vllm:request_success_total";

class PdRouting : public PdFixture {
 protected:
  void StartCluster(const std::string& model) {
    const std::string h = "127.0.0.1";
    const std::string cfg = KvCfg("ucx:tcp");
    int pc = Port(), pp = Port(), pd0 = Port(), pd1 = Port();
    colo_ = Spawn("colocated", ServeArgs(model, "both", h, pc, ""), h, pc);
    p_ = Spawn("prefill", ServeArgs(model, "prefill", h, pp, cfg), h, pp);
    d_[0] = Spawn("decode0", ServeArgs(model, "decode", h, pd0, cfg), h, pd0);
    d_[1] = Spawn("decode1", ServeArgs(model, "decode", h, pd1, cfg), h, pd1);
    ASSERT_NO_FATAL_FAILURE(WaitHealthyAll({colo_, p_, d_[0], d_[1]}));
  }

  Proc* StartRouter(const std::string& name, const std::string& model,
                    const std::vector<std::string>& extra) {
    const std::string h = "127.0.0.1";
    const int port = Port();
    std::vector<std::string> a = {"router",   "--prefill",    p_->url(),   "--decode", d_[0]->url(),
                                  "--decode", d_[1]->url(),   "--host",    h,          "--port",
                                  std::to_string(port), "--tokenizer", model,
                                  "--health-interval-ms", "200"};
    a.insert(a.end(), extra.begin(), extra.end());
    Proc* r = Spawn(name, a, h, port);
    EXPECT_NO_FATAL_FAILURE(WaitHealthyAll({r}));
    return r;
  }

  /// Sends the prompt set to the colocated instance, then through `router` (every third
  /// streamed), and expects the same token ids.
  void ExpectSameAsColocated(Proc* router, uint32_t seed, bool seeded) {
    std::vector<Req> reqs = MakePrompts(512, seed, 5, 5, 5, 5, 12);
    for (Req& r : reqs) r.seeded = seeded;
    const std::vector<Res> ref = SendAll(colo_->host, colo_->port, reqs, 1);
    for (size_t i = 0; i < reqs.size(); ++i) reqs[i].stream = i % 3 == 1;
    const std::vector<Res> got = SendAll(router->host, router->port, reqs, 2);
    for (size_t i = 0; i < reqs.size(); ++i) {
      ASSERT_EQ(ref[i].status, 200) << reqs[i].label << ": " << ref[i].error;
      ASSERT_EQ(got[i].status, 200) << router->name << " " << reqs[i].label << ": "
                                    << got[i].error;
      EXPECT_EQ(IdsToString(got[i].ids), IdsToString(ref[i].ids))
          << router->name << " " << reqs[i].label << (reqs[i].stream ? " (streamed)" : "");
    }
  }

  double DSuccess(int k) { return Metric(d_[k]->host, d_[k]->port, kSuccess); }

  Proc* colo_ = nullptr;
  Proc* p_ = nullptr;
  Proc* d_[2] = {nullptr, nullptr};
};

/// POSTs `body` to /v1/chat/completions of `p`: status and raw body.
Res PostChat(const Proc* p, const json& body) {
  Res out;
  httplib::Client cli(p->host, p->port);
  cli.set_read_timeout(60, 0);
  auto r = cli.Post("/v1/chat/completions", body.dump(), "application/json");
  if (!r) return out;
  out.status = r->status;
  out.raw = r->body;
  return out;
}

/// The growing history of conversation `c` after `turn` turns (plain text, ~60 tokens a turn).
std::string History(int c, int turn) {
  static const char* kWords[] = {"Lily", "Tom",  "the",   "dog",  "ran",   "to",   "park",
                                 "and",  "saw",  "a",     "big",  "red",   "ball", "happy",
                                 "sun",  "tree", "cat",   "sat",  "under", "blue", "sky"};
  std::string s = "Once upon a time, conversation " + std::to_string(c) + " began.";
  for (int t = 0; t < turn; ++t) {
    s += "\nUser: ";
    for (int w = 0; w < 24; ++w) s += std::string(kWords[(c * 7 + t * 5 + w * 3) % 21]) + " ";
    s += "\nAssistant: they played all day.";
  }
  return s;
}

TEST_F(PdRouting, CacheAwareBitIdenticalAndConversationsStayOnTheirDecode) {
  KVP_REQUIRE_SHARED_MODEL(model, "stories260K.gguf");
  ASSERT_NO_FATAL_FAILURE(StartCluster(model));
  Proc* router = StartRouter("router-cache-aware", model, {"--routing", "cache-aware"});
  ASSERT_NO_FATAL_FAILURE(ExpectSameAsColocated(router, 11, false));
  ASSERT_NO_FATAL_FAILURE(ExpectSameAsColocated(router, 12, true));

  // Conversations, one request at a time (no load): every turn of one conversation goes to the
  // D that served its first turn (its history's blocks are in that D's prefix index).
  const double hits0 = Metric(router->host, router->port,
                              "kvpush_router_decode_choices_total{policy=\"cache-aware\","
                              "reason=\"prefix_hit\"}");
  int used[2] = {0, 0};
  for (int c = 0; c < 6; ++c) {
    int first = -1;
    for (int turn = 1; turn <= 4; ++turn) {
      const double before[2] = {DSuccess(0), DSuccess(1)};
      const json body = {{"prompt", History(c, turn)}, {"max_tokens", 4}, {"temperature", 0}};
      const Res r = PostRaw(router->host, router->port, body);
      ASSERT_EQ(r.status, 200) << r.raw;
      const Res ref = PostRaw(colo_->host, colo_->port, body);
      EXPECT_EQ(json::parse(r.raw)["choices"][0]["text"], json::parse(ref.raw)["choices"][0]["text"])
          << "conversation " << c << " turn " << turn;
      int served = -1;
      ASSERT_TRUE(WaitFor(
          [&] {
            for (int k = 0; k < 2; ++k) {
              if (DSuccess(k) > before[k]) served = k;
            }
            return served >= 0;
          },
          5000));
      if (first < 0) first = served;
      EXPECT_EQ(served, first) << "conversation " << c << " turn " << turn << " left its D";
    }
    ++used[first];
  }
  std::printf("conversations per D: %d / %d\n", used[0], used[1]);
  const double hits = Metric(router->host, router->port,
                             "kvpush_router_decode_choices_total{policy=\"cache-aware\","
                             "reason=\"prefix_hit\"}");
  EXPECT_GE(hits - hits0, 6 * 3) << "turns 2..4 of each conversation are predicted prefix hits";

  // A chat conversation: the router renders and tokenizes messages as the instances do, so the
  // second turn is a predicted prefix hit too; answers equal the colocated instance's.
  json chat = {{"messages", json::array({{{"role", "system"}, {"content", History(9, 3)}},
                                         {{"role", "user"}, {"content", "Tell me more."}}})},
               {"max_tokens", 4},
               {"temperature", 0}};
  for (int turn = 0; turn < 2; ++turn) {
    const double h0 = Metric(router->host, router->port,
                             "kvpush_router_decode_choices_total{policy=\"cache-aware\","
                             "reason=\"prefix_hit\"}");
    const Res r = PostChat(router, chat);
    const Res ref = PostChat(colo_, chat);
    ASSERT_EQ(r.status, 200) << r.raw;
    ASSERT_EQ(ref.status, 200) << ref.raw;
    EXPECT_EQ(json::parse(r.raw)["choices"][0]["message"], json::parse(ref.raw)["choices"][0]["message"]);
    const double h1 = Metric(router->host, router->port,
                             "kvpush_router_decode_choices_total{policy=\"cache-aware\","
                             "reason=\"prefix_hit\"}");
    if (turn == 1) {
      EXPECT_EQ(h1 - h0, 1) << "the chat's second turn is a predicted prefix hit";
    }
    chat["messages"].push_back({{"role", "assistant"}, {"content", "They played."}});
    chat["messages"].push_back({{"role", "user"}, {"content", "And then?"}});
  }
  EXPECT_EQ(Metric(router->host, router->port,
                   "kvpush_router_decode_choices_total{policy=\"cache-aware\",reason=\"unhashed\"}"),
            0);
}

TEST_F(PdRouting, LocalPrefillThresholdSkipsPrefillAndStaysBitIdentical) {
  KVP_REQUIRE_SHARED_MODEL(model, "stories260K.gguf");
  ASSERT_NO_FATAL_FAILURE(StartCluster(model));
  Proc* router = StartRouter("router-threshold", model,
                             {"--routing", "cache-aware", "--local-prefill-threshold", "32"});
  const double p0 = Metric(p_->host, p_->port, kSuccess);
  ASSERT_NO_FATAL_FAILURE(ExpectSameAsColocated(router, 21, false));
  ASSERT_NO_FATAL_FAILURE(ExpectSameAsColocated(router, 22, true));
  const double thr = Metric(router->host, router->port,
                            "kvpush_router_prefill_legs_skipped_total{reason=\"threshold\"}");
  const double cached = Metric(router->host, router->port,
                               "kvpush_router_prefill_legs_skipped_total{reason=\"cached\"}");
  std::printf("P legs skipped: threshold %.0f, cached %.0f\n", thr, cached);
  EXPECT_GE(thr, 10) << "the 5 short prompts of each set (< 16 tokens) skip P";
  EXPECT_GE(cached, 1) << "a repeated long prompt is cached on its D";
  // P served only the requests that were not skipped.
  const double p_served = Metric(p_->host, p_->port, kSuccess) - p0;
  EXPECT_LE(p_served, 40 - thr - cached);
}

}  // namespace
}  // namespace kvpush::pd_test
