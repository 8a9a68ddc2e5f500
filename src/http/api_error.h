// http::ApiError: an OpenAI-style error response (HTTP status + the JSON error object).
#pragma once

#include <string>

namespace kvpush::http {

/// {"error": {"message", "type", "param", "code"}} with an HTTP status. `param` and `code` are
/// emitted as null when empty. Value type.
struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;
  std::string code;

  /// 400 invalid_request_error naming the offending field.
  static ApiError Invalid(std::string message, std::string param = {}, std::string code = {}) {
    return ApiError{400, std::move(message), "invalid_request_error", std::move(param),
                    std::move(code)};
  }

  /// The JSON body (one line).
  std::string ToJson() const;
};

}  // namespace kvpush::http
