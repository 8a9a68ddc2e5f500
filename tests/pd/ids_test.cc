// pd/ids.h: transfer ids, request ids and the prompt hash (docs/pd_protocol.md §1).
#include "pd/ids.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvpush::pd {
namespace {

const std::string kTid = "0123456789abcdef0123456789abcdef";

TEST(Ids, IsValidTransferId) {
  EXPECT_TRUE(IsValidTransferId(kTid));
  EXPECT_TRUE(IsValidTransferId(std::string(32, 'f')));
  EXPECT_FALSE(IsValidTransferId(""));
  EXPECT_FALSE(IsValidTransferId(kTid.substr(1)));
  EXPECT_FALSE(IsValidTransferId(kTid + "0"));
  EXPECT_FALSE(IsValidTransferId("0123456789ABCDEF0123456789ABCDEF"));
  EXPECT_FALSE(IsValidTransferId("0123456789abcdefg123456789abcdef"));
}

TEST(Ids, PromptHashIsStableAndSensitive) {
  // XXH3-64 (seed 0) of the int32 little-endian bytes, computed independently with libxxhash.
  EXPECT_EQ(PromptHash({}), 0x2d06800538d394c2ull);
  const std::vector<int32_t> t = {1, 2, 3, 4, 5};
  EXPECT_EQ(PromptHash(t), 0xf2f19a6764b86d62ull);
  EXPECT_EQ(PromptHash(t), PromptHash(std::vector<int32_t>(t)));
  auto u = t;
  u[4] = 6;
  EXPECT_NE(PromptHash(u), PromptHash(t));
  u = t;
  u[0] = 0;
  EXPECT_NE(PromptHash(u), PromptHash(t));
  u = t;
  u.push_back(0);  // one more token (a zero) changes the hash too
  EXPECT_NE(PromptHash(u), PromptHash(t));
}

// The router's and the instances' rule: 1..256 visible ASCII characters.
TEST(Ids, RequestIdsAreVisibleAsciiUpTo256) {
  EXPECT_TRUE(IsValidRequestId("req-1.a:b_c"));
  EXPECT_TRUE(IsValidRequestId("my/id+a@b"));
  EXPECT_TRUE(IsValidRequestId(std::string(256, 'a')));
  EXPECT_FALSE(IsValidRequestId(""));
  EXPECT_FALSE(IsValidRequestId("a b"));
  EXPECT_FALSE(IsValidRequestId("a\tb"));
  EXPECT_FALSE(IsValidRequestId("caf\xc3\xa9"));
  EXPECT_FALSE(IsValidRequestId(std::string(257, 'a')));
}

}  // namespace
}  // namespace kvpush::pd
