// LoadModel and LlamaExecutor: formats, dtypes, refusals, argument checks and the layer observer.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/llama_executor.h"
#include "model/llama_weights.h"
#include "model/model.h"
#include "model/random_model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace kvpush {
namespace {

RandomLlamaOptions Tiny() {
  RandomLlamaOptions o;
  o.dim = 64;
  o.layers = 3;
  o.heads = 4;
  o.kv_heads = 2;
  o.hidden_dim = 96;
  o.vocab = 400;
  o.context = 64;
  o.seed = 11;
  return o;
}

Result<LoadedModel> Load(const RandomLlamaOptions& o) {
  KVP_ASSIGN_OR_RETURN(GgufWriter w, BuildRandomLlamaGguf(o));
  ModelLoadOptions lo;
  lo.path = "tiny.gguf";
  return LoadModelFromGgufBytes(w.Serialize(), lo);
}

std::vector<float> PromptLogits(LoadedModel& m, const std::vector<int32_t>& prompt) {
  auto kv = testing::MakeCache(m.config, 8);
  auto table = testing::Blocks(0, 8);
  SequenceChunk ch;
  ch.tokens = prompt;
  ch.block_table = table;
  ch.want_logits = true;
  std::vector<float> logits(static_cast<size_t>(m.config.vocab_size));
  Status s = m.executor->Execute({&ch, 1}, *kv, logits, nullptr);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return logits;
}

TEST(ExecutorTest, UnsupportedArchitectureIsRefusedByName) {
  for (const char* arch : {"gpt2", "phi3", "gemma"}) {
    GgufWriter w;
    w.SetString("general.architecture", arch);
    auto m = LoadModelFromGgufBytes(w.Serialize(), {});
    EXPECT_EQ(m.status().code(), StatusCode::kUnimplemented);
    EXPECT_NE(m.status().message().find(std::string("unsupported architecture '") + arch + "'"),
              std::string::npos)
        << m.status().message();
  }
}

TEST(ExecutorTest, LoadsConfigFromGguf) {
  auto m = Load(Tiny());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config.architecture, "llama");
  EXPECT_EQ(m->config.name, "kvpush-random-llama");
  EXPECT_EQ(m->config.head_dim, 16);
  EXPECT_EQ(m->config.num_kv_heads, 2);
  EXPECT_EQ(m->config.context_length, 64);
  EXPECT_EQ(m->tokenizer->vocab_size(), 400);
  EXPECT_NE(m->config.fingerprint, 0u);
}

TEST(ExecutorTest, QuantizedDtypesGiveCloseLogits) {
  const std::vector<int32_t> prompt = {1, 300, 301, 302, 50, 60, 70};
  auto ref = Load(Tiny());
  ASSERT_TRUE(ref.ok());
  const auto want = PromptLogits(*ref, prompt);
  for (auto [type, tol] : {std::pair{GgmlType::kF16, 0.02f}, std::pair{GgmlType::kBF16, 0.1f},
                           std::pair{GgmlType::kQ8_0, 0.1f}}) {
    RandomLlamaOptions o = Tiny();
    o.dtype = type;
    auto m = Load(o);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    EXPECT_NE(m->config.fingerprint, ref->config.fingerprint);
    const auto got = PromptLogits(*m, prompt);
    float max_err = 0, max_abs = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      max_err = std::max(max_err, std::fabs(got[i] - want[i]));
      max_abs = std::max(max_abs, std::fabs(want[i]));
    }
    EXPECT_LT(max_err, tol * max_abs) << GgmlTypeName(static_cast<uint32_t>(type));
    EXPECT_GT(max_err, 0.0f);
  }
}

TEST(ExecutorTest, TiedOutputUsesTheEmbedding) {
  RandomLlamaOptions o = Tiny();
  o.tied_output = true;
  auto w = BuildRandomLlamaGguf(o);
  ASSERT_TRUE(w.ok());
  const auto bytes = w->Serialize();
  auto f = GgufFile::Parse(bytes);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->FindTensor("output.weight"), nullptr);
  auto weights = LoadLlamaWeightsFromGguf(*f);
  ASSERT_TRUE(weights.ok());
  EXPECT_TRUE(weights->output.empty());
  EXPECT_EQ(&weights->classifier(), &weights->token_embd);
  auto m = LoadModelFromGgufBytes(bytes, {});
  ASSERT_TRUE(m.ok());
  auto logits = PromptLogits(*m, {1, 5, 6});
  EXPECT_TRUE(std::isfinite(logits[0]));
}

TEST(ExecutorTest, PartialRotaryDimensionRuns) {
  RandomLlamaOptions o = Tiny();
  auto w = BuildRandomLlamaGguf(o);
  ASSERT_TRUE(w.ok());
  auto bytes = w->Serialize();
  auto f = GgufFile::Parse(bytes);
  ASSERT_TRUE(f.ok());
  auto weights = LoadLlamaWeightsFromGguf(*f);
  ASSERT_TRUE(weights.ok());
  weights->config.rope_dim = 8;
  auto ex = LlamaExecutor::Create(std::move(*weights));
  ASSERT_TRUE(ex.ok()) << ex.status().ToString();
  weights = LoadLlamaWeightsFromGguf(*f);
  weights->config.rope_dim = 7;
  EXPECT_EQ(LlamaExecutor::Create(std::move(*weights)).status().code(), StatusCode::kDataLoss);
}

TEST(ExecutorTest, ObserverSeesEveryLayerInOrderAfterItsKvIsWritten) {
  auto m = Load(Tiny());
  ASSERT_TRUE(m.ok());
  auto kv = testing::MakeCache(m->config, 4);
  auto table = testing::Blocks(0, 4);
  std::vector<int32_t> prompt = {1, 2, 3};
  SequenceChunk ch;
  ch.tokens = prompt;
  ch.block_table = table;
  struct Check : LayerObserver {
    KvCache* kv;
    std::vector<int32_t> layers;
    void OnLayerDone(int32_t layer) override {
      // This layer's K for position 2 is written; the next layer's is still zero.
      const float* k = kv->chunk_f32(layer, KvKind::kKey, 0) + 2 * 2 * 16;
      EXPECT_NE(k[0], 0.0f) << layer;
      if (layer + 1 < kv->layout().num_layers) {
        EXPECT_EQ(kv->chunk_f32(layer + 1, KvKind::kKey, 0)[2 * 2 * 16], 0.0f) << layer;
      }
      layers.push_back(layer);
    }
  } obs;
  obs.kv = kv.get();
  ASSERT_TRUE(m->executor->Execute({&ch, 1}, *kv, {}, &obs).ok());
  EXPECT_EQ(obs.layers, (std::vector<int32_t>{0, 1, 2}));
}

TEST(ExecutorTest, RefusesBadArguments) {
  auto m = Load(Tiny());
  ASSERT_TRUE(m.ok());
  auto kv = testing::MakeCache(m->config, 4);
  auto table = testing::Blocks(0, 4);
  std::vector<float> logits(400);
  auto run = [&](std::vector<int32_t> tokens, int32_t start, std::span<const BlockId> t,
                 std::span<float> out) {
    SequenceChunk ch;
    ch.tokens = tokens;
    ch.start_pos = start;
    ch.block_table = t;
    ch.want_logits = true;
    return m->executor->Execute({&ch, 1}, *kv, out, nullptr).code();
  };
  EXPECT_EQ(run({1, 2}, 0, table, logits), StatusCode::kOk);
  EXPECT_EQ(run({400}, 0, table, logits), StatusCode::kInvalidArgument);
  EXPECT_EQ(run({-1}, 0, table, logits), StatusCode::kInvalidArgument);
  EXPECT_EQ(run({}, 0, table, logits), StatusCode::kInvalidArgument);
  EXPECT_EQ(run({1}, 64, table, logits), StatusCode::kInvalidArgument);  // beyond context
  EXPECT_EQ(run({1}, 16, std::span(table).first(1), logits), StatusCode::kInvalidArgument);
  std::vector<BlockId> bad = {0, 99};
  EXPECT_EQ(run({1}, 16, bad, logits), StatusCode::kInvalidArgument);
  EXPECT_EQ(run({1}, 0, table, std::span(logits).first(10)), StatusCode::kInvalidArgument);
  ModelConfig other = m->config;
  other.num_layers = 2;
  auto wrong = testing::MakeCache(other, 4);
  SequenceChunk ch;
  std::vector<int32_t> one = {1};
  ch.tokens = one;
  ch.block_table = table;
  EXPECT_EQ(m->executor->Execute({&ch, 1}, *wrong, {}, nullptr).code(),
            StatusCode::kInvalidArgument);
}

TEST(ExecutorTest, MaxContextCapsTheModel) {
  auto w = BuildRandomLlamaGguf(Tiny());
  ASSERT_TRUE(w.ok());
  ModelLoadOptions lo;
  lo.max_context = 32;
  auto m = LoadModelFromGgufBytes(w->Serialize(), lo);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->config.context_length, 32);
}

TEST(ExecutorTest, MissingFileAndTruncatedCheckpoint) {
  ModelLoadOptions o;
  o.path = "/nonexistent/model.gguf";
  EXPECT_EQ(LoadModel(o).status().code(), StatusCode::kNotFound);
  KVP_REQUIRE_SHARED_MODEL(bin, "stories260K.bin");
  std::ifstream in(bin, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_TRUE(ParseLlama2cCheckpoint(bytes).ok());
  bytes.resize(bytes.size() - 4);
  EXPECT_EQ(ParseLlama2cCheckpoint(bytes).status().code(), StatusCode::kDataLoss);
  bytes.resize(10);
  EXPECT_EQ(ParseLlama2cCheckpoint(bytes).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace kvpush
