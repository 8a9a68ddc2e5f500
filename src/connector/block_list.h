// Block lists on the wire: the block ids of a PUSH_TARGET or PINNED (docs/pd_protocol.md §3,
// *Block lists*), as runs of consecutive ids, split into parts that each fit one notification.
//
// Encoding of one part's list (canonical; DecodeBlockRuns refuses anything else):
//   u32 nruns | nruns x (varint start, varint length)
// where a varint is unsigned LEB128 of at most 5 bytes in its shortest form, a run is the ids
// start, start+1, ..., start+length-1 (length >= 1, start + length <= 2^31), and a run never
// continues the one before it (start != the previous run's end; those would be one run). Runs
// of one part may not overlap. A freshly allocated block table is a few runs (8,192 blocks of a
// 128k-token prompt: 8 bytes when contiguous); a fully scattered one costs 2-5 bytes per block.
//
// Thread-safety: pure functions; a BlockListAssembly is owned by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvpush::connector {

/// Bytes `ids` take encoded as runs (AppendBlockRuns). Ids must be >= 0.
size_t BlockRunsBytes(std::span<const int32_t> ids);

/// Appends `ids` (each >= 0) encoded as runs to `out`.
void AppendBlockRuns(std::vector<uint8_t>& out, std::span<const int32_t> ids);

/// Decodes runs that fill `bytes` exactly into `count` ids appended to `out`. `count` is the
/// part's declared id count (checked against the runs' total before anything is expanded).
/// Errors: kInvalidArgument (truncated, trailing bytes, a non-shortest or over-long varint, an
/// empty run, an id >= 2^31, runs that overlap or continue each other, a total != count).
Status DecodeBlockRuns(std::span<const uint8_t> bytes, uint32_t count, std::vector<int32_t>& out);

/// Splits `ids` into consecutive parts, each of at most `max_part_ids` ids whose runs encode to at
/// most `max_bytes` bytes (>= 16). Returns (offset, count) per part, in order; one part for an
/// empty list. Linear in ids.size().
std::vector<std::pair<uint32_t, uint32_t>> SplitBlockList(std::span<const int32_t> ids,
                                                          size_t max_bytes, uint32_t max_part_ids);

/// True when some id occurs twice in `ids` (O(n log n), copies).
bool HasDuplicateBlocks(std::span<const int32_t> ids);

/// Collects the parts of one block list of `total` ids, in any order. Memory: 5 bytes per id.
/// The ids of the list's longest received prefix are usable before the list is complete (a push
/// target D announces in parts as its pool frees blocks: docs/pd_protocol.md §3).
class BlockListAssembly {
 public:
  BlockListAssembly() = default;
  explicit BlockListAssembly(uint32_t total) : ids_(total), have_(total, 0) {}
  /// Adds the part at [offset, offset + ids.size()). Errors: kInvalidArgument (empty, beyond
  /// the list's end, or overlapping a part already added); nothing is changed then.
  Status Add(uint32_t offset, std::span<const int32_t> ids);
  uint32_t total() const { return static_cast<uint32_t>(ids_.size()); }
  uint32_t received() const { return received_; }
  bool complete() const { return received_ == total(); }
  /// True when id `i` (< total()) was received.
  bool Has(uint32_t i) const { return have_[i] != 0; }
  /// Ids [0, prefix()) were all received (the longest such prefix).
  uint32_t prefix() const { return prefix_; }
  /// The list's slots: id i is valid for i < prefix() (and wherever a part was added).
  std::span<const int32_t> ids() const { return ids_; }
  /// The whole list once complete (empties the assembly).
  std::vector<int32_t> Take() {
    prefix_ = received_ = 0;
    have_.clear();
    return std::exchange(ids_, {});
  }

 private:
  std::vector<int32_t> ids_;
  std::vector<uint8_t> have_;
  uint32_t received_ = 0;
  uint32_t prefix_ = 0;
};

}  // namespace kvpush::connector
