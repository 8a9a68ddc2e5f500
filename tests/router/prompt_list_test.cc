// Lists of prompts through the router (issue 13): which bodies are split, the merge of the
// answers (pure functions of router/prompt_list.h), and the router running one P/D request per
// prompt against fake instances (streamed and not).
#include "router/prompt_list.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <set>
#include <string>

#include "router_test_util.h"

namespace kvpush::router::test {
namespace {

TEST(PromptListTest, OnlyWellFormedListsAreSplit) {
  EXPECT_TRUE(IsPromptList({{"prompt", {"a", "b"}}}));
  EXPECT_TRUE(IsPromptList({{"prompt", json::array({"a"})}}));
  EXPECT_TRUE(IsPromptList({{"prompt", json::array({json::array({1, 2}), "b"})}}));
  // One prompt: a string or one array of token ids.
  EXPECT_FALSE(IsPromptList({{"prompt", "a"}}));
  EXPECT_FALSE(IsPromptList({{"prompt", {1, 2, 3}}}));
  // Shapes the instance refuses are left whole, so it refuses them with its own words.
  EXPECT_FALSE(IsPromptList({{"prompt", json::array()}}));
  EXPECT_FALSE(IsPromptList({{"prompt", json::array({"a", ""})}}));
  EXPECT_FALSE(IsPromptList({{"prompt", json::array({"a", 5})}}));
  EXPECT_FALSE(IsPromptList({{"prompt", json::array({"a", json::array()})}}));
  EXPECT_FALSE(IsPromptList({{"prompt", json::array({json::array({1, -1})})}}));
  EXPECT_FALSE(IsPromptList({{"prompt", json::array({json::array({1, 2147483648LL})})}}));
  EXPECT_FALSE(IsPromptList({{"prompt", json::array({json::array({1, "x"})})}}));
  EXPECT_FALSE(IsPromptList({{"max_tokens", 3}}));
}

TEST(PromptListTest, SplitKeepsEveryOtherField) {
  const json body = {{"prompt", {"a", "b"}}, {"seed", 7}, {"n", 2}, {"stream", true}};
  const auto parts = SplitPromptList(body);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0]["prompt"], "a");
  EXPECT_EQ(parts[1]["prompt"], "b");
  for (const json& p : parts) {
    EXPECT_EQ(p["seed"], 7);
    EXPECT_EQ(p["n"], 2);
    EXPECT_EQ(p["stream"], true);
  }
  EXPECT_EQ(ChoicesPerPrompt(body), 2);
  EXPECT_EQ(ChoicesPerPrompt({{"n", "x"}}), 1);
  EXPECT_EQ(ChoicesPerPrompt(json::object()), 1);
}

TEST(PromptListTest, MergeReindexesChoicesAndSumsUsage) {
  auto answer = [](const std::string& text, int prompt, int completion, int cached) {
    json a = {
        {"id", "cmpl-x"},
        {"object", "text_completion"},
        {"choices", {{{"index", 0}, {"text", text + "0"}}, {{"index", 1}, {"text", text + "1"}}}},
        {"usage",
         {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion}}}};
    if (cached >= 0) a["usage"]["prompt_tokens_details"] = {{"cached_tokens", cached}};
    return a;
  };
  const json m = MergeAnswers({answer("a", 5, 7, 0), answer("b", 3, 4, 16)}, "cmpl-list", 2);
  EXPECT_EQ(m["id"], "cmpl-list");
  EXPECT_EQ(m["object"], "text_completion");
  ASSERT_EQ(m["choices"].size(), 4u);
  const char* texts[] = {"a0", "a1", "b0", "b1"};
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(m["choices"][k]["index"], k);
    EXPECT_EQ(m["choices"][k]["text"], texts[k]);
  }
  EXPECT_EQ(m["usage"], json({{"prompt_tokens", 8},
                              {"completion_tokens", 11},
                              {"total_tokens", 19},
                              {"prompt_tokens_details", {{"cached_tokens", 16}}}}));
  // Without prompt_tokens_details in the parts, none in the sum.
  EXPECT_FALSE(
      MergeAnswers({answer("a", 1, 1, -1)}, "x", 2)["usage"].contains("prompt_tokens_details"));
}

TEST(PromptListTest, StreamChunksAreRewrittenAndUsageChunksRecognized) {
  json chunk =
      ParseSseData("data: {\"id\":\"p-1\",\"choices\":[{\"index\":1,\"text\":\"x\"}]}\n\n");
  ASSERT_TRUE(chunk.is_object());
  EXPECT_FALSE(IsUsageChunk(chunk));
  RewriteChunk(chunk, "cmpl-list", 2, 3);
  EXPECT_EQ(chunk["id"], "cmpl-list");
  EXPECT_EQ(chunk["choices"][0]["index"], 7);
  EXPECT_EQ(SseEvent(chunk),
            "data: {\"choices\":[{\"index\":7,\"text\":\"x\"}],\"id\":\"cmpl-list\"}\n\n");
  EXPECT_TRUE(IsUsageChunk(ParseSseData(
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n")));
  EXPECT_TRUE(ParseSseData("data: [DONE]\n\n").is_discarded());
  EXPECT_TRUE(ParseSseData(": comment\n\n").is_discarded());
}

// Found by fuzz/prompt_list_fuzz.cc (UBSan: signed overflow): the instances' usage counts and
// choice indexes are summed saturating, not wrapped.
TEST(PromptListTest, InstanceNumbersNearInt64MaxSaturate) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  UsageSum usage;
  const json big = {{"prompt_tokens", kMax},
                    {"completion_tokens", 2},
                    {"total_tokens", kMax},
                    {"prompt_tokens_details", {{"cached_tokens", kMax}}}};
  usage.Add(big);
  usage.Add(big);
  const json sum = usage.ToJson();
  EXPECT_EQ(sum["prompt_tokens"], kMax);
  EXPECT_EQ(sum["completion_tokens"], 4);
  EXPECT_EQ(sum["total_tokens"], kMax);
  EXPECT_EQ(sum["prompt_tokens_details"]["cached_tokens"], kMax);

  json chunk = {{"id", "x"}, {"choices", {{{"index", kMax}}, {{"index", 1}}}}};
  RewriteChunk(chunk, "cmpl-list", 2, 3);
  EXPECT_EQ(chunk["choices"][0]["index"], kMax);
  EXPECT_EQ(chunk["choices"][1]["index"], 7);
}

TEST_F(RouterTest, ListOfPromptsRunsOnePdRequestPerPromptAndMergesInOrder) {
  StartRouter(1, 1, TransferMode::kPush);
  auto res = Post({{"prompt", {"a", "b", "c"}}, {"max_tokens", 3}}, {{"x-request-id", "list-1"}});
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json a = json::parse(res->body);
  EXPECT_EQ(a["id"], "list-1");
  ASSERT_EQ(a["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a["choices"][i]["index"], i);
  // One P leg and one D leg per prompt, each with one prompt, its own transfer, the same seed.
  const auto d = d_[0]->received();
  const auto p = p_[0]->received();
  ASSERT_EQ(d.size(), 3u);
  ASSERT_EQ(p.size(), 3u);
  std::set<std::string> prompts, transfers, ids;
  std::set<int64_t> seeds;
  for (const Received& r : d) {
    prompts.insert(r.body["prompt"].get<std::string>());
    transfers.insert(r.body["kv_transfer_params"]["transfer_id"].get<std::string>());
    ids.insert(r.request_id);
    seeds.insert(r.body["seed"].get<int64_t>());
  }
  EXPECT_EQ(prompts, (std::set<std::string>{"a", "b", "c"}));
  EXPECT_EQ(transfers.size(), 3u);
  EXPECT_EQ(ids, (std::set<std::string>{"list-1-0", "list-1-1", "list-1-2"}));
  EXPECT_EQ(seeds.size(), 1u);  // minted once: choice j of every prompt uses seed + j
}

TEST_F(RouterTest, ListOfPromptsStreamsEveryChoiceAndOneDone) {
  StartRouter(1, 1, TransferMode::kPull);
  StreamSeen s = PostStream({{"prompt", {"a", "b"}}});
  ASSERT_TRUE(s.ok);
  EXPECT_EQ(s.status, 200);
  for (const char* want : {"\"index\":0,\"text\":\"t0\"", "\"index\":1,\"text\":\"t2\"",
                           "\"index\":0,\"text\":\"t2\""}) {
    EXPECT_NE(s.body.find(want), std::string::npos) << want << " in " << s.body;
  }
  EXPECT_EQ(s.body.find("data: [DONE]"), s.body.rfind("data: [DONE]"));
  EXPECT_EQ(s.body.size() - s.body.rfind("data: [DONE]\n\n"), 14u);  // [DONE] last
  EXPECT_EQ(d_[0]->count(), 2u);
}

TEST_F(RouterTest, ListOfPromptsAnswersTheFirstFailingPrompt) {
  StartRouter(1, 1, TransferMode::kPull);
  d_[0]->status = 400;
  auto res = Post({{"prompt", {"a", "b"}}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "bad prompt");
}

TEST_F(RouterTest, ClientLeavingAListStreamClosesEveryPromptsLegs) {
  StartRouter(1, 1, TransferMode::kPush);
  d_[0]->chunks = 500;
  d_[0]->chunk_delay_ms = 10;
  StreamSeen s = PostStream({{"prompt", {"a", "b", "c"}}}, /*cancel_after_first=*/true);
  EXPECT_FALSE(s.ok);
  // Every prompt's D leg is closed and every prompt's transfer aborted on P.
  ASSERT_TRUE(WaitFor([&] { return d_[0]->write_failed.load(); }, 4000));
  ASSERT_TRUE(WaitFor([&] { return p_[0]->aborts().size() == 3; }, 4000));
  std::set<std::string> aborted;
  for (const std::string& tid : p_[0]->aborts()) aborted.insert(tid);
  EXPECT_EQ(aborted.size(), 3u);
  ASSERT_TRUE(WaitFor([&] {
    for (const auto& i : router_->Snapshot()) {
      if (i.outstanding != 0) return false;
    }
    return true;
  }));
}

TEST_F(RouterTest, MalformedListsAndChatAreNotSplit) {
  StartRouter(1, 1, TransferMode::kPull);
  auto res = Post({{"prompt", json::array({"a", 5})}});
  ASSERT_TRUE(res);
  res = Post({{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"prompt", {"a", "b"}}}, {},
             "/v1/chat/completions");
  ASSERT_TRUE(res);
  const auto d = d_[0]->received();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].body["prompt"], json::array({"a", 5}));
  EXPECT_EQ(d[1].body["prompt"], json::array({"a", "b"}));
}

}  // namespace
}  // namespace kvpush::router::test
