// TLS to instances: the router's client side of HTTPS (OpenSSL), for every call it makes to an
// instance whose URL is https:// (legs, health checks, /kv/abort). One TlsClientContext (one
// SSL_CTX: the trusted CAs, TLS >= 1.2, peer verification) per router; one TlsSession (one SSL)
// per connection, driven step by step over the connection's non-blocking socket by HttpConn.
// docs/router.md, "TLS to instances".
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "common/status.h"

struct ssl_st;      // OpenSSL's SSL
struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace kvpush::router {

/// What one non-blocking TLS step did.
enum class TlsStep {
  kDone,       ///< finished (bytes moved, or the handshake completed)
  kWantRead,   ///< wait until the socket is readable, then repeat the step
  kWantWrite,  ///< wait until the socket is writable, then repeat the step
  kClosed,     ///< the peer closed the connection (close_notify, or a TCP close)
  kFailed,     ///< a TLS or socket error; the session is unusable (error text given)
};

/// One TLS client connection over a connected non-blocking socket it does not own (the caller
/// closes the socket after destroying the session). Made by TlsClientContext::NewSession.
/// Not thread-safe: one owner thread (HttpConn's; another thread may shutdown(2) the socket,
/// which makes the pending step fail or see kClosed).
class TlsSession {
 public:
  ~TlsSession();  ///< sends close_notify when the session is healthy, frees the SSL
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  /// One step of the handshake (SSL_connect): kDone once it completed, kWant* to wait, kFailed
  /// with `*error` = "TLS certificate verification failed: <OpenSSL's reason>" when the
  /// instance's certificate is not trusted or names another host, else "TLS handshake failed:
  /// <reason>" (e.g. the port speaks plain HTTP).
  TlsStep Handshake(std::string* error);
  /// Reads at most `n` decrypted bytes into `buf`; kDone with `*got` > 0, kClosed at the end of
  /// the stream (`clean_close()` tells whether the peer sent close_notify), kWant* to wait.
  TlsStep Read(char* buf, size_t n, size_t* got, std::string* error);
  /// Writes at most `n` bytes of `buf` (partial writes allowed: kDone with `*put` > 0); kWant*
  /// to wait and call again with the same unwritten bytes.
  TlsStep Write(const char* buf, size_t n, size_t* put, std::string* error);
  /// True when bytes are buffered inside OpenSSL (decrypted or raw, not yet read).
  bool HasPending() const;
  /// After Read returned kClosed: true when the peer ended the stream with close_notify, false
  /// for a TCP close without it (a body delimited by the close may then be truncated).
  bool clean_close() const { return clean_close_; }
  /// Marks the session unusable: no close_notify is sent on destruction (the socket was shut
  /// down or failed).
  void Abandon() { healthy_ = false; }

 private:
  friend class TlsClientContext;
  explicit TlsSession(ssl_st* ssl) : ssl_(ssl) {}
  /// Maps the outcome `ret` of an SSL call; sets healthy_ = false on a fatal error.
  TlsStep Outcome(int ret, const char* what, std::string* error);

  ssl_st* ssl_;
  bool healthy_ = true;       ///< no fatal error yet: close_notify may be sent
  bool clean_close_ = false;  ///< the peer sent close_notify
};

/// The trusted CAs and settings of every TLS connection a router makes: TLS 1.2 or later, the
/// instance's certificate verified against `ca_file` (or the system's default store), and its
/// name (a DNS name, or an IP address for an IP literal URL) checked against the certificate's
/// subjectAltName / CN. Never falls back to plain HTTP or to an unverified connection.
/// Immutable once made; thread-safe (NewSession from any thread).
class TlsClientContext {
 public:
  /// `ca_file`: PEM CA certificates the instances' certificates must chain to ("" = the
  /// system's default store, OpenSSL's default verify paths). Errors: kInvalidArgument naming
  /// the file and OpenSSL's reason when it cannot be loaded (missing, no certificate in it).
  static Result<std::shared_ptr<const TlsClientContext>> Create(const std::string& ca_file);
  ~TlsClientContext();
  TlsClientContext(const TlsClientContext&) = delete;
  TlsClientContext& operator=(const TlsClientContext&) = delete;

  /// A session for connected socket `fd` to `host` (SNI for a DNS name; the name or IP address
  /// the certificate must carry). Null with `*error` when OpenSSL cannot make one.
  std::unique_ptr<TlsSession> NewSession(int fd, const std::string& host, std::string* error) const;

  /// The CA file given ("" = the system's store), for messages.
  const std::string& ca_file() const { return ca_file_; }

 private:
  TlsClientContext(ssl_ctx_st* ctx, std::string ca_file)
      : ctx_(ctx), ca_file_(std::move(ca_file)) {}
  ssl_ctx_st* ctx_;
  std::string ca_file_;
};

}  // namespace kvpush::router
