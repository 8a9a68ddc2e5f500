// KvCache: the paged KV arena of one instance (memory + layout).
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "common/status.h"
#include "kv/layout.h"

namespace kvpush {

/// Owns (or borrows) the arena memory described by a KvLayout and hands out typed chunk pointers.
///
/// The arena is one contiguous allocation (page-aligned when owned) so it can be registered with
/// the transfer engine as a single region. Memory is zero-initialised when owned.
/// Thread-safety: the pointers are plain memory; the engine thread writes chunks of blocks it owns,
/// transfer threads write chunks of blocks reserved for a transfer. Nothing here locks.
class KvCache {
 public:
  /// Allocates an owned, zeroed, page-aligned arena. Errors: kInvalidArgument (bad layout),
  /// kResourceExhausted (allocation failed).
  static Result<std::unique_ptr<KvCache>> Create(const KvLayout& layout);

  /// Wraps externally owned memory (e.g. allocated through the transfer agent). `memory.size()`
  /// must be >= layout.total_bytes() and the memory must outlive the KvCache.
  static Result<std::unique_ptr<KvCache>> Wrap(const KvLayout& layout, std::span<std::byte> memory);

  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvLayout& layout() const { return layout_; }
  std::byte* data() { return base_; }
  const std::byte* data() const { return base_; }
  size_t size_bytes() const { return layout_.total_bytes(); }

  /// Pointer to chunk (layer, kind, block) as float; valid only for KvDtype::kF32 layouts.
  float* chunk_f32(int32_t layer, KvKind kind, BlockId block) {
    return reinterpret_cast<float*>(base_ + layout_.offset(layer, kind, block));
  }
  const float* chunk_f32(int32_t layer, KvKind kind, BlockId block) const {
    return reinterpret_cast<const float*>(base_ + layout_.offset(layer, kind, block));
  }

 private:
  KvCache(const KvLayout& layout, std::byte* base, bool owned);
  KvLayout layout_;
  std::byte* base_;
  bool owned_;
};

}  // namespace kvpush
