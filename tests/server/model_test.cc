// The real stories260K model (../shared/models) through the engine and through HTTP:
// reproduces stories260K.reference.json token for token (GGUF and llama2.c .bin + tok512.bin),
// batched == one-at-a-time (greedy and seeded, chunked prefill), prefix cache hits with identical
// output, preemption under a tiny KV pool with identical output. Skips when the files are absent.
#include "model/model.h"

#include <gtest/gtest.h>

#include <fstream>

#include "server_test_util.h"
#include "test_util.h"

namespace kvpush::testing {
namespace {

using std::chrono::milliseconds;

struct Reference {
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> output_tokens;
  std::string output_text;
};

Reference LoadReference(const std::string& path) {
  std::ifstream f(path);
  json j = json::parse(f, nullptr, false);
  EXPECT_FALSE(j.is_discarded());
  const json& g = j["generation"][0];
  return {g["prompt_tokens"].get<std::vector<int32_t>>(),
          g["output_tokens"].get<std::vector<int32_t>>(), g["output_text"].get<std::string>()};
}

LoadedModel Load(const std::string& path, const std::string& tok = {}) {
  ModelLoadOptions o;
  o.path = path;
  o.tokenizer_path = tok;
  auto m = LoadModel(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(m).value();
}

struct Out {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  int32_t cached = 0;
};

Out Drain(OutputChannel& ch) {
  Out o;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (o.finish == FinishReason::kNone && std::chrono::steady_clock::now() < deadline) {
    auto r = ch.Next(milliseconds(200));
    if (!r) continue;
    for (const auto& t : r->tokens) o.tokens.push_back(t.id);
    o.text += r->text;
    if (r->finished()) {
      o.finish = r->finish_reason;
      o.cached = r->num_cached_tokens;
    }
  }
  EXPECT_NE(o.finish, FinishReason::kNone) << "timed out";
  return o;
}

/// The engine's stats once nothing runs or waits and no block is used (10 s deadline; stats are
/// published after the step that sent the final outputs).
EngineStats IdleStats(const Engine& e) {
  EngineStats s = e.stats();
  ::kvpush::testing::WaitUntil(
      [&] {
        s = e.stats();
        return s.kv.num_used == 0 && s.num_running == 0 && s.num_waiting == 0;
      },
      std::chrono::seconds(10));
  return s;
}

std::unique_ptr<Engine> MakeEngine(LoadedModel& m, EngineConfig c) {
  auto e = Engine::Create(c, std::move(m.executor), *m.tokenizer);
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return std::move(e).value();
}

GenerationRequest Greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

void CheckReferenceThroughEngine(LoadedModel m, const Reference& ref) {
  auto engine = MakeEngine(m, EngineConfig{});
  auto h =
      engine->Submit(Greedy(ref.prompt_tokens, static_cast<int32_t>(ref.output_tokens.size())));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  Out o = Drain(*h->channel);
  EXPECT_EQ(o.tokens, ref.output_tokens);
  EXPECT_EQ(o.text, ref.output_text);
  EXPECT_EQ(o.finish, FinishReason::kLength);
}

TEST(ModelEngineTest, ReferenceGgufThroughEngine) {
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  KVP_REQUIRE_SHARED_MODEL(refp, "stories260K.reference.json");
  CheckReferenceThroughEngine(Load(gguf), LoadReference(refp));
}

TEST(ModelEngineTest, ReferenceLlama2cBinThroughEngine) {
  KVP_REQUIRE_SHARED_MODEL(bin, "stories260K.bin");
  KVP_REQUIRE_SHARED_MODEL(tok, "tok512.bin");
  KVP_REQUIRE_SHARED_MODEL(refp, "stories260K.reference.json");
  CheckReferenceThroughEngine(Load(bin, tok), LoadReference(refp));
}

void CheckReferenceThroughHttp(LoadedModel m, const Reference& ref) {
  TestServer srv(std::move(m.executor), *m.tokenizer, EngineConfig{}, "stories260K");
  json body = {{"model", "stories260K"},
               {"prompt", ref.prompt_tokens},
               {"max_tokens", ref.output_tokens.size()},
               {"temperature", 0},
               {"return_token_ids", true}};
  auto [status, resp] = srv.Post("/v1/completions", body.dump());
  ASSERT_EQ(status, 200) << resp;
  json j = ParseJson(resp);
  EXPECT_EQ(j["choices"][0]["token_ids"].get<std::vector<int32_t>>(), ref.output_tokens);
  EXPECT_EQ(j["choices"][0]["text"], ref.output_text);
  EXPECT_EQ(j["usage"]["prompt_tokens"], ref.prompt_tokens.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], ref.output_tokens.size());

  // Streaming gives the same tokens and text.
  body["stream"] = true;
  auto [s2, sse] = srv.Post("/v1/completions", body.dump());
  ASSERT_EQ(s2, 200);
  std::vector<int32_t> ids;
  std::string text;
  for (const auto& e : SseEvents(sse)) {
    if (e == "[DONE]") continue;
    json c = ParseJson(e);
    text += c["choices"][0]["text"].get<std::string>();
    for (int32_t t : c["choices"][0]["token_ids"]) ids.push_back(t);
  }
  EXPECT_EQ(ids, ref.output_tokens);
  EXPECT_EQ(text, ref.output_text);
  srv.WaitIdle();
}

TEST(ModelHttpTest, ReferenceGgufThroughHttp) {
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  KVP_REQUIRE_SHARED_MODEL(refp, "stories260K.reference.json");
  CheckReferenceThroughHttp(Load(gguf), LoadReference(refp));
}

TEST(ModelHttpTest, ReferenceLlama2cBinThroughHttp) {
  KVP_REQUIRE_SHARED_MODEL(bin, "stories260K.bin");
  KVP_REQUIRE_SHARED_MODEL(tok, "tok512.bin");
  KVP_REQUIRE_SHARED_MODEL(refp, "stories260K.reference.json");
  CheckReferenceThroughHttp(Load(bin, tok), LoadReference(refp));
}

std::vector<std::vector<int32_t>> SixteenPrompts(const Tokenizer& tok) {
  const char* texts[] = {"Once upon a time",
                         "Tom had a big red ball.",
                         "The sun was shining and the birds were singing.",
                         "Lily",
                         "One day, a small dog found a bone in the park. The dog was happy.",
                         "Sara and Ben went to the beach with their mom.",
                         "The old man had a magic box. He opened it and saw a bird.",
                         "Mia wanted to fly like a bird.",
                         "A cat",
                         "Once upon a time, in a big forest, there lived a little bear who "
                         "loved honey. Every day he went to look for honey in the trees.",
                         "The boy ran",
                         "She saw a pretty flower in the garden and wanted to pick it.",
                         "It was a cold day.",
                         "Ben and his friend played with blocks. They built a tall tower and "
                         "then it fell down. They laughed and built it again.",
                         "The fish",
                         "Mom said"};
  std::vector<std::vector<int32_t>> out;
  for (const char* t : texts) {
    std::vector<int32_t> p{tok.bos_id()};
    auto enc = tok.Encode(t);
    EXPECT_TRUE(enc.ok());
    p.insert(p.end(), enc->begin(), enc->end());
    out.push_back(std::move(p));
  }
  return out;
}

void CheckBatchedEqualsSequential(float temperature) {
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  LoadedModel batched_model = Load(gguf);
  auto prompts = SixteenPrompts(*batched_model.tokenizer);
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  EngineConfig small;
  small.max_num_batched_tokens = 24;  // the long prompts are prefilled in chunks
  ASSERT_GT(longest, 24u);
  auto request = [&](size_t i) {
    GenerationRequest r = Greedy(prompts[i], 40 + static_cast<int32_t>(i) * 3);
    r.sampling.temperature = temperature;
    r.sampling.top_k = temperature > 0 ? 40 : 0;
    r.sampling.top_p = temperature > 0 ? 0.9f : 1.0f;
    r.sampling.seed = 4242 + i;
    return r;
  };
  auto batched_engine = MakeEngine(batched_model, small);
  std::vector<Engine::Handle> hs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto h = batched_engine->Submit(request(i));
    ASSERT_TRUE(h.ok());
    hs.push_back(*h);
  }
  std::vector<Out> batched;
  for (auto& h : hs) batched.push_back(Drain(*h.channel));
  auto stats = IdleStats(*batched_engine);
  EXPECT_EQ(stats.kv.num_used, 0);

  LoadedModel solo_model = Load(gguf);
  EngineConfig solo_cfg;
  solo_cfg.enable_prefix_caching = false;
  auto solo_engine = MakeEngine(solo_model, solo_cfg);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto h = solo_engine->Submit(request(i));
    ASSERT_TRUE(h.ok());
    Out solo = Drain(*h->channel);
    EXPECT_EQ(batched[i].tokens, solo.tokens) << "prompt " << i;
    EXPECT_EQ(batched[i].text, solo.text) << "prompt " << i;
    EXPECT_FALSE(solo.tokens.empty());
  }
}

TEST(ModelEngineTest, BatchedEqualsSequentialGreedy) {
  CheckBatchedEqualsSequential(0.0f);
}
TEST(ModelEngineTest, BatchedEqualsSequentialSeeded) {
  CheckBatchedEqualsSequential(0.8f);
}

TEST(ModelEngineTest, PreemptionUnderTinyPoolGivesSameTokens) {
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  LoadedModel tiny_model = Load(gguf);
  auto prompts = SixteenPrompts(*tiny_model.tokenizer);
  EngineConfig tiny;
  tiny.block_size = 16;
  tiny.num_kv_blocks = 12;  // 192 tokens for 8 requests of up to ~120 tokens each
  tiny.max_num_batched_tokens = 64;
  auto engine = MakeEngine(tiny_model, tiny);
  std::vector<Engine::Handle> hs;
  for (size_t i = 0; i < 8; ++i) {
    GenerationRequest r = Greedy(prompts[i], 80);
    r.ignore_eos = true;
    auto h = engine->Submit(r);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    hs.push_back(*h);
  }
  std::vector<Out> got;
  for (auto& h : hs) got.push_back(Drain(*h.channel));
  auto s = IdleStats(*engine);
  EXPECT_GT(s.num_preemptions, 0);
  EXPECT_EQ(s.kv.num_used, 0);
  EXPECT_EQ(s.kv.num_free + s.kv.num_cached, 12);

  // A request that can never fit is refused cleanly.
  auto never = engine->Submit(Greedy(prompts[0], 300));
  EXPECT_EQ(never.status().code(), StatusCode::kResourceExhausted);

  LoadedModel big_model = Load(gguf);
  auto big = MakeEngine(big_model, EngineConfig{});
  for (size_t i = 0; i < 8; ++i) {
    GenerationRequest r = Greedy(prompts[i], 80);
    r.ignore_eos = true;
    auto h = big->Submit(r);
    ASSERT_TRUE(h.ok());
    Out ref = Drain(*h->channel);
    EXPECT_EQ(got[i].tokens, ref.tokens) << "prompt " << i;
    EXPECT_EQ(got[i].tokens.size(), 80u);
  }
}

TEST(ModelHttpTest, PrefixCacheHitsWithIdenticalOutput) {
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  LoadedModel m = Load(gguf);
  TestServer srv(std::move(m.executor), *m.tokenizer, EngineConfig{}, "stories260K");
  const std::string body =
      R"({"prompt":"Once upon a time, in a big forest, there lived a little bear who loved honey. Every day he went to look for honey in the trees.","max_tokens":30,"temperature":0})";
  auto a = srv.Post("/v1/completions", body);
  ASSERT_EQ(a.first, 200);
  const int n = ParseJson(a.second)["usage"]["prompt_tokens"];
  auto b = srv.Post("/v1/completions", body);
  ASSERT_EQ(b.first, 200);
  EXPECT_EQ(ParseJson(a.second)["choices"][0]["text"], ParseJson(b.second)["choices"][0]["text"]);
  auto c = srv.Client();
  auto metrics = c->Get("/metrics");
  ASSERT_TRUE(metrics);
  const std::string lbl = "{model_name=\"stories260K\"}";
  // vLLM's units: tokens. The second request found every full block but the last token's.
  EXPECT_EQ(MetricValue(metrics->body, "vllm:prefix_cache_hits_total" + lbl), (n - 1) / 16 * 16);
  EXPECT_EQ(MetricValue(metrics->body, "vllm:prefix_cache_queries_total" + lbl), 2 * n);
  EXPECT_GT((n - 1) / 16, 0);
  srv.WaitIdle();
}

}  // namespace
}  // namespace kvpush::testing
