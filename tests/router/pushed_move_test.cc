// PushedMove (src/router/pushed_move.h): the legs that move a stream's context by push, per
// choice for n > 1, built from the client's body and the stream's ledger.
#include "router/pushed_move.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvpush::router {
namespace {

using nlohmann::json;

InstanceAddress Source() {
  InstanceAddress a;
  a.host = "10.0.0.2";
  a.port = 8101;
  a.url = "http://10.0.0.2:8101";
  return a;
}

ClientBody Client(const std::string& text) {
  Result<ClientBody> b = ParseClientBody(text);
  EXPECT_TRUE(b.ok());
  return *b;
}

/// A ledger fed with the comments an instance writes: `{index, token_ids, text_bytes, finished}`.
ResumeLedger Ledger(const std::vector<json>& comments) {
  ResumeLedger l;
  for (const json& c : comments) EXPECT_TRUE(l.Note(c.dump())) << c;
  return l;
}

json Comment(int64_t index, std::vector<int32_t> ids, int64_t bytes, bool finished = false) {
  return {{"index", index}, {"token_ids", ids}, {"text_bytes", bytes}, {"finished", finished},
          {"seed", 11}};
}

// n = 1: one round, the continuation itself; the whole push at the switch is the same move.
TEST(PushedMove, OneChoiceMovesAsOneSequence) {
  const ClientBody c = Client(R"({"prompt":"Once","max_tokens":40,"stream":true,
                                  "stream_options":{"include_usage":true},"temperature":0.8})");
  const ResumeLedger l = Ledger({Comment(0, {5, 6}, 4), Comment(0, {7}, 6)});
  const std::vector<PushedMove> rounds = PlanFirstRounds(c, l, Source());
  ASSERT_EQ(rounds.size(), 1u);
  EXPECT_EQ(rounds[0].resumed, 3);
  const json p = json::parse(rounds[0].PrefillBody(c, "t1"));
  EXPECT_EQ(p["prompt"], "Once");
  EXPECT_EQ(p["max_tokens"], 4);
  EXPECT_EQ(p["stream"], false);
  EXPECT_FALSE(p.contains("stream_options"));
  EXPECT_EQ(p["seed"], 11);  // the instance's seed: the client named none
  EXPECT_EQ(p["kvpush_resume"]["choices"][0]["token_ids"], json({5, 6, 7}));
  EXPECT_EQ(p["kvpush_resume"]["choices"][0]["text_bytes"], 6);
  EXPECT_EQ(p["kv_transfer_params"]["do_remote_decode"], true);
  EXPECT_EQ(p["kv_transfer_params"]["transfer_id"], "t1");
  const json first = json::parse(rounds[0].DecodeBody(c, "t1", /*first_round=*/true));
  EXPECT_EQ(first["stream"], false);
  EXPECT_EQ(first["max_tokens"], 4);
  EXPECT_FALSE(first.contains("stream_options"));
  EXPECT_EQ(first["kv_transfer_params"]["remote_port"], 8101);
  EXPECT_EQ(first["kvpush_resume"], p["kvpush_resume"]);
  const json sw = json::parse(rounds[0].DecodeBody(c, "t2"));
  EXPECT_EQ(sw["stream"], true);
  EXPECT_EQ(sw["max_tokens"], 40);
  EXPECT_EQ(sw["stream_options"]["include_usage"], true);
  const auto whole = PlanWholePush(c, l, Source());
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->leg, rounds[0].leg);
}

// n > 1: one round per choice that is neither finished nor empty, each the continuation of
// that choice alone (n = 1, its tokens as choice 0, the request's seed untouched); no whole
// push at the switch.
TEST(PushedMove, EachOpenChoiceWithOutputIsItsOwnSequence) {
  const ClientBody c = Client(
      R"({"messages":[{"role":"user","content":"hi"}],"n":4,"seed":3,"stream":true,
          "max_completion_tokens":30,"logprobs":true,"top_logprobs":2})");
  // Choice 0 has 2 tokens, 1 is finished, 2 has none yet, 3 has one.
  const ResumeLedger l = Ledger({Comment(0, {5}, 2), Comment(1, {8}, 1, true), Comment(0, {6}, 3),
                                 Comment(3, {9}, 1), Comment(2, {}, 0)});
  const std::vector<PushedMove> rounds = PlanFirstRounds(c, l, Source());
  ASSERT_EQ(rounds.size(), 2u);
  const std::vector<std::vector<int32_t>> ids = {{5, 6}, {9}};
  for (size_t i = 0; i < rounds.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(rounds[i].resumed, static_cast<int64_t>(ids[i].size()));
    const json p = json::parse(rounds[i].PrefillBody(c, "t"));
    const json d = json::parse(rounds[i].DecodeBody(c, "t", /*first_round=*/true));
    for (const json& leg : {p, d}) {
      EXPECT_EQ(leg["n"], 1);
      EXPECT_EQ(leg["seed"], 3);
      EXPECT_EQ(leg["messages"][0]["content"], "hi");
      EXPECT_FALSE(leg.contains("max_completion_tokens"));
      EXPECT_EQ(leg["max_tokens"], rounds[i].resumed + 1);
      ASSERT_EQ(leg["kvpush_resume"]["choices"].size(), 1u);
      EXPECT_EQ(leg["kvpush_resume"]["choices"][0]["index"], 0);
      EXPECT_EQ(leg["kvpush_resume"]["choices"][0]["token_ids"], json(ids[i]));
      EXPECT_EQ(leg["kvpush_resume"]["choices"][0]["finished"], false);
      EXPECT_FALSE(leg["kvpush_resume"].contains("usage_sent"));
    }
  }
  EXPECT_FALSE(PlanWholePush(c, l, Source()).has_value());
}

// min_tokens above a first round's one-token max_tokens is clamped on its D leg (a D leg
// refuses min_tokens > max_tokens; P clamps its own), and only there: the switch's leg keeps
// the client's. Found by a break-it pass: such a stream moved by recompute.
TEST(PushedMove, AFirstRoundClampsMinTokensToItsOneToken) {
  const ClientBody c = Client(R"({"prompt":"a","stream":true,"max_tokens":400,"min_tokens":100})");
  const std::vector<PushedMove> rounds =
      PlanFirstRounds(c, Ledger({Comment(0, {5, 6, 7, 8}, 4)}), Source());
  ASSERT_EQ(rounds.size(), 1u);
  const json first = json::parse(rounds[0].DecodeBody(c, "t", /*first_round=*/true));
  EXPECT_EQ(first["max_tokens"], 5);
  EXPECT_EQ(first["min_tokens"], 5);
  EXPECT_EQ(json::parse(rounds[0].DecodeBody(c, "t"))["min_tokens"], 100);
  EXPECT_EQ(json::parse(rounds[0].PrefillBody(c, "t"))["min_tokens"], 100);  // P clamps itself
  const ClientBody low = Client(R"({"prompt":"a","stream":true,"min_tokens":2})");
  EXPECT_EQ(json::parse(PlanFirstRounds(low, Ledger({Comment(0, {5, 6, 7, 8}, 4)}), Source())[0]
                            .DecodeBody(low, "t", true))["min_tokens"],
            2);
}

// Nothing to push: no output yet, only finished choices, a malformed n, a choice the request
// does not have.
TEST(PushedMove, NothingToPushPlansNoRound) {
  const ClientBody one = Client(R"({"prompt":"a"})");
  EXPECT_TRUE(PlanFirstRounds(one, ResumeLedger(), Source()).empty());
  EXPECT_FALSE(PlanWholePush(one, Ledger({Comment(0, {}, 0)}), Source()).has_value());
  const ClientBody two = Client(R"({"prompt":"a","n":2})");
  EXPECT_TRUE(PlanFirstRounds(two, Ledger({Comment(0, {4}, 1, true)}), Source()).empty());
  EXPECT_TRUE(PlanFirstRounds(two, Ledger({Comment(5, {4}, 1)}), Source()).empty());
  EXPECT_TRUE(
      PlanFirstRounds(Client(R"({"prompt":"a","n":"2"})"), Ledger({Comment(0, {4}, 1)}), Source())
          .empty());
}

}  // namespace
}  // namespace kvpush::router
