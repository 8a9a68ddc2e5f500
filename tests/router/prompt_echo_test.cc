// Echo with logprobs on P/D (router/prompt_echo.h): which bodies need P's prompt_echo, its
// parsing, and how it is put before D's choices, whole and in streamed chunks.
#include "router/prompt_echo.h"

#include <gtest/gtest.h>

#include <set>

namespace kvpush::router {
namespace {

using nlohmann::json;

PromptEcho Echo() {
  json p = {{"prompt_echo",
             {{"text", "Once upon"},
              {"logprobs",
               {{"tokens", {"<s>", "Once", " upon"}},
                {"token_logprobs", {nullptr, -1.5, -0.25}},
                {"top_logprobs", {nullptr, {{"Once", -1.5}}, {{" upon", -0.25}}}},
                {"text_offset", {0, 3, 7}}}},
              {"text_offset_end", 12}}}};
  auto e = ParsePromptEcho(p);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return *e;
}

TEST(PromptEchoTest, OnlyCompletionsWithEchoAndNumericLogprobs) {
  EXPECT_TRUE(WantsPromptEcho("/v1/completions", {{"echo", true}, {"logprobs", 0}}));
  EXPECT_FALSE(WantsPromptEcho("/v1/completions", {{"echo", true}}));
  EXPECT_FALSE(WantsPromptEcho("/v1/completions", {{"echo", true}, {"logprobs", nullptr}}));
  EXPECT_FALSE(WantsPromptEcho("/v1/completions", {{"echo", false}, {"logprobs", 2}}));
  EXPECT_FALSE(WantsPromptEcho("/v1/chat/completions", {{"echo", true}, {"logprobs", true}}));
}

TEST(PromptEchoTest, MalformedOrMissingPromptEchoIsAnError) {
  EXPECT_FALSE(ParsePromptEcho(json{{"choices", json::array()}}).ok());
  EXPECT_FALSE(ParsePromptEcho(json{{"prompt_echo", {{"text", "a"}}}}).ok());
  EXPECT_FALSE(ParsePromptEcho(json{{"prompt_echo",
                                     {{"text", "a"},
                                      {"logprobs", {{"tokens", json::array()}}},
                                      {"text_offset_end", 1}}}})
                   .ok());
}

TEST(PromptEchoTest, PutsThePromptBeforeEveryChoiceAndMovesTheOffsets) {
  json answer = {{"choices",
                  {{{"index", 0},
                    {"text", " a time"},
                    {"logprobs",
                     {{"tokens", {" a", " time"}},
                      {"token_logprobs", {-0.5, -0.75}},
                      {"top_logprobs", {{{" a", -0.5}}, {{" time", -0.75}}}},
                      {"text_offset", {0, 2}}}}},
                   {{"index", 1}, {"text", " the"}, {"logprobs", nullptr}}}}};
  PrependPromptEchoToAnswer(answer, Echo());
  const json& c0 = answer["choices"][0];
  EXPECT_EQ(c0["text"], "Once upon a time");
  EXPECT_EQ(c0["logprobs"]["tokens"], json({"<s>", "Once", " upon", " a", " time"}));
  EXPECT_EQ(c0["logprobs"]["token_logprobs"], json({nullptr, -1.5, -0.25, -0.5, -0.75}));
  EXPECT_TRUE(c0["logprobs"]["top_logprobs"][0].is_null());
  EXPECT_EQ(c0["logprobs"]["top_logprobs"][3], json({{" a", -0.5}}));
  EXPECT_EQ(c0["logprobs"]["text_offset"], json({0, 3, 7, 12, 14}));
  EXPECT_EQ(answer["choices"][1]["text"], "Once upon the");
  EXPECT_EQ(answer["choices"][1]["logprobs"]["tokens"].size(), 3u);
}

TEST(PromptEchoTest, EachChoiceGetsThePromptInItsFirstChunkOnly) {
  const PromptEcho echo = Echo();
  std::set<int64_t> echoed;
  auto chunk = [](int index, const std::string& text) {
    return json{{"choices",
                 {{{"index", index},
                   {"text", text},
                   {"logprobs",
                    {{"tokens", {text}},
                     {"token_logprobs", {-1.0}},
                     {"top_logprobs", {{{text, -1.0}}}},
                     {"text_offset", {0}}}}}}}};
  };
  json a = chunk(1, " x");
  EXPECT_TRUE(PrependPromptEchoToChunk(a, echo, &echoed));
  EXPECT_EQ(a["choices"][0]["text"], "Once upon x");
  EXPECT_EQ(a["choices"][0]["logprobs"]["text_offset"], json({0, 3, 7, 12}));
  json b = chunk(1, " y");
  EXPECT_FALSE(PrependPromptEchoToChunk(b, echo, &echoed));
  EXPECT_EQ(b, chunk(1, " y"));
  json c = chunk(0, " z");
  EXPECT_TRUE(PrependPromptEchoToChunk(c, echo, &echoed));
  json usage = {{"choices", json::array()}, {"usage", {{"prompt_tokens", 3}}}};
  EXPECT_FALSE(PrependPromptEchoToChunk(usage, echo, &echoed));
}

}  // namespace
}  // namespace kvpush::router
