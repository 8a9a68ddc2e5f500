#include "engine/engine_config.h"

#include <sstream>

#include "kv/layout.h"

namespace kvpush {

Status EngineConfig::Validate() const {
  if (block_size < 1 || block_size > 1024) {
    return InvalidArgument("--block-size must be in [1, 1024], got " + std::to_string(block_size));
  }
  if (num_kv_blocks < 0) return InvalidArgument("--num-kv-blocks must be >= 0");
  if (num_kv_blocks == 0 && kv_cache_memory_bytes <= 0) {
    return InvalidArgument("--kv-cache-memory must be > 0 when --num-kv-blocks is not given");
  }
  if (max_num_seqs < 1) return InvalidArgument("--max-num-seqs must be >= 1");
  if (max_num_batched_tokens < 1) return InvalidArgument("--max-num-batched-tokens must be >= 1");
  if (max_model_len < 0) return InvalidArgument("--max-model-len must be >= 0");
  if (max_pending_requests < 1) return InvalidArgument("max_pending_requests must be >= 1");
  return Status::Ok();
}

Result<EngineConfig> EngineConfig::Resolve(const ModelConfig& model) const {
  KVP_RETURN_IF_ERROR(Validate());
  EngineConfig c = *this;
  if (model.context_length < 2) return InvalidArgument("model context length < 2");
  if (c.max_model_len == 0) c.max_model_len = model.context_length;
  if (c.max_model_len > model.context_length) {
    return InvalidArgument("--max-model-len " + std::to_string(c.max_model_len) +
                           " exceeds the model's context length " +
                           std::to_string(model.context_length));
  }
  if (c.max_model_len < 2) return InvalidArgument("--max-model-len must be >= 2");
  if (c.num_kv_blocks == 0) {
    KvLayout one{model.num_layers, model.num_kv_heads, model.head_dim, c.block_size, 1,
                 model.kv_dtype};
    const int64_t per_block = static_cast<int64_t>(one.total_bytes());
    if (per_block <= 0) return InvalidArgument("model has an empty KV layout");
    const int64_t n = c.kv_cache_memory_bytes / per_block;
    if (n < 1) {
      return InvalidArgument("--kv-cache-memory " + std::to_string(c.kv_cache_memory_bytes) +
                             " bytes is less than one KV block (" + std::to_string(per_block) +
                             " bytes)");
    }
    c.num_kv_blocks = static_cast<int32_t>(std::min<int64_t>(n, 1 << 24));
  }
  return c;
}

std::string EngineConfig::ToString() const {
  std::ostringstream os;
  os << "block_size=" << block_size << " num_kv_blocks=" << num_kv_blocks
     << " kv_cache_memory_bytes=" << kv_cache_memory_bytes << " max_num_seqs=" << max_num_seqs
     << " max_num_batched_tokens=" << max_num_batched_tokens << " max_model_len=" << max_model_len
     << " enable_prefix_caching=" << (enable_prefix_caching ? "true" : "false")
     << " max_pending_requests=" << max_pending_requests;
  return os.str();
}

}  // namespace kvpush
