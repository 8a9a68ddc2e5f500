// Loading the qwen3, qwen2 and llama (Llama 3) architectures: what each reads from GGUF, the
// refusals, and gen-model's Llama 3.1 RoPE factors. (Their arithmetic is checked against the NumPy
// reference in arch_reference_test.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "model/gguf.h"
#include "model/llama_weights.h"
#include "model/model.h"
#include "model/random_model.h"

namespace kvpush {
namespace {

RandomLlamaOptions Small(const char* arch) {
  RandomLlamaOptions o;
  o.arch = arch;
  o.dim = 64;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.hidden_dim = 96;
  o.vocab = 400;
  o.context = 64;
  o.seed = 5;
  return o;
}

Result<LlamaWeights> Weights(const GgufWriter& w) {
  const std::vector<uint8_t> bytes = w.Serialize();
  KVP_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Parse(bytes));
  return LoadLlamaWeightsFromGguf(f);
}

TEST(ArchConfigTest, Qwen3HeadDimComesFromKeyLengthWithQkNormsAndNeoxRope) {
  RandomLlamaOptions o = Small("qwen3");
  o.head_dim = 24;  // 4 x 24 = 96 != dim 64
  auto w = BuildRandomLlamaGguf(o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto weights = Weights(*w);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  const ModelConfig& c = weights->config;
  EXPECT_EQ(c.architecture, "qwen3");
  EXPECT_EQ(c.head_dim, 24);
  EXPECT_EQ(c.rope_dim, 24);
  EXPECT_EQ(c.rope_style, RopeStyle::kNeox);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  const LlamaLayerWeights& l = weights->layers[1];
  EXPECT_EQ(l.wq.size(), 96u * 64u);
  EXPECT_EQ(l.wo.size(), 64u * 96u);
  EXPECT_EQ(l.q_norm.size(), 24u);
  EXPECT_EQ(l.k_norm.size(), 24u);
  EXPECT_TRUE(l.bq.empty());
  EXPECT_TRUE(weights->rope_freqs.empty());
  auto m = LoadModelFromGgufBytes(w->Serialize(), {});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config.head_dim, 24);  // the KV cache layout follows head_dim, not dim / heads
}

TEST(ArchConfigTest, Qwen2HasBiasesAndNeoxRope) {
  auto w = BuildRandomLlamaGguf(Small("qwen2"));
  ASSERT_TRUE(w.ok());
  auto weights = Weights(*w);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  EXPECT_EQ(weights->config.rope_style, RopeStyle::kNeox);
  EXPECT_EQ(weights->layers[0].bq.size(), 64u);
  EXPECT_EQ(weights->layers[0].bk.size(), 32u);
  EXPECT_EQ(weights->layers[0].bv.size(), 32u);
  EXPECT_TRUE(weights->layers[0].q_norm.empty());
}

TEST(ArchConfigTest, Llama3CarriesRopeFreqsAndKeepsNormalRope) {
  auto w = BuildRandomLlamaGguf(Small("llama3"));
  ASSERT_TRUE(w.ok());
  auto weights = Weights(*w);
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  EXPECT_EQ(weights->config.architecture, "llama");
  EXPECT_EQ(weights->config.rope_style, RopeStyle::kNormal);
  EXPECT_EQ(weights->rope_freqs, Llama31RopeFactors(16, 10000.0f));
  auto plain = Weights(*BuildRandomLlamaGguf(Small("llama")));
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(weights->config.fingerprint, plain->config.fingerprint);
}

TEST(ArchConfigTest, Llama31RopeFactorsMatchTheConvertersFormula) {
  // Llama 3.1 8B: head_dim 128, base 500000. High frequencies keep their wavelength (factor 1),
  // low ones are slowed 8x, the band between is interpolated.
  const std::vector<float> f = Llama31RopeFactors(128, 500000.0f);
  ASSERT_EQ(f.size(), 64u);
  EXPECT_EQ(f.front(), 1.0f);
  EXPECT_EQ(f.back(), 8.0f);
  int between = 0;
  for (size_t i = 1; i < f.size(); ++i) {
    EXPECT_GE(f[i], f[i - 1]) << i;
    between += f[i] > 1.0f && f[i] < 8.0f;
  }
  EXPECT_GT(between, 0);
}

TEST(ArchConfigTest, EveryArchitectureLoadsInEveryStorageType) {
  for (const char* arch : {"llama", "llama3", "qwen2", "qwen3"}) {
    for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
      RandomLlamaOptions o = Small(arch);
      o.dtype = type;
      if (std::string(arch) == "qwen3") o.head_dim = 32;  // q = 128: Q8_0 rows of 32
      auto w = BuildRandomLlamaGguf(o);
      ASSERT_TRUE(w.ok()) << arch << ": " << w.status().ToString();
      auto m = LoadModelFromGgufBytes(w->Serialize(), {});
      EXPECT_TRUE(m.ok()) << arch << " type " << static_cast<int>(type) << ": "
                          << m.status().ToString();
    }
  }
}

TEST(ArchConfigTest, RefusesWhatTheExecutorDoesNotImplement) {
  {  // rope_freqs belongs to llama only
    auto w = BuildRandomLlamaGguf(Small("qwen3"));
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(
        w->AddTensor("rope_freqs.weight", {8}, GgmlType::kF32, std::vector<float>(8, 1)).ok());
    EXPECT_EQ(Weights(*w).status().code(), StatusCode::kUnimplemented);
  }
  {  // RoPE scaling declared by key
    auto w = BuildRandomLlamaGguf(Small("qwen2"));
    ASSERT_TRUE(w.ok());
    w->SetString("qwen2.rope.scaling.type", "yarn");
    auto s = Weights(*w).status();
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
    EXPECT_NE(s.message().find("yarn"), std::string::npos) << s.message();
  }
  {  // a zero frequency factor
    auto w = BuildRandomLlamaGguf(Small("llama"));
    ASSERT_TRUE(w.ok());
    std::vector<float> factors(8, 1.0f);
    factors[3] = 0.0f;
    ASSERT_TRUE(w->AddTensor("rope_freqs.weight", {8}, GgmlType::kF32, factors).ok());
    EXPECT_EQ(LoadModelFromGgufBytes(w->Serialize(), {}).status().code(), StatusCode::kDataLoss);
  }
}

// gguf_fuzz found a small file whose block count made the loader allocate without bound: a
// count the file's tensors cannot hold is refused before anything is allocated per block.
TEST(ArchConfigTest, ABlockCountTheFileCannotHoldIsRefused) {
  auto w = BuildRandomLlamaGguf(Small("llama"));
  ASSERT_TRUE(w.ok());
  std::vector<uint8_t> bytes = w->Serialize();
  const std::string key = "llama.block_count";
  auto at = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(at, bytes.end());
  const size_t value = static_cast<size_t>(at - bytes.begin()) + key.size() + 4;  // after type
  uint32_t count = 0;
  std::memcpy(&count, &bytes[value], 4);
  ASSERT_EQ(count, 2u);
  count = 1u << 30;
  std::memcpy(&bytes[value], &count, 4);
  auto f = GgufFile::Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto s = LoadLlamaWeightsFromGguf(*f).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("1073741824 blocks declared"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kvpush
