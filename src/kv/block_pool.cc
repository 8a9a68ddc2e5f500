#include "kv/block_pool.h"

#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <cstring>

namespace kvpush {

BlockPool::BlockPool(const Options& options)
    : options_(options),
      meta_(static_cast<size_t>(std::max(options.num_blocks, 0))),
      tokens_(static_cast<size_t>(std::max(options.num_blocks, 0)) *
              static_cast<size_t>(std::max(options.block_size, 0))) {
  for (BlockId b = 0; b < options_.num_blocks; ++b) free_.insert(free_.end(), b);
}

int32_t BlockPool::num_available() const {
  return static_cast<int32_t>(free_.size() + lru_.size());
}

BlockId BlockPool::TakeFree(BlockId preferred) {
  if (!free_.empty()) {
    auto it = preferred >= 0 ? free_.find(preferred) : free_.end();
    if (it == free_.end()) it = free_.begin();
    BlockId b = *it;
    free_.erase(it);
    return b;
  }
  // Evict the least recently used cached block.
  assert(!lru_.empty());
  BlockId b = lru_.front();
  Evict(b);
  free_.erase(b);
  return b;
}

BlockId BlockPool::TakeScattered(BlockId previous) {
  if (free_.empty()) return TakeFree(-1);  // eviction order is the LRU's, as without scatter
  // splitmix64 (Steele, Lea, Flood 2014): a fixed-seed, well-mixed draw of the start point.
  uint64_t z = (scatter_state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  auto it = free_.lower_bound(static_cast<BlockId>(z % static_cast<uint64_t>(options_.num_blocks)));
  if (it == free_.end()) it = free_.begin();
  // Skip the neighbours of the previous block (at most two steps) unless nothing else is free.
  for (int step = 0; step < 2 && previous >= 0 && free_.size() > 2; ++step) {
    if (*it != previous + 1 && *it != previous - 1) break;
    if (++it == free_.end()) it = free_.begin();
  }
  const BlockId b = *it;
  free_.erase(it);
  return b;
}

void BlockPool::Evict(BlockId block) {
  Meta& m = meta_[static_cast<size_t>(block)];
  if (m.in_lru) {
    lru_.erase(m.lru_it);
    m.in_lru = false;
  }
  if (m.hashed) {
    auto it = by_hash_.find(m.hash);
    if (it != by_hash_.end() && it->second == block) by_hash_.erase(it);
    m.hashed = false;
  }
  ++evictions_;
  free_.insert(block);
}

Status BlockPool::AllocateAppend(int32_t n, std::vector<BlockId>& table) {
  if (n < 0) return InvalidArgument("AllocateAppend: negative block count");
  if (n == 0) return Status::Ok();
  if (n > num_available()) {
    return ResourceExhausted("KV cache: need " + std::to_string(n) + " blocks, " +
                             std::to_string(num_available()) + " available of " +
                             std::to_string(options_.num_blocks));
  }
  // Preferred start: right after the table's last block; otherwise the first free run of n.
  BlockId next = table.empty() ? -1 : table.back() + 1;
  if (!options_.scatter && (next < 0 || free_.count(next) == 0)) {
    next = -1;
    BlockId run_start = -1;
    int32_t run_len = 0;
    BlockId prev = -2;
    for (BlockId b : free_) {
      if (b == prev + 1) {
        ++run_len;
      } else {
        run_start = b;
        run_len = 1;
      }
      prev = b;
      if (run_len >= n) {
        next = run_start;
        break;
      }
    }
  }
  table.reserve(table.size() + static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const BlockId b =
        options_.scatter ? TakeScattered(table.empty() ? -1 : table.back()) : TakeFree(next);
    Meta& m = meta_[static_cast<size_t>(b)];
    m.ref = 1;
    m.hashed = false;
    ++num_used_;
    table.push_back(b);
    next = b + 1;
  }
  return Status::Ok();
}

BlockHash BlockPool::HashBlock(BlockHash parent, std::span<const int32_t> block_tokens) const {
  return XXH3_64bits_withSeed(block_tokens.data(), block_tokens.size_bytes(), parent);
}

bool BlockPool::TokensEqual(BlockId block, std::span<const int32_t> tokens) const {
  const int32_t* stored = &tokens_[static_cast<size_t>(block) * options_.block_size];
  return std::memcmp(stored, tokens.data(), tokens.size_bytes()) == 0;
}

std::vector<BlockId> BlockPool::MatchPrefix(std::span<const int32_t> tokens, int32_t max_blocks) {
  std::vector<BlockId> out;
  if (!options_.enable_prefix_cache) return out;
  const auto bs = static_cast<size_t>(options_.block_size);
  const int32_t full = std::min<int32_t>(static_cast<int32_t>(tokens.size() / bs), max_blocks);
  BlockHash parent = options_.hash_salt;
  prefix_query_blocks_ += full;
  for (int32_t i = 0; i < full; ++i) {
    auto blk = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    BlockHash h = HashBlock(parent, blk);
    auto it = by_hash_.find(h);
    if (it == by_hash_.end()) break;
    BlockId b = it->second;
    const Meta& m = meta_[static_cast<size_t>(b)];
    if (m.parent != parent || !TokensEqual(b, blk)) break;  // hash collision: treat as a miss
    ++prefix_hit_blocks_;
    out.push_back(b);
    parent = h;
  }
  for (BlockId b : out) {
    Meta& m = meta_[static_cast<size_t>(b)];
    if (m.ref == 0) {
      if (m.in_lru) {
        lru_.erase(m.lru_it);
        m.in_lru = false;
      }
      ++num_used_;
    }
    ++m.ref;
  }
  return out;
}

void BlockPool::CommitFullBlock(BlockId block, BlockHash parent, BlockHash hash,
                                std::span<const int32_t> block_tokens) {
  if (!options_.enable_prefix_cache) return;
  Meta& m = meta_[static_cast<size_t>(block)];
  assert(m.ref > 0);
  assert(block_tokens.size() == static_cast<size_t>(options_.block_size));
  if (m.hashed || by_hash_.count(hash) != 0) return;
  m.hashed = true;
  m.hash = hash;
  m.parent = parent;
  std::memcpy(&tokens_[static_cast<size_t>(block) * options_.block_size], block_tokens.data(),
              block_tokens.size_bytes());
  by_hash_.emplace(hash, block);
}

void BlockPool::Release(std::span<const BlockId> blocks) {
  // Walk in reverse so a sequence's earlier (shared-prefix) blocks end up most recently used and
  // are evicted after its tail.
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    Meta& m = meta_[static_cast<size_t>(*it)];
    assert(m.ref > 0);
    if (m.ref <= 0) continue;
    if (--m.ref > 0) continue;
    --num_used_;
    if (m.hashed) {
      lru_.push_back(*it);
      m.lru_it = std::prev(lru_.end());
      m.in_lru = true;
    } else {
      free_.insert(*it);
    }
  }
}

void BlockPool::AddRef(BlockId block) {
  Meta& m = meta_[static_cast<size_t>(block)];
  assert(m.ref > 0);
  ++m.ref;
}

BlockPool::Stats BlockPool::stats() const {
  Stats s;
  s.num_free = static_cast<int32_t>(free_.size());
  s.num_cached = static_cast<int32_t>(lru_.size());
  s.num_used = num_used_;
  s.prefix_query_blocks = prefix_query_blocks_;
  s.prefix_hit_blocks = prefix_hit_blocks_;
  s.evictions = evictions_;
  return s;
}

void BlockPool::ResetPrefixCache() {
  while (!lru_.empty()) Evict(lru_.front());
  for (auto& m : meta_) {
    if (m.hashed && m.ref > 0) {
      by_hash_.erase(m.hash);
      m.hashed = false;
    }
  }
}

}  // namespace kvpush
