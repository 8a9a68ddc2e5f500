// ParseOpenAiRequest: accepted shapes and the field each refusal names.
#include "server/openai_request.h"

#include <gtest/gtest.h>

namespace kvpush::server {
namespace {

OpenAiRequest MustParse(ApiKind kind, const std::string& body) {
  auto r = ParseOpenAiRequest(kind, body);
  if (auto* e = std::get_if<http::ApiError>(&r)) {
    ADD_FAILURE() << body << " -> " << e->ToJson();
    return {};
  }
  return std::get<OpenAiRequest>(r);
}

http::ApiError MustFail(ApiKind kind, const std::string& body) {
  auto r = ParseOpenAiRequest(kind, body);
  EXPECT_TRUE(std::holds_alternative<http::ApiError>(r)) << body;
  return std::holds_alternative<http::ApiError>(r) ? std::get<http::ApiError>(r) : http::ApiError{};
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
  EXPECT_TRUE(plain.chat_template.add_generation_prompt);
  EXPECT_FALSE(plain.chat_template.enable_thinking.has_value());
}

TEST(OpenAiRequestTest, ChatTemplateOptions) {
  auto r = MustParse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],
                                        "add_generation_prompt":false,
                                        "chat_template_kwargs":{"enable_thinking":false}})");
  EXPECT_FALSE(r.chat_template.add_generation_prompt);
  ASSERT_TRUE(r.chat_template.enable_thinking.has_value());
  EXPECT_FALSE(*r.chat_template.enable_thinking);
  auto empty = MustParse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],
                                            "chat_template_kwargs":{}})");
  EXPECT_FALSE(empty.chat_template.enable_thinking.has_value());
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
      {ApiKind::kCompletion, R"({"prompt":"a","presence_penalty":2.5})", "presence_penalty"},
      {ApiKind::kCompletion, R"({"prompt":"a","frequency_penalty":"x"})", "frequency_penalty"},
      {ApiKind::kCompletion, R"({"prompt":"a","repetition_penalty":0})", "repetition_penalty"},
      {ApiKind::kCompletion, R"({"prompt":"a","min_p":"abc"})", "min_p"},
      {ApiKind::kCompletion, R"({"prompt":"a","min_p":5})", "min_p"},
      {ApiKind::kCompletion, R"({"prompt":"a","min_p":-0.1})", "min_p"},
      {ApiKind::kCompletion, R"({"prompt":"a","min_tokens":-1})", "min_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"a","min_tokens":"5"})", "min_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"a","n":0})", "n"},
      {ApiKind::kCompletion, R"({"prompt":"a","n":129})", "n"},
      {ApiKind::kCompletion, R"({"prompt":"a","best_of":2})", "best_of"},
      {ApiKind::kCompletion, R"({"prompt":"a","echo":"yes"})", "echo"},
      {ApiKind::kCompletion, R"({"prompt":"a","prompt_logprobs":1})", "prompt_logprobs"},
      {ApiKind::kCompletion, R"({"prompt":"a","logit_bias":[1]})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt":"a","logit_bias":{"abc":1}})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt":"a","logit_bias":{"-1":1}})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt":"a","logit_bias":{"5":101}})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt":"a","logit_bias":{"5":"1"}})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt":"a","logit_bias":{"5":1,"05":2}})", "logit_bias"},
      {ApiKind::kCompletion, R"({"prompt":"a","use_beam_search":true})", "use_beam_search"},
      {ApiKind::kCompletion, R"({"prompt":"a","include_stop_str_in_output":true})",
       "include_stop_str_in_output"},
      {ApiKind::kCompletion, R"({"prompt":"a","skip_special_tokens":false})",
       "skip_special_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"a","add_special_tokens":false})", "add_special_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"a","prompt_logprobs":1})", "prompt_logprobs"},
      {ApiKind::kCompletion, R"({"prompt":"a","guided_json":{"type":"object"}})", "guided_json"},
      {ApiKind::kCompletion, R"({"prompt":"a","allowed_token_ids":[1]})", "allowed_token_ids"},
      {ApiKind::kCompletion, R"({"prompt":"a","truncate_prompt_tokens":3})",
       "truncate_prompt_tokens"},
      {ApiKind::kCompletion, R"({"prompt":"a","priority":1})", "priority"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"echo":1})", "echo"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"modalities":["audio"]})",
       "modalities"},
      {ApiKind::kChat,
       R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":"no"})",
       "add_generation_prompt"},
      {ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":3})",
       "chat_template_kwargs"},
      {ApiKind::kChat,
       R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"foo":1}})",
       "chat_template_kwargs.foo"},
      {ApiKind::kChat,
       R"({"messages":[{"role":"user","content":"x"}],
           "chat_template_kwargs":{"enable_thinking":"no"}})",
       "chat_template_kwargs.enable_thinking"},
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
    http::ApiError e = MustFail(c.kind, c.body);
    EXPECT_EQ(e.http_status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body << " -> " << e.message;
    EXPECT_EQ(e.type, "invalid_request_error");
  }
  http::ApiError bad = MustFail(ApiKind::kCompletion, "{\"prompt\": \"\xff\xfe\"}");
  EXPECT_EQ(bad.http_status, 400);
  EXPECT_NE(bad.ToJson().find("\"param\":null"), std::string::npos);
}

TEST(OpenAiRequestTest, SamplingExtensions) {
  auto r = MustParse(ApiKind::kCompletion,
                     R"({"prompt":"a","min_tokens":5,"min_p":0.25,"presence_penalty":-1.5,
                         "frequency_penalty":2,"repetition_penalty":1.3,"n":3,"echo":true,
                         "logit_bias":{"17":-100,"3":2.5},"best_of":1,"use_beam_search":false,
                         "skip_special_tokens":true,"length_penalty":1.0,"priority":0,
                         "logit_bias_unknown":1})");
  EXPECT_EQ(r.min_tokens, 5);
  EXPECT_FLOAT_EQ(r.min_p, 0.25f);
  EXPECT_FLOAT_EQ(r.presence_penalty, -1.5f);
  EXPECT_FLOAT_EQ(r.frequency_penalty, 2.0f);
  EXPECT_FLOAT_EQ(r.repetition_penalty, 1.3f);
  EXPECT_EQ(r.n, 3);
  EXPECT_TRUE(r.echo);
  // Ids ascending, whatever the object's order.
  const std::vector<std::pair<int32_t, float>> bias = {{3, 2.5f}, {17, -100.0f}};
  EXPECT_EQ(r.logit_bias, bias);
  auto d = MustParse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],
                                        "logit_bias":{},"n":2,"add_generation_prompt":true,
                                        "add_special_tokens":false,"echo":false})");
  EXPECT_TRUE(d.logit_bias.empty());
  EXPECT_EQ(d.n, 2);
  EXPECT_EQ(d.min_tokens, 0);
  EXPECT_FLOAT_EQ(d.repetition_penalty, 1.0f);
}

TEST(OpenAiRequestTest, DeeplyNestedJsonDoesNotCrash) {
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  http::ApiError e = MustFail(ApiKind::kCompletion, "{\"prompt\":" + deep + "}");
  EXPECT_EQ(e.http_status, 400);
}

// kvpush_resume (issue 24, a continuation the router sends): accepted shapes and refusals.
TEST(OpenAiRequestTest, ResumeOfAStream) {
  const OpenAiRequest r = MustParse(
      ApiKind::kCompletion,
      R"({"prompt":"a","stream":true,"n":2,"kvpush_resume":{"choices":[
          {"index":1,"token_ids":[4,5],"text_bytes":7,"finished":true},{"index":0}]}})");
  ASSERT_EQ(r.resume.size(), 2u);
  EXPECT_EQ(r.resume[0].index, 1);
  EXPECT_EQ(r.resume[0].token_ids, (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(r.resume[0].text_bytes, 7);
  EXPECT_TRUE(r.resume[0].finished);
  EXPECT_TRUE(r.resume[1].token_ids.empty());
  EXPECT_FALSE(r.resume[1].finished);
  // A migration's legs: P's (one token as JSON) and D's (a stream, or one token as JSON in the
  // first round) all carry the resume.
  const OpenAiRequest p = MustParse(
      ApiKind::kCompletion,
      R"({"prompt":"a","kv_transfer_params":{"do_remote_decode":true},
          "kvpush_resume":{"choices":[{"index":0,"token_ids":[4]}]}})");
  ASSERT_EQ(p.resume.size(), 1u);
  EXPECT_FALSE(p.stream);
  const OpenAiRequest d = MustParse(
      ApiKind::kCompletion,
      R"({"prompt":"a","stream":true,"kv_transfer_params":{"do_remote_prefill":true},
          "kvpush_resume":{"choices":[{"index":0,"token_ids":[4]}]}})");
  ASSERT_EQ(d.resume.size(), 1u);
  const OpenAiRequest first_round = MustParse(
      ApiKind::kCompletion,
      R"({"prompt":"a","kv_transfer_params":{"do_remote_prefill":true},
          "kvpush_resume":{"choices":[{"index":0,"token_ids":[4]}]}})");
  ASSERT_EQ(first_round.resume.size(), 1u);
  struct Bad {
    const char* body;
    const char* param;
  };
  const Bad bad[] = {
      {R"({"prompt":"a","kvpush_resume":{"choices":[]}})", "kvpush_resume"},
      {R"({"prompt":"a","stream":true,"kvpush_resume":[]})", "kvpush_resume"},
      {R"({"prompt":"a","stream":true,"kvpush_resume":{}})", "kvpush_resume.choices"},
      {R"({"prompt":"a","stream":true,"kvpush_resume":{"choices":[{"index":1}]}})",
       "kvpush_resume.choices.index"},
      {R"({"prompt":"a","stream":true,"kvpush_resume":{"choices":[{"index":0},{"index":0}]}})",
       "kvpush_resume.choices.index"},
      {R"({"prompt":"a","stream":true,"kvpush_resume":{"choices":[{"token_ids":[1]}]}})",
       "kvpush_resume.choices.index"},
      {R"({"prompt":"a","stream":true,"kvpush_resume":{"choices":[{"index":0,"token_ids":[-1]}]}})",
       "kvpush_resume.choices.token_ids"},
      {R"({"prompt":"a","stream":true,"kvpush_resume":{"choices":[{"index":0,"text_bytes":-1}]}})",
       "kvpush_resume.choices.text_bytes"},
      // Only a migration's P leg (do_remote_decode) resumes without a stream.
      {R"({"prompt":"a","kv_transfer_params":{"do_remote_prefill":false},"kvpush_resume":{"choices":[]}})",
       "kvpush_resume"},
      {R"({"prompt":"a","kv_transfer_params":{"do_remote_decode":"yes"},"kvpush_resume":{"choices":[]}})",
       "kvpush_resume"},
  };
  for (const Bad& b : bad) {
    const http::ApiError e = MustFail(ApiKind::kCompletion, b.body);
    EXPECT_EQ(e.http_status, 400) << b.body;
    EXPECT_EQ(e.param, b.param) << b.body;
  }
}

// kvpush_resume.whole (a whole answer a draining instance handed back, the router's
// continuation of it): text, logprobs and finish per choice; refusals name the member.
TEST(OpenAiRequestTest, ResumeOfAWholeAnswer) {
  const OpenAiRequest r = MustParse(
      ApiKind::kCompletion,
      R"({"prompt":"a","n":2,"logprobs":1,"kvpush_resume":{"whole":true,"choices":[
          {"index":0,"token_ids":[4,5],"text_bytes":3,"text":"a b","finished":false,
           "logprobs":[[-0.5,[[4,-0.5]]],[-1.25,[[7,-0.75]]]]},
          {"index":1,"token_ids":[6],"text_bytes":1,"text":"c","finished":true,
           "logprobs":[[-2,[[6,-2]]]],"finish_reason":"stop","stop_reason":"x",
           "stop_token_id":-1}]}})");
  EXPECT_TRUE(r.resume_whole);
  ASSERT_EQ(r.resume.size(), 2u);
  EXPECT_EQ(r.resume[0].text, "a b");
  ASSERT_EQ(r.resume[0].logprobs.size(), 2u);
  EXPECT_FLOAT_EQ(r.resume[0].logprobs[1].logprob, -1.25f);
  ASSERT_EQ(r.resume[0].logprobs[1].top.size(), 1u);
  EXPECT_EQ(r.resume[0].logprobs[1].top[0].first, 7);
  EXPECT_FLOAT_EQ(r.resume[0].logprobs[1].top[0].second, -0.75f);
  EXPECT_EQ(r.resume[1].finish_reason, "stop");
  EXPECT_EQ(r.resume[1].stop_reason, "x");
  EXPECT_EQ(r.resume[1].stop_token_id, -1);
  const OpenAiRequest length = MustParse(
      ApiKind::kChat, R"({"messages":[{"role":"user","content":"hi"}],"kvpush_resume":{
          "whole":true,"choices":[{"index":0,"token_ids":[4],"text_bytes":0,"finished":true,
          "finish_reason":"length","stop_reason":null}]}})");
  EXPECT_EQ(length.resume[0].finish_reason, "length");
  EXPECT_EQ(length.resume[0].stop_reason, "");
  struct Bad {
    const char* body;
    const char* param;
  };
  const Bad bad[] = {
      {R"({"prompt":"a","stream":true,"kvpush_resume":{"whole":true,"choices":[]}})",
       "kvpush_resume.whole"},
      {R"({"prompt":"a","kvpush_resume":{"whole":1,"choices":[]}})", "kvpush_resume.whole"},
      {R"({"prompt":"a","kvpush_resume":{"whole":true,"choices":[{"index":0,"text_bytes":2,
          "text":"abc"}]}})",
       "kvpush_resume.choices.text"},
      {R"({"prompt":"a","kvpush_resume":{"whole":true,"choices":[{"index":0,"text":7}]}})",
       "kvpush_resume.choices.text"},
      {R"({"prompt":"a","kvpush_resume":{"whole":true,"choices":[{"index":0,"token_ids":[1],
          "logprobs":[]}]}})",
       "kvpush_resume.choices.logprobs"},
      {R"({"prompt":"a","kvpush_resume":{"whole":true,"choices":[{"index":0,"token_ids":[1],
          "logprobs":[[-1,[[-3,-1]]]]}]}})",
       "kvpush_resume.choices.logprobs"},
      {R"({"prompt":"a","kvpush_resume":{"whole":true,"choices":[{"index":0,"token_ids":[1],
          "logprobs":[[-1]]}]}})",
       "kvpush_resume.choices.logprobs"},
      {R"({"prompt":"a","kvpush_resume":{"whole":true,"choices":[{"index":0,"finished":true}]}})",
       "kvpush_resume.choices.finish_reason"},
      {R"({"prompt":"a","kvpush_resume":{"whole":true,"choices":[{"index":0,"finished":true,
          "finish_reason":"stop","stop_reason":3}]}})",
       "kvpush_resume.choices.stop_reason"},
  };
  for (const Bad& b : bad) {
    const http::ApiError e = MustFail(ApiKind::kCompletion, b.body);
    EXPECT_EQ(e.http_status, 400) << b.body;
    EXPECT_EQ(e.param, b.param) << b.body;
  }
}

}  // namespace
}  // namespace kvpush::server
