#include "kv/layout.h"

#include <cstdio>
#include <limits>

namespace kvpush {

Status KvLayout::Validate() const {
  auto positive = [](int32_t v, const char* name) -> Status {
    if (v <= 0)
      return InvalidArgument(std::string("KV layout: ") + name + " must be > 0, got " +
                             std::to_string(v));
    return Status::Ok();
  };
  KVP_RETURN_IF_ERROR(positive(num_layers, "num_layers"));
  KVP_RETURN_IF_ERROR(positive(num_kv_heads, "num_kv_heads"));
  KVP_RETURN_IF_ERROR(positive(head_dim, "head_dim"));
  KVP_RETURN_IF_ERROR(positive(block_size, "block_size"));
  KVP_RETURN_IF_ERROR(positive(num_blocks, "num_blocks"));
  if (dtype != KvDtype::kF32 && dtype != KvDtype::kF16 && dtype != KvDtype::kBF16) {
    return InvalidArgument("KV layout: unknown dtype");
  }
  // Overflow check on the total size, in long double to avoid wrapping.
  long double total = static_cast<long double>(num_layers) * 2 * num_blocks * block_size *
                      num_kv_heads * head_dim * static_cast<long double>(element_size());
  if (total > static_cast<long double>(std::numeric_limits<int64_t>::max()) / 2) {
    return InvalidArgument("KV layout: arena size overflows");
  }
  return Status::Ok();
}

std::string KvLayout::ToString() const {
  const char* dt = dtype == KvDtype::kF32 ? "f32" : dtype == KvDtype::kF16 ? "f16" : "bf16";
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "layers=%d kv_heads=%d head_dim=%d block_size=%d blocks=%d dtype=%s (%.1f MiB)",
                num_layers, num_kv_heads, head_dim, block_size, num_blocks, dt,
                static_cast<double>(total_bytes()) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace kvpush
