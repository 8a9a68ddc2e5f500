// SseSplitter: cuts a byte stream of server-sent events into whole events, so the router relays
// event by event and can append its own error event after a broken stream without splicing it
// into a half-written one.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace kvpush::router {

/// What one event carries, as far as the router cares.
enum class SseEventKind {
  kData,   ///< anything else (a chunk, a comment)
  kDone,   ///< "data: [DONE]"
  kError,  ///< "data: {"error": ...}"
};

/// Events are separated by a blank line ("\n\n" or "\r\n\r\n"). Not thread-safe.
class SseSplitter {
 public:
  /// Appends bytes; returns the events completed by them, each with its trailing blank line.
  std::vector<std::string> Feed(const char* data, size_t len);
  /// Whatever is left after the stream ended (an unterminated event), or "".
  std::string TakeRest();

 private:
  std::string buffer_;
};

/// The event's data as the SSE spec defines it (WHATWG HTML, "Interpreting an event stream"):
/// the payloads of its `data:` lines (one leading space dropped), joined with "\n"; lines end at
/// CRLF, LF or CR. nullopt when it has no `data:` line (a comment, other fields only). Pure.
std::optional<std::string> SseEventData(const std::string& event);

/// Classifies one event (as returned by SseSplitter::Feed) by its data (SseEventData): exactly
/// `[DONE]` → kDone, a JSON object with an `error` member → kError, anything else kData.
SseEventKind ClassifySseEvent(const std::string& event);

/// True for an event that carries no generated output yet: a comment (no `data:` line) or a
/// chunk whose every choice has an empty delta apart from `role` (the chat stream's opening
/// `{"delta":{"role":"assistant","content":""}}`), no text, no token ids and no finish reason.
/// Parses the event's JSON: meant for the first events of a stream only.
bool IsPreambleEvent(const std::string& event);

}  // namespace kvpush::router
