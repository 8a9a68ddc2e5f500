#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>

#include <chrono>
#include <ctime>
#include <memory>
#include <string>

namespace kvpush {
namespace {

/// The request the calling thread's log lines are about (LogRequestScope, SetLogRequestId).
thread_local std::string t_request_id;  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)

/// %* in the text pattern: "[req ID] " on a line about a request, nothing otherwise.
class RequestIdFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg&, const std::tm&, spdlog::memory_buf_t& dest) override {
    if (t_request_id.empty()) return;
    static constexpr std::string_view kOpen = "[req ";
    dest.append(kOpen.data(), kOpen.data() + kOpen.size());
    dest.append(t_request_id.data(), t_request_id.data() + t_request_id.size());
    dest.push_back(']');
    dest.push_back(' ');
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<RequestIdFlag>();
  }
};

/// --log-format json: one JSON object per line.
class JsonLineFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto t = msg.time;
    const std::time_t secs = std::chrono::system_clock::to_time_t(t);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()) % 1000;
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char ts[32];
    std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    const auto level = spdlog::level::to_string_view(msg.level);
    const std::string line = std::string("{\"time\":\"") + ts + "." +
                             std::to_string(1000 + ms.count()).substr(1) + "Z\",\"level\":\"" +
                             std::string(level.data(), level.size()) + "\",\"tid\":" +
                             std::to_string(msg.thread_id) +
                             (t_request_id.empty()
                                  ? std::string()
                                  : ",\"request_id\":\"" + JsonEscape(t_request_id) + "\"") +
                             ",\"message\":\"" +
                             JsonEscape(std::string_view(msg.payload.data(), msg.payload.size())) +
                             "\"}\n";
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<JsonLineFormatter>();
  }
};

}  // namespace

LogRequestScope::LogRequestScope(std::string_view request_id) : previous_(t_request_id) {
  t_request_id.assign(request_id);
}

LogRequestScope::~LogRequestScope() { t_request_id.swap(previous_); }

void SetLogRequestId(std::string_view request_id) { t_request_id.assign(request_id); }

std::string_view CurrentLogRequestId() { return t_request_id; }

std::string JsonEscape(std::string_view s) {
  // nlohmann's serializer: RFC 8259 escapes, and bytes that are not UTF-8 become U+FFFD, so a
  // line stays valid JSON whatever a message holds.
  const std::string quoted =
      nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

Status InitLogging(std::string_view level, std::string_view format) {
  if (format != "text" && format != "json") {
    return InvalidArgument("unknown log format '" + std::string(format) + "' (text or json)");
  }
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return InvalidArgument("unknown log level '" + std::string(level) +
                           "' (expected trace, debug, info, warn, error or off)");
  }
  spdlog::drop("kvpush");  // a second call (tests) replaces the logger
  auto logger = spdlog::stderr_color_mt("kvpush");
  spdlog::set_default_logger(logger);
  spdlog::set_level(lvl);
  if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonLineFormatter>());
  } else {
    auto text = std::make_unique<spdlog::pattern_formatter>();
    text->add_flag<RequestIdFlag>('*').set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [t%t] %*%v");
    spdlog::set_formatter(std::move(text));
  }
  return Status::Ok();
}

}  // namespace kvpush
