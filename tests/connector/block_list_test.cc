// docs/pd_protocol.md §3, *Block lists*: runs of consecutive ids, their split into parts that
// fit a notification, and the reassembly of the parts (src/connector/block_list.h).
#include "connector/block_list.h"

#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

namespace kvpush::connector {
namespace {

std::vector<int32_t> RoundTrip(const std::vector<int32_t>& ids) {
  std::vector<uint8_t> b;
  AppendBlockRuns(b, ids);
  EXPECT_EQ(b.size(), BlockRunsBytes(ids));
  std::vector<int32_t> out;
  Status s = DecodeBlockRuns(b, static_cast<uint32_t>(ids.size()), out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

TEST(BlockList, RunsRoundTripAndSizes) {
  std::vector<int32_t> contiguous(8192);
  std::iota(contiguous.begin(), contiguous.end(), 100);
  EXPECT_EQ(RoundTrip(contiguous), contiguous);
  EXPECT_EQ(BlockRunsBytes(contiguous), 4u + 1 + 2);  // one run: start 100, length 8192
  const std::vector<int32_t> edge = {0x7fffffff, 0, 5, 6, 7, 1};
  EXPECT_EQ(RoundTrip(edge), edge);
  EXPECT_EQ(BlockRunsBytes(edge), 4u + (5 + 1) + (1 + 1) + (1 + 1) + (1 + 1));
  // A scattered list of a 2^16-block pool: 4 bytes a block (3-byte start, 1-byte length).
  std::vector<int32_t> scattered;
  for (int32_t i = 0; i < 1000; ++i) scattered.push_back(20000 + ((i * 37) % 1000) * 2);
  EXPECT_EQ(RoundTrip(scattered), scattered);
  EXPECT_EQ(BlockRunsBytes(scattered), 4u + 1000 * 4);
  std::vector<uint8_t> b;
  AppendBlockRuns(b, std::vector<int32_t>{});
  EXPECT_EQ(b, (std::vector<uint8_t>{0, 0, 0, 0}));
  std::vector<int32_t> none;
  EXPECT_TRUE(DecodeBlockRuns(b, 0, none).ok());
}

TEST(BlockList, DecodeRefusesACountTheRunsDoNotName) {
  std::vector<uint8_t> b;
  AppendBlockRuns(b, std::vector<int32_t>{4, 5, 6});
  std::vector<int32_t> out;
  EXPECT_FALSE(DecodeBlockRuns(b, 2, out).ok());
  EXPECT_FALSE(DecodeBlockRuns(b, 4, out).ok());
  EXPECT_TRUE(out.empty());  // nothing expanded from a refused list
  // More runs declared than ids, or than the bytes can hold: refused before reading them.
  b = {0xff, 0xff, 0xff, 0xff, 1, 1};
  EXPECT_FALSE(DecodeBlockRuns(b, 0xffffffffu, out).ok());
  EXPECT_FALSE(DecodeBlockRuns({}, 0, out).ok());  // no run count at all
}

TEST(BlockList, SplitKeepsEveryPartUnderTheBudget) {
  std::mt19937 rng(27);
  for (size_t budget : {16u, 64u, 3072u}) {
    for (uint32_t max_part : {1u, 7u, 65536u}) {
      std::vector<int32_t> ids(5000);
      std::iota(ids.begin(), ids.end(), 0);
      std::shuffle(ids.begin(), ids.begin() + 2500, rng);  // half scattered, half runs
      auto parts = SplitBlockList(ids, budget, max_part);
      uint32_t next = 0;
      BlockListAssembly a(static_cast<uint32_t>(ids.size()));
      for (auto [offset, n] : parts) {
        ASSERT_EQ(offset, next);
        ASSERT_GT(n, 0u);
        ASSERT_LE(n, max_part);
        const std::span<const int32_t> part(ids.data() + offset, n);
        EXPECT_LE(BlockRunsBytes(part), budget);
        ASSERT_TRUE(a.Add(offset, part).ok());
        next += n;
      }
      EXPECT_EQ(next, ids.size());
      ASSERT_TRUE(a.complete());
      EXPECT_EQ(a.Take(), ids);
    }
  }
  // A contiguous 128k-token table is one part; a part of many is still all of it.
  std::vector<int32_t> run(8192);
  std::iota(run.begin(), run.end(), 0);
  EXPECT_EQ(SplitBlockList(run, 3072, 65536).size(), 1u);
  EXPECT_EQ(SplitBlockList(run, 3072, 1000).size(), 9u);
  EXPECT_EQ(SplitBlockList(std::vector<int32_t>{}, 3072, 1000), (std::vector<std::pair<uint32_t, uint32_t>>{{0, 0}}));
}

TEST(BlockList, AssemblyRefusesOverlapsAndPartsBeyondTheEnd) {
  BlockListAssembly a(10);
  const std::vector<int32_t> ids = {1, 2, 3, 4};
  ASSERT_TRUE(a.Add(4, ids).ok());
  EXPECT_FALSE(a.Add(4, ids).ok());                                        // twice
  EXPECT_FALSE(a.Add(2, ids).ok());                                        // overlaps [4, 6)
  EXPECT_FALSE(a.Add(7, ids).ok());                                        // [7, 11) of 10
  EXPECT_FALSE(a.Add(0xfffffffeu, ids).ok());                              // wraps
  EXPECT_FALSE(a.Add(0, std::span<const int32_t>()).ok());                 // empty
  EXPECT_EQ(a.received(), 4u);
  ASSERT_TRUE(a.Add(0, ids).ok());
  ASSERT_TRUE(a.Add(8, std::vector<int32_t>{9, 9}).ok());  // duplicates: AttachTarget's check
  EXPECT_TRUE(a.complete());
  EXPECT_TRUE(HasDuplicateBlocks(a.Take()));
  EXPECT_FALSE(HasDuplicateBlocks(ids));
}

}  // namespace
}  // namespace kvpush::connector
