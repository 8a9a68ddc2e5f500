// Routing policies (router/routing_policy.h) and the router's prefix index (router/prefix_index.h):
// pure functions over candidate snapshots, no sockets.
#include "router/routing_policy.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "router/instance_pool.h"
#include "router/prefix_index.h"

namespace kvpush::router {
namespace {

std::vector<int32_t> Tokens(int n, int32_t base = 1) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(base + i);
  return t;
}

std::vector<DecodeCandidate> Ds(std::vector<int64_t> outstanding,
                                std::vector<int64_t> cached = {}) {
  std::vector<DecodeCandidate> c;
  for (size_t i = 0; i < outstanding.size(); ++i) {
    c.push_back(DecodeCandidate{"http://127.0.0.1:" + std::to_string(9000 + i), outstanding[i],
                                i < cached.size() ? cached[i] : 0});
  }
  return c;
}

TEST(RoutingPolicyTest, ParsesNames) {
  EXPECT_EQ(*ParseRoutingPolicy("cache-aware"), RoutingPolicy::kCacheAware);
  EXPECT_EQ(*ParseRoutingPolicy("least-outstanding"), RoutingPolicy::kLeastOutstanding);
  EXPECT_FALSE(ParseRoutingPolicy("random").ok());
  EXPECT_STREQ(RoutingPolicyName(RoutingPolicy::kCacheAware), "cache-aware");
}

TEST(RoutingPolicyTest, BlockHashesAreChainedOverFullBlocks) {
  const auto h = PrefixBlockHashes(Tokens(40), 16);
  ASSERT_EQ(h.size(), 2u);  // the partial third block has no hash
  // A prompt that shares the first block shares its hash; the chain makes block 1 differ when
  // block 0 differs even if block 1's tokens are equal.
  std::vector<int32_t> other = Tokens(40);
  other[3] = 999;
  const auto g = PrefixBlockHashes(other, 16);
  EXPECT_NE(h[0], g[0]);
  EXPECT_NE(h[1], g[1]);
  std::vector<int32_t> longer = Tokens(64);
  const auto l = PrefixBlockHashes(longer, 16);
  ASSERT_EQ(l.size(), 4u);
  EXPECT_EQ(l[0], h[0]);
  EXPECT_EQ(l[1], h[1]);
  EXPECT_TRUE(PrefixBlockHashes(Tokens(15), 16).empty());
  EXPECT_TRUE(PrefixBlockHashes(Tokens(15), 0).empty());
}

TEST(RoutingPolicyTest, RendezvousIsStableAndSpreadsKeys) {
  const auto ds = Ds({0, 0, 0});
  std::map<size_t, int> owners;
  for (int32_t conv = 0; conv < 300; ++conv) {
    const auto h = PrefixBlockHashes(Tokens(32, 1000 * conv), 16);
    const auto a = ChooseDecodeCacheAware(ds, h, {}, 0);
    const auto b = ChooseDecodeCacheAware(ds, h, {}, 2);  // the cursor does not matter
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->index, b->index);
    EXPECT_EQ(a->reason, DecodeReason::kRendezvous);
    EXPECT_FALSE(a->load_cap_override);
    ++owners[a->index];
    // A longer prompt with the same first block (the next turn) has the same owner.
    const auto next = PrefixBlockHashes(Tokens(80, 1000 * conv), 16);
    EXPECT_EQ(ChooseDecodeCacheAware(ds, next, {}, 0)->index, a->index);
  }
  ASSERT_EQ(owners.size(), 3u);
  for (const auto& [d, n] : owners) EXPECT_GT(n, 50) << "D " << d << " owns too few keys";
}

TEST(RoutingPolicyTest, RendezvousMovesOnlyTheLeavingInstancesKeys) {
  const auto three = Ds({0, 0, 0});
  std::vector<DecodeCandidate> two = {three[0], three[2]};  // D 1 left
  for (int32_t conv = 0; conv < 200; ++conv) {
    const auto h = PrefixBlockHashes(Tokens(16, 77 * conv), 16);
    const size_t before = ChooseDecodeCacheAware(three, h, {}, 0)->index;
    const size_t after = ChooseDecodeCacheAware(two, h, {}, 0)->index;
    if (before != 1) {
      EXPECT_EQ(two[after].url, three[before].url);
    }
  }
}

TEST(RoutingPolicyTest, MostCachedBlocksWinsOverRendezvous) {
  const auto h = PrefixBlockHashes(Tokens(64), 16);
  const size_t owner = ChooseDecodeCacheAware(Ds({0, 0}), h, {}, 0)->index;
  const size_t other = 1 - owner;
  std::vector<int64_t> cached(2, 0);
  cached[other] = 3;
  cached[owner] = 1;
  const auto c = ChooseDecodeCacheAware(Ds({0, 0}, cached), h, {}, 0);
  EXPECT_EQ(c->index, other);
  EXPECT_EQ(c->cached_blocks, 3);
  EXPECT_EQ(c->reason, DecodeReason::kPrefixHit);
}

TEST(RoutingPolicyTest, ASharedHeadDoesNotPinEveryPromptToOneOwner) {
  // Every D holds the same 2-block system prompt: the key is the first block past it, so
  // conversations that differ after it spread over the Ds.
  const auto ds = Ds({0, 0, 0}, {2, 2, 2});
  std::map<size_t, int> owners;
  for (int32_t conv = 0; conv < 120; ++conv) {
    std::vector<int32_t> t = Tokens(32);
    const std::vector<int32_t> own = Tokens(32, 5000 + 100 * conv);
    t.insert(t.end(), own.begin(), own.end());
    const auto c = ChooseDecodeCacheAware(ds, PrefixBlockHashes(t, 16), {}, 0);
    EXPECT_EQ(c->reason, DecodeReason::kPrefixHit);
    ++owners[c->index];
  }
  EXPECT_EQ(owners.size(), 3u);
}

TEST(RoutingPolicyTest, LoadCapSkipsAnOverloadedOwner) {
  const auto h = PrefixBlockHashes(Tokens(64), 16);
  const size_t owner = ChooseDecodeCacheAware(Ds({0, 0}), h, {}, 0)->index;
  std::vector<int64_t> out(2, 0), cached(2, 0);
  cached[owner] = 4;
  // cap = ceil(1.25 * (total + 1) / 2): owner 1, other 0 -> cap 2, the owner takes a second.
  out[owner] = 1;
  auto c = ChooseDecodeCacheAware(Ds(out, cached), h, {1.25}, 0);
  EXPECT_EQ(c->index, owner);
  EXPECT_FALSE(c->load_cap_override);
  // Owner 2, other 0 -> cap ceil(1.25 * 3 / 2) = 2: 2 + 1 > 2, the other D takes it.
  out[owner] = 2;
  c = ChooseDecodeCacheAware(Ds(out, cached), h, {1.25}, 0);
  EXPECT_EQ(c->index, 1 - owner);
  EXPECT_TRUE(c->load_cap_override);
  EXPECT_EQ(c->cached_blocks, 0);
  EXPECT_EQ(c->reason, DecodeReason::kRendezvous);
  // A looser cap keeps it on the owner.
  c = ChooseDecodeCacheAware(Ds(out, cached), h, {3.0}, 0);
  EXPECT_EQ(c->index, owner);
}

TEST(RoutingPolicyTest, OneHotPrefixSpreadsUnderTheCap) {
  // Every request has the same prefix: with the cap, outstanding legs stay within
  // ceil(c * (total + 1) / n) of each D.
  const auto h = PrefixBlockHashes(Tokens(64), 16);
  std::vector<int64_t> out(4, 0), cached(4, 0);
  for (int k = 0; k < 40; ++k) {
    const auto c = ChooseDecodeCacheAware(Ds(out, cached), h, {1.25}, 0);
    ++out[c->index];
    cached[c->index] = 4;
  }
  int used = 0;
  for (int64_t o : out) {
    EXPECT_LE(o, 13);  // ceil(1.25 * 40 / 4) = 13
    used += o > 0 ? 1 : 0;
  }
  EXPECT_GE(used, 3);  // the owner filled to the cap, the next ones in rendezvous order took the rest
}

TEST(RoutingPolicyTest, ShortPromptFallsBackToLeastOutstanding) {
  const auto c = ChooseDecodeCacheAware(Ds({3, 1, 1}), {}, {}, 2);
  EXPECT_EQ(c->index, 2u);  // a tie between 1 and 2: the first from the cursor
  EXPECT_EQ(c->reason, DecodeReason::kLeastOutstanding);
  EXPECT_FALSE(ChooseDecodeCacheAware({}, {}, {}, 0));
  EXPECT_EQ(*ChooseLeastOutstanding(Ds({2, 1, 1}), 0), 1u);
}

TEST(RoutingPolicyTest, PrefillByOutstandingTokens) {
  std::vector<PrefillCandidate> p = {{500, 1}, {100, 3}, {100, 2}};
  EXPECT_EQ(*ChoosePrefillByTokens(p, 0), 2u);  // fewest tokens, then fewest legs
  p = {{0, 0}, {0, 0}};
  EXPECT_EQ(*ChoosePrefillByTokens(p, 1), 1u);  // full tie: the cursor
  EXPECT_FALSE(ChoosePrefillByTokens({}, 0));
}

TEST(RoutingPolicyTest, LocalPrefillThreshold) {
  EXPECT_EQ(ShouldSkipPrefill(100, 0, 0), SkipReason::kNone);    // off
  EXPECT_EQ(ShouldSkipPrefill(-1, 0, 64), SkipReason::kNone);    // not tokenized
  EXPECT_EQ(ShouldSkipPrefill(20, 0, 64), SkipReason::kThreshold);
  EXPECT_EQ(ShouldSkipPrefill(100, 0, 64), SkipReason::kNone);
  EXPECT_EQ(ShouldSkipPrefill(100, 48, 64), SkipReason::kCached);   // 52 uncached
  EXPECT_EQ(ShouldSkipPrefill(100, 36, 64), SkipReason::kNone);     // 64 uncached: not below
  EXPECT_EQ(ShouldSkipPrefill(100, 500, 2), SkipReason::kCached);   // clamped: 1 uncached
  EXPECT_EQ(ShouldSkipPrefill(100, 500, 1), SkipReason::kNone);     // D computes >= 1 token
}

TEST(PrefixIndexTest, MatchesLeadingBlocksAndEvictsLru) {
  PrefixIndex idx(6);
  const auto a = PrefixBlockHashes(Tokens(64, 1), 16);    // 4 blocks
  const auto a2 = PrefixBlockHashes(Tokens(96, 1), 16);   // the same 4 + 2 more
  const auto b = PrefixBlockHashes(Tokens(64, 500), 16);  // 4 other blocks
  EXPECT_EQ(idx.MatchedBlocks(a), 0);
  idx.Insert(a);
  EXPECT_EQ(idx.MatchedBlocks(a), 4);
  EXPECT_EQ(idx.MatchedBlocks(a2), 4);
  idx.Insert(b);  // 8 > 6: a's last two blocks (least recent) go first
  EXPECT_EQ(idx.size(), 6u);
  EXPECT_EQ(idx.MatchedBlocks(b), 4);
  EXPECT_EQ(idx.MatchedBlocks(a), 2);
  idx.Insert(a2);
  EXPECT_EQ(idx.MatchedBlocks(a2), 6);
  EXPECT_EQ(idx.MatchedBlocks(b), 0);  // b's first block was the least recent of b's
}

TEST(HealthBodyTest, ParsesLoadAndBlockSize) {
  const ReportedLoad r = ParseHealthBody(
      R"({"status":"ok","block_size":16,"load":{"outstanding_prefill_tokens":120,"running":3,)"
      R"("waiting":2}})");
  EXPECT_TRUE(r.reported);
  EXPECT_EQ(r.block_size, 16);
  EXPECT_EQ(r.outstanding_prefill_tokens, 120);
  EXPECT_EQ(r.running, 3);
  EXPECT_EQ(r.waiting, 2);
  const ReportedLoad old = ParseHealthBody("");
  EXPECT_FALSE(old.reported);
  EXPECT_EQ(old.block_size, 0);
  EXPECT_FALSE(ParseHealthBody("not json").reported);
}

}  // namespace
}  // namespace kvpush::router
