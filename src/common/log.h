// Logging: a thin setup layer over spdlog. Code logs with spdlog's free functions
// (spdlog::info, spdlog::warn, ...) after InitLogging() chose the level and format.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace kvpush {

/// Sets the global spdlog level ("trace", "debug", "info", "warn", "error", "off") and the format
/// of each line: `format` "text" (millisecond local timestamps and thread ids) or "json" (one JSON
/// object a line: {"time": UTC ISO 8601 with ms, "level", "tid", "message"}, for log pipelines;
/// the message escaped by JsonEscape). Logs go to stderr. Call
/// once at start-up. Errors: kInvalidArgument for an unknown level or format name.
Status InitLogging(std::string_view level, std::string_view format = "text");

/// `s` as the body of a JSON string (RFC 8259 §7: '"', '\\' and control characters escaped;
/// bytes that are not valid UTF-8 become U+FFFD, so the result is always valid JSON). Pure.
std::string JsonEscape(std::string_view s);

}  // namespace kvpush
