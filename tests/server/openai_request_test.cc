// ParseOpenAiRequest: accepted shapes and the field each refusal names.
#include "server/openai_request.h"

#include <gtest/gtest.h>

namespace kvpush::server {
namespace {

OpenAiRequest MustParse(ApiKind kind, const std::string& body) {
  auto r = ParseOpenAiRequest(kind, body);
  if (auto* e = std::get_if<ApiError>(&r)) {
    ADD_FAILURE() << body << " -> " << e->ToJson();
    return {};
  }
  return std::get<OpenAiRequest>(r);
}

ApiError MustFail(ApiKind kind, const std::string& body) {
  auto r = ParseOpenAiRequest(kind, body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(OpenAiRequestTest, CompletionFields) {
  auto r = MustParse(ApiKind::kCompletion,
                     R"({"model":"m","prompt":"hi","max_tokens":5,"temperature":0.5,"top_p":0.9,
                         "top_k":3,"seed":-7,"stop":["a","","b"],"stop_token_ids":[2],
                         "ignore_eos":true,"logprobs":2,"stream":true,
                         "stream_options":{"include_usage":true},"n":1,"echo":false,
                         "user":"ignored","unknown_field":{"x":1}})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_FALSE(r.prompts[0].is_tokens);
  EXPECT_EQ(r.prompts[0].text, "hi");
  EXPECT_EQ(r.max_tokens, 5);
  EXPECT_FLOAT_EQ(r.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.top_p, 0.9f);
  EXPECT_EQ(r.top_k, 3);
  EXPECT_EQ(r.seed, -7);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(r.stop_token_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(r.ignore_eos);
  EXPECT_EQ(r.logprobs, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(OpenAiRequestTest, PromptShapes) {
  auto ids = MustParse(ApiKind::kCompletion, R"({"prompt":[1,2,3]})");
  ASSERT_EQ(ids.prompts.size(), 1u);
  EXPECT_TRUE(ids.prompts[0].is_tokens);
  EXPECT_EQ(ids.prompts[0].tokens, (std::vector<int32_t>{1, 2, 3}));
  auto batch = MustParse(ApiKind::kCompletion, R"({"prompt":["a",[4,5],"b"]})");
  ASSERT_EQ(batch.prompts.size(), 3u);
  EXPECT_TRUE(batch.prompts[1].is_tokens);
  EXPECT_EQ(batch.prompts[2].text, "b");
  EXPECT_FALSE(ids.max_tokens.has_value());
  EXPECT_FLOAT_EQ(ids.temperature, 1.0f);
}

TEST(OpenAiRequestTest, ChatFields) {
  auto r = MustParse(ApiKind::kChat,
                     R"({"messages":[{"role":"developer","content":"s"},
                         {"role":"user","content":[{"type":"text","text":"a"},
                                                   {"type":"text","text":"b"}]},
                         {"role":"assistant","content":null}],
                         "max_completion_tokens":9,"logprobs":true,"top_logprobs":3,
                         "response_format":{"type":"text"},"tools":[]})");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.logprobs, 3);
  auto plain = MustParse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],
                                            "logprobs":true})");
  EXPECT_EQ(plain.logprobs, 0);
}

TEST(OpenAiRequestTest, RefusalsNameTheField) {
  struct Case {
    ApiKind kind;
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {ApiKind::kCompletion, R"({"prompt":"a","max_tokens":1.5})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"a","max_tokens":99999999999})", "max_tokens"},
      {ApiKind::kCompletion, R"({"prompt":[1,99999999999]})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":[[]]})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":[null]})", "prompt"},
      {ApiKind::kCompletion, R"({"prompt":"a","top_p":1.5})", "top_p"},
      {ApiKind::kCompletion, R"({"prompt":"a","suffix":"z"})", "suffix"},
      {ApiKind::kCompletion, R"({"prompt":"a","presence_penalty":0.5})", "presence_penalty"},
      {ApiKind::kCompletion, R"({"prompt":"a","stop":["a",1]})", "stop"},
      {ApiKind::kCompletion, R"({"prompt":"a","stream":true,"stream_options":3})",
       "stream_options"},
      {ApiKind::kCompletion, R"({"prompt":"a","model":7})", "model"},
      {ApiKind::kChat, R"({"messages":[{"content":"x"}]})", "messages"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages"},
      {ApiKind::kChat, R"({"messages":"hi"})", "messages"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"response_format":
                           {"type":"json_object"}})",
       "response_format"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs"},
  };
  for (const auto& c : cases) {
    ApiError e = MustFail(c.kind, c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.type, "invalid_request_error");
  }
  ApiError bad = MustFail(ApiKind::kCompletion, "{\"prompt\": \"\xff\xfe\"}");
  EXPECT_EQ(bad.http_status, 400);
  EXPECT_NE(bad.ToJson().find("\"param\":null"), std::string::npos);
}

TEST(OpenAiRequestTest, DeeplyNestedJsonDoesNotCrash) {
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  ApiError e = MustFail(ApiKind::kCompletion, "{\"prompt\":" + deep + "}");
  EXPECT_EQ(e.http_status, 400);
}

}  // namespace
}  // namespace kvpush::server
