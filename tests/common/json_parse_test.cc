// ParseJson (src/common/json_parse.h): simdjson's parse gives nlohmann's document and verdicts.
#include "common/json_parse.h"

#include <gtest/gtest.h>

#include <string>

namespace kvpush {
namespace {

using nlohmann::json;

TEST(ParseJsonTest, SameDocumentAndVerdictAsNlohmann) {
  for (const char* text : {
           R"({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.7, "stream": true})",
           R"({"a": -1, "b": 0, "d": 1.0, "e": 1e5, "f": 18446744073709551615, "g": 2.5e-3})",
           R"({"big": 18446744073709551616, "huge": 1e400, "neg": -9223372036854775809})",
           R"({"s": "caf\u00e9 \ud83d\ude00", "n": null, "t": [true, false], "o": {}})",
           R"({"dup": 1, "dup": [2]})", R"([1, "x"])", "42", "  {\"pad\" : 1 }  \n",
           R"({"a": 1,})", R"({"a": 1} x)", R"({"a": 01})", "{\"a\": \"\xff\"}", "", "{",
       }) {
    SCOPED_TRACE(text);
    const json want = json::parse(text, nullptr, /*allow_exceptions=*/false);
    const json got = ParseJson(text);
    ASSERT_EQ(got.is_discarded(), want.is_discarded());
    if (want.is_discarded()) continue;
    EXPECT_EQ(got, want);
    EXPECT_EQ(got.dump(), want.dump());  // same number kinds: dumps are byte-identical
  }
}

TEST(ParseJsonTest, NumberKindsAreNlohmanns) {
  const json j = ParseJson(R"({"u": 7, "i": -7, "f": 7.0})");
  EXPECT_TRUE(j["u"].is_number_unsigned());
  EXPECT_TRUE(j["i"].is_number_integer() && !j["i"].is_number_unsigned());
  EXPECT_TRUE(j["f"].is_number_float());
}

}  // namespace
}  // namespace kvpush
