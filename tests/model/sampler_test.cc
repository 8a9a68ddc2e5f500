// Sample(): greedy, temperature, top-k, top-p, min-p, counter-based seeds, logprobs, the logits
// processors (logit_bias, suppressed ids, vLLM's penalties); Validate().
#include "model/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace kvpush {
namespace {

TEST(SamplerTest, GreedyPicksArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  std::vector<float> l = {0.1f, 3.0f, -1.0f, 3.0f};
  EXPECT_EQ(Sample(l, p, 0).token, 1);
}

TEST(SamplerTest, LogprobsAreLogSoftmaxOfRawLogits) {
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  std::vector<float> l = {1.0f, 2.0f, 3.0f};
  auto r = Sample(l, p, 0);
  const double z = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  EXPECT_EQ(r.token, 2);
  EXPECT_NEAR(r.logprob, 3.0 - z, 1e-6);
  ASSERT_EQ(r.top_logprobs.size(), 2u);
  EXPECT_EQ(r.top_logprobs[0].first, 2);
  EXPECT_EQ(r.top_logprobs[1].first, 1);
  EXPECT_NEAR(r.top_logprobs[1].second, 2.0 - z, 1e-6);
  p.logprobs = -1;
  EXPECT_TRUE(Sample(l, p, 0).top_logprobs.empty());
}

TEST(SamplerTest, SameSeedSameIndexSameToken) {
  std::vector<float> l(100);
  for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::sin(i * 0.37));
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  int differs_by_index = 0, differs_by_seed = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const int32_t a = Sample(l, p, i).token;
    EXPECT_EQ(a, Sample(l, p, i).token);
    differs_by_index += a != Sample(l, p, i + 1).token;
    SamplingParams q = p;
    q.seed = 43;
    differs_by_seed += a != Sample(l, q, i).token;
  }
  EXPECT_GT(differs_by_index, 100);
  EXPECT_GT(differs_by_seed, 100);
}

TEST(SamplerTest, TemperatureFrequenciesFollowSoftmax) {
  std::vector<float> l = {0.0f, std::log(2.0f), std::log(3.0f)};  // probs 1/6, 2/6, 3/6
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  std::map<int32_t, int> count;
  const int n = 30000;
  for (int64_t i = 0; i < n; ++i) ++count[Sample(l, p, i).token];
  EXPECT_NEAR(count[0] / double(n), 1 / 6.0, 0.015);
  EXPECT_NEAR(count[1] / double(n), 2 / 6.0, 0.015);
  EXPECT_NEAR(count[2] / double(n), 3 / 6.0, 0.015);
}

TEST(SamplerTest, TopKAndTopPRestrictCandidates) {
  std::vector<float> l = {0.0f, 1.0f, 2.0f, 3.0f, 4.0f};
  SamplingParams p;
  p.temperature = 5.0f;  // flat enough that every token would appear
  p.top_k = 2;
  for (int64_t i = 0; i < 500; ++i) EXPECT_GE(Sample(l, p, i).token, 3);
  p.top_k = 0;
  p.temperature = 1.0f;
  p.top_p = 0.5f;  // token 4 alone has p = 0.636
  for (int64_t i = 0; i < 500; ++i) EXPECT_EQ(Sample(l, p, i).token, 4);
  p.top_p = 0.8f;  // tokens 4 and 3 (0.636 + 0.234)
  std::map<int32_t, int> seen;
  for (int64_t i = 0; i < 500; ++i) ++seen[Sample(l, p, i).token];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[3], 0);
}

TEST(SamplerTest, ValidateNamesTheBadField) {
  SamplingParams p;
  EXPECT_TRUE(p.Validate().ok());
  p.temperature = -1;
  EXPECT_NE(p.Validate().message().find("temperature"), std::string::npos);
  p = {};
  p.top_p = 0;
  EXPECT_NE(p.Validate().message().find("top_p"), std::string::npos);
  p = {};
  p.top_p = 1.5f;
  EXPECT_EQ(p.Validate().code(), StatusCode::kInvalidArgument);
  p = {};
  p.top_k = -2;
  EXPECT_NE(p.Validate().message().find("top_k"), std::string::npos);
  p = {};
  p.logprobs = -3;
  EXPECT_NE(p.Validate().message().find("logprobs"), std::string::npos);
  p = {};
  p.temperature = NAN;
  EXPECT_FALSE(p.Validate().ok());
}

TEST(SamplerTest, PenaltiesFollowVllmApplyPenalties) {
  // vllm/model_executor/layers/utils.py apply_penalties: repetition over prompt + output
  // (positive logits divided, others multiplied), then frequency * count and presence over the
  // output only.
  std::vector<float> l = {1.0f, 2.0f, -1.0f, 0.5f, 3.0f};
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  const std::vector<int32_t> prompt = {1, 4};
  const std::vector<int32_t> output = {2, 2, 4};
  ApplyLogitsProcessors(l, p, {prompt, output, {}});
  EXPECT_FLOAT_EQ(l[0], 1.0f);                             // never seen
  EXPECT_FLOAT_EQ(l[1], 2.0f / 2.0f);                      // prompt only: repetition
  EXPECT_FLOAT_EQ(l[2], -1.0f * 2.0f - 2 * 0.5f - 0.25f);  // output twice
  EXPECT_FLOAT_EQ(l[3], 0.5f);
  EXPECT_FLOAT_EQ(l[4], 3.0f / 2.0f - 0.5f - 0.25f);  // prompt and output once
}

TEST(SamplerTest, PenaltiesChangeTheGreedyToken) {
  std::vector<float> l = {0.0f, 2.0f, 1.9f};
  SamplingParams p;
  p.temperature = 0;
  const std::vector<int32_t> output = {1};
  EXPECT_EQ(Sample(l, p, 1, {{}, output, {}}).token, 1);  // no penalty: history ignored
  p.presence_penalty = 0.2f;
  p.logprobs = 0;  // the sampled token's logprob only
  SampleResult r = Sample(l, p, 1, {{}, output, {}});
  EXPECT_EQ(r.token, 2);
  // Logprobs stay those of the raw logits (vLLM's default raw_logprobs).
  const double z = std::log(std::exp(0.0) + std::exp(2.0) + std::exp(1.9));
  EXPECT_NEAR(r.logprob, 1.9 - z, 1e-6);
}

TEST(SamplerTest, LogitBiasIsAddedBeforeSampling) {
  std::vector<float> l = {0.0f, 5.0f, 1.0f};
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{0, 10.0f}};
  EXPECT_EQ(Sample(l, p, 0).token, 0);
  p.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(Sample(l, p, 0).token, 2);
  p.temperature = 1.0f;
  p.logit_bias = {{0, -100.0f}, {1, -100.0f}};
  for (int64_t i = 0; i < 200; ++i) EXPECT_EQ(Sample(l, p, i).token, 2);
}

TEST(SamplerTest, SuppressedIdsAreNeverSampled) {
  std::vector<float> l = {0.0f, 3.0f, 2.9f, 2.8f};
  const std::vector<int32_t> suppressed = {1, 3, 99};  // 99: outside the vocabulary, ignored
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(Sample(l, p, 0, {{}, {}, suppressed}).token, 2);
  p.temperature = 2.0f;
  p.seed = 5;
  std::map<int32_t, int> seen;
  for (int64_t i = 0; i < 500; ++i) ++seen[Sample(l, p, i, {{}, {}, suppressed}).token];
  EXPECT_EQ(seen.count(1), 0u);
  EXPECT_EQ(seen.count(3), 0u);
  EXPECT_GT(seen[0], 0);
  EXPECT_GT(seen[2], 0);
  // Suppressing every token is ignored rather than leaving nothing to sample.
  const std::vector<int32_t> all = {0, 1, 2, 3};
  p.temperature = 0;
  EXPECT_EQ(Sample(l, p, 0, {{}, {}, all}).token, 1);
}

TEST(SamplerTest, MinPDropsTokensBelowTheFloor) {
  // Relative probabilities 1, 0.5, 0.2 (at temperature 1).
  std::vector<float> l = {0.0f, std::log(0.5f), std::log(0.2f)};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 9;
  p.min_p = 0.3f;
  std::map<int32_t, int> seen;
  for (int64_t i = 0; i < 2000; ++i) ++seen[Sample(l, p, i).token];
  EXPECT_EQ(seen.count(2), 0u);
  EXPECT_NEAR(seen[0] / 2000.0, 2 / 3.0, 0.04);  // renormalised over {0, 1}
  // min_p 0.99 leaves only the most likely token: sampling gives the greedy text.
  p.min_p = 0.99f;
  for (int64_t i = 0; i < 500; ++i) EXPECT_EQ(Sample(l, p, i).token, 0);
  // The floor applies at the temperature: T = 10 flattens 0.2 to 0.85 relative.
  p.temperature = 10.0f;
  p.min_p = 0.8f;
  seen.clear();
  for (int64_t i = 0; i < 2000; ++i) ++seen[Sample(l, p, i).token];
  EXPECT_EQ(seen.size(), 3u);
}

TEST(SamplerTest, ValidateRangesOfTheExtraParameters) {
  SamplingParams p;
  p.min_p = 1.5f;
  EXPECT_NE(p.Validate().message().find("min_p"), std::string::npos);
  p = {};
  p.presence_penalty = 2.5f;
  EXPECT_NE(p.Validate().message().find("presence_penalty"), std::string::npos);
  p = {};
  p.frequency_penalty = -3.0f;
  EXPECT_NE(p.Validate().message().find("frequency_penalty"), std::string::npos);
  p = {};
  p.repetition_penalty = 0.0f;
  EXPECT_NE(p.Validate().message().find("repetition_penalty"), std::string::npos);
  p = {};
  p.logit_bias = {{3, 1.0f}, {3, 2.0f}};
  EXPECT_NE(p.Validate().message().find("logit_bias"), std::string::npos);
  p = {};
  p.logit_bias = {{3, 101.0f}};
  EXPECT_NE(p.Validate().message().find("logit_bias"), std::string::npos);
  p = {};
  p.logit_bias = {{1, -100.0f}, {4, 100.0f}};
  p.min_p = 1.0f;
  p.repetition_penalty = 10.0f;
  EXPECT_TRUE(p.Validate().ok());
}

}  // namespace
}  // namespace kvpush
