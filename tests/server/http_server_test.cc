// HTTP API over the fake model: response shapes, SSE format, errors, x-request-id, /v1/models,
// /health, /metrics, prefix-cache counters, client disconnect -> abort.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

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

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    probe_ = std::make_shared<FakeProbe>();
    server_ =
        std::make_unique<TestServer>(std::make_unique<FakeExecutor>(probe_), tok_, SmallConfig());
  }
  void TearDown() override {
    server_->WaitIdle();
    server_.reset();
  }
  FakeTokenizer tok_;
  std::shared_ptr<FakeProbe> probe_;
  std::unique_ptr<TestServer> server_;
};

TEST_F(HttpServerTest, HealthModelsAndUnknownRoutes) {
  auto c = server_->Client();
  auto h = c->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c->Get("/v1/models");
  ASSERT_TRUE(m);
  EXPECT_EQ(m->status, 200);
  json mj = ParseJson(m->body);
  EXPECT_EQ(mj["object"], "list");
  ASSERT_EQ(mj["data"].size(), 1u);
  EXPECT_EQ(mj["data"][0]["id"], "test-model");
  EXPECT_EQ(mj["data"][0]["max_model_len"], 2048);

  auto nf = c->Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
  EXPECT_TRUE(ParseJson(nf->body)["error"]["message"].is_string());

  auto wrong = c->Get("/v1/completions");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 405);
  EXPECT_EQ(wrong->get_header_value("Allow"), "POST");
  EXPECT_EQ(ParseJson(wrong->body)["error"]["code"], "method_not_allowed");
  auto wrong2 = c->Post("/health", "", "text/plain");
  ASSERT_TRUE(wrong2);
  EXPECT_EQ(wrong2->status, 405);
}

TEST_F(HttpServerTest, CompletionNonStreaming) {
  auto c = server_->Client();
  auto r = c->Post("/v1/completions", {{"x-request-id", "my-req-42"}},
                   R"({"model":"test-model","prompt":"the cat","max_tokens":7,"temperature":0,
                       "ignore_eos":true})",
                   "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(r->get_header_value("x-request-id"), "my-req-42");
  json j = ParseJson(r->body);
  EXPECT_EQ(j["id"], "my-req-42");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "test-model");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  auto ids = tok_.Encode("the cat");
  ASSERT_TRUE(ids.ok());
  const int prompt_tokens = 1 + static_cast<int>(ids->size());
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 7);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_tokens + 7);

  // The same prompt as token ids (BOS + ids) gives the same text; the id is generated.
  std::vector<int32_t> prompt{1};
  prompt.insert(prompt.end(), ids->begin(), ids->end());
  json body = {{"prompt", prompt}, {"max_tokens", 7}, {"temperature", 0}, {"ignore_eos", true}};
  auto r2 = c->Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(r2);
  json j2 = ParseJson(r2->body);
  EXPECT_EQ(j2["choices"][0]["text"], j["choices"][0]["text"]);
  std::string gen_id = r2->get_header_value("x-request-id");
  EXPECT_EQ(gen_id.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(j2["id"], gen_id);
  // Expected tokens are the fake model's greedy continuation; check via logprobs tokens count.
  EXPECT_EQ(j2["usage"]["completion_tokens"], 7);
}

TEST_F(HttpServerTest, ChatUsesDefaultTemplate) {
  auto chat = server_->Post("/v1/chat/completions",
                            R"({"messages":[{"role":"system","content":"be nice"},
                                {"role":"user","content":[{"type":"text","text":"the cat"}]}],
                                "max_tokens":6,"temperature":0,"ignore_eos":true})");
  ASSERT_EQ(chat.first, 200) << chat.second;
  json j = ParseJson(chat.second);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  // Same as a completion of the rendered template.
  json body = {{"prompt", "System: be nice\nUser: the cat\nAssistant:"},
               {"max_tokens", 6},
               {"temperature", 0},
               {"ignore_eos", true}};
  auto comp = server_->Post("/v1/completions", body.dump());
  ASSERT_EQ(comp.first, 200);
  json cj = ParseJson(comp.second);
  EXPECT_EQ(j["choices"][0]["message"]["content"], cj["choices"][0]["text"]);
  EXPECT_EQ(j["usage"], cj["usage"]);
}

TEST_F(HttpServerTest, CompletionStreamingSseFormat) {
  const std::string base =
      R"("prompt":"the dog sat","max_tokens":9,"temperature":0,"ignore_eos":true)";
  auto whole = server_->Post("/v1/completions", "{" + base + "}");
  ASSERT_EQ(whole.first, 200);
  std::string want_text = ParseJson(whole.second)["choices"][0]["text"];

  auto c = server_->Client();
  auto r = c->Post("/v1/completions",
                   "{" + base + R"(,"stream":true,"stream_options":{"include_usage":true}})",
                   "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream; charset=utf-8");
  auto events = SseEvents(r->body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  json usage = ParseJson(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 9);
  std::string text;
  int finished = 0;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json e = ParseJson(events[i]);
    EXPECT_EQ(e["object"], "text_completion");
    EXPECT_TRUE(e.contains("usage") && e["usage"].is_null());
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) {
      ++finished;
      EXPECT_EQ(e["choices"][0]["finish_reason"], "length");
      EXPECT_EQ(i, events.size() - 3);  // the finish chunk is the last choice chunk
    }
  }
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(text, want_text);

  // Without include_usage: no usage chunk, no "usage" key.
  auto r2 = c->Post("/v1/completions", "{" + base + R"(,"stream":true})", "application/json");
  ASSERT_TRUE(r2);
  auto ev2 = SseEvents(r2->body);
  EXPECT_EQ(ev2.back(), "[DONE]");
  for (size_t i = 0; i + 1 < ev2.size(); ++i) {
    EXPECT_FALSE(ParseJson(ev2[i]).contains("usage"));
  }
}

TEST_F(HttpServerTest, ChatStreamingStartsWithRole) {
  auto r = server_->Post(
      "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,"seed":3})");
  ASSERT_EQ(r.first, 200);
  auto events = SseEvents(r.second);
  ASSERT_GE(events.size(), 3u);
  json first = ParseJson(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events.back(), "[DONE]");
}

TEST_F(HttpServerTest, SeededSamplingIsReproducible) {
  const std::string body = R"({"prompt":"the cat","max_tokens":12,"temperature":1.0,"seed":1234,
                               "ignore_eos":true})";
  auto a = server_->Post("/v1/completions", body);
  auto b = server_->Post("/v1/completions", body);
  ASSERT_EQ(a.first, 200);
  EXPECT_EQ(ParseJson(a.second)["choices"][0]["text"], ParseJson(b.second)["choices"][0]["text"]);
}

TEST_F(HttpServerTest, BatchPromptsGiveOneChoiceEach) {
  auto r = server_->Post("/v1/completions",
                         R"({"prompt":["the cat","a dog", [1, 5, 6]],"max_tokens":4,
                             "temperature":0,"ignore_eos":true})");
  ASSERT_EQ(r.first, 200) << r.second;
  json j = ParseJson(r.second);
  ASSERT_EQ(j["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(j["choices"][i]["index"], i);
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  auto single = server_->Post("/v1/completions", R"({"prompt":"a dog","max_tokens":4,
                                                      "temperature":0,"ignore_eos":true})");
  EXPECT_EQ(ParseJson(single.second)["choices"][0]["text"], j["choices"][1]["text"]);
}

TEST_F(HttpServerTest, LogprobsAndStopStrings) {
  auto r = server_->Post("/v1/completions", R"({"prompt":"the cat","max_tokens":5,
                         "temperature":0,"logprobs":2,"ignore_eos":true})");
  ASSERT_EQ(r.first, 200);
  json lp = ParseJson(r.second)["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 5u);
  ASSERT_EQ(lp["token_logprobs"].size(), 5u);
  ASSERT_EQ(lp["top_logprobs"].size(), 5u);
  EXPECT_LE(lp["token_logprobs"][0].get<double>(), 0.0);

  auto chat = server_->Post("/v1/chat/completions",
                            R"({"messages":[{"role":"user","content":"x"}],"max_tokens":3,
                                "logprobs":true,"top_logprobs":2,"temperature":0,
                                "ignore_eos":true})");
  ASSERT_EQ(chat.first, 200);
  json content = ParseJson(chat.second)["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  EXPECT_EQ(content[0]["top_logprobs"].size(), 2u);

  // A stop string taken from the middle of a longer greedy output.
  auto full = server_->Post("/v1/completions", R"({"prompt":"the cat","max_tokens":30,
                            "temperature":0,"ignore_eos":true})");
  std::string text = ParseJson(full.second)["choices"][0]["text"];
  ASSERT_GT(text.size(), 10u);
  std::string stop = text.substr(4, 4);
  json body = {{"prompt", "the cat"},
               {"max_tokens", 30},
               {"temperature", 0},
               {"ignore_eos", true},
               {"stop", {stop}}};
  for (bool stream : {false, true}) {
    body["stream"] = stream;
    auto s = server_->Post("/v1/completions", body.dump());
    ASSERT_EQ(s.first, 200);
    std::string got;
    std::string reason;
    if (!stream) {
      json j = ParseJson(s.second);
      got = j["choices"][0]["text"];
      reason = j["choices"][0]["finish_reason"];
      EXPECT_EQ(j["choices"][0]["stop_reason"], stop);
    } else {
      for (const auto& e : SseEvents(s.second)) {
        if (e == "[DONE]") continue;
        json j = ParseJson(e);
        got += j["choices"][0]["text"].get<std::string>();
        if (!j["choices"][0]["finish_reason"].is_null()) reason = j["choices"][0]["finish_reason"];
      }
    }
    EXPECT_EQ(got, text.substr(0, text.find(stop))) << "stream=" << stream;
    EXPECT_EQ(reason, "stop");
  }
}

struct BadCase {
  const char* path;
  std::string body;
  int status;
  const char* param;  // expected error.param ("" = null)
};

TEST_F(HttpServerTest, BadInputGetsOpenAiErrors) {
  const std::string long_prompt = "[" + [] {
    std::string s = "1";
    for (int i = 0; i < 2100; ++i) s += ",5";
    return s;
  }() + "]";
  const std::vector<BadCase> cases = {
      {"/v1/completions", "{not json", 400, ""},
      {"/v1/completions", "[1,2]", 400, ""},
      {"/v1/completions", R"({"max_tokens":3})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":123})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":""})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":[]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":[1, 64]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":[1, -3]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":[1, 2.5]})", 400, "prompt"},
      {"/v1/completions", R"({"prompt":"a","max_tokens":0})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"a","max_tokens":"5"})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":"a","max_tokens":5000})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt":)" + long_prompt + "}", 400, "prompt"},
      {"/v1/completions", R"({"prompt":"a","temperature":-1})", 400, "temperature"},
      {"/v1/completions", R"({"prompt":"a","temperature":"hot"})", 400, "temperature"},
      {"/v1/completions", R"({"prompt":"a","top_p":0})", 400, "top_p"},
      {"/v1/completions", R"({"prompt":"a","top_k":-2})", 400, "top_k"},
      {"/v1/completions", R"({"prompt":"a","n":0})", 400, "n"},
      {"/v1/completions", R"({"prompt":"a","n":129})", 400, "n"},
      {"/v1/completions", R"({"prompt":"a","prompt_logprobs":1})", 400, "prompt_logprobs"},
      {"/v1/completions", R"({"prompt":"a","min_p":"abc"})", 400, "min_p"},
      {"/v1/completions", R"({"prompt":"a","min_p":5})", 400, "min_p"},
      {"/v1/completions", R"({"prompt":"a","max_tokens":4,"min_tokens":5})", 400, "min_tokens"},
      {"/v1/completions", R"({"prompt":"a","min_tokens":17})", 400, "min_tokens"},
      {"/v1/completions", R"({"prompt":"a","stop_token_ids":[64]})", 400, "stop_token_ids"},
      {"/v1/completions", R"({"prompt":"a","presence_penalty":-2.5})", 400, "presence_penalty"},
      {"/v1/completions", R"({"prompt":"a","use_beam_search":true})", 400, "use_beam_search"},
      {"/v1/completions", R"({"prompt":"a","best_of":3})", 400, "best_of"},
      {"/v1/completions", R"({"prompt":"a","logprobs":21})", 400, "logprobs"},
      {"/v1/completions", R"({"prompt":"a","stop":5})", 400, "stop"},
      {"/v1/completions", R"({"prompt":"a","seed":"x"})", 400, "seed"},
      {"/v1/completions", R"({"prompt":"a","stream":"yes"})", 400, "stream"},
      {"/v1/completions", R"({"prompt":"a","stream_options":{"include_usage":true}})", 400,
       "stream_options"},
      {"/v1/completions", R"({"prompt":"a","logit_bias":{"64":1}})", 400, "logit_bias"},
      {"/v1/completions", R"({"prompt":"a","logit_bias":{"5":-101}})", 400, "logit_bias"},
      {"/v1/completions", R"({"prompt":"a","model":"other"})", 404, "model"},
      {"/v1/chat/completions", R"({"prompt":"a"})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages":[]})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages":[{"role":"tool","content":"x"}]})", 400, "messages"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})",
       400, "top_logprobs"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", 400,
       "tools"},
      {"/v1/chat/completions", R"({"messages":[{"role":"user","content":"x"}],"echo":"yes"})", 400,
       "echo"},
  };
  for (const auto& bc : cases) {
    auto [status, body] = server_->Post(bc.path, bc.body);
    EXPECT_EQ(status, bc.status) << bc.path << " " << bc.body.substr(0, 80);
    json j = ParseJson(body);
    ASSERT_TRUE(j.contains("error")) << body;
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(j["error"]["type"].is_string());
    if (std::string(bc.param).empty()) {
      EXPECT_TRUE(j["error"]["param"].is_null()) << body;
    } else {
      EXPECT_EQ(j["error"]["param"], bc.param) << bc.body.substr(0, 80) << " -> " << body;
    }
  }
  // Nothing was admitted by the engine for any of them.
  EXPECT_EQ(server_->engine->stats().requests_received, 0);
}

TEST_F(HttpServerTest, PrefixCacheHitsShowInMetrics) {
  auto c = server_->Client();
  auto metrics = [&] {
    auto m = c->Get("/metrics");
    EXPECT_TRUE(m);
    EXPECT_EQ(m->status, 200);
    return m->body;
  };
  const std::string body = R"({"prompt":"the cat sat on the mat and the dog sat on the cat",
                               "max_tokens":5,"temperature":0,"ignore_eos":true})";
  auto first = server_->Post("/v1/completions", body);
  ASSERT_EQ(first.first, 200);
  const int prompt_tokens = ParseJson(first.second)["usage"]["prompt_tokens"];
  std::string m1 = metrics();
  const std::string lbl = "{model_name=\"test-model\"}";
  double hits1 = MetricValue(m1, "vllm:prefix_cache_hits_total" + lbl);
  double queries1 = MetricValue(m1, "vllm:prefix_cache_queries_total" + lbl);
  EXPECT_EQ(hits1, 0);
  EXPECT_EQ(queries1, prompt_tokens);  // vLLM counts tokens: every prompt token is looked up
  auto second = server_->Post("/v1/completions", body);
  ASSERT_EQ(second.first, 200);
  EXPECT_EQ(ParseJson(second.second)["choices"][0]["text"],
            ParseJson(first.second)["choices"][0]["text"]);
  std::string m2 = metrics();
  const int expect_blocks = (prompt_tokens - 1) / 4;
  EXPECT_EQ(MetricValue(m2, "vllm:prefix_cache_hits_total" + lbl) - hits1, expect_blocks * 4);
  EXPECT_EQ(MetricValue(m2, "vllm:prefix_cache_queries_total" + lbl) - queries1, prompt_tokens);
  EXPECT_EQ(MetricValue(m2, "kvpush_prompt_tokens_cached_total" + lbl), expect_blocks * 4);
  EXPECT_EQ(MetricValue(m2, "vllm:prompt_tokens_total" + lbl), 2 * prompt_tokens);
  EXPECT_EQ(MetricValue(m2, "vllm:generation_tokens_total" + lbl), 10);
  EXPECT_EQ(MetricValue(m2,
                        "vllm:request_success_total{model_name=\"test-model\","
                        "finished_reason=\"length\"}"),
            2);
  EXPECT_EQ(MetricValue(m2, "vllm:time_to_first_token_seconds_count" + lbl), 2);
  EXPECT_EQ(MetricValue(m2, "vllm:e2e_request_latency_seconds_count" + lbl), 2);
  EXPECT_EQ(MetricValue(m2, "vllm:inter_token_latency_seconds_count" + lbl), 8);
  EXPECT_EQ(MetricValue(m2,
                        "vllm:time_to_first_token_seconds_bucket{model_name=\"test-model\","
                        "le=\"+Inf\"}"),
            2);
  EXPECT_EQ(MetricValue(m2, "vllm:num_requests_running" + lbl), 0);
  EXPECT_EQ(MetricValue(m2, "kvpush_kv_blocks_used" + lbl), 0);
  EXPECT_EQ(MetricValue(m2, "kvpush_kv_blocks_total" + lbl), 1024);
  EXPECT_EQ(MetricValue(m2, "kvpush_kv_blocks_free" + lbl) +
                MetricValue(m2, "kvpush_kv_blocks_cached" + lbl),
            1024);
  // HTTP responses are counted after they are written: poll (deadline) for the second one.
  const std::string http_ok =
      "kvpush_http_requests_total{model_name=\"test-model\",path=\"/v1/completions\","
      "status=\"200\"}";
  double ok_count = MetricValue(m2, http_ok);
  for (int i = 0; i < 500 && ok_count < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ok_count = MetricValue(metrics(), http_ok);
  }
  EXPECT_EQ(ok_count, 2);
  EXPECT_NE(m2.find("# TYPE vllm:request_time_per_output_token_seconds histogram"),
            std::string::npos);
  EXPECT_NE(m2.find("# TYPE vllm:request_queue_time_seconds histogram"), std::string::npos);
  // vLLM's per-request histograms: sizes in tokens, phases in seconds, one observation each.
  EXPECT_EQ(MetricValue(m2, "vllm:request_prompt_tokens_sum" + lbl), 2 * prompt_tokens);
  EXPECT_EQ(MetricValue(m2, "vllm:request_generation_tokens_sum" + lbl), 10);
  EXPECT_EQ(MetricValue(m2, "vllm:request_prefill_kv_computed_tokens_sum" + lbl),
            2 * prompt_tokens - expect_blocks * 4);
  for (const char* h : {"vllm:request_prefill_time_seconds_count",
                        "vllm:request_decode_time_seconds_count",
                        "vllm:request_inference_time_seconds_count",
                        "vllm:request_time_per_output_token_seconds_count",
                        "vllm:request_params_n_count", "vllm:request_params_max_tokens_count",
                        "vllm:request_max_num_generation_tokens_count"}) {
    EXPECT_EQ(MetricValue(m2, h + lbl), 2) << h;
  }
  EXPECT_EQ(MetricValue(m2, "vllm:request_params_max_tokens_sum" + lbl), 10);
  EXPECT_EQ(MetricValue(m2, "vllm:request_max_num_generation_tokens_sum" + lbl), 10);
  // The tokens executed per step add up to every token computed.
  EXPECT_EQ(MetricValue(m2, "vllm:iteration_tokens_total_sum" + lbl),
            MetricValue(m2, "kvpush_computed_tokens_total" + lbl));
  // Bounds are written as vLLM's Python client writes them, and include vLLM's own.
  EXPECT_NE(m2.find("vllm:time_to_first_token_seconds_bucket{model_name=\"test-model\",le=\"2560.0\"}"),
            std::string::npos);
  EXPECT_NE(m2.find("vllm:request_prompt_tokens_bucket{model_name=\"test-model\",le=\"1.0\"}"),
            std::string::npos);
  EXPECT_NE(m2.find("vllm:cache_config_info{model_name=\"test-model\",block_size=\"4\""),
            std::string::npos);
}

TEST_F(HttpServerTest, ClientDisconnectDuringSseAbortsTheRequest) {
  probe_->step_delay_us = 2000;  // ~2 ms per token: the stream is still running when we leave
  auto c = server_->Client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  req.body = R"({"prompt":"the cat","max_tokens":1500,"stream":true,"ignore_eos":true})";
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto res = c->send(req);
  EXPECT_FALSE(res);  // we cancelled
  c->stop();
  c.reset();
  EXPECT_TRUE(kvpush::testing::WaitUntil(
      [&] {
        return server_->engine->stats()
                   .finished_by_reason[static_cast<size_t>(FinishReason::kAbort)] == 1;
      },
      std::chrono::seconds(10)))
      << "the cancelled request was not aborted";
  probe_->step_delay_us = 0;
  server_->WaitIdle();
  EXPECT_LT(server_->engine->stats().generation_tokens, 1500);
}

TEST_F(HttpServerTest, OverloadGets503) {
  server_.reset();
  EngineConfig c = SmallConfig();
  c.max_num_seqs = 1;
  c.max_pending_requests = 1;
  probe_ = std::make_shared<FakeProbe>();
  probe_->step_delay_us = 2000;
  server_ = std::make_unique<TestServer>(std::make_unique<FakeExecutor>(probe_), tok_, c);
  const std::string body = R"({"prompt":"the cat","max_tokens":300,"ignore_eos":true})";
  std::thread a([&] { server_->Post("/v1/completions", body); });
  auto wait_for = [&](auto pred) {
    return kvpush::testing::WaitUntil(pred, std::chrono::seconds(10));
  };
  ASSERT_TRUE(wait_for([&] { return server_->engine->stats().num_running == 1; }));
  std::thread b([&] { server_->Post("/v1/completions", body); });
  ASSERT_TRUE(wait_for([&] { return server_->engine->stats().num_waiting == 1; }));
  auto [status, resp] = server_->Post("/v1/completions", body);
  EXPECT_EQ(status, 503);
  EXPECT_EQ(ParseJson(resp)["error"]["code"], "overloaded");
  probe_->step_delay_us = 0;
  a.join();
  b.join();
}

}  // namespace
}  // namespace kvpush::testing

namespace kvpush::testing {
namespace {

// A whole answer whose router asked for resume info (x-kvpush-resume-info: 1) is handed back
// when the server begins draining: 503 draining_handback with the answer so far and the seed as
// a valid `seed` (the bits of a negative one kept: a seed drawn at random is any uint64, and the
// continuation's `seed` takes int64). The continuation of it (kvpush_resume whole, admitted
// while draining with x-kvpush-migration-source) answers the whole uninterrupted answer.
TEST_F(HttpServerTest, ADrainingServerHandsAWholeAnswerBackAndItsContinuationFinishesIt) {
  const json req = json::parse(R"({"prompt":"the cat","max_tokens":40,"temperature":1.0,
      "seed":-5,"logprobs":2,"ignore_eos":true})");
  const auto [ref_status, ref_body] = server_->Post("/v1/completions", req.dump());
  ASSERT_EQ(ref_status, 200) << ref_body;
  probe_->step_delay_us = 5000;  // 40 tokens: about 200 ms
  const int64_t steps_before = probe_->steps.load();
  std::pair<int, std::string> handed;
  std::thread client([&] {
    handed = server_->Post("/v1/completions", req.dump(), {{"x-kvpush-resume-info", "1"}});
  });
  ASSERT_TRUE(WaitUntil([&] { return probe_->steps.load() > steps_before + 10; },
                        std::chrono::seconds(5),
                        std::chrono::milliseconds(1)));
  server_->http->BeginDrain();
  client.join();
  probe_->step_delay_us = 0;
  ASSERT_EQ(handed.first, 503) << handed.second;
  const json back = json::parse(handed.second);
  EXPECT_EQ(back["error"]["code"], "draining_handback");
  EXPECT_FALSE(back["kvpush_seed"].is_number_unsigned()) << back["kvpush_seed"];
  EXPECT_EQ(back["kvpush_seed"].get<int64_t>(), -5);
  const json& resume = back["kvpush_resume"];
  EXPECT_EQ(resume["whole"], true);
  ASSERT_EQ(resume["choices"].size(), 1u);
  const json& c = resume["choices"][0];
  EXPECT_GT(c["token_ids"].size(), 0u);
  EXPECT_LT(c["token_ids"].size(), 40u);
  EXPECT_EQ(c["logprobs"].size(), c["token_ids"].size());
  EXPECT_EQ(c["text"].get<std::string>().size(), c["text_bytes"].get<size_t>());
  json cont = req;
  cont["kvpush_resume"] = resume;
  cont["seed"] = back["kvpush_seed"];
  const auto [status, body] =
      server_->Post("/v1/completions", cont.dump(), {{"x-kvpush-migration-source", "1"}});
  ASSERT_EQ(status, 200) << body;
  json a = json::parse(body);
  json b = json::parse(ref_body);
  for (json* j : {&a, &b}) {
    j->erase("id");
    j->erase("created");
  }
  EXPECT_EQ(a, b);
}

TEST_F(HttpServerTest, SecondServerOnTheSamePortFailsToStart) {
  server::ServerOptions so;
  so.host = "127.0.0.1";
  so.port = server_->port;
  so.served_model_name = "second";
  server::HttpServer second(*server_->engine, so);
  Status st = second.Start();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
}

}  // namespace
}  // namespace kvpush::testing
