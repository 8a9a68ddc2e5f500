#include "http/connection_options.h"

#include <string>

namespace kvpush::http {

Status ConnectionOptions::Validate() const {
  constexpr int kDay = 86400;
  if (keep_alive_timeout_s < 1 || keep_alive_timeout_s > kDay) {
    return InvalidArgument("--timeout-keep-alive must be 1..86400 seconds, got " +
                           std::to_string(keep_alive_timeout_s));
  }
  if (header_timeout_s < 1 || header_timeout_s > kDay) {
    return InvalidArgument("--request-head-timeout-s must be 1..86400 seconds, got " +
                           std::to_string(header_timeout_s));
  }
  return Status::Ok();
}

}  // namespace kvpush::http
