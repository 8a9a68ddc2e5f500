#include "kv/block_checksum.h"

#include <xxhash.h>

#include <algorithm>

namespace kvpush {

uint64_t KvChunkHash(const KvLayout& layout, std::span<const std::byte> arena, int32_t layer,
                     KvKind kind, BlockId block) {
  return XXH3_64bits(arena.data() + layout.offset(layer, kind, block), layout.chunk_bytes());
}

uint64_t KvBlockChecksumFromChunks(std::span<const uint64_t> chunk_hashes) {
  return XXH3_64bits(chunk_hashes.data(), chunk_hashes.size_bytes());
}

uint64_t KvBlockChecksum(const KvLayout& layout, std::span<const std::byte> arena, BlockId block) {
  std::vector<uint64_t> h;
  h.reserve(static_cast<size_t>(layout.num_layers) * 2);
  for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      h.push_back(KvChunkHash(layout, arena, layer, kind, block));
    }
  }
  return KvBlockChecksumFromChunks(h);
}

uint64_t KvDigest(std::span<const uint64_t> block_checksums) {
  return XXH3_64bits(block_checksums.data(), block_checksums.size_bytes());
}

uint64_t KvDigestFromChunks(std::span<const uint64_t> chunk_hashes, int32_t num_layers) {
  const size_t per_block = 2 * static_cast<size_t>(num_layers);
  std::vector<uint64_t> sums;
  sums.reserve(chunk_hashes.size() / per_block);
  for (size_t i = 0; i + per_block <= chunk_hashes.size(); i += per_block) {
    sums.push_back(KvBlockChecksumFromChunks(chunk_hashes.subspan(i, per_block)));
  }
  return KvDigest(sums);
}

uint64_t KvBlocksDigest(const KvLayout& layout, std::span<const std::byte> arena,
                        std::span<const BlockId> blocks) {
  std::vector<uint64_t> sums;
  sums.reserve(blocks.size());
  for (BlockId b : blocks) sums.push_back(KvBlockChecksum(layout, arena, b));
  return KvDigest(sums);
}

KvDigestBuilder::KvDigestBuilder(size_t num_blocks, int32_t num_layers)
    : per_block_(static_cast<uint16_t>(2 * num_layers)),
      hashes_(num_blocks * per_block_, 0),
      seen_(num_blocks * per_block_, 0),
      counts_(num_blocks, 0),
      block_sums_(num_blocks, 0) {}

bool KvDigestBuilder::Add(size_t i, int32_t layer, KvKind kind, uint64_t hash) {
  const size_t k = Index(i, layer, kind);
  if (seen_[k] != 0) return false;
  seen_[k] = 1;
  hashes_[k] = hash;
  if (++counts_[i] == per_block_) {
    block_sums_[i] = KvBlockChecksumFromChunks(
        std::span<const uint64_t>(hashes_.data() + i * per_block_, per_block_));
  }
  return true;
}

std::optional<uint64_t> KvDigestBuilder::Digest(size_t from) const {
  for (size_t i = from; i < counts_.size(); ++i) {
    if (counts_[i] != per_block_) return std::nullopt;
  }
  return KvDigest(std::span<const uint64_t>(block_sums_).subspan(std::min(from, block_sums_.size())));
}

}  // namespace kvpush
