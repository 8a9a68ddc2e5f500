#include "http/request_head.h"

#include <cctype>
#include <charconv>
#include <cstdint>
#include <string>

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
  bool worker_reads = false;  ///< chunked, or Expect: 100-continue
  bool chunked = false;       ///< Transfer-Encoding: chunked
  uint64_t length = 0;        ///< Content-Length (0 when absent)
  const char* bad = nullptr;  ///< why the framing is refused (RFC 9112 §6), or null
};

BodyShape ShapeOf(std::string_view head) {
  BodyShape shape;
  bool has_cl = false;
  bool has_te = false;
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
    if (EqualsNoCase(name, "Transfer-Encoding")) {
      has_te = true;
      shape.worker_reads = true;
      if (!EqualsNoCase(value, "chunked"))
        shape.bad = "unsupported Transfer-Encoding (only chunked)";
      shape.chunked = true;
    } else if (EqualsNoCase(name, "Expect")) {
      shape.worker_reads = true;
    } else if (EqualsNoCase(name, "Content-Length")) {
      uint64_t n = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size()) {
        shape.bad = "invalid Content-Length";
      } else if (has_cl && n != shape.length) {
        shape.bad = "two different Content-Length values";
      }
      has_cl = true;
      shape.length = n;
    }
  }
  if (has_cl && has_te) shape.bad = "both Content-Length and Transfer-Encoding";
  shape.has_length = has_cl || has_te;
  return shape;
}

/// The request line's method.
std::string_view MethodOf(std::string_view head) {
  return head.substr(0, head.find(' '));
}

/// Whether the HTTP library always reads a body for `method`.
bool MethodHasBody(std::string_view method) {
  return method == "POST" || method == "PUT" || method == "PATCH";
}

/// Whether the HTTP library never reads a body for `method`: one sent with it would be read as
/// the next request.
bool MethodHasNoBody(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "OPTIONS";
}

}  // namespace

RequestScan ScanRequest(std::string_view buffered, size_t max_head_bytes, size_t max_body_bytes) {
  RequestScan scan;
  if (buffered.empty()) return scan;
  const size_t head_end = HeadEnd(buffered);
  if (head_end == 0 || head_end > max_head_bytes) {  // a whole head over the limit in one read too
    scan.progress = buffered.size() >= max_head_bytes ? RequestProgress::kHeadTooLarge
                                                      : RequestProgress::kReadingHead;
    return scan;
  }
  scan.head_bytes = head_end;
  const BodyShape shape = ShapeOf(buffered.substr(0, head_end));
  const std::string_view method = MethodOf(buffered);
  if (shape.bad == nullptr && MethodHasNoBody(method) && (shape.length > 0 || shape.worker_reads)) {
    scan.why = "a GET, HEAD or OPTIONS request carries no body";
    scan.progress = RequestProgress::kBadFraming;
    return scan;
  }
  if (shape.bad != nullptr) {
    scan.why = shape.bad;
    scan.progress = RequestProgress::kBadFraming;
    return scan;
  }
  if (!shape.has_length && MethodHasBody(method)) {
    scan.progress = RequestProgress::kReady;  // an empty body (RFC 9112 §6.3)
    scan.needs_zero_length = true;
    return scan;
  }
  // A body over the limit goes to the worker too: cpp-httplib reads and discards it before its
  // 413, so the client, still sending, gets the answer rather than a reset.
  const bool worker_reads = shape.worker_reads || shape.length > max_body_bytes;
  const bool ready = worker_reads || buffered.size() - head_end >= shape.length;
  scan.progress = ready ? RequestProgress::kReady : RequestProgress::kReadingBody;
  scan.body_bytes = shape.length;
  scan.worker_reads_body = worker_reads;
  scan.has_body = shape.length > 0 || shape.chunked;
  return scan;
}

size_t AddZeroContentLength(std::string* bytes, size_t at, size_t head_bytes) {
  // The head ends with its empty line: CRLF or LF, after the last header's line end.
  const size_t end = at + head_bytes;
  const size_t blank = (*bytes)[end - 2] == '\r' ? end - 2 : end - 1;
  static constexpr std::string_view kHeader = "Content-Length: 0\r\n";
  bytes->insert(blank, kHeader);
  return head_bytes + kHeader.size();
}

NextRequest NextRequestStart(const RequestScan& scan, size_t consumed) {
  NextRequest next;
  if (scan.progress != RequestProgress::kReady) {
    next.close = true;
    return next;
  }
  if (!scan.worker_reads_body) {
    const size_t end = scan.head_bytes + static_cast<size_t>(scan.body_bytes);
    next.start = consumed > end ? consumed : end;
    return next;
  }
  if (scan.has_body && consumed <= scan.head_bytes) {
    next.close = true;
    return next;
  }
  next.start = consumed;
  return next;
}

}  // namespace kvpush::http
