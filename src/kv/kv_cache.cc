#include "kv/kv_cache.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace kvpush {

namespace {
constexpr size_t kPageSize = 4096;
}

KvCache::KvCache(const KvLayout& layout, std::byte* base, bool owned)
    : layout_(layout), base_(base), owned_(owned) {}

KvCache::~KvCache() {
  if (owned_) std::free(base_);  // NOLINT(cppcoreguidelines-no-malloc)
}

Result<std::unique_ptr<KvCache>> KvCache::Create(const KvLayout& layout) {
  KVP_RETURN_IF_ERROR(layout.Validate());
  size_t bytes = (layout.total_bytes() + kPageSize - 1) / kPageSize * kPageSize;
  void* p = std::aligned_alloc(kPageSize, bytes);  // NOLINT(cppcoreguidelines-no-malloc)
  if (p == nullptr) {
    return ResourceExhausted("KV arena: cannot allocate " + std::to_string(bytes) + " bytes");
  }
  std::memset(p, 0, bytes);
  return std::unique_ptr<KvCache>(new KvCache(layout, static_cast<std::byte*>(p), true));
}

Result<std::unique_ptr<KvCache>> KvCache::Wrap(const KvLayout& layout,
                                               std::span<std::byte> memory) {
  KVP_RETURN_IF_ERROR(layout.Validate());
  if (memory.size() < layout.total_bytes()) {
    return InvalidArgument("KV arena: external memory of " + std::to_string(memory.size()) +
                           " bytes is smaller than the layout's " +
                           std::to_string(layout.total_bytes()));
  }
  return std::unique_ptr<KvCache>(new KvCache(layout, memory.data(), false));
}

}  // namespace kvpush
