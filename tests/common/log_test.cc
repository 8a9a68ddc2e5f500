// common/log.h: JsonEscape, the message of --log-format json lines.
#include "common/log.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace kvpush {
namespace {

TEST(Log, JsonEscapeReadsBackAsTheSameString) {
  const std::string s = std::string("plain \"quoted\" back\\slash\nnew\ttab\r") + '\x01' +
                        "\x1f utf-8: \xc3\xa9";
  const std::string doc = "\"" + JsonEscape(s) + "\"";
  EXPECT_EQ(nlohmann::json::parse(doc).get<std::string>(), s) << doc;
  EXPECT_EQ(JsonEscape("a\"b"), "a\\\"b");
  EXPECT_EQ(JsonEscape(std::string(1, '\x02')), "\\u0002");
  // Bytes that are not UTF-8 still give valid JSON (U+FFFD in their place).
  EXPECT_EQ(nlohmann::json::parse("\"" + JsonEscape("a\xff") + "\"").get<std::string>(),
            "a\xef\xbf\xbd");
}

TEST(Log, UnknownLevelOrFormatIsRefused) {
  EXPECT_EQ(InitLogging("loud").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(InitLogging("info", "xml").code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpush
