// Batch invariance of LlamaExecutor: a sequence's logits (and its KV cache contents) are
// bit-identical whether it runs alone or with 31 others, whatever its place in the batch, however
// its prompt is chunked, and with 1 or 2 OpenBLAS threads; for every architecture (llama 2 shape,
// llama3 with rope_freqs, qwen2 with biases, qwen3 with q/k norms and head_dim != dim / heads),
// and for weights kept in a stored type (f16, bf16, q8_0, q4_k, q6_k: dequantized per GEMM tile).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>
#include <tuple>

#include "model/gemm.h"
#include "model/model.h"
#include "model/random_model.h"
#include "model_test_util.h"
#include "test_util.h"

namespace kvpush {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocksPerSeq = 8;  // 128 positions per sequence

/// `dtype` is the matrices' stored type ("f32", "f16", "bf16", "q8_0", "q4_k", "q6_k"); the
/// quantized ones use dim 256 / hidden 512 / 8 x 32 heads (K-quant rows are multiples of 256).
LoadedModel SmallRandomModel(int32_t blas_threads, GemmBackend gemm, const std::string& arch,
                             const std::string& dtype) {
  RandomLlamaOptions o;
  o.arch = arch;
  if (arch == "qwen3") o.head_dim = 24;  // heads * head_dim = 192 != dim
  if (arch == "llama3") o.rope_freq_base = 500000.0f;
  o.dim = 128;
  o.layers = 2;
  o.heads = 8;
  o.kv_heads = 2;
  o.hidden_dim = 344;
  o.vocab = 400;
  o.context = 256;
  o.seed = 7;
  if (dtype != "f32") {
    const std::map<std::string, GgmlType> types = {{"f16", GgmlType::kF16},
                                                   {"bf16", GgmlType::kBF16},
                                                   {"q8_0", GgmlType::kQ8_0},
                                                   {"q4_k", GgmlType::kQ4_K},
                                                   {"q6_k", GgmlType::kQ6_K}};
    o.dtype = types.at(dtype);
    o.dim = 256;
    o.hidden_dim = 512;
    if (arch == "qwen3") o.head_dim = 32;
  }
  auto w = BuildRandomLlamaGguf(o);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  const std::vector<uint8_t> bytes = w->Serialize();
  ModelLoadOptions lo;
  lo.path = "random.gguf";
  lo.blas_threads = blas_threads;
  lo.gemm = gemm;
  auto m = LoadModelFromGgufBytes(bytes, lo);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return std::move(*m);
}

/// One sequence: its prompt and its blocks (sequence i owns blocks [i * 8, i * 8 + 8)).
struct Seq {
  std::vector<int32_t> prompt;
  std::vector<BlockId> table;
};

std::vector<Seq> MakeSeqs(int n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<Seq> seqs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int len = 1 + static_cast<int>(rng() % 70);
    for (int t = 0; t < len; ++t)
      seqs[static_cast<size_t>(i)].prompt.push_back(static_cast<int32_t>(rng() % vocab));
    seqs[static_cast<size_t>(i)].table = testing::Blocks(i * kBlocksPerSeq, kBlocksPerSeq);
  }
  return seqs;
}

class BatchInvarianceTest
    : public ::testing::TestWithParam<std::tuple<GemmBackend, int32_t, const char*, const char*>> {
 protected:
  void SetUp() override {
    model_ = SmallRandomModel(std::get<1>(GetParam()), std::get<0>(GetParam()),
                              std::get<2>(GetParam()), std::get<3>(GetParam()));
    vocab_ = model_.config.vocab_size;
    seqs_ = MakeSeqs(32, vocab_, 123);
  }
  std::unique_ptr<KvCache> NewCache() {
    return testing::MakeCache(model_.config, 32 * kBlocksPerSeq, kBlockSize);
  }

  /// Runs sequence `s` alone: prompt in chunks of `chunk` tokens, then `decode` greedy steps.
  /// Returns the logits after the prompt and after every decode step, concatenated.
  std::vector<float> RunAlone(const Seq& s, size_t chunk, int decode, KvCache& kv) {
    std::vector<float> all, logits(static_cast<size_t>(vocab_));
    for (size_t p = 0; p < s.prompt.size(); p += chunk) {
      SequenceChunk ch;
      ch.tokens =
          std::span<const int32_t>(s.prompt).subspan(p, std::min(chunk, s.prompt.size() - p));
      ch.start_pos = static_cast<int32_t>(p);
      ch.block_table = s.table;
      ch.want_logits = p + chunk >= s.prompt.size();
      EXPECT_TRUE(model_.executor->Execute({&ch, 1}, kv, logits, nullptr).ok());
    }
    all.insert(all.end(), logits.begin(), logits.end());
    std::vector<int32_t> tok(1);
    for (int d = 0; d < decode; ++d) {
      tok[0] =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      SequenceChunk ch;
      ch.tokens = tok;
      ch.start_pos = static_cast<int32_t>(s.prompt.size()) + d;
      ch.block_table = s.table;
      ch.want_logits = true;
      EXPECT_TRUE(model_.executor->Execute({&ch, 1}, kv, logits, nullptr).ok());
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  }

  /// Runs all sequences together: whole prompts in one step, then `decode` batched greedy steps.
  std::vector<std::vector<float>> RunBatched(const std::vector<Seq>& seqs, int decode,
                                             KvCache& kv) {
    const size_t n = seqs.size();
    std::vector<std::vector<float>> all(n);
    std::vector<float> logits(n * static_cast<size_t>(vocab_));
    std::vector<SequenceChunk> batch(n);
    for (size_t i = 0; i < n; ++i) {
      batch[i].seq_id = static_cast<int64_t>(i);
      batch[i].tokens = seqs[i].prompt;
      batch[i].block_table = seqs[i].table;
      batch[i].want_logits = true;
    }
    EXPECT_TRUE(model_.executor->Execute(batch, kv, logits, nullptr).ok());
    std::vector<int32_t> toks(n);
    for (int d = 0;; ++d) {
      for (size_t i = 0; i < n; ++i) {
        auto row = logits.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(vocab_));
        all[i].insert(all[i].end(), row, row + vocab_);
        toks[i] = static_cast<int32_t>(std::max_element(row, row + vocab_) - row);
      }
      if (d == decode) break;
      for (size_t i = 0; i < n; ++i) {
        batch[i].tokens = std::span<const int32_t>(toks).subspan(i, 1);
        batch[i].start_pos = static_cast<int32_t>(seqs[i].prompt.size()) + d;
      }
      EXPECT_TRUE(model_.executor->Execute(batch, kv, logits, nullptr).ok());
    }
    return all;
  }

  /// Bytes of sequence `s`'s K/V for positions [0, n) in every layer.
  std::vector<float> SeqKv(const KvCache& kv, const Seq& s, int32_t n) {
    std::vector<float> out;
    const KvLayout& lay = kv.layout();
    const size_t tok = static_cast<size_t>(lay.num_kv_heads * lay.head_dim);
    for (int32_t l = 0; l < lay.num_layers; ++l) {
      for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
        for (int32_t p = 0; p < n; ++p) {
          const float* c = kv.chunk_f32(l, kind, s.table[static_cast<size_t>(p / kBlockSize)]) +
                           static_cast<size_t>(p % kBlockSize) * tok;
          out.insert(out.end(), c, c + tok);
        }
      }
    }
    return out;
  }

  LoadedModel model_;
  int32_t vocab_ = 0;
  std::vector<Seq> seqs_;
};

TEST_P(BatchInvarianceTest, ChunkedPrefillGivesIdenticalLogitsAndKv) {
  const Seq& s = seqs_[3];
  auto kv1 = NewCache();
  const auto ref = RunAlone(s, s.prompt.size(), 4, *kv1);
  const auto ref_kv = SeqKv(*kv1, s, static_cast<int32_t>(s.prompt.size()) + 4);
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{7}, size_t{8}, size_t{16}, size_t{17}}) {
    auto kv = NewCache();
    EXPECT_EQ(RunAlone(s, chunk, 4, *kv), ref) << "chunk " << chunk;
    EXPECT_EQ(SeqKv(*kv, s, static_cast<int32_t>(s.prompt.size()) + 4), ref_kv)
        << "chunk " << chunk;
  }
}

TEST_P(BatchInvarianceTest, BatchOf32EqualsAlone) {
  auto kvb = NewCache();
  const auto batched = RunBatched(seqs_, 3, *kvb);
  for (size_t i = 0; i < seqs_.size(); ++i) {
    auto kv = NewCache();
    EXPECT_EQ(RunAlone(seqs_[i], seqs_[i].prompt.size(), 3, *kv), batched[i]) << "sequence " << i;
  }
}

TEST_P(BatchInvarianceTest, PlaceInBatchDoesNotMatter) {
  auto kv1 = NewCache();
  const auto ref = RunBatched(seqs_, 2, *kv1);
  std::vector<Seq> rotated(seqs_.begin() + 13, seqs_.end());
  rotated.insert(rotated.end(), seqs_.begin(), seqs_.begin() + 13);
  auto kv2 = NewCache();
  const auto got = RunBatched(rotated, 2, *kv2);
  for (size_t i = 0; i < seqs_.size(); ++i) {
    EXPECT_EQ(got[(i + seqs_.size() - 13) % seqs_.size()], ref[i]) << "sequence " << i;
  }
}

TEST_P(BatchInvarianceTest, MixedPrefillAndDecodeStep) {
  // Sequence 0 decodes while sequence 1 prefills a chunk in the same step.
  const Seq& a = seqs_[0];
  const Seq& b = seqs_[1];
  auto kv_ref = NewCache();
  const auto ref_a = RunAlone(a, a.prompt.size(), 1, *kv_ref);
  auto kv_ref_b = NewCache();
  const auto ref_b = RunAlone(b, b.prompt.size(), 0, *kv_ref_b);

  auto kv = NewCache();
  std::vector<float> logits(2 * static_cast<size_t>(vocab_));
  SequenceChunk ca;
  ca.tokens = a.prompt;
  ca.block_table = a.table;
  ca.want_logits = true;
  ASSERT_TRUE(model_.executor->Execute({&ca, 1}, *kv, logits, nullptr).ok());
  std::vector<int32_t> tok = {static_cast<int32_t>(
      std::max_element(logits.begin(), logits.begin() + vocab_) - logits.begin())};
  SequenceChunk batch[2];
  batch[0].tokens = tok;
  batch[0].start_pos = static_cast<int32_t>(a.prompt.size());
  batch[0].block_table = a.table;
  batch[0].want_logits = true;
  batch[1].tokens = b.prompt;
  batch[1].block_table = b.table;
  batch[1].want_logits = true;
  ASSERT_TRUE(model_.executor->Execute(batch, *kv, logits, nullptr).ok());
  EXPECT_TRUE(std::equal(logits.begin(), logits.begin() + vocab_, ref_a.begin() + vocab_));
  EXPECT_TRUE(std::equal(logits.begin() + vocab_, logits.end(), ref_b.begin()));
}

INSTANTIATE_TEST_SUITE_P(
    Backends, BatchInvarianceTest,
    ::testing::Values(std::tuple{GemmBackend::kFixedOrder, 1, "llama", "f32"},
                      std::tuple{GemmBackend::kOpenBlasTiles, 1, "llama", "f32"},
                      std::tuple{GemmBackend::kOpenBlasTiles, 2, "llama", "f32"},
                      std::tuple{GemmBackend::kFixedOrder, 1, "qwen3", "f32"},
                      std::tuple{GemmBackend::kOpenBlasTiles, 2, "qwen3", "f32"},
                      std::tuple{GemmBackend::kFixedOrder, 1, "qwen2", "f32"},
                      std::tuple{GemmBackend::kOpenBlasTiles, 2, "qwen2", "f32"},
                      std::tuple{GemmBackend::kFixedOrder, 1, "llama3", "f32"},
                      std::tuple{GemmBackend::kOpenBlasTiles, 2, "llama3", "f32"},
                      std::tuple{GemmBackend::kFixedOrder, 1, "llama", "q8_0"},
                      std::tuple{GemmBackend::kOpenBlasTiles, 2, "qwen2", "q8_0"},
                      std::tuple{GemmBackend::kFixedOrder, 1, "qwen3", "q4_k"},
                      std::tuple{GemmBackend::kFixedOrder, 1, "llama3", "q6_k"},
                      std::tuple{GemmBackend::kFixedOrder, 1, "qwen3", "f16"},
                      std::tuple{GemmBackend::kFixedOrder, 1, "llama", "bf16"}),
    [](const auto& p) {
      const std::string arch = std::get<2>(p.param);
      const std::string dtype = std::get<3>(p.param);
      return std::string(std::get<0>(p.param) == GemmBackend::kFixedOrder ? "FixedOrder"
                                                                          : "OpenBlasTiles") +
             "Threads" + std::to_string(std::get<1>(p.param)) +
             (arch == "llama" ? "" : "_" + arch) + (dtype == "f32" ? "" : "_" + dtype);
    });

TEST(BatchInvarianceStories, BatchOf32EqualsAlone) {
  KVP_REQUIRE_SHARED_MODEL(path, "stories260K.gguf");
  ModelLoadOptions o;
  o.path = path;
  auto m = LoadModel(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const int32_t V = m->config.vocab_size;
  auto seqs = MakeSeqs(32, V, 99);
  auto kvb = testing::MakeCache(m->config, 32 * kBlocksPerSeq);
  std::vector<SequenceChunk> batch(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    batch[i].tokens = seqs[i].prompt;
    batch[i].block_table = seqs[i].table;
    batch[i].want_logits = true;
  }
  std::vector<float> all(seqs.size() * static_cast<size_t>(V)), one(static_cast<size_t>(V));
  ASSERT_TRUE(m->executor->Execute(batch, *kvb, all, nullptr).ok());
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto kv = testing::MakeCache(m->config, 32 * kBlocksPerSeq);
    ASSERT_TRUE(m->executor->Execute({&batch[i], 1}, *kv, one, nullptr).ok());
    EXPECT_TRUE(std::equal(one.begin(), one.end(),
                           all.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(V))))
        << "sequence " << i;
  }
}

}  // namespace
}  // namespace kvpush
