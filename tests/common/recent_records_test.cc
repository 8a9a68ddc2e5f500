// RecentRecords (the bounded ring behind the /debug listings) and ParseListLimit (their `limit`).
#include "common/recent_records.h"

#include <gtest/gtest.h>

#include <string>

namespace kvpush {
namespace {

TEST(ParseListLimit, AcceptsOnlyDecimalDigitsWithinTheRange) {
  EXPECT_EQ(ParseListLimit("1", 4096), 1u);
  EXPECT_EQ(ParseListLimit("256", 4096), 256u);
  EXPECT_EQ(ParseListLimit("4096", 4096), 4096u);
  EXPECT_EQ(ParseListLimit("0004", 4096), 4u);
  for (const char* bad :
       {"", "0", "4097", "-1", "+5", " 5", "5 ", "1e3", "0x10", "abc", "99999999999999999999"}) {
    EXPECT_FALSE(ParseListLimit(bad, 4096).has_value()) << "'" << bad << "'";
  }
}

TEST(RecentRecords, KeepsTheNewestOldestFirst) {
  RecentRecords<std::string> r(3);
  EXPECT_TRUE(r.Newest(10).empty());
  for (const char* s : {"a", "b", "c", "d"}) r.Add(s);
  EXPECT_EQ(r.Newest(10), (std::vector<std::string>{"b", "c", "d"}));
  EXPECT_EQ(r.Newest(2), (std::vector<std::string>{"c", "d"}));
  EXPECT_TRUE(r.Newest(0).empty());
  RecentRecords<int> one(0);  // a capacity below 1 keeps one
  one.Add(1);
  one.Add(2);
  EXPECT_EQ(one.Newest(5), std::vector<int>{2});
}

}  // namespace
}  // namespace kvpush
