#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <string>

namespace kvpush {

Status InitLogging(std::string_view level) {
  auto lvl = spdlog::level::from_str(std::string(level));
  if (lvl == spdlog::level::off && level != "off") {
    return InvalidArgument("unknown log level '" + std::string(level) +
                           "' (expected trace, debug, info, warn, error or off)");
  }
  auto logger = spdlog::stderr_color_mt("kvpush");
  spdlog::set_default_logger(logger);
  spdlog::set_level(lvl);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] [t%t] %v");
  return Status::Ok();
}

}  // namespace kvpush
