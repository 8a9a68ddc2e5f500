// The executor's GEMM threads (LlamaExecutorOptions::threads, a WorkerPool splitting output
// columns) change no bit: logits and KV cache contents of a batched prefill (5 sequences, 1..40
// tokens) and 3 batched decode steps are identical with 1, 2, 3 and 4 threads, for every stored
// weight type, through both the integer (default) and the float path of the quantized types.
// A single row (decode of one sequence) is covered too: sequence 0 has a 1-token prompt.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "model/gemm.h"
#include "model/model.h"
#include "model/random_model.h"
#include "model/worker_pool.h"
#include "model_test_util.h"

namespace kvpush {
namespace {

constexpr int32_t kBlockSize = 16;
constexpr int32_t kBlocksPerSeq = 4;
constexpr int kSeqs = 5;

std::vector<uint8_t> ModelBytes(const std::string& dtype) {
  const std::map<std::string, GgmlType> types = {
      {"f32", GgmlType::kF32},   {"f16", GgmlType::kF16},   {"bf16", GgmlType::kBF16},
      {"q8_0", GgmlType::kQ8_0}, {"q4_k", GgmlType::kQ4_K}, {"q6_k", GgmlType::kQ6_K}};
  RandomLlamaOptions o;
  o.arch = "llama3";
  o.rope_freq_base = 500000.0f;
  o.dim = 256;
  o.layers = 2;
  o.heads = 8;
  o.kv_heads = 2;
  o.hidden_dim = 512;
  o.vocab = 400;
  o.context = 256;
  o.seed = 3;
  o.dtype = types.at(dtype);
  auto w = BuildRandomLlamaGguf(o);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return w->Serialize();
}

/// Logits of every step, then the K/V of every sequence's positions, concatenated.
std::vector<float> RunSteps(const std::vector<uint8_t>& bytes, int threads, QuantMath quant) {
  ModelLoadOptions lo;
  lo.path = "random.gguf";
  lo.threads = threads;
  lo.quant_math = quant;
  auto m = LoadModelFromGgufBytes(bytes, lo);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  const size_t vocab = static_cast<size_t>(m->config.vocab_size);
  auto kv = testing::MakeCache(m->config, kSeqs * kBlocksPerSeq, kBlockSize);
  std::mt19937 rng(17);
  std::vector<std::vector<int32_t>> prompts(kSeqs);
  std::vector<std::vector<BlockId>> tables(kSeqs);
  std::vector<SequenceChunk> batch(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    const int len = i == 0 ? 1 : 1 + static_cast<int>(rng() % 40);
    for (int t = 0; t < len; ++t) prompts[i].push_back(static_cast<int32_t>(rng() % vocab));
    tables[i] = testing::Blocks(i * kBlocksPerSeq, kBlocksPerSeq);
    batch[i].seq_id = i;
    batch[i].tokens = prompts[i];
    batch[i].block_table = tables[i];
    batch[i].want_logits = true;
  }
  std::vector<float> out, logits(kSeqs * vocab);
  std::vector<int32_t> toks(kSeqs);
  for (int step = 0; step <= 3; ++step) {
    EXPECT_TRUE(m->executor->Execute(batch, *kv, logits, nullptr).ok());
    out.insert(out.end(), logits.begin(), logits.end());
    for (int i = 0; i < kSeqs; ++i) {
      auto row = logits.begin() + static_cast<std::ptrdiff_t>(i * vocab);
      toks[i] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
      batch[i].tokens = std::span<const int32_t>(toks).subspan(i, 1);
      batch[i].start_pos = static_cast<int32_t>(prompts[i].size()) + step;
    }
  }
  const KvLayout& lay = kv->layout();
  const size_t tok = static_cast<size_t>(lay.num_kv_heads) * static_cast<size_t>(lay.head_dim);
  for (int i = 0; i < kSeqs; ++i) {
    const int32_t n = static_cast<int32_t>(prompts[i].size()) + 3;
    for (int32_t l = 0; l < lay.num_layers; ++l) {
      for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
        for (int32_t p = 0; p < n; ++p) {
          const float* c = kv->chunk_f32(l, kind, tables[i][static_cast<size_t>(p / kBlockSize)]) +
                           static_cast<size_t>(p % kBlockSize) * tok;
          out.insert(out.end(), c, c + tok);
        }
      }
    }
  }
  return out;
}

class ThreadsTest : public ::testing::TestWithParam<std::tuple<const char*, QuantMath>> {};

TEST_P(ThreadsTest, LogitsAndKvIdenticalForAnyThreadCount) {
  const auto [dtype, quant] = GetParam();
  const std::vector<uint8_t> bytes = ModelBytes(dtype);
  const std::vector<float> one = RunSteps(bytes, 1, quant);
  ASSERT_FALSE(one.empty());
  for (int threads : {2, 3, 4}) {
    EXPECT_EQ(RunSteps(bytes, threads, quant), one) << dtype << ", " << threads << " threads";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, ThreadsTest,
    ::testing::Values(std::tuple{"f32", QuantMath::kInt8}, std::tuple{"f16", QuantMath::kInt8},
                      std::tuple{"bf16", QuantMath::kInt8}, std::tuple{"q8_0", QuantMath::kInt8},
                      std::tuple{"q4_k", QuantMath::kInt8}, std::tuple{"q6_k", QuantMath::kInt8},
                      std::tuple{"q8_0", QuantMath::kDequantF32},
                      std::tuple{"q4_k", QuantMath::kDequantF32}),
    [](const auto& p) {
      return std::string(std::get<0>(p.param)) +
             (std::get<1>(p.param) == QuantMath::kInt8 ? "" : "_float");
    });

TEST(ThreadsTest, RefusesThreadCountBelowOne) {
  ModelLoadOptions lo;
  lo.path = "random.gguf";
  lo.threads = 0;
  EXPECT_EQ(LoadModelFromGgufBytes(ModelBytes("f32"), lo).status().code(),
            StatusCode::kInvalidArgument);
}

// --threads-bind: auto binds only when every thread gets a CPU of its own; lists are exact.
TEST(ThreadsBindTest, ResolvesSpecs) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) allowed.push_back(c);
  }
  const int n = static_cast<int>(allowed.size());
  EXPECT_TRUE(ResolveThreadsBind("nobind", 2)->empty());
  EXPECT_TRUE(ResolveThreadsBind("auto", 1)->empty());
  EXPECT_TRUE(ResolveThreadsBind("auto", n + 1)->empty());
  if (n >= 2) {
    EXPECT_EQ(*ResolveThreadsBind("auto", 2), std::vector<int>(allowed.begin(), allowed.begin() + 2));
  }
  const std::string first = std::to_string(allowed[0]);
  EXPECT_EQ(*ResolveThreadsBind(first, 1), std::vector<int>{allowed[0]});
  if (n >= 2) {
    const std::string list = first + "," + std::to_string(allowed[1]);
    EXPECT_EQ(*ResolveThreadsBind(list, 2), (std::vector<int>{allowed[0], allowed[1]}));
  }
  for (const char* bad : {"", "x", "0-", "-1", "1-0", "0,,1", "0 ", "99999"}) {
    EXPECT_EQ(ResolveThreadsBind(bad, 1).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(ResolveThreadsBind(first + "," + first, 2).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveThreadsBind(first, 2).status().code(), StatusCode::kInvalidArgument);
}

// Bound pools run each part on its thread's CPU (the caller's on cpus[0]) and give the same logits.
TEST(ThreadsBindTest, BoundPoolRunsOnItsCpus) {
  const auto cpus = ResolveThreadsBind("auto", 2);
  ASSERT_TRUE(cpus.ok());
  if (cpus->empty()) GTEST_SKIP() << "this process may use fewer than 2 CPUs";
  WorkerPool pool(2, *cpus);
  std::vector<int> ran(2, -1);
  pool.Run(2, [&](int part) { ran[static_cast<size_t>(part)] = sched_getcpu(); });
  EXPECT_EQ(ran, *cpus);
}

}  // namespace
}  // namespace kvpush
