// Helpers for model tests: a KV cache sized for a model, and greedy generation through Execute().
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <vector>

#include "kv/kv_cache.h"
#include "model/executor.h"
#include "model/sampler.h"

namespace kvpush::testing {

/// A KV cache for `config` with `blocks` blocks of `block_size` tokens.
inline std::unique_ptr<KvCache> MakeCache(const ModelConfig& config, int32_t blocks,
                                          int32_t block_size = 16) {
  KvLayout layout;
  layout.num_layers = config.num_layers;
  layout.num_kv_heads = config.num_kv_heads;
  layout.head_dim = config.head_dim;
  layout.block_size = block_size;
  layout.num_blocks = blocks;
  auto cache = KvCache::Create(layout);
  EXPECT_TRUE(cache.ok()) << cache.status().ToString();
  return std::move(*cache);
}

/// Block table [first, first + n).
inline std::vector<BlockId> Blocks(int32_t first, int32_t n) {
  std::vector<BlockId> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

/// Greedy generation as llama2.c run.c: feeds `prompt` (one chunk), then one token per step until
/// `steps` positions (prompt included) are filled. Returns the generated ids (prompt excluded).
inline std::vector<int32_t> GreedyGenerate(Executor& ex, const std::vector<int32_t>& prompt,
                                           int32_t steps) {
  const ModelConfig& c = ex.config();
  auto cache = MakeCache(c, (steps + 15) / 16 + 1);
  auto table = Blocks(0, (steps + 15) / 16 + 1);
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> out;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SequenceChunk ch;
  ch.block_table = table;
  ch.want_logits = true;
  ch.tokens = prompt;
  ch.start_pos = 0;
  int32_t pos = static_cast<int32_t>(prompt.size());
  std::vector<int32_t> next(1);
  while (true) {
    Status s = ex.Execute({&ch, 1}, *cache, logits, nullptr);
    EXPECT_TRUE(s.ok()) << s.ToString();
    if (!s.ok()) break;
    next[0] = Sample(logits, greedy, static_cast<int64_t>(out.size())).token;
    out.push_back(next[0]);
    if (pos >= steps) break;
    ch.tokens = next;
    ch.start_pos = pos++;
  }
  return out;
}

}  // namespace kvpush::testing
