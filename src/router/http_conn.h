// HttpConn: one HTTP/1.1 client connection from the router to an instance, driven step by step
// (write the request, read the head, read the body piece by piece) on the caller's thread, so
// that the router can relay an instance's answer from the thread that writes it to the client,
// with no hand-off between threads on the token path (docs/router.md, "Connections and
// threads").
#pragma once

#include <cstddef>
#include <string>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "router/instance_pool.h"

namespace kvpush::router {

/// The head of an instance's answer.
struct HttpHead {
  int status = 0;
  std::string content_type;
};

/// Outcome of one ReadBody() call.
enum class BodyRead {
  kData,     ///< bytes were appended to the output (the body may have ended too: see `ended`)
  kTimeout,  ///< nothing arrived within the timeout
  kFailed,   ///< the connection failed or closed mid-body (error()); the connection is dead
};

/// Not thread-safe, except Shutdown(), which any thread may call at any time (it makes every
/// pending or later operation of the owner fail promptly; the instance sees the connection
/// close). Supports bodies with Content-Length, chunked transfer encoding, or delimited by the
/// connection closing. Every wait is a poll() bounded by the timeout the call gives.
class HttpConn {
 public:
  explicit HttpConn(InstanceAddress address);
  ~HttpConn();
  HttpConn(const HttpConn&) = delete;
  HttpConn& operator=(const HttpConn&) = delete;

  /// Opens the TCP connection (TCP_NODELAY). False on failure, with error() set.
  bool Connect(double timeout_s);
  bool connected() const { return fd_ >= 0; }

  /// Writes `method path` with `headers` (each "Name: value"; Host and Content-Length are added)
  /// and `body`, in one write when the socket takes it. False on failure (error()).
  bool WriteRequest(const std::string& method, const std::string& path, const std::string& headers,
                    const std::string& body, double timeout_s);

  /// Reads the status line and headers (each wait at most `timeout_s`). False on failure.
  bool ReadHead(double timeout_s, HttpHead* head);

  /// Appends the next decoded piece of the body to `*out`, waiting at most `timeout_ms` (0: do
  /// not wait) for bytes. `*ended` is set once the whole body was read.
  BodyRead ReadBody(int timeout_ms, std::string* out, bool* ended);

  /// True when the answer was read completely and the instance did not ask to close: the
  /// connection may carry another request.
  bool reusable() const;

  /// For an idle pooled connection: open, nothing buffered, and nothing to read (no EOF, no
  /// error, no stray bytes).
  bool IdleUsable() const;

  /// Shuts the socket down (both directions). Thread-safe, idempotent.
  void Shutdown();

  /// True when the last failure was a failed connect (refused, unreachable, timed out).
  bool connect_failed() const { return connect_failed_; }
  const std::string& error() const { return error_; }
  const InstanceAddress& address() const { return address_; }

 private:
  enum class Body { kNone, kLength, kChunked, kUntilClose, kDone };
  enum class Chunk { kSize, kData, kCrlf, kTrailers };
  /// Reads more bytes into buf_: 1 = got some, 0 = timeout, -1 = EOF, -2 = error.
  int Fill(int timeout_ms);
  /// Decodes what buf_ holds into *out; true once the body is complete.
  bool Decode(std::string* out);
  bool Fail(const std::string& error);

  InstanceAddress address_;
  int fd_ = -1;                        ///< written only by the owner, under mu_
  mutable Mutex mu_;                   ///< guards fd_ against Shutdown()
  bool shut_ GUARDED_BY(mu_) = false;  ///< Shutdown() was called (guarded by mu_)
  std::string buf_;                    ///< bytes read and not consumed, from pos_
  size_t pos_ = 0;
  Body body_ = Body::kNone;
  Chunk chunk_ = Chunk::kSize;
  size_t remaining_ = 0;  ///< kLength: body bytes left; kChunked: bytes left in the chunk
  bool keep_alive_ = true;
  bool broken_ = false;
  bool connect_failed_ = false;
  std::string error_;
};

}  // namespace kvpush::router
