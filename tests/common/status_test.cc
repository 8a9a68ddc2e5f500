#include "common/status.h"

#include <gtest/gtest.h>

namespace kvpush {
namespace {

Result<int> ParsePositive(int v) {
  if (v <= 0) return InvalidArgument("not positive: " + std::to_string(v));
  return v;
}

Status UsesMacros(int v, int* out) {
  KVP_ASSIGN_OR_RETURN(int x, ParsePositive(v));
  *out = x * 2;
  return Status::Ok();
}

TEST(StatusTest, OkAndErrorCarryCodeAndMessage) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = OutOfRange("offset 10 > 4");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s.ToString(), "out_of_range: offset 10 > 4");
  EXPECT_EQ(s.WithContext("region 3").message(), "region 3: offset 10 > 4");
}

TEST(StatusTest, ResultPropagatesThroughMacros) {
  int out = 0;
  EXPECT_TRUE(UsesMacros(4, &out).ok());
  EXPECT_EQ(out, 8);
  Status err = UsesMacros(-1, &out);
  EXPECT_EQ(err.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(err.message(), "not positive: -1");
}

TEST(StatusTest, ResultFromOkStatusBecomesInternalError) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace kvpush
