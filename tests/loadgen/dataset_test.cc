// Datasets: the random dataset's lengths, shared prefix, id range and determinism; ShareGPT's
// turn extraction, length filter and oversampling.
#include "loadgen/dataset.h"

#include <gtest/gtest.h>

namespace kvpush::loadgen {
namespace {

RandomDatasetOptions Opts() {
  RandomDatasetOptions o;
  o.num_prompts = 200;
  o.input_len = 100;
  o.output_len = 64;
  o.prefix_len = 16;
  o.range_ratio = 0.5;
  o.seed = 5;
  return o;
}

TEST(LoadgenDataset, RandomLengthsStayInVllmRanges) {
  auto reqs = SampleRandomDataset(Opts());
  ASSERT_TRUE(reqs.ok()) << reqs.status().ToString();
  ASSERT_EQ(reqs->size(), 200u);
  EXPECT_EQ(InputLengthRange(Opts()).low, 50);
  EXPECT_EQ(InputLengthRange(Opts()).high, 150);
  bool saw_short = false, saw_long = false;
  for (const auto& r : *reqs) {
    ASSERT_TRUE(r.prompt.is_array());
    EXPECT_EQ(static_cast<int64_t>(r.prompt.size()), r.prompt_len);
    EXPECT_GE(r.prompt_len, 16 + 50);
    EXPECT_LE(r.prompt_len, 16 + 150);
    EXPECT_GE(r.expected_output_len, 32);
    EXPECT_LE(r.expected_output_len, 96);
    saw_short = saw_short || r.prompt_len < 16 + 75;
    saw_long = saw_long || r.prompt_len > 16 + 125;
    for (const auto& id : r.prompt) {
      EXPECT_GE(id.get<int>(), 3);
      EXPECT_LT(id.get<int>(), 512);
    }
  }
  EXPECT_TRUE(saw_short && saw_long);  // the draws spread over the range (P(miss) ~ 0.75^200)
}

TEST(LoadgenDataset, RandomPromptsShareThePrefix) {
  auto reqs = SampleRandomDataset(Opts());
  ASSERT_TRUE(reqs.ok());
  const auto& first = (*reqs)[0].prompt;
  bool differ_after = false;
  for (const auto& r : *reqs) {
    for (size_t j = 0; j < 16; ++j) EXPECT_EQ(r.prompt[j], first[j]);
    differ_after = differ_after || r.prompt[16] != first[16];
  }
  EXPECT_TRUE(differ_after);
}

TEST(LoadgenDataset, RandomIsDeterministicInTheSeed) {
  auto a = SampleRandomDataset(Opts());
  auto b = SampleRandomDataset(Opts());
  auto o = Opts();
  o.seed = 6;
  auto c = SampleRandomDataset(o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].prompt, (*b)[i].prompt);
    EXPECT_EQ((*a)[i].expected_output_len, (*b)[i].expected_output_len);
  }
  bool any_diff = false;
  for (size_t i = 0; i < a->size(); ++i) any_diff = any_diff || (*a)[i].prompt != (*c)[i].prompt;
  EXPECT_TRUE(any_diff);
}

TEST(LoadgenDataset, ZeroRangeRatioGivesExactLengths) {
  auto o = Opts();
  o.range_ratio = 0;
  o.prefix_len = 0;
  auto reqs = SampleRandomDataset(o);
  ASSERT_TRUE(reqs.ok());
  for (const auto& r : *reqs) {
    EXPECT_EQ(r.prompt_len, 100);
    EXPECT_EQ(r.expected_output_len, 64);
  }
  o.output_len = 1;
  o.range_ratio = 0.9;
  EXPECT_EQ(OutputLengthRange(o).low, 1);  // never 0 output tokens
}

TEST(LoadgenDataset, RefusesBadOptions) {
  auto o = Opts();
  o.range_ratio = 1.0;
  EXPECT_FALSE(SampleRandomDataset(o).ok());
  o = Opts();
  o.vocab_size = 3;
  EXPECT_FALSE(SampleRandomDataset(o).ok());
  o = Opts();
  o.input_len = 0;
  o.prefix_len = 0;
  EXPECT_FALSE(SampleRandomDataset(o).ok());
}

nlohmann::json Conv(const std::string& human, const std::string& gpt) {
  return {{"conversations",
           {{{"from", "human"}, {"value", human}}, {{"from", "gpt"}, {"value", gpt}}}}};
}

TEST(LoadgenDataset, ShareGptTakesFirstTurnsFiltersAndOversamples) {
  nlohmann::json data = nlohmann::json::array();
  data.push_back(
      Conv("Tell me a story about a cat and a dog.", "Once upon a time there was a cat."));
  data.push_back(Conv("Hi", "Hello there, how can I help you today?"));  // prompt < 4 tokens
  data.push_back({{"conversations", {{{"from", "human"}, {"value", "only one turn here!"}}}}});
  data.push_back(Conv("Why is the sky blue? Explain.", "ok"));  // reply < 4 tokens
  ShareGptOptions o;
  o.num_prompts = 5;
  auto reqs = SampleShareGpt(data, o);
  ASSERT_TRUE(reqs.ok()) << reqs.status().ToString();
  ASSERT_EQ(reqs->size(), 5u);  // one valid entry, oversampled
  for (const auto& r : *reqs) {
    EXPECT_EQ(r.prompt, "Tell me a story about a cat and a dog.");
    EXPECT_EQ(r.prompt_len, EstimateTokens("Tell me a story about a cat and a dog.", 4.0));
    EXPECT_EQ(r.expected_output_len, 9);  // ceil(34 / 4)
  }
  o.output_len = 7;  // a fixed output length skips the reply's minimum
  reqs = SampleShareGpt(data, o);
  ASSERT_TRUE(reqs.ok());
  bool saw_sky = false;
  for (const auto& r : *reqs) {
    EXPECT_EQ(r.expected_output_len, 7);
    saw_sky = saw_sky || r.prompt == "Why is the sky blue? Explain.";
  }
  EXPECT_TRUE(saw_sky);
  EXPECT_FALSE(SampleShareGpt(nlohmann::json::object(), o).ok());
  EXPECT_FALSE(SampleShareGpt(nlohmann::json::array({Conv("Hi", "Yo")}), ShareGptOptions{}).ok());
}

TEST(LoadgenDataset, VllmSequenceFilter) {
  EXPECT_TRUE(IsValidSequence(4, 4, false));
  EXPECT_FALSE(IsValidSequence(3, 100, false));
  EXPECT_FALSE(IsValidSequence(100, 3, false));
  EXPECT_TRUE(IsValidSequence(100, 3, true));
  EXPECT_FALSE(IsValidSequence(1025, 10, false));
  EXPECT_FALSE(IsValidSequence(1024, 1025, false));
}

}  // namespace
}  // namespace kvpush::loadgen
