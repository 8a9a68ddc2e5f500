// EngineConfig: the typed, validated configuration of one engine (vLLM flag names in comments).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/executor.h"

namespace kvpush {

/// Engine knobs. Validate() at start; Resolve() fills the model-dependent defaults.
struct EngineConfig {
  int32_t block_size = 16;    ///< --block-size: tokens per KV block
  int32_t num_kv_blocks = 0;  ///< --num-gpu-blocks-override / --num-kv-blocks; 0 = from memory
  int64_t kv_cache_memory_bytes =
      256ll << 20;                       ///< --kv-cache-memory: arena bytes when num_kv_blocks == 0
  int32_t max_num_seqs = 64;             ///< --max-num-seqs: running requests per step
  int32_t max_num_batched_tokens = 512;  ///< --max-num-batched-tokens: token budget per step
  int32_t max_model_len = 0;             ///< --max-model-len: prompt + output tokens; 0 = model's
  bool enable_prefix_caching = true;     ///< --no-enable-prefix-caching turns it off
  /// --kv-block-allocation scattered: draw KV blocks pseudo-randomly so that no descriptors
  /// coalesce (a benchmark of fragmented KV memory; BlockPool::Options::scatter).
  bool scatter_kv_blocks = false;
  int32_t max_pending_requests = 4096;   ///< waiting + queued requests before Submit refuses

  /// Checks the model-independent fields. Errors: kInvalidArgument naming the flag.
  Status Validate() const;

  /// Returns a copy with max_model_len and num_kv_blocks resolved against the model
  /// (max_model_len <= context_length; num_kv_blocks from kv_cache_memory_bytes and the KV layout).
  /// Errors: kInvalidArgument (max_model_len above the model's context, memory for < 1 block).
  Result<EngineConfig> Resolve(const ModelConfig& model) const;

  /// One line, every field, for the start-up log.
  std::string ToString() const;
};

}  // namespace kvpush
