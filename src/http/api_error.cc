#include "http/api_error.h"

#include <nlohmann/json.hpp>

namespace kvpush::http {

std::string ApiError::ToJson() const {
  using nlohmann::json;
  json e = {{"message", message}, {"type", type}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace kvpush::http
