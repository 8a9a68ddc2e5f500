// OpenAI / vLLM parity of the HTTP API over the fake model (issue 13): stop_reason of a stop
// token id, min_tokens, n > 1 with vLLM's per-choice seeds, echo, logit_bias and penalties,
// system_fingerprint, usage.prompt_tokens_details.cached_tokens (--enable-prompt-tokens-details).
// The P/D side of the same parameters: tests/pd/pd_api_parity_test.cc.
#include <gtest/gtest.h>

#include "fake_model.h"
#include "server_test_util.h"

namespace kvpush::testing {
namespace {

EngineConfig SmallConfig() {
  EngineConfig c;
  c.block_size = 4;
  c.num_kv_blocks = 1024;
  c.max_num_batched_tokens = 32;
  c.max_model_len = 2048;
  return c;
}

class OpenAiParityTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(false); }
  void TearDown() override {
    server_->WaitIdle();
    server_.reset();
  }
  void Start(bool details) {
    if (server_) {
      server_->WaitIdle();
      server_.reset();
    }
    server_ = std::make_unique<TestServer>(std::make_unique<FakeExecutor>(), tok_, SmallConfig(),
                                           "test-model", details);
  }
  /// POSTs a completion body; expects 200 and returns the parsed body.
  json Complete(const json& body) {
    auto [status, text] = server_->Post("/v1/completions", body.dump());
    EXPECT_EQ(status, 200) << body.dump() << " -> " << text;
    return ParseJson(text);
  }
  /// Greedy ids of "the cat" (ignore_eos, 20 tokens).
  std::vector<int32_t> GreedyIds() {
    json j = Complete({{"prompt", "the cat"},
                       {"max_tokens", 20},
                       {"temperature", 0},
                       {"ignore_eos", true},
                       {"return_token_ids", true}});
    return j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  }

  FakeTokenizer tok_;
  std::unique_ptr<TestServer> server_;
};

TEST_F(OpenAiParityTest, StopTokenIdIsTheStopReason) {
  const auto ids = GreedyIds();
  ASSERT_EQ(ids.size(), 20u);
  const int32_t stop = ids[5];
  const auto first = std::find(ids.begin(), ids.end(), stop) - ids.begin();
  json body = {{"prompt", "the cat"},
               {"max_tokens", 20},
               {"temperature", 0},
               {"ignore_eos", true},
               {"stop_token_ids", {stop}}};
  json j = Complete(body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["stop_reason"], stop);  // an integer, as vLLM reports it
  EXPECT_EQ(j["usage"]["completion_tokens"], first + 1);
  // Streamed: the finishing event carries the same stop_reason.
  body["stream"] = true;
  auto [status, text] = server_->Post("/v1/completions", body.dump());
  ASSERT_EQ(status, 200);
  auto events = SseEvents(text);
  ASSERT_GE(events.size(), 2u);
  json last = ParseJson(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["choices"][0]["stop_reason"], stop);
}

TEST_F(OpenAiParityTest, MinTokensHoldsOffStopIdsAndStrings) {
  const auto ids = GreedyIds();
  json body = {{"prompt", "the cat"},        {"max_tokens", 20}, {"temperature", 0},
               {"stop_token_ids", {ids[0]}}, {"min_tokens", 5},  {"return_token_ids", true}};
  json j = Complete(body);
  const auto got = j["choices"][0]["token_ids"].get<std::vector<int32_t>>();
  ASSERT_GE(got.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(got[i], ids[0]) << i;
  // A stop string present in the first tokens' text does not end a request whose min_tokens
  // covers them all.
  json text = Complete(
      {{"prompt", "the cat"}, {"max_tokens", 20}, {"temperature", 0}, {"ignore_eos", true}});
  const std::string s = text["choices"][0]["text"].get<std::string>().substr(0, 2);
  json held = Complete({{"prompt", "the cat"},
                        {"max_tokens", 20},
                        {"temperature", 0},
                        {"ignore_eos", true},
                        {"min_tokens", 20},
                        {"stop", s}});
  EXPECT_EQ(held["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(held["usage"]["completion_tokens"], 20);
}

TEST_F(OpenAiParityTest, NChoicesUseSeedPlusIndex) {
  json body = {{"prompt", "the cat"}, {"max_tokens", 8}, {"temperature", 1.0},      {"seed", 40},
               {"ignore_eos", true},  {"n", 3},          {"return_token_ids", true}};
  json many = Complete(body);
  ASSERT_EQ(many["choices"].size(), 3u);
  int distinct = 0;
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(many["choices"][k]["index"], k);
    json one = body;
    one.erase("n");
    one["seed"] = 40 + k;
    json single = Complete(one);
    EXPECT_EQ(many["choices"][k]["token_ids"], single["choices"][0]["token_ids"]) << k;
    if (k == 0) {
      // The prompt counts once however many samples (vLLM).
      EXPECT_EQ(many["usage"]["prompt_tokens"], single["usage"]["prompt_tokens"]);
    }
    distinct += k > 0 && many["choices"][k]["token_ids"] != many["choices"][0]["token_ids"];
  }
  EXPECT_GT(distinct, 0);
  EXPECT_EQ(many["usage"]["completion_tokens"], 24);
  // Streamed with a batch of 2 prompts: indexes prompt * n + j, each finished once.
  body["prompt"] = {"the cat", "a dog"};
  body["n"] = 2;
  body["stream"] = true;
  auto [status, text] = server_->Post("/v1/completions", body.dump());
  ASSERT_EQ(status, 200);
  std::vector<int> finished(4, 0);
  for (const auto& e : SseEvents(text)) {
    if (e == "[DONE]") continue;
    json ev = ParseJson(e);
    for (const auto& c : ev["choices"]) {
      if (!c["finish_reason"].is_null()) ++finished.at(c["index"].get<size_t>());
    }
  }
  EXPECT_EQ(finished, std::vector<int>(4, 1));
  // Chat takes n too.
  auto [cs, ct] = server_->Post("/v1/chat/completions",
                                R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":3,
                                    "n":2,"seed":1})");
  ASSERT_EQ(cs, 200) << ct;
  EXPECT_EQ(ParseJson(ct)["choices"].size(), 2u);
}

TEST_F(OpenAiParityTest, EchoPrependsThePrompt) {
  json plain = Complete({{"prompt", "the cat"}, {"max_tokens", 6}, {"temperature", 0}});
  json echo =
      Complete({{"prompt", "the cat"}, {"max_tokens", 6}, {"temperature", 0}, {"echo", true}});
  EXPECT_EQ(echo["choices"][0]["text"].get<std::string>(),
            "the cat" + plain["choices"][0]["text"].get<std::string>());
  EXPECT_EQ(echo["usage"], plain["usage"]);
  // Token prompts echo their decoded text.
  const std::vector<int32_t> prompt = {1, 5, 6};
  json tplain = Complete({{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}});
  json techo =
      Complete({{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}, {"echo", true}});
  EXPECT_EQ(techo["choices"][0]["text"].get<std::string>(),
            DecodeTokens(tok_, prompt) + tplain["choices"][0]["text"].get<std::string>());
  // Streamed: the prompt leads the first event.
  auto [status, text] = server_->Post(
      "/v1/completions",
      R"({"prompt":"the cat","max_tokens":6,"temperature":0,"echo":true,"stream":true})");
  ASSERT_EQ(status, 200);
  std::string all;
  for (const auto& e : SseEvents(text)) {
    if (e != "[DONE]") all += ParseJson(e)["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(all, echo["choices"][0]["text"]);
}

// vLLM's echo with logprobs: the choice's logprobs cover the prompt then the completion; the
// first prompt token has null token_logprobs and top_logprobs; tokens and text offsets run on
// across both; the generated part is the one a plain logprobs request gets.
TEST_F(OpenAiParityTest, EchoWithLogprobsCoversThePromptThenTheCompletion) {
  const json base = {
      {"prompt", "the cat sat"}, {"max_tokens", 5}, {"temperature", 0}, {"logprobs", 2}};
  json plain = Complete(base);
  json echo_body = base;
  echo_body["echo"] = true;
  json echo = Complete(echo_body);
  const json& lp = echo["choices"][0]["logprobs"];
  const json& gen = plain["choices"][0]["logprobs"];
  const size_t prompt = echo["usage"]["prompt_tokens"].get<size_t>();
  const size_t completion = gen["tokens"].size();
  ASSERT_GE(prompt, 3u);
  ASSERT_EQ(lp["tokens"].size(), prompt + completion);
  for (const char* k : {"token_logprobs", "top_logprobs", "text_offset"}) {
    ASSERT_EQ(lp[k].size(), prompt + completion) << k;
  }
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["text_offset"][0], 0);
  for (size_t i = 1; i < prompt; ++i) {
    ASSERT_TRUE(lp["token_logprobs"][i].is_number()) << i;
    EXPECT_LE(lp["token_logprobs"][i].get<double>(), 0.0) << i;
    const json& top = lp["top_logprobs"][i];
    // The 2 best, plus the actual token when it is not among them (as for sampled tokens).
    EXPECT_GE(top.size(), 2u) << i;
    EXPECT_LE(top.size(), 3u) << i;
    const std::string tok = lp["tokens"][i].get<std::string>();
    ASSERT_TRUE(top.contains(tok)) << i;
    EXPECT_EQ(top[tok], lp["token_logprobs"][i]) << i;
  }
  for (size_t i = 1; i < prompt + completion; ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), lp["text_offset"][i - 1].get<size_t>() +
                                                      lp["tokens"][i - 1].get<std::string>().size())
        << i;
  }
  const size_t base_offset = lp["text_offset"][prompt].get<size_t>();
  for (size_t i = 0; i < completion; ++i) {
    EXPECT_EQ(lp["tokens"][prompt + i], gen["tokens"][i]) << i;
    EXPECT_EQ(lp["token_logprobs"][prompt + i], gen["token_logprobs"][i]) << i;
    EXPECT_EQ(lp["top_logprobs"][prompt + i], gen["top_logprobs"][i]) << i;
    EXPECT_EQ(lp["text_offset"][prompt + i].get<size_t>(),
              base_offset + gen["text_offset"][i].get<size_t>())
        << i;
  }
  EXPECT_EQ(echo["choices"][0]["text"].get<std::string>(),
            "the cat sat" + plain["choices"][0]["text"].get<std::string>());
  // Streamed: the prompt's part arrives with the first event; the events add up to the body.
  json stream_body = echo_body;
  stream_body["stream"] = true;
  auto [status, text] = server_->Post("/v1/completions", stream_body.dump());
  ASSERT_EQ(status, 200) << text;
  json tokens = json::array(), logprobs = json::array();
  std::string all;
  for (const auto& e : SseEvents(text)) {
    if (e == "[DONE]") continue;
    const json c = ParseJson(e)["choices"][0];
    all += c["text"].get<std::string>();
    if (c["logprobs"].is_null()) continue;
    for (const auto& t : c["logprobs"]["tokens"]) tokens.push_back(t);
    for (const auto& t : c["logprobs"]["token_logprobs"]) logprobs.push_back(t);
  }
  EXPECT_EQ(all, echo["choices"][0]["text"]);
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(logprobs, lp["token_logprobs"]);
  // A token-id prompt: the same, its tokens echoed.
  json tok_body = echo_body;
  tok_body["prompt"] = {1, 5, 6, 7};
  json techo = Complete(tok_body);
  EXPECT_EQ(techo["choices"][0]["logprobs"]["tokens"].size(),
            4u + techo["usage"]["completion_tokens"].get<size_t>());
  EXPECT_TRUE(techo["choices"][0]["logprobs"]["token_logprobs"][0].is_null());
  // vLLM's prompt_logprobs itself is refused, naming it.
  json pl = base;
  pl["prompt_logprobs"] = 1;
  auto [ps, pt] = server_->Post("/v1/completions", pl.dump());
  EXPECT_EQ(ps, 400);
  EXPECT_EQ(ParseJson(pt)["error"]["param"], "prompt_logprobs");
}

TEST_F(OpenAiParityTest, ChatEchoPrependsTheLastAssistantMessage) {
  // vLLM: echo prepends the last message when it has the reply's role (assistant); else nothing.
  const std::string asst =
      R"({"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"Once"}],)"
      R"("max_tokens":5,"temperature":0)";
  auto [s1, plain] = server_->Post("/v1/chat/completions", asst + "}");
  auto [s2, echo] = server_->Post("/v1/chat/completions", asst + R"(,"echo":true})");
  ASSERT_EQ(s1, 200) << plain;
  ASSERT_EQ(s2, 200) << echo;
  EXPECT_EQ(ParseJson(echo)["choices"][0]["message"]["content"].get<std::string>(),
            "Once" + ParseJson(plain)["choices"][0]["message"]["content"].get<std::string>());
  const std::string user =
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0)";
  auto [s3, uplain] = server_->Post("/v1/chat/completions", user + "}");
  auto [s4, uecho] = server_->Post("/v1/chat/completions", user + R"(,"echo":true})");
  ASSERT_EQ(s4, 200) << uecho;
  EXPECT_EQ(ParseJson(uecho)["choices"], ParseJson(uplain)["choices"]);
  (void)s3;
}

TEST_F(OpenAiParityTest, LogitBiasAndPenaltiesChangeTheTokens) {
  const auto ids = GreedyIds();
  json body = {{"prompt", "the cat"},
               {"max_tokens", 20},
               {"temperature", 0},
               {"ignore_eos", true},
               {"return_token_ids", true}};
  json biased = body;
  biased["logit_bias"] = {{std::to_string(ids[0]), -100}};
  EXPECT_NE(Complete(biased)["choices"][0]["token_ids"][0], ids[0]);
  json boosted = body;
  boosted["logit_bias"] = {{"7", 100}};
  for (const auto& t : Complete(boosted)["choices"][0]["token_ids"]) EXPECT_EQ(t, 7);
  // A strong repetition penalty over prompt + output changes a greedy run of 20 tokens.
  json rep = body;
  rep["repetition_penalty"] = 10.0;
  EXPECT_NE(Complete(rep)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), ids);
  // Neutral values change nothing.
  json neutral = body;
  neutral["presence_penalty"] = 0;
  neutral["frequency_penalty"] = 0;
  neutral["repetition_penalty"] = 1;
  neutral["min_p"] = 0;
  neutral["logit_bias"] = json::object();
  EXPECT_EQ(Complete(neutral)["choices"][0]["token_ids"].get<std::vector<int32_t>>(), ids);
}

TEST_F(OpenAiParityTest, FingerprintAndCachedTokens) {
  const std::string prompt = R"({"prompt":[1,5,6,7,8,9,10,11,12,13,14],"max_tokens":2,
                                 "temperature":0})";
  json a = ParseJson(server_->Post("/v1/completions", prompt).second);
  const std::string fp = a["system_fingerprint"].get<std::string>();
  EXPECT_EQ(fp.size(), 19u);
  EXPECT_EQ(fp.rfind("fp_", 0), 0u);
  EXPECT_FALSE(a["usage"].contains("prompt_tokens_details"));  // off by default, as in vLLM
  Start(true);
  json first = ParseJson(server_->Post("/v1/completions", prompt).second);
  json second = ParseJson(server_->Post("/v1/completions", prompt).second);
  EXPECT_EQ(first["system_fingerprint"], fp);
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  // 11 prompt tokens, blocks of 4: two full blocks are found (never the whole prompt).
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  // The streamed usage event has it too.
  auto [status, text] =
      server_->Post("/v1/completions", R"({"prompt":[1,5,6,7,8,9,10,11,12,13,14],"max_tokens":2,
                             "temperature":0,"stream":true,"stream_options":{"include_usage":true}})");
  ASSERT_EQ(status, 200);
  auto events = SseEvents(text);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(ParseJson(events[events.size() - 2])["usage"]["prompt_tokens_details"]["cached_tokens"],
            8);
}

TEST_F(OpenAiParityTest, BodyErrorsUseTheRoutersVocabulary) {
  // Same status, type, code and message as `kvpush router` for the same bytes.
  for (const std::string& body : {std::string("{\"prompt\": "), std::string("[1, 2]")}) {
    auto [status, text] = server_->Post("/v1/completions", body);
    EXPECT_EQ(status, 400) << body;
    json e = ParseJson(text)["error"];
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["code"], "invalid_json") << text;
    EXPECT_TRUE(e["param"].is_null());
    EXPECT_EQ(e["message"], body[0] == '{' ? "request body is not valid JSON"
                                           : "request body must be a JSON object");
  }
  // Over 8 MiB of JSON: 413 without a word about form data.
  std::string big = R"({"prompt":")" + std::string(9u << 20, 'a') + R"("})";
  auto [status, text] = server_->Post("/v1/completions", big);
  EXPECT_EQ(status, 413);
  EXPECT_EQ(ParseJson(text)["error"]["message"], "request body too large");
}

}  // namespace
}  // namespace kvpush::testing
