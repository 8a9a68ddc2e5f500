// KvDigestBuilder (kv/block_checksum.h): the digest built chunk by chunk, in any order, equals
// KvDigestFromChunks over the same hashes; incomplete blocks give no digest.
#include "kv/block_checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

namespace kvpush {
namespace {

constexpr int32_t kLayers = 3;
constexpr size_t kPerBlock = 2 * kLayers;

std::vector<uint64_t> RandomHashes(size_t blocks, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> h(blocks * kPerBlock);
  for (uint64_t& x : h) x = rng();
  return h;
}

/// Adds every chunk of blocks [from, to) to `b`, from `h` laid out as KvDigestFromChunks reads it.
void AddBlocks(KvDigestBuilder& b, const std::vector<uint64_t>& h, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i) {
    for (int32_t l = 0; l < kLayers; ++l) {
      for (KvKind k : {KvKind::kKey, KvKind::kValue}) {
        ASSERT_TRUE(b.Add(i, l, k, h[i * kPerBlock + static_cast<size_t>(l) * 2 +
                                     static_cast<size_t>(k)]));
      }
    }
  }
}

TEST(KvDigestBuilderTest, AnyOrderGivesTheDigestOfTheChunkList) {
  const size_t blocks = 9;
  const std::vector<uint64_t> h = RandomHashes(blocks, 1);
  std::vector<std::tuple<size_t, int32_t, KvKind>> order;
  for (size_t i = 0; i < blocks; ++i) {
    for (int32_t l = 0; l < kLayers; ++l) {
      for (KvKind k : {KvKind::kKey, KvKind::kValue}) order.emplace_back(i, l, k);
    }
  }
  std::mt19937 rng(7);
  for (int round = 0; round < 5; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    KvDigestBuilder b(blocks, kLayers);
    for (size_t n = 0; n < order.size(); ++n) {
      EXPECT_FALSE(b.Digest().has_value()) << "digest after " << n << " of " << order.size();
      const auto [i, l, k] = order[n];
      EXPECT_FALSE(b.Has(i, l, k));
      EXPECT_TRUE(b.Add(i, l, k, h[i * kPerBlock + static_cast<size_t>(l) * 2 +
                                   static_cast<size_t>(k)]));
      EXPECT_TRUE(b.Has(i, l, k));
    }
    ASSERT_TRUE(b.Digest().has_value());
    EXPECT_EQ(*b.Digest(), KvDigestFromChunks(h, kLayers));
    for (size_t from = 0; from <= blocks; ++from) {
      EXPECT_EQ(*b.Digest(from),
                KvDigestFromChunks(std::span<const uint64_t>(h).subspan(from * kPerBlock), kLayers))
          << "from block " << from;
    }
  }
}

TEST(KvDigestBuilderTest, TheFirstHashOfAChunkCounts) {
  const std::vector<uint64_t> h = RandomHashes(2, 2);
  KvDigestBuilder b(2, kLayers);
  AddBlocks(b, h, 0, 2);
  for (size_t i = 0; i < 2; ++i) {
    for (int32_t l = 0; l < kLayers; ++l) {
      for (KvKind k : {KvKind::kKey, KvKind::kValue}) {
        const uint64_t x = h[i * kPerBlock + static_cast<size_t>(l) * 2 + static_cast<size_t>(k)];
        EXPECT_FALSE(b.Add(i, l, k, x ^ 1)) << "a repeated chunk replaced the first hash";
      }
    }
  }
  EXPECT_EQ(*b.Digest(), KvDigestFromChunks(h, kLayers));
}

TEST(KvDigestBuilderTest, DigestFromSkipsOnlyTheBlocksBeforeIt) {
  const std::vector<uint64_t> h = RandomHashes(4, 3);
  KvDigestBuilder b(4, kLayers);
  // Blocks 2 and 3 complete, block 0 and 1 empty (a target that starts at block 2).
  AddBlocks(b, h, 2, 4);
  EXPECT_FALSE(b.BlockComplete(1));
  EXPECT_TRUE(b.BlockComplete(2));
  EXPECT_FALSE(b.Digest(0).has_value());
  EXPECT_FALSE(b.Digest(1).has_value());
  ASSERT_TRUE(b.Digest(2).has_value());
  EXPECT_EQ(*b.Digest(2),
            KvDigestFromChunks(std::span<const uint64_t>(h).subspan(2 * kPerBlock), kLayers));
  EXPECT_EQ(*b.Digest(4), KvDigest({}));
  EXPECT_EQ(*KvDigestBuilder().Digest(), KvDigest({}));
}

}  // namespace
}  // namespace kvpush
