// PrefixIndex: the router's bounded memory of which prefix-block hashes (routing_policy.h,
// PrefixBlockHashes) it sent to one decode instance, used to estimate how many leading tokens of
// a prompt that instance holds in its prefix cache (docs/router.md, "Routing policies").
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>

namespace kvpush::router {

/// An LRU set of block hashes with a fixed capacity (blocks). An estimate only: D may have
/// evicted a block the index still holds (its cache is smaller or sees other traffic), or hold
/// one the index forgot. Not thread-safe (InstancePool guards it with its lock).
class PrefixIndex {
 public:
  /// `capacity` >= 1 hashes; the least recently touched ones are dropped beyond it.
  explicit PrefixIndex(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  /// How many leading hashes of `chain` (a prompt's chained block hashes) the index holds: the
  /// first miss ends the match (a chained hash implies its whole prefix).
  int64_t MatchedBlocks(std::span<const uint64_t> chain) const;

  /// Records every hash of `chain` as most recently used (the first hash ends up most recent, so
  /// a prompt's later blocks are dropped before its earlier ones, as D's LRU does).
  void Insert(std::span<const uint64_t> chain);

  size_t size() const { return map_.size(); }
  size_t capacity() const { return capacity_; }

 private:
  size_t capacity_;
  std::list<uint64_t> lru_;  ///< front = most recently used
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> map_;
};

}  // namespace kvpush::router
