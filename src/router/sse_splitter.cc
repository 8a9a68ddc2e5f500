#include "router/sse_splitter.h"

#include <nlohmann/json.hpp>
#include <string_view>

namespace kvpush::router {

std::vector<std::string> SseSplitter::Feed(const char* data, size_t len) {
  buffer_.append(data, len);
  std::vector<std::string> events;
  size_t start = 0;
  while (start < buffer_.size()) {
    const size_t lf = buffer_.find("\n\n", start);
    const size_t crlf = buffer_.find("\r\n\r\n", start);
    size_t end = std::string::npos;
    if (lf != std::string::npos && (crlf == std::string::npos || lf < crlf)) {
      end = lf + 2;
    } else if (crlf != std::string::npos) {
      end = crlf + 4;
    }
    if (end == std::string::npos) break;
    events.push_back(buffer_.substr(start, end - start));
    start = end;
  }
  buffer_.erase(0, start);
  return events;
}

std::string SseSplitter::TakeRest() {
  std::string rest;
  rest.swap(buffer_);
  return rest;
}

namespace {

/// A choice of a stream chunk without output: no text, token ids or finish reason, and a delta
/// holding nothing but `role` and an empty `content`.
bool IsEmptyChoice(const nlohmann::json& c) {
  if (!c.is_object() || c.contains("text")) return false;
  if (c.contains("finish_reason") && !c["finish_reason"].is_null()) return false;
  if (c.contains("token_ids") && !(c["token_ids"].is_array() && c["token_ids"].empty())) {
    return false;
  }
  const auto delta = c.find("delta");
  if (delta == c.end() || !delta->is_object()) return false;
  for (const auto& [key, value] : delta->items()) {
    if (key == "role") continue;
    if (key == "content" && value.is_string() && value.get<std::string>().empty()) continue;
    return false;
  }
  return true;
}

}  // namespace

std::optional<std::string> SseEventData(const std::string& event) {
  std::optional<std::string> data;
  size_t pos = 0;
  while (pos < event.size()) {
    // A line ends at CRLF, LF or CR (WHATWG HTML, "Interpreting an event stream").
    size_t eol = event.find_first_of("\r\n", pos);
    if (eol == std::string::npos) eol = event.size();
    const std::string_view line(event.data() + pos, eol - pos);
    pos = eol + (event.compare(eol, 2, "\r\n") == 0 ? 2 : 1);
    if (line.substr(0, 5) != "data:") continue;  // other fields and comments carry no data
    std::string_view payload = line.substr(5);
    if (!payload.empty() && payload.front() == ' ') payload.remove_prefix(1);
    if (data) {
      *data += '\n';
      *data += payload;
    } else {
      data.emplace(payload);
    }
  }
  return data;
}

bool IsPreambleEvent(const std::string& event) {
  const auto data = SseEventData(event);
  if (!data) return true;  // a comment
  auto j = nlohmann::json::parse(*data, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.contains("error")) return false;
  const auto choices = j.find("choices");
  if (choices == j.end() || !choices->is_array() || choices->empty()) return false;
  for (const auto& c : *choices) {
    if (!IsEmptyChoice(c)) return false;
  }
  return true;
}

SseEventKind ClassifySseEvent(const std::string& event) {
  const auto data = SseEventData(event);
  if (!data) return SseEventKind::kData;
  if (*data == "[DONE]") return SseEventKind::kDone;
  if (data->find("\"error\"") != std::string::npos) {
    auto j = nlohmann::json::parse(*data, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("error")) return SseEventKind::kError;
  }
  return SseEventKind::kData;
}

}  // namespace kvpush::router
