// HttpConn: one HTTP/1.1 client connection from the router to an instance, driven step by step
// (write the request, read the head, read the body piece by piece) on the caller's thread, so
// that the router can relay an instance's answer from the thread that writes it to the client,
// with no hand-off between threads on the token path (docs/router.md, "Connections and
// threads"). An https:// instance is spoken to over TLS (tls_client.h) on the same socket, with
// the same non-blocking steps and timeouts.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "router/instance_pool.h"
#include "router/tls_client.h"

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
///
/// TLS: when `address.https`, Connect() also runs the TLS handshake with `tls` (the instance's
/// certificate verified, never a plain-HTTP fallback) and every read and write goes through the
/// session; keep-alive, streaming, timeouts and Shutdown() work as for plain HTTP. A TLS write
/// to a closed peer may raise SIGPIPE: the process must ignore it (Router::Start does).
class HttpConn {
 public:
  /// `tls`: the router's TLS settings, needed when `address.https` (may be null otherwise; an
  /// https address without it fails to Connect).
  explicit HttpConn(InstanceAddress address, std::shared_ptr<const TlsClientContext> tls = nullptr);
  ~HttpConn();  ///< sends TLS close_notify on a healthy TLS connection, closes the socket
  HttpConn(const HttpConn&) = delete;
  HttpConn& operator=(const HttpConn&) = delete;

  /// Opens the TCP connection (TCP_NODELAY) and, for an https address, runs the TLS handshake;
  /// each at most `timeout_s`. False on failure, with error() set (a refused certificate:
  /// "TLS certificate verification failed: <reason>", tls_failed() true).
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

  /// True when the last failure was a failed connect (refused, unreachable, timed out, or the
  /// TLS handshake failed).
  bool connect_failed() const { return connect_failed_; }
  /// True when the last failure was the TLS handshake (the certificate refused, or the port does
  /// not speak TLS).
  bool tls_failed() const { return tls_failed_; }
  const std::string& error() const { return error_; }
  const InstanceAddress& address() const { return address_; }

 private:
  enum class Body { kNone, kLength, kChunked, kUntilClose, kDone };
  enum class Chunk { kSize, kData, kCrlf, kTrailers };
  /// Reads more bytes into buf_: 1 = got some, 0 = timeout, -1 = EOF, -2 = error.
  int Fill(int timeout_ms);
  /// One read (recv or TLS) into `tmp`: 1 = `*got` bytes, 0 = would block (wait for
  /// `*wait_for`), -1 = EOF, -2 = error (error_ set). Never waits.
  int ReadSome(char* tmp, size_t cap, size_t* got, short* wait_for);
  /// One write (send or TLS) of at most `n` bytes: 1 = `*put` bytes, 0 = would block (wait for
  /// `*wait_for`), -2 = error (error_ set). Never waits.
  int WriteSome(const char* data, size_t n, size_t* put, short* wait_for);
  /// The TLS handshake on the connected socket, at most `timeout_s`. False after Fail().
  bool Handshake(double timeout_s);
  /// Decodes what buf_ holds into *out; true once the body is complete.
  bool Decode(std::string* out);
  bool Fail(const std::string& error);

  InstanceAddress address_;
  std::shared_ptr<const TlsClientContext> tls_ctx_;
  std::unique_ptr<TlsSession> tls_;    ///< the TLS session of an https connection (owner only)
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
  bool tls_failed_ = false;
  std::string error_;
};

}  // namespace kvpush::router
