// Logging: a thin setup layer over spdlog. Code logs with spdlog's free functions
// (spdlog::info, spdlog::warn, ...) after InitLogging() chose the level and format.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpush {

/// Sets the global spdlog level ("trace", "debug", "info", "warn", "error", "off") and the format
/// of each line: `format` "text" (millisecond local timestamps, thread ids, then `[req ID] ` when
/// the line is about a request) or "json" (one JSON object a line: {"time": UTC ISO 8601 with ms,
/// "level", "tid", "request_id" (only on a line about a request), "message"}, for log pipelines;
/// strings escaped by JsonEscape). A line is about a request while its thread holds a
/// LogRequestScope. Logs go to stderr. Call once at start-up. Errors: kInvalidArgument for an
/// unknown level or format name.
Status InitLogging(std::string_view level, std::string_view format = "text");

/// While alive, every log line the calling thread writes carries `request_id` (the router's and
/// the instances' x-request-id, so one id finds a request's lines in every process's log). Scopes
/// nest: the destructor restores the id that was current before (an empty `request_id` marks the
/// lines as about no request). Thread-local: a scope affects only its own thread; construct and
/// destroy it on the same thread. Cheap (one string assignment each way).
class LogRequestScope {
 public:
  explicit LogRequestScope(std::string_view request_id);
  ~LogRequestScope();
  LogRequestScope(const LogRequestScope&) = delete;
  LogRequestScope& operator=(const LogRequestScope&) = delete;

 private:
  std::string previous_;
};

/// Sets the calling thread's current request id without a scope (for a thread that serves one
/// request after another and resets the id at each request's start, as the HTTP front door's
/// connection threads do). "" clears it.
void SetLogRequestId(std::string_view request_id);

/// The calling thread's current request id ("" when none).
std::string_view CurrentLogRequestId();

/// `s` as the body of a JSON string (RFC 8259 §7: '"', '\\' and control characters escaped;
/// bytes that are not valid UTF-8 become U+FFFD, so the result is always valid JSON). Pure.
std::string JsonEscape(std::string_view s);

}  // namespace kvpush
