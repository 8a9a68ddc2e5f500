#include "router/prefix_index.h"

namespace kvpush::router {

int64_t PrefixIndex::MatchedBlocks(std::span<const uint64_t> chain) const {
  int64_t n = 0;
  for (uint64_t h : chain) {
    if (map_.find(h) == map_.end()) break;
    ++n;
  }
  return n;
}

void PrefixIndex::Insert(std::span<const uint64_t> chain) {
  // Back to front, so that the first block is the most recently used.
  for (size_t k = chain.size(); k-- > 0;) {
    const uint64_t h = chain[k];
    auto it = map_.find(h);
    if (it != map_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      continue;
    }
    lru_.push_front(h);
    map_.emplace(h, lru_.begin());
    if (map_.size() > capacity_) {
      map_.erase(lru_.back());
      lru_.pop_back();
    }
  }
}

}  // namespace kvpush::router
