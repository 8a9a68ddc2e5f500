// Executor: the interface between the engine and a model implementation (llama CPU, later sim).
//
// One Execute() call runs one engine step: a batch of sequence chunks (prefill chunks and decode
// tokens mixed), writes their K/V into the paged KV cache through each sequence's block table, and
// returns logits for the chunks that ask for them.
//
// Determinism contract: the logits of a sequence are bit-identical whatever else is in the batch
// and however its prompt was split into chunks (batch invariance). The P/D modes rely on it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "kv/kv_cache.h"

namespace kvpush {

/// How RoPE pairs the dimensions of a head (llama.cpp's rope types). kNormal rotates adjacent pairs
/// (x[2i], x[2i+1]) (Llama GGUFs, whose converter permutes Wq/Wk rows for it); kNeox rotates
/// (x[i], x[i + rope_dim/2]) (GPT-NeoX / HF rotate_half; Qwen2, Qwen3).
enum class RopeStyle : uint8_t { kNormal, kNeox };

/// Model hyper-parameters the engine and the KV layer need. Units: counts; rope_theta in radians
/// base; rms_eps unitless.
struct ModelConfig {
  std::string architecture;  ///< GGUF general.architecture: "llama", "qwen2", "qwen3" (or "sim")
  std::string name;          ///< display name (file stem or general.name)
  int32_t dim = 0;           ///< embedding length
  int32_t hidden_dim = 0;    ///< FFN hidden size
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;  ///< per head; num_heads * head_dim may differ from dim (Qwen3)
  int32_t vocab_size = 0;
  int32_t context_length = 0;  ///< max positions the engine will accept
  float rope_theta = 10000.0f;
  int32_t rope_dim = 0;  ///< dims rotated per head (GGUF rope.dimension_count); 0 = head_dim
  RopeStyle rope_style = RopeStyle::kNormal;
  float rms_eps = 1e-5f;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
  uint64_t fingerprint = 0;          ///< hash of the weights' identity (used as prefix-cache salt)
  KvDtype kv_dtype = KvDtype::kF32;  ///< element type of the KV cache this executor writes
};

/// One sequence's work in a step: compute `tokens` at positions [start_pos, start_pos + n).
struct SequenceChunk {
  int64_t seq_id = 0;                    ///< engine's id, for observers and errors
  std::span<const int32_t> tokens;       ///< token ids to compute this step (n >= 1)
  int32_t start_pos = 0;                 ///< position of tokens[0]
  std::span<const BlockId> block_table;  ///< blocks covering positions [0, start_pos + n)
  bool want_logits = false;              ///< produce logits for the last token of the chunk
  /// Produce logits for every token of the chunk (prompt logprobs: the row of position p scores
  /// token p + 1), in token order; then `want_logits` adds no row of its own (its row is the
  /// last one).
  bool all_logits = false;

  /// Rows of logits this chunk produces: tokens.size() with all_logits, else 1 with want_logits,
  /// else 0.
  int64_t logit_rows() const {
    if (all_logits) return static_cast<int64_t>(tokens.size());
    return want_logits ? 1 : 0;
  }
};

/// Receives a callback after each layer's K/V of the whole batch has been written to the cache
/// (the push connector's hook point; DESIGN.md §3 push step 3). Called on the engine thread; must
/// not block.
class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  virtual void OnLayerDone(int32_t layer) = 0;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const ModelConfig& config() const = 0;

  /// Runs one step. `logits` receives [sum of the chunks' logit_rows(), vocab_size] floats, in
  /// chunk order (a chunk's rows in token order). Errors: kInvalidArgument (bad token id, position
  /// beyond context, block table too short, logits span too small). Not thread-safe: one engine
  /// thread calls it.
  virtual Status Execute(std::span<const SequenceChunk> batch, KvCache& kv, std::span<float> logits,
                         LayerObserver* observer) = 0;
};

}  // namespace kvpush
