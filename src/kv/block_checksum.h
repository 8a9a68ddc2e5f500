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

}  // namespace kvpush
