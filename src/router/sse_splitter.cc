#include "router/sse_splitter.h"

#include <nlohmann/json.hpp>

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

SseEventKind ClassifySseEvent(const std::string& event) {
  size_t pos = 0;
  while (pos < event.size()) {
    size_t eol = event.find('\n', pos);
    if (eol == std::string::npos) eol = event.size();
    std::string line = event.substr(pos, eol - pos);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    pos = eol + 1;
    if (line.rfind("data:", 0) != 0) continue;
    std::string payload = line.substr(5);
    if (!payload.empty() && payload.front() == ' ') payload.erase(0, 1);
    if (payload == "[DONE]") return SseEventKind::kDone;
    if (payload.find("\"error\"") != std::string::npos) {
      auto j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("error")) return SseEventKind::kError;
    }
  }
  return SseEventKind::kData;
}

}  // namespace kvpush::router
