// Logging: a thin setup layer over spdlog. Code logs with spdlog's free functions
// (spdlog::info, spdlog::warn, ...) after InitLogging() chose the level and format.
#pragma once

#include <string_view>

#include "common/status.h"

namespace kvpush {

/// Sets the global spdlog level ("trace", "debug", "info", "warn", "error", "off") and a format
/// with millisecond timestamps and thread ids. Logs go to stderr. Call once at start-up.
/// Errors: kInvalidArgument for an unknown level name.
Status InitLogging(std::string_view level);

}  // namespace kvpush
