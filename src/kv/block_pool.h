// BlockPool: allocation, reference counts and the prefix cache of one instance's KV blocks.
//
// Block states (DESIGN.md §5): free -> allocated (ref > 0) -> filled (full block committed with its
// prefix hash) -> cached (ref == 0, hashed, LRU-evictable) -> free (on eviction).
//
// Prefix cache: a full block is identified by a chained hash of token ids,
//   h_0 = salt,  h_i = XXH3_64bits_withSeed(tokens of block i as int32 LE, seed = h_{i-1}),
// (xxHash XXH3, https://github.com/Cyan4973/xxHash). A lookup also compares the stored token ids
// and parent hash, so a 64-bit collision can never return a wrong block.
//
// Allocation prefers contiguous runs of block ids (fewer transfer descriptors): AllocateAppend
// first tries the block right after the table's last block, fresh allocations take the first free
// run that fits; free (never cached) blocks are used before cached blocks are evicted (LRU order).
// With Options::scatter (a benchmark of fragmented KV memory, `--kv-block-allocation scattered`)
// every free block is drawn pseudo-randomly instead (splitmix64, fixed seed), never adjacent to the
// table's previous block when another free block exists, so a request's descriptors cannot
// coalesce: one transfer op per (layer, K|V, block).
//
// Thread-safety: not thread-safe. Owned by the engine thread (DESIGN.md: one owner per state).
#pragma once

#include <cstdint>
#include <list>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kv/layout.h"

namespace kvpush {

using BlockHash = uint64_t;

class BlockPool {
 public:
  struct Options {
    int32_t num_blocks = 0;
    int32_t block_size = 16;  ///< tokens per block
    bool enable_prefix_cache = true;
    uint64_t hash_salt = 0;  ///< root of the hash chain (e.g. a model fingerprint)
    bool scatter = false;    ///< draw free blocks pseudo-randomly (fragmented memory; see above)
  };

  /// Counters for /metrics. Monotonic except the gauges (free/cached/used).
  struct Stats {
    int32_t num_free = 0;             ///< never-cached free blocks
    int32_t num_cached = 0;           ///< ref 0, hashed, evictable
    int32_t num_used = 0;             ///< ref > 0
    int64_t prefix_query_blocks = 0;  ///< full blocks looked up
    int64_t prefix_hit_blocks = 0;    ///< of which found in the cache
    int64_t evictions = 0;
  };

  explicit BlockPool(const Options& options);

  int32_t num_blocks() const { return options_.num_blocks; }
  int32_t block_size() const { return options_.block_size; }

  /// Blocks that an allocation could take now: free + cached (evictable).
  int32_t num_available() const;

  /// Appends `n` new blocks (ref 1, unhashed) to `table`, preferring the ids right after
  /// table.back(), then the first free run that fits, evicting LRU cached blocks when free ones
  /// run out. All-or-nothing. Errors: kResourceExhausted when fewer than n blocks are available.
  Status AllocateAppend(int32_t n, std::vector<BlockId>& table);

  /// Looks up the longest cached prefix of full blocks of `tokens` (at most `max_blocks` blocks).
  /// Takes one reference on each returned block (a cached block leaves the LRU). Returns the block
  /// ids in order; matched tokens = result.size() * block_size. Counts the lookup in Stats.
  std::vector<BlockId> MatchPrefix(std::span<const int32_t> tokens, int32_t max_blocks);

  /// Hash of block `index` of a token sequence given its parent hash (salt for index 0).
  BlockHash HashBlock(BlockHash parent, std::span<const int32_t> block_tokens) const;
  BlockHash root_hash() const { return options_.hash_salt; }

  /// Marks an allocated, completely written block as holding `block_tokens` (block_size ids) whose
  /// chain hash is `hash` with parent `parent`. It becomes findable by MatchPrefix at once and
  /// stays cached after release. If another block already holds that hash, nothing is recorded for
  /// this one (it is freed normally on release). No-op when the prefix cache is disabled.
  void CommitFullBlock(BlockId block, BlockHash parent, BlockHash hash,
                       std::span<const int32_t> block_tokens);

  /// Drops one reference on each block. At zero, a committed block joins the LRU cache (most
  /// recently used end, in the given order reversed so earlier blocks are evicted last), others
  /// become free. Releasing a block with ref 0 is a bug (asserts in debug, ignored otherwise).
  void Release(std::span<const BlockId> blocks);

  /// Takes an extra reference on an allocated block (sharing). The block must have ref > 0.
  void AddRef(BlockId block);

  int32_t ref_count(BlockId block) const { return meta_[static_cast<size_t>(block)].ref; }

  Stats stats() const;

  /// Drops every cached (ref 0) block from the prefix cache; they become free.
  void ResetPrefixCache();

 private:
  struct Meta {
    int32_t ref = 0;
    bool hashed = false;
    BlockHash hash = 0;
    BlockHash parent = 0;
    std::list<BlockId>::iterator lru_it;
    bool in_lru = false;
  };

  BlockId TakeFree(BlockId preferred);
  BlockId TakeScattered(BlockId previous);
  void Evict(BlockId block);
  bool TokensEqual(BlockId block, std::span<const int32_t> tokens) const;

  Options options_;
  std::vector<Meta> meta_;
  std::vector<int32_t> tokens_;  // [num_blocks * block_size]: token ids of hashed blocks
  std::set<BlockId> free_;       // never-cached free blocks, ordered for run search
  std::list<BlockId> lru_;       // cached blocks, front = least recently used
  std::unordered_map<BlockHash, BlockId> by_hash_;
  int32_t num_used_ = 0;
  int64_t prefix_query_blocks_ = 0;
  int64_t prefix_hit_blocks_ = 0;
  int64_t evictions_ = 0;
  uint64_t scatter_state_ = 0x9E3779B97F4A7C15ull;  // splitmix64 state (Options::scatter)
};

}  // namespace kvpush
