// End-to-end KV block checksums (DESIGN.md §6 "end-to-end block checksums (XXH3) verified before
// use"; docs/pd_protocol.md §3 "Checksums").
//
// A block's KV lives in 2 * num_layers chunks of the arena (KvLayout: one (layer, K|V, block)
// chunk each, chunk_bytes() long). Definitions, all XXH3-64 with seed 0 over little-endian data:
//   chunk hash        h(l, kind, b) = XXH3-64(bytes of chunk (l, kind, b))
//   block checksum    c(b)          = XXH3-64(h(0,K,b), h(0,V,b), h(1,K,b), ..., h(L-1,V,b))
//   digest of blocks  D(b_0..b_k)   = XXH3-64(c(b_0), ..., c(b_k))
// The chunk level lets a producer hash each layer as soon as that layer's K/V are final (while
// the next layer computes), in any order, and combine at the end; the digest lets one 8-byte
// field cover a request's blocks whatever their number. Whole chunks are hashed, including the
// unused token slots of a partial last block: a transfer moves whole chunks, so both ends see the
// same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/layout.h"

namespace kvpush {

/// h(l, kind, b): hash of one chunk of `arena` (laid out as `layout`). Pure; indices must be in
/// range (caller's contract, as KvLayout::offset).
uint64_t KvChunkHash(const KvLayout& layout, std::span<const std::byte> arena, int32_t layer,
                     KvKind kind, BlockId block);

/// c(b) from its 2 * num_layers chunk hashes in (layer, K|V) order.
uint64_t KvBlockChecksumFromChunks(std::span<const uint64_t> chunk_hashes);

/// c(b) computed from the arena (hashes every chunk of block `block`). Pure.
uint64_t KvBlockChecksum(const KvLayout& layout, std::span<const std::byte> arena, BlockId block);

/// D over block checksums, in order.
uint64_t KvDigest(std::span<const uint64_t> block_checksums);

/// D of consecutive blocks from their chunk hashes, laid out block after block, each block's
/// 2 * num_layers hashes in (layer, K|V) order (the size must be a multiple of that).
uint64_t KvDigestFromChunks(std::span<const uint64_t> chunk_hashes, int32_t num_layers);

/// D(blocks) computed from the arena: KvDigest of KvBlockChecksum of each block, in order.
uint64_t KvBlocksDigest(const KvLayout& layout, std::span<const std::byte> arena,
                        std::span<const BlockId> blocks);

/// D of `num_blocks` consecutive blocks built up chunk hash by chunk hash, in any order, as a
/// producer hashes each layer once it is computed and a consumer each layer once it landed:
/// c(b) is computed as soon as the block's 2 * num_layers hashes are all in, so Digest() at the
/// end hashes only the block checksums (8 bytes a block) instead of every chunk hash (16 * L
/// bytes a block: 2 MiB for a 64k-token prompt of a 32-layer model, on the handoff's critical
/// path). Same value as KvDigestFromChunks over the same hashes.
/// Memory: 8 * (2L + 1) + 2L + 2 bytes a block. Not thread-safe (one owner).
class KvDigestBuilder {
 public:
  KvDigestBuilder() = default;
  KvDigestBuilder(size_t num_blocks, int32_t num_layers);

  size_t num_blocks() const { return counts_.size(); }
  /// Whether h(layer, kind) of block i is in. Indices must be in range.
  bool Has(size_t i, int32_t layer, KvKind kind) const { return seen_[Index(i, layer, kind)] != 0; }
  /// Records h(layer, kind) of block i. Returns false, changing nothing, if it was recorded
  /// already (the first hash counts). Indices must be in range.
  bool Add(size_t i, int32_t layer, KvKind kind, uint64_t hash);
  /// Whether every chunk of block i is in.
  bool BlockComplete(size_t i) const { return counts_[i] == per_block_; }
  /// D of blocks [from, num_blocks()), or nullopt while a chunk of one of them is missing.
  std::optional<uint64_t> Digest(size_t from = 0) const;

 private:
  size_t Index(size_t i, int32_t layer, KvKind kind) const {
    return i * per_block_ + static_cast<size_t>(layer) * 2 + static_cast<size_t>(kind);
  }

  uint16_t per_block_ = 0;
  std::vector<uint64_t> hashes_;       ///< [i * 2L + layer * 2 + kind]
  std::vector<uint8_t> seen_;          ///< same index: 1 once recorded
  std::vector<uint16_t> counts_;       ///< per block: chunks recorded
  std::vector<uint64_t> block_sums_;   ///< per block: c(b), valid once counts_ is full
};

}  // namespace kvpush
