// SimExecutor: the `sim` executor (DESIGN.md §7). It stands in for a large model on a named
// accelerator: each engine step waits, layer by layer, for the roofline time of that layer
// (model/sim_model.h) and calls the layer observer after each layer, so layer-wise push sees the
// real model's per-layer timing; it writes KV of the real model's per-token size (bf16, times a
// scale) whose content is a pure function of the tokens; and its next token is a pure function of
// (context, position), so colocated, pull and push give the same tokens.
//
// Content. Each position p of a sequence has a chain hash
//   h_p = XXH3-64(h_{p-1} as u64 LE, token_p as i32 LE, p as i32 LE; seed = 0), h_{-1} = fingerprint
// The K and V slot of position p in layer l hold the 64-bit words
//   w_0 = h_p, w_j = SplitMix64(h_p ^ (l << 1 | kind) * 0x9E3779B97F4A7C15 + j) for j >= 1
// (truncated to the slot size). A chunk that starts at position s > 0 reads h_{s-1} back from
// layer 0's K slot of position s - 1, so the tokens depend on the KV a transfer delivered, as a
// real model's do. The next token after position p is
//   256 + 3 + XXH3-64(h_p, seed = 0x746f6b) mod (vocab - 259)
// and its logits row is 0 everywhere except 20 at that token (greedy and seeded sampling pick it).
//
// Waiting sleeps on the steady clock (no core burnt); the time spent writing KV counts against
// the layer's budget. Not thread-safe: one engine thread.
#pragma once

#include <chrono>
#include <memory>

#include "model/executor.h"
#include "model/model.h"
#include "model/sim_model.h"
#include "model/tokenizer.h"

namespace kvpush {

struct SimOptions {
  SimModelSpec model;
  SimHardware hardware;
  SimEfficiency efficiency;
  /// KV bytes per token = model.KvBytesPerToken() * kv_scale (the head dim is scaled; >= 1).
  double kv_scale = 0.125;
  /// false: compute the times but do not wait (unit tests, correctness runs).
  bool sleep = true;
};

/// Validates `o` and returns the ModelConfig the sim reports (bf16 KV, scaled head dim, byte-level
/// vocabulary ids within the model's vocab). Errors: kInvalidArgument naming the field.
Result<ModelConfig> SimModelConfig(const SimOptions& o);

class SimExecutor final : public Executor {
 public:
  /// Errors: those of SimModelConfig.
  static Result<std::unique_ptr<SimExecutor>> Create(const SimOptions& options);

  const ModelConfig& config() const override { return config_; }
  Status Execute(std::span<const SequenceChunk> batch, KvCache& kv, std::span<float> logits,
                 LayerObserver* observer) override;

  /// The modelled time of the last Execute (seconds), for tests and logs.
  const SimStepTime& last_step() const { return last_step_; }

 private:
  SimExecutor(SimOptions options, ModelConfig config)
      : options_(std::move(options)), config_(std::move(config)) {}
  /// Chain hashes h_p of the chunk's positions (reads h_{start-1} from the cache).
  void ChainHashes(const SequenceChunk& c, const KvCache& kv, std::vector<uint64_t>& out) const;
  /// Writes layer `layer`'s K and V slots of the chunk's positions.
  void WriteLayer(const SequenceChunk& c, std::span<const uint64_t> hashes, int32_t layer,
                  KvCache& kv) const;

  SimOptions options_;
  ModelConfig config_;
  SimStepTime last_step_;
  std::vector<std::vector<uint64_t>> hashes_;  ///< per chunk, reused
};

/// A sim executor and its tokenizer, as `kvpush serve --executor sim` uses them.
/// Errors: those of SimModelConfig.
Result<LoadedModel> MakeSimModel(const SimOptions& options);

/// A tokenizer that accepts any text: byte b is token 3 + b; ids 0, 1, 2 are <unk>, BOS, EOS; an
/// id >= 259 decodes to " w<id>". Thread-safe.
class SimTokenizer final : public Tokenizer {
 public:
  explicit SimTokenizer(int32_t vocab_size) : vocab_(vocab_size) {}
  int32_t vocab_size() const override { return vocab_; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  Result<std::vector<int32_t>> Encode(std::string_view text) const override;
  std::string TokenBytes(int32_t id) const override;
  bool IsControl(int32_t id) const override { return id >= 0 && id < 3; }

 private:
  int32_t vocab_;
};

}  // namespace kvpush
