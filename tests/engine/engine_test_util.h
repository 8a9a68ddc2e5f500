// Helpers for engine tests: build an EngineCore over the fake model and run requests to the end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "fake_model.h"

namespace kvpush::testing {

/// Everything a request produced, concatenated.
struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::kNone;
  std::string stop_reason;
  int32_t stop_token_id = -1;
  Status error;
  int32_t num_cached_tokens = 0;
  int32_t num_outputs = 0;
};

inline void Accumulate(Collected& c, const RequestOutput& o) {
  for (const auto& t : o.tokens) c.tokens.push_back(t.id);
  c.text += o.text;
  ++c.num_outputs;
  if (o.finished()) {
    c.finish = o.finish_reason;
    c.stop_reason = o.stop_reason;
    c.stop_token_id = o.stop_token_id;
    c.error = o.error;
    c.num_cached_tokens = o.num_cached_tokens;
  }
}

/// A simple greedy request.
inline GenerationRequest MakeRequest(std::vector<int32_t> prompt, int32_t max_tokens,
                                     float temperature = 0.0f, uint64_t seed = 0) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.ignore_eos = true;
  return r;
}

/// A prompt of `n` pseudo-random ids in [3, 64) derived from `salt`, starting with BOS.
inline std::vector<int32_t> MakePrompt(int32_t n, uint32_t salt) {
  std::vector<int32_t> p{1};
  uint32_t x = salt * 2654435761u + 12345u;
  while (static_cast<int32_t>(p.size()) < n) {
    x = x * 1664525u + 1013904223u;
    p.push_back(3 + static_cast<int32_t>((x >> 16) % 61));
  }
  return p;
}

/// Resolved config for the fake model.
inline EngineConfig FakeConfig(int32_t num_blocks, int32_t block_size, int32_t budget,
                               int32_t max_seqs = 64) {
  EngineConfig c;
  c.block_size = block_size;
  c.num_kv_blocks = num_blocks;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  auto r = c.Resolve(FakeModelConfig());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : c;
}

/// Submits every request to `core` at once and steps until all finished (bounded step count).
inline std::vector<Collected> RunAll(EngineCore& core, std::vector<GenerationRequest> reqs,
                                     int64_t first_id = 1) {
  std::vector<std::shared_ptr<OutputChannel>> chans;
  for (size_t i = 0; i < reqs.size(); ++i) {
    chans.push_back(std::make_shared<OutputChannel>());
    core.AddRequest(first_id + static_cast<int64_t>(i), std::move(reqs[i]), chans.back(), 0);
  }
  std::vector<Collected> out(chans.size());
  auto all_closed = [&] {
    for (const auto& ch : chans) {
      if (!ch->closed()) return false;
    }
    return true;
  };
  for (int step = 0; step < 100000 && !all_closed(); ++step) core.Step();
  EXPECT_TRUE(all_closed()) << "engine did not finish every request";
  for (size_t i = 0; i < chans.size(); ++i) {
    for (auto& o : chans[i]->TakeAll()) Accumulate(out[i], o);
  }
  return out;
}

/// Every block is back: none used; free + cached = total.
inline void ExpectNoLeak(const EngineCore& core) {
  auto s = core.block_pool().stats();
  EXPECT_EQ(s.num_used, 0);
  EXPECT_EQ(s.num_free + s.num_cached, core.block_pool().num_blocks());
}

}  // namespace kvpush::testing
