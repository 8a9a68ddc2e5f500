// Sample(): greedy, temperature, top-k, top-p, counter-based seeds, logprobs; Validate().
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

}  // namespace
}  // namespace kvpush
