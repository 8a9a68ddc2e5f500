// A small deterministic fake model for engine/server tests: FakeExecutor writes each token's
// (id, position) into the paged KV cache and derives the logits of a sequence's last token only
// from what it reads back through the block table, so any scheduling or block-table bug changes
// the generated tokens (or fails the step). FakeTokenizer is a 64-entry vocabulary with
// multi-character pieces and a UTF-8 character split over two byte tokens.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/executor.h"
#include "model/tokenizer.h"

namespace kvpush::testing {

/// What the fake executor observed (shared with the test; atomics because the engine thread
/// writes while the test thread may read).
struct FakeProbe {
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> max_step_tokens{0};
  std::atomic<int64_t> chunked_prefills{0};  ///< chunks with start_pos > 0 and > 1 token
  std::atomic<int64_t> max_batch_seqs{0};
  std::atomic<int32_t> step_delay_us{0};  ///< sleep per step (slow model for abort tests)
};

/// Model config of the fake: 2 layers, 1 KV head, head_dim 2, vocab 64, context `context`.
ModelConfig FakeModelConfig(int32_t context = 4096);

/// Reference logits of the next token after `tokens` (what the executor must produce).
std::vector<float> FakeLogits(std::span<const int32_t> tokens, int32_t vocab);

/// Greedy reference continuation of `prompt` for `n` tokens (no EOS stop).
std::vector<int32_t> FakeGreedy(std::vector<int32_t> prompt, int32_t n, int32_t vocab);

class FakeExecutor : public Executor {
 public:
  explicit FakeExecutor(std::shared_ptr<FakeProbe> probe = nullptr, int32_t context = 4096);
  const ModelConfig& config() const override { return config_; }
  Status Execute(std::span<const SequenceChunk> batch, KvCache& kv, std::span<float> logits,
                 LayerObserver* observer) override;

 private:
  ModelConfig config_;
  std::shared_ptr<FakeProbe> probe_;
};

class FakeTokenizer : public Tokenizer {
 public:
  FakeTokenizer();
  int32_t vocab_size() const override { return 64; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  Result<std::vector<int32_t>> Encode(std::string_view text) const override;
  std::string TokenBytes(int32_t id) const override;
  bool IsControl(int32_t id) const override { return id >= 0 && id < 3; }

 private:
  std::vector<std::string> pieces_;
};

}  // namespace kvpush::testing
