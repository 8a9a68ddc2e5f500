// libFuzzer target: the front door's scan of a connection's buffered bytes for one request
// (src/http/request_head.h, ScanRequest), which decides when the connection loop hands a
// connection to a worker. Any bytes a client sends reach it.
// Input: two bytes choosing max_head_bytes (1..4096) and max_body_bytes (0..1023), one byte
// choosing a cut, then the buffered bytes. Asserted:
//   * kIdle exactly for no bytes; head_bytes <= the bytes; a complete head ends at the first
//     empty line (LF LF or LF CR LF) and nowhere else;
//   * kBadFraming and kHeadTooLarge stay so with more bytes (the head decides it);
//   * kHeadTooLarge exactly for a head over max_head_bytes (ended or not yet);
//   * more bytes never undo a request: a prefix that is kReady stays kReady with the same head
//     (pipelined bytes after a request are left alone), and a complete head stays complete;
//   * the early-answer path (NextRequestStart): after an answer given at any point — the cut
//     byte as the bytes the answer consumed — the connection's next request never starts inside
//     this one: a buffered body is skipped whole (and is all there), a body the worker reads
//     itself that the answer did not touch closes the connection.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "http/request_head.h"

using kvpush::http::NextRequest;
using kvpush::http::NextRequestStart;
using kvpush::http::RequestProgress;
using kvpush::http::RequestScan;
using kvpush::http::ScanRequest;

namespace {

/// Just past the first empty line of `b`, or 0.
size_t FirstHeadEnd(std::string_view b) {
  for (size_t i = 0; i + 1 < b.size(); ++i) {
    if (b[i] != '\n') continue;
    if (b[i + 1] == '\n') return i + 2;
    if (i + 2 < b.size() && b[i + 1] == '\r' && b[i + 2] == '\n') return i + 3;
  }
  return 0;
}

void CheckScan(std::string_view b, size_t max_head, size_t max_body, const RequestScan& s) {
  Check((s.progress == RequestProgress::kIdle) == b.empty());
  Check(s.head_bytes <= b.size());
  const size_t end = FirstHeadEnd(b);
  const bool complete = s.progress == RequestProgress::kReady ||
                        s.progress == RequestProgress::kReadingBody ||
                        s.progress == RequestProgress::kBadFraming;
  Check(complete == (end != 0 && end <= max_head));
  Check(s.head_bytes == (complete ? end : 0));
  Check((s.progress == RequestProgress::kHeadTooLarge) ==
        ((end == 0 && b.size() >= max_head) || end > max_head));
  (void)max_body;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const size_t max_head = 1 + (static_cast<size_t>(data[0]) << 4);
  const size_t max_body = static_cast<size_t>(data[1]) << 2;
  const std::string_view b(reinterpret_cast<const char*>(data + 3), size - 3);
  const size_t cut = b.empty() ? 0 : data[2] % (b.size() + 1);
  const RequestScan whole = ScanRequest(b, max_head, max_body);
  CheckScan(b, max_head, max_body, whole);
  const RequestScan part = ScanRequest(b.substr(0, cut), max_head, max_body);
  CheckScan(b.substr(0, cut), max_head, max_body, part);
  if (part.progress == RequestProgress::kReady) {
    Check(whole.progress == RequestProgress::kReady && whole.head_bytes == part.head_bytes);
  }
  if (part.progress == RequestProgress::kBadFraming ||
      part.progress == RequestProgress::kHeadTooLarge) {
    Check(whole.progress == part.progress);  // the head decides it
  }
  if (part.progress == RequestProgress::kReadingBody) {
    Check(whole.head_bytes == part.head_bytes);
  }
  if (whole.progress == RequestProgress::kReady) {
    const size_t consumed = cut;  // an answer given after this many bytes of the request
    const NextRequest next = NextRequestStart(whole, consumed);
    const size_t end = whole.head_bytes + static_cast<size_t>(whole.body_bytes);
    if (!whole.worker_reads_body) {
      Check(end <= b.size());  // the whole request was buffered
      Check(!next.close && next.start >= end && next.start >= consumed);
    } else if (whole.has_body && consumed <= whole.head_bytes) {
      Check(next.close);
    } else {
      Check(!next.close && next.start == consumed);
    }
  } else {
    Check(NextRequestStart(whole, cut).close);
  }
  return 0;
}
