#include "http/request_head.h"

#include <cctype>
#include <charconv>
#include <cstdint>

namespace kvpush::http {
namespace {

bool EqualsNoCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

/// The end of the head (just past its empty line), or 0 when it is not all there.
size_t HeadEnd(std::string_view b) {
  for (size_t i = b.find('\n'); i != std::string_view::npos; i = b.find('\n', i + 1)) {
    if (i + 1 < b.size() && b[i + 1] == '\n') return i + 2;
    if (i + 2 < b.size() && b[i + 1] == '\r' && b[i + 2] == '\n') return i + 3;
  }
  return 0;
}

/// What the head's headers say about its body.
struct BodyShape {
  bool has_length = false;    ///< a Content-Length or Transfer-Encoding header is present
  bool worker_reads = false;  ///< chunked, Expect: 100-continue, or an unreadable length
  uint64_t length = 0;        ///< Content-Length (0 when absent)
};

BodyShape ShapeOf(std::string_view head) {
  BodyShape shape;
  size_t line_start = head.find('\n');  // skip the request line
  while (line_start != std::string_view::npos && line_start + 1 < head.size()) {
    const size_t next = head.find('\n', line_start + 1);
    const std::string_view line =
        head.substr(line_start + 1, next == std::string_view::npos ? std::string_view::npos
                                                                   : next - line_start - 1);
    line_start = next;
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, colon);
    const std::string_view value = Trim(line.substr(colon + 1));
    if (EqualsNoCase(name, "Transfer-Encoding") || EqualsNoCase(name, "Expect")) {
      shape.worker_reads = true;
      shape.has_length = shape.has_length || EqualsNoCase(name, "Transfer-Encoding");
    } else if (EqualsNoCase(name, "Content-Length")) {
      shape.has_length = true;
      const auto [end, ec] =
          std::from_chars(value.data(), value.data() + value.size(), shape.length);
      if (ec != std::errc() || end != value.data() + value.size()) shape.worker_reads = true;
    }
  }
  return shape;
}

/// Whether the request line's method is one whose body the HTTP library always reads.
bool MethodHasBody(std::string_view head) {
  const std::string_view method = head.substr(0, head.find(' '));
  return method == "POST" || method == "PUT" || method == "PATCH";
}

}  // namespace

RequestScan ScanRequest(std::string_view buffered, size_t max_head_bytes, size_t max_body_bytes) {
  RequestScan scan;
  if (buffered.empty()) return scan;
  const size_t head_end = HeadEnd(buffered);
  if (head_end == 0) {
    scan.progress = buffered.size() >= max_head_bytes ? RequestProgress::kHeadTooLarge
                                                      : RequestProgress::kReadingHead;
    return scan;
  }
  scan.head_bytes = head_end;
  const BodyShape shape = ShapeOf(buffered.substr(0, head_end));
  if (!shape.has_length && MethodHasBody(buffered)) {
    scan.progress = RequestProgress::kLengthRequired;
    return scan;
  }
  // A body over the limit goes to the worker too: cpp-httplib reads and discards it before its
  // 413, so the client, still sending, gets the answer rather than a reset.
  const bool ready = shape.worker_reads || shape.length > max_body_bytes ||
                     buffered.size() - head_end >= shape.length;
  scan.progress = ready ? RequestProgress::kReady : RequestProgress::kReadingBody;
  return scan;
}

}  // namespace kvpush::http
