// libFuzzer target: the router's reading of an instance's event stream (src/router/sse_splitter.h,
// ParseSseData in src/router/prompt_list.h): the bytes a P or D instance streams back, split into
// events, classified, and parsed as JSON when a list of prompts is merged.
// Input: one byte seeding how the stream is cut into reads, then the stream. Asserted:
//   * the events plus TakeRest() are the stream, byte for byte, in order;
//   * each event ends at its first blank line ("\n\n" or "\r\n\r\n") and the rest holds none;
//   * the events do not depend on how the stream was cut into reads;
//   * ClassifySseEvent / IsPreambleEvent never crash (nor throw) on any event;
//   * an event ParseSseData reads as JSON is written back by SseEvent as one it reads to the
//     same value, and which ClassifySseEvent gives the same kind.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "router/prompt_list.h"
#include "router/sse_splitter.h"

using namespace kvpush::router;

namespace {

/// Position just past the first blank line of `s`, or npos.
size_t FirstEventEnd(const std::string& s) {
  const size_t lf = s.find("\n\n");
  const size_t crlf = s.find("\r\n\r\n");
  if (lf != std::string::npos && (crlf == std::string::npos || lf < crlf)) return lf + 2;
  return crlf == std::string::npos ? std::string::npos : crlf + 4;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  uint32_t cut = data[0] | 1u;
  const std::string stream(reinterpret_cast<const char*>(data + 1), size - 1);

  SseSplitter whole;
  std::vector<std::string> events = whole.Feed(stream.data(), stream.size());
  const std::string rest = whole.TakeRest();
  Check(whole.TakeRest().empty());

  std::string joined;
  for (const std::string& e : events) {
    Check(FirstEventEnd(e) == e.size());
    joined += e;
  }
  Check(FirstEventEnd(rest) == std::string::npos);
  Check(joined + rest == stream);

  SseSplitter pieces;
  std::vector<std::string> chunked;
  for (size_t pos = 0; pos < stream.size();) {
    cut = cut * 1103515245u + 12345u;  // reads of 1..16 bytes
    const size_t n = std::min<size_t>(1 + ((cut >> 16) & 15), stream.size() - pos);
    for (std::string& e : pieces.Feed(stream.data() + pos, n)) chunked.push_back(std::move(e));
    pos += n;
  }
  Check(chunked == events && pieces.TakeRest() == rest);

  events.push_back(rest);
  for (const std::string& e : events) {
    const SseEventKind kind = ClassifySseEvent(e);
    (void)IsPreambleEvent(e);
    const nlohmann::json j = ParseSseData(e);
    if (j.is_discarded()) continue;
    const std::string written = SseEvent(j);
    Check(ParseSseData(written) == j);
    if (kind != SseEventKind::kData) Check(ClassifySseEvent(written) == kind);
  }
  return 0;
}
