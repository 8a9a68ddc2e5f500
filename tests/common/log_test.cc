// common/log.h: JsonEscape, the message of --log-format json lines.
#include "common/log.h"

#include <gtest/gtest.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <functional>
#include <thread>
#include <vector>

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

/// The lines a logger set up by InitLogging(level, format) writes for `log`.
std::string Capture(const char* format, const std::function<void(spdlog::logger&)>& log) {
  EXPECT_TRUE(InitLogging("info", format).ok());
  std::ostringstream out;
  auto logger =
      std::make_shared<spdlog::logger>("capture", std::make_shared<spdlog::sinks::ostream_sink_st>(out));
  spdlog::initialize_logger(logger);  // the registry's formatter and level, as InitLogging set them
  log(*logger);
  spdlog::drop("capture");
  return out.str();
}

TEST(Log, ALineAboutARequestCarriesItsIdInText) {
  const std::string text = Capture("text", [](spdlog::logger& l) {
    l.info("before");
    {
      LogRequestScope outer("req-1");
      l.info("in outer");
      {
        LogRequestScope inner("req-2");
        l.info("in inner");
      }
      l.info("outer again");
    }
    l.info("after");
  });
  std::istringstream lines(text);
  std::string line;
  std::vector<std::string> got;
  while (std::getline(lines, line)) got.push_back(line);
  ASSERT_EQ(got.size(), 5u) << text;
  EXPECT_EQ(got[0].find("[req"), std::string::npos);
  EXPECT_NE(got[1].find("] [req req-1] in outer"), std::string::npos) << got[1];
  EXPECT_NE(got[2].find("] [req req-2] in inner"), std::string::npos) << got[2];
  EXPECT_NE(got[3].find("] [req req-1] outer again"), std::string::npos) << got[3];
  EXPECT_EQ(got[4].find("[req"), std::string::npos) << got[4];
  EXPECT_TRUE(CurrentLogRequestId().empty());
}

TEST(Log, ALineAboutARequestCarriesItsIdInJson) {
  const std::string text = Capture("json", [](spdlog::logger& l) {
    l.warn("none");
    SetLogRequestId("cmpl-\"x\"");
    l.warn("about it");
    // Another thread's lines are not about this thread's request.
    std::thread([&l] { l.warn("other thread"); }).join();
    SetLogRequestId("");
  });
  std::istringstream lines(text);
  std::string line;
  std::vector<nlohmann::json> got;
  while (std::getline(lines, line)) got.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(got.size(), 3u) << text;
  EXPECT_FALSE(got[0].contains("request_id"));
  EXPECT_EQ(got[1]["request_id"], "cmpl-\"x\"");
  EXPECT_EQ(got[1]["message"], "about it");
  EXPECT_EQ(got[1]["level"], "warning");
  EXPECT_FALSE(got[2].contains("request_id")) << got[2];
}

}  // namespace
}  // namespace kvpush
