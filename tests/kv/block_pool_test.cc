#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <vector>

namespace kvpush {
namespace {

BlockPool::Options Opts(int32_t blocks, int32_t block_size = 4) {
  BlockPool::Options o;
  o.num_blocks = blocks;
  o.block_size = block_size;
  o.hash_salt = 0x1234;
  return o;
}

std::vector<int32_t> Iota(int32_t n, int32_t start = 100) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Allocates and commits every full block of `tokens` like the engine does after prefill.
std::vector<BlockId> FillSequence(BlockPool& pool, const std::vector<int32_t>& tokens) {
  std::vector<BlockId> table;
  const int32_t bs = pool.block_size();
  const int32_t need = (static_cast<int32_t>(tokens.size()) + bs - 1) / bs;
  EXPECT_TRUE(pool.AllocateAppend(need, table).ok());
  BlockHash parent = pool.root_hash();
  for (int32_t i = 0; i < static_cast<int32_t>(tokens.size()) / bs; ++i) {
    std::span<const int32_t> blk(tokens.data() + static_cast<size_t>(i) * bs,
                                 static_cast<size_t>(bs));
    BlockHash h = pool.HashBlock(parent, blk);
    pool.CommitFullBlock(table[static_cast<size_t>(i)], parent, h, blk);
    parent = h;
  }
  return table;
}

TEST(BlockPoolTest, AllocatesContiguousRunsAndExtendsInPlace) {
  BlockPool pool(Opts(16));
  std::vector<BlockId> a;
  ASSERT_TRUE(pool.AllocateAppend(3, a).ok());
  EXPECT_EQ(a, (std::vector<BlockId>{0, 1, 2}));
  std::vector<BlockId> b;
  ASSERT_TRUE(pool.AllocateAppend(2, b).ok());
  EXPECT_EQ(b, (std::vector<BlockId>{3, 4}));
  pool.Release(a);  // frees 0..2
  ASSERT_TRUE(pool.AllocateAppend(1, b).ok());
  EXPECT_EQ(b.back(), 5);  // extends b right after its last block
  std::vector<BlockId> c;
  ASSERT_TRUE(pool.AllocateAppend(4, c).ok());
  EXPECT_EQ(c, (std::vector<BlockId>{6, 7, 8, 9}));  // 0..2 is too short a run for 4
  std::vector<BlockId> d;
  ASSERT_TRUE(pool.AllocateAppend(3, d).ok());
  EXPECT_EQ(d, (std::vector<BlockId>{0, 1, 2}));
}

TEST(BlockPoolTest, ScatteredAllocationNeverPlacesNeighboursAdjacent) {
  BlockPool::Options o = Opts(1024);
  o.scatter = true;
  BlockPool pool(o);
  std::vector<BlockId> a;
  ASSERT_TRUE(pool.AllocateAppend(100, a).ok());
  ASSERT_TRUE(pool.AllocateAppend(28, a).ok());  // extending does not continue a run either
  std::set<BlockId> distinct(a.begin(), a.end());
  EXPECT_EQ(distinct.size(), a.size());
  for (size_t i = 1; i < a.size(); ++i) {
    EXPECT_NE(a[i], a[i - 1] + 1) << "block " << i;
    EXPECT_NE(a[i], a[i - 1] - 1) << "block " << i;
  }
  // The whole pool can still be allocated (the last draws take whatever is left), all distinct.
  std::vector<BlockId> rest;
  ASSERT_TRUE(pool.AllocateAppend(1024 - 128, rest).ok());
  distinct.insert(rest.begin(), rest.end());
  EXPECT_EQ(distinct.size(), 1024u);
  EXPECT_FALSE(pool.AllocateAppend(1, rest).ok());
  pool.Release(a);
  pool.Release(rest);
  EXPECT_EQ(pool.stats().num_free, 1024);
}

TEST(BlockPoolTest, ExhaustionIsAllOrNothing) {
  BlockPool pool(Opts(4));
  std::vector<BlockId> a;
  ASSERT_TRUE(pool.AllocateAppend(3, a).ok());
  std::vector<BlockId> b;
  Status s = pool.AllocateAppend(2, b);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.num_available(), 1);
  pool.Release(a);
  EXPECT_EQ(pool.stats().num_free, 4);
  EXPECT_EQ(pool.stats().num_used, 0);
}

TEST(BlockPoolTest, PrefixCacheReturnsCommittedBlocksAfterRelease) {
  BlockPool pool(Opts(16));
  auto tokens = Iota(10);  // 2 full blocks + 2 tokens
  auto table = FillSequence(pool, tokens);
  ASSERT_EQ(table.size(), 3u);
  pool.Release(table);
  EXPECT_EQ(pool.stats().num_cached, 2);
  EXPECT_EQ(pool.stats().num_used, 0);

  auto hit = pool.MatchPrefix(tokens, 100);
  EXPECT_EQ(hit, (std::vector<BlockId>{table[0], table[1]}));
  EXPECT_EQ(pool.ref_count(table[0]), 1);
  EXPECT_EQ(pool.stats().num_cached, 0);
  EXPECT_EQ(pool.stats().prefix_hit_blocks, 2);

  // A different second block matches only the first.
  auto other = tokens;
  other[5] = 7;
  auto hit2 = pool.MatchPrefix(other, 100);
  EXPECT_EQ(hit2, (std::vector<BlockId>{table[0]}));
  EXPECT_EQ(pool.ref_count(table[0]), 2);
  pool.Release(hit);
  pool.Release(hit2);
  EXPECT_EQ(pool.stats().num_used, 0);
}

TEST(BlockPoolTest, MatchRespectsMaxBlocks) {
  BlockPool pool(Opts(16));
  auto tokens = Iota(8);
  auto table = FillSequence(pool, tokens);
  pool.Release(table);
  EXPECT_EQ(pool.MatchPrefix(tokens, 1).size(), 1u);
}

TEST(BlockPoolTest, EvictsLeastRecentlyUsedCachedBlocksWhenFreeRunsOut) {
  BlockPool pool(Opts(4));
  auto t1 = Iota(8, 0);
  auto t2 = Iota(8, 50);
  auto a = FillSequence(pool, t1);
  pool.Release(a);
  auto b = FillSequence(pool, t2);
  pool.Release(b);
  EXPECT_EQ(pool.stats().num_cached, 4);
  EXPECT_EQ(pool.stats().num_free, 0);
  // Allocating 2 evicts t1's blocks (least recently used), t2 stays findable.
  std::vector<BlockId> c;
  ASSERT_TRUE(pool.AllocateAppend(2, c).ok());
  EXPECT_EQ(pool.stats().evictions, 2);
  EXPECT_TRUE(pool.MatchPrefix(t1, 10).empty());
  auto hit = pool.MatchPrefix(t2, 10);
  EXPECT_EQ(hit.size(), 2u);
  pool.Release(hit);
  pool.Release(c);
}

TEST(BlockPoolTest, DisabledPrefixCacheNeverMatches) {
  auto o = Opts(8);
  o.enable_prefix_cache = false;
  BlockPool pool(o);
  auto tokens = Iota(8);
  auto table = FillSequence(pool, tokens);
  pool.Release(table);
  EXPECT_TRUE(pool.MatchPrefix(tokens, 10).empty());
  EXPECT_EQ(pool.stats().num_free, 8);
}

TEST(BlockPoolTest, SaltSeparatesModels) {
  BlockPool a(Opts(4));
  auto o = Opts(4);
  o.hash_salt = 99;
  BlockPool b(o);
  auto t = Iota(4);
  EXPECT_NE(a.HashBlock(a.root_hash(), t), b.HashBlock(b.root_hash(), t));
}

}  // namespace
}  // namespace kvpush
