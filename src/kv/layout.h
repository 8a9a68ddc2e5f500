// KV cache layout: the shape of one instance's paged KV arena.
//
// Per layer, a K array and a V array, each [num_blocks, block_size, num_kv_heads, head_dim] of
// `dtype`. The arena stores them as one contiguous allocation ordered (layer, K|V, block), so a
// (layer, K|V, block) chunk is contiguous and `chunk_bytes()` long, and consecutive block ids of
// the same (layer, K|V) are adjacent in memory (contiguous block runs coalesce into one
// descriptor).
//
//   offset(layer, kind, block) = ((layer * 2 + kind) * num_blocks + block) * chunk_bytes
//
// Within a chunk, the token slot t (0 <= t < block_size), KV head h and element d sit at
//   ((t * num_kv_heads + h) * head_dim + d) * element_size.
// Source: the vLLM/DESIGN.md §5 layout; this page fixes the arena order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace kvpush {

/// Element type of the KV arena. Only F32 is produced by the llama executor today.
enum class KvDtype : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };

/// K or V half of a layer.
enum class KvKind : uint8_t { kKey = 0, kValue = 1 };

using BlockId = int32_t;

/// Shape of a KV arena. Plain value; thread-safe to read.
struct KvLayout {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 16;  ///< tokens per block
  int32_t num_blocks = 0;
  KvDtype dtype = KvDtype::kF32;

  /// Bytes per element of `dtype`.
  size_t element_size() const { return dtype == KvDtype::kF32 ? 4 : 2; }
  /// Bytes of one token's K (or V) for one layer: num_kv_heads * head_dim * element_size.
  size_t token_bytes() const {
    return static_cast<size_t>(num_kv_heads) * head_dim * element_size();
  }
  /// Bytes of one (layer, K|V, block) chunk.
  size_t chunk_bytes() const { return token_bytes() * static_cast<size_t>(block_size); }
  /// Total bytes of the arena: num_layers * 2 * num_blocks * chunk_bytes.
  size_t total_bytes() const {
    return static_cast<size_t>(num_layers) * 2 * static_cast<size_t>(num_blocks) * chunk_bytes();
  }
  /// Byte offset of a chunk inside the arena. Caller guarantees indices are in range.
  size_t offset(int32_t layer, KvKind kind, BlockId block) const {
    return ((static_cast<size_t>(layer) * 2 + static_cast<size_t>(kind)) *
                static_cast<size_t>(num_blocks) +
            static_cast<size_t>(block)) *
           chunk_bytes();
  }

  /// Checks every field is positive and the arena size does not overflow.
  /// Errors: kInvalidArgument naming the bad field.
  Status Validate() const;

  /// "layers=5 kv_heads=4 head_dim=8 block_size=16 blocks=1024 dtype=f32 (10.0 MiB)".
  std::string ToString() const;

  friend bool operator==(const KvLayout&, const KvLayout&) = default;
};

}  // namespace kvpush
