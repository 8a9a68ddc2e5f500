// ScanRequest: how far the bytes a connection has sent go toward one HTTP/1.1 request, so the
// front door's connection loop hands a connection to a worker only once its request is all there.
// docs/architecture.md, "The front door (src/http/)". Sans-IO.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvpush::http {

/// Where a connection's buffered bytes stand.
enum class RequestProgress {
  kIdle,          ///< nothing buffered: between requests (keep-alive) or before the first
  kReadingHead,   ///< part of a request head (request line and headers), no blank line yet
  kReadingBody,   ///< the head is complete; its Content-Length body is not all there yet
  kReady,         ///< a worker can serve it (see RequestScan)
  kHeadTooLarge,  ///< a head over the allowed bytes (its blank line not yet come, or past them)
  /// A complete head whose body framing is refused (RFC 9112 §6): an invalid Content-Length,
  /// two different ones, Content-Length with Transfer-Encoding, a Transfer-Encoding other than
  /// chunked, or a body on GET/HEAD/OPTIONS (which the library would read as the next request).
  /// The loop answers 400 with RequestScan::why and closes.
  kBadFraming
};

struct RequestScan {
  RequestProgress progress = RequestProgress::kIdle;
  size_t head_bytes = 0;  ///< bytes of the head, its blank line included (0 until complete)
  const char* why = "";   ///< kBadFraming: what is wrong (a static string)
  /// kReady: the body's Content-Length (0: none, or chunked).
  uint64_t body_bytes = 0;
  /// kReady: the body is one the worker reads itself (chunked, Expect: 100-continue, or over
  /// max_body_bytes); false: the whole request, head_bytes + body_bytes, is buffered.
  bool worker_reads_body = false;
  /// kReady: the request carries a body (Content-Length > 0, or chunked).
  bool has_body = false;
  /// kReady: a POST, PUT or PATCH with neither Content-Length nor Transfer-Encoding, whose body
  /// is therefore empty (RFC 9112 §6.3, what `curl -X POST` without `-d` sends). The HTTP
  /// library would read such a body until the client closes, so the loop writes
  /// `Content-Length: 0` into the head (AddZeroContentLength) before a worker reads it.
  bool needs_zero_length = false;
};

/// Inserts `Content-Length: 0` as the last header of the complete head that `*bytes` holds
/// from `at` on (`head_bytes` long, as ScanRequest found it); returns the head's new length.
size_t AddZeroContentLength(std::string* bytes, size_t at, size_t head_bytes);

/// Scans `buffered` (a connection's unread bytes, the next request first) for one request:
/// kReady once the head is complete and either its Content-Length body (at most
/// `max_body_bytes`) is buffered too, or the body is one the worker reads itself — chunked
/// (Transfer-Encoding), after `Expect: 100-continue` (the client waits for the interim answer
/// the worker writes), or over `max_body_bytes` (the worker reads and discards it, then answers
/// 413: closing on a client still sending would reset the connection before it read the answer). A
/// head ends at the first empty line (CRLF CRLF, or LF LF as cpp-httplib also accepts).
/// kHeadTooLarge when `max_head_bytes` are buffered without the head's end; kBadFraming (see
/// there); a POST, PUT or PATCH with no Content-Length and no Transfer-Encoding is kReady with
/// `needs_zero_length` (its body is empty).
/// Bytes after the request (pipelining) are left alone. Pure; header names are matched
/// case-insensitively (RFC 9110).
RequestScan ScanRequest(std::string_view buffered, size_t max_head_bytes, size_t max_body_bytes);

/// What a connection does after a worker answered one request (docs/server.md, "Early answers").
struct NextRequest {
  bool close = false;  ///< close the connection after the answer (its next byte is unknown)
  size_t start = 0;    ///< else: where the next request starts in the bytes buffered at dispatch
};

/// Where the connection's next request starts once a worker answered the request `scan`
/// describes (ScanRequest of the bytes buffered when it was dispatched: kReady), having consumed
/// `consumed` bytes from their start. No byte of this request is ever read as the next one:
/// - a buffered body (Content-Length within the limit, all of it read ahead by the loop): the
///   request's end, head_bytes + body_bytes — the part of it an answer given before reading it
///   did not consume is discarded — or `consumed` if that is further;
/// - a body the worker reads itself (chunked, Expect: 100-continue, over the limit) that the
///   answer did not read (`consumed` <= head_bytes): close — its length is not known yet, and
///   reading it all could take as long as the client likes;
/// - otherwise `consumed`.
/// `close` as well for a scan that is not kReady. Pure.
NextRequest NextRequestStart(const RequestScan& scan, size_t consumed);

}  // namespace kvpush::http
