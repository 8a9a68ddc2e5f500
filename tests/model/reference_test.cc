// Greedy generation with stories260K (GGUF and llama2.c formats) against the independent
// reference in ../shared/models/stories260K.reference.json, token for token and text for text.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace kvpush {
namespace {

struct Reference {
  std::vector<int32_t> prompt_tokens, output_tokens;
  int32_t steps = 0;
  std::string output_text;
};

Reference ReadReference(const std::string& path) {
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  const auto& g = j.at("generation").at(0);
  Reference r;
  r.prompt_tokens = g.at("prompt_tokens").get<std::vector<int32_t>>();
  r.output_tokens = g.at("output_tokens").get<std::vector<int32_t>>();
  r.steps = g.at("steps").get<int32_t>();
  r.output_text = g.at("output_text").get<std::string>();
  return r;
}

LoadedModel Load(const std::string& path) {
  ModelLoadOptions o;
  o.path = path;
  auto m = LoadModel(o);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(*m);
}

void CheckGreedyMatchesReference(const std::string& model_path, const std::string& ref_path) {
  Reference ref = ReadReference(ref_path);
  LoadedModel m = Load(model_path);
  EXPECT_EQ(m.config.dim, 64);
  EXPECT_EQ(m.config.num_layers, 5);
  EXPECT_EQ(m.config.num_heads, 8);
  EXPECT_EQ(m.config.num_kv_heads, 4);
  EXPECT_EQ(m.config.vocab_size, 512);
  ASSERT_EQ(ref.prompt_tokens, std::vector<int32_t>{m.config.bos_id});
  std::vector<int32_t> got = testing::GreedyGenerate(*m.executor, ref.prompt_tokens, ref.steps);
  EXPECT_EQ(got, ref.output_tokens);
  EXPECT_EQ(DecodeTokens(*m.tokenizer, got), ref.output_text);
}

TEST(ReferenceTest, GgufGreedyMatchesReference) {
  KVP_REQUIRE_SHARED_MODEL(model, "stories260K.gguf");
  KVP_REQUIRE_SHARED_MODEL(ref, "stories260K.reference.json");
  CheckGreedyMatchesReference(model, ref);
}

TEST(ReferenceTest, Llama2cGreedyMatchesReference) {
  KVP_REQUIRE_SHARED_MODEL(model, "stories260K.bin");
  KVP_REQUIRE_SHARED_MODEL(tok, "tok512.bin");
  KVP_REQUIRE_SHARED_MODEL(ref, "stories260K.reference.json");
  CheckGreedyMatchesReference(model, ref);
}

TEST(ReferenceTest, GgufAndLlama2cGiveIdenticalLogits) {
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  KVP_REQUIRE_SHARED_MODEL(bin, "stories260K.bin");
  KVP_REQUIRE_SHARED_MODEL(tok, "tok512.bin");
  LoadedModel a = Load(gguf), b = Load(bin);
  EXPECT_EQ(a.config.fingerprint, b.config.fingerprint);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 383, 286};
  auto ca = testing::MakeCache(a.config, 4), cb = testing::MakeCache(b.config, 4);
  auto table = testing::Blocks(0, 4);
  SequenceChunk ch;
  ch.tokens = prompt;
  ch.block_table = table;
  ch.want_logits = true;
  std::vector<float> la(512), lb(512);
  ASSERT_TRUE(a.executor->Execute({&ch, 1}, *ca, la, nullptr).ok());
  ASSERT_TRUE(b.executor->Execute({&ch, 1}, *cb, lb, nullptr).ok());
  EXPECT_EQ(la, lb);
  EXPECT_EQ(0, std::memcmp(ca->data(), cb->data(), ca->size_bytes()));
}

TEST(ReferenceTest, EncodingReferenceTextRoundTrips) {
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  KVP_REQUIRE_SHARED_MODEL(bin, "stories260K.bin");
  KVP_REQUIRE_SHARED_MODEL(tok, "tok512.bin");
  KVP_REQUIRE_SHARED_MODEL(ref_path, "stories260K.reference.json");
  Reference ref = ReadReference(ref_path);
  for (const std::string& path : {gguf, bin}) {
    LoadedModel m = Load(path);
    auto ids = m.tokenizer->Encode(ref.output_text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(DecodeTokens(*m.tokenizer, *ids), ref.output_text) << path;
    // The greedy output is a valid tokenization, but BPE prefers its own merges: the encoding
    // must not be longer than what the model produced.
    EXPECT_LE(ids->size(), ref.output_tokens.size()) << path;
    EXPECT_EQ(ids->front(), ref.output_tokens.front()) << path;  // "▁Once"
  }
}

TEST(ReferenceTest, GgufAndLlama2cTokenizersAgree) {
  KVP_REQUIRE_SHARED_MODEL(gguf, "stories260K.gguf");
  KVP_REQUIRE_SHARED_MODEL(bin, "stories260K.bin");
  KVP_REQUIRE_SHARED_MODEL(tok, "tok512.bin");
  LoadedModel a = Load(gguf), b = Load(bin);
  for (const char* text : {"Once upon a time", "Lily's mom said, \"Hi!\"", "  two  spaces",
                           "caf\xC3\xA9 \xE2\x82\xAC 100 \xF0\x9F\x98\x80", "\n\n"}) {
    auto ia = a.tokenizer->Encode(text), ib = b.tokenizer->Encode(text);
    ASSERT_TRUE(ia.ok() && ib.ok());
    EXPECT_EQ(*ia, *ib) << text;
    EXPECT_EQ(DecodeTokens(*a.tokenizer, *ia), text);
  }
}

}  // namespace
}  // namespace kvpush
