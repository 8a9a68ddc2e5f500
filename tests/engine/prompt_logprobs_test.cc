// Prompt logprobs (completions' echo with logprobs) on the real stories260K model: what the engine
// reports for every prompt token equals a straightforward computation — one full forward pass of
// each prefix, log-softmax in double, top-k by sorting — whatever the chunking and whatever the
// prefix cache holds (a prompt-logprobs request reads none of it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/engine_core.h"
#include "model/model.h"
#include "model/model_test_util.h"
#include "test_util.h"

namespace kvpush {
namespace {

constexpr int32_t kTop = 3;

/// The reference: prompt token p (p >= 1) scored by the logits of a fresh single-chunk forward
/// pass of tokens [0, p), log-softmax computed here in double.
std::vector<TokenOutput> ReferencePromptLogprobs(Executor& ex, const std::vector<int32_t>& prompt) {
  const ModelConfig& c = ex.config();
  const auto vocab = static_cast<size_t>(c.vocab_size);
  std::vector<TokenOutput> out;
  for (size_t p = 1; p < prompt.size(); ++p) {
    const auto blocks = static_cast<int32_t>(p / 16 + 1);
    auto cache = testing::MakeCache(c, blocks);
    auto table = testing::Blocks(0, blocks);
    SequenceChunk ch;
    ch.tokens = std::span<const int32_t>(prompt.data(), p);
    ch.block_table = table;
    ch.want_logits = true;
    std::vector<float> logits(vocab);
    Status st = ex.Execute({&ch, 1}, *cache, logits, nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    double max = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
    const double log_z = max + std::log(sum);
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
    });
    TokenOutput t;
    t.id = prompt[p];
    t.logprob = static_cast<float>(logits[static_cast<size_t>(t.id)] - log_z);
    for (int32_t k = 0; k < kTop; ++k) {
      const int32_t id = order[static_cast<size_t>(k)];
      t.top_logprobs.emplace_back(id, static_cast<float>(logits[static_cast<size_t>(id)] - log_z));
    }
    out.push_back(std::move(t));
  }
  return out;
}

/// Runs `req` alone on `core` to its end; returns its outputs.
std::vector<RequestOutput> RunToEnd(EngineCore& core, int64_t id, GenerationRequest req) {
  auto ch = std::make_shared<OutputChannel>();
  core.AddRequest(id, std::move(req), ch, 0);
  for (int step = 0; step < 10000 && !ch->closed(); ++step) core.Step();
  EXPECT_TRUE(ch->closed());
  auto outs = ch->TakeAll();
  return std::vector<RequestOutput>(outs.begin(), outs.end());
}

void ExpectSame(const std::vector<TokenOutput>& got, const std::vector<TokenOutput>& want,
                const std::string& who) {
  ASSERT_EQ(got.size(), want.size()) << who;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].id, want[i].id) << who << " token " << i + 1;
    EXPECT_NEAR(got[i].logprob, want[i].logprob, 1e-5) << who << " token " << i + 1;
    ASSERT_EQ(got[i].top_logprobs.size(), want[i].top_logprobs.size()) << who;
    for (size_t k = 0; k < got[i].top_logprobs.size(); ++k) {
      EXPECT_EQ(got[i].top_logprobs[k].first, want[i].top_logprobs[k].first) << who << " " << i;
      EXPECT_NEAR(got[i].top_logprobs[k].second, want[i].top_logprobs[k].second, 1e-5) << who;
    }
  }
}

TEST(PromptLogprobsTest, EqualAFullForwardOfEachPrefixWhateverTheChunkingAndCache) {
  KVP_REQUIRE_SHARED_MODEL(path, "stories260K.gguf");
  ModelLoadOptions o;
  o.path = path;
  auto loaded = LoadModel(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  auto ref_model = LoadModel(o);
  ASSERT_TRUE(ref_model.ok());
  auto ids = loaded->tokenizer->Encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her friends.");
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> prompt{loaded->config.bos_id};
  prompt.insert(prompt.end(), ids->begin(), ids->end());
  ASSERT_GT(prompt.size(), 33u);  // more than two blocks of 16
  const std::vector<TokenOutput> want = ReferencePromptLogprobs(*ref_model->executor, prompt);

  // A budget of 7 tokens per step: the prompt is computed in many chunks, not block-aligned.
  EngineConfig cfg;
  cfg.block_size = 16;
  cfg.num_kv_blocks = 64;
  cfg.max_num_batched_tokens = 7;
  auto resolved = cfg.Resolve(loaded->config);
  ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();
  auto core =
      EngineCore::Create(*resolved, std::move(loaded->executor), *loaded->tokenizer, nullptr);
  ASSERT_TRUE(core.ok()) << core.status().ToString();

  GenerationRequest plain;
  plain.prompt_tokens = prompt;
  plain.max_tokens = 4;
  plain.sampling.temperature = 0.0f;
  plain.sampling.logprobs = kTop;
  // First a plain request: its prompt blocks enter the prefix cache.
  auto first = RunToEnd(**core, 1, plain);
  ASSERT_FALSE(first.empty());
  EXPECT_TRUE(first.front().prompt_logprobs.empty());

  GenerationRequest echo = plain;
  echo.prompt_logprobs = kTop;
  auto outs = RunToEnd(**core, 2, echo);
  ASSERT_FALSE(outs.empty());
  // With the first generated token, once; the prefix cache served none of the prompt.
  ExpectSame(outs.front().prompt_logprobs, want, "chunked, cache warm");
  for (size_t i = 1; i < outs.size(); ++i) EXPECT_TRUE(outs[i].prompt_logprobs.empty());
  EXPECT_EQ(outs.back().num_cached_tokens, 0);
  // The generated tokens are those of the plain request.
  ASSERT_EQ(outs.size(), first.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    ASSERT_EQ(outs[i].tokens.size(), first[i].tokens.size());
    for (size_t k = 0; k < outs[i].tokens.size(); ++k) {
      EXPECT_EQ(outs[i].tokens[k].id, first[i].tokens[k].id);
      EXPECT_EQ(outs[i].tokens[k].logprob, first[i].tokens[k].logprob);
    }
  }
  // A plain request afterwards still finds the prompt's blocks cached (the cache stayed
  // consistent: the echo request committed its blocks, or left the existing ones).
  auto again = RunToEnd(**core, 3, plain);
  ASSERT_FALSE(again.empty());
  EXPECT_EQ(again.back().num_cached_tokens, static_cast<int32_t>(prompt.size() - 1) / 16 * 16);
  EXPECT_EQ(again.front().tokens.front().id, first.front().tokens.front().id);
  EXPECT_EQ((*core)->block_pool().stats().num_used, 0);
}

}  // namespace
}  // namespace kvpush
