#include "router/tls_client.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvpush::router {
namespace {

/// The oldest error on this thread's OpenSSL error queue, as text; the queue is cleared.
std::string TakeErrorText(const char* fallback) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return fallback;
  const char* reason = ERR_reason_error_string(code);
  if (reason != nullptr) return reason;
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

bool IsIpLiteral(const std::string& host) {
  unsigned char addr[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), addr) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), addr) == 1;
}

}  // namespace

TlsSession::~TlsSession() {
  // One non-blocking close_notify when the connection ends cleanly (never after a fatal error:
  // OpenSSL forbids it; never on a shut-down socket: the write would fail).
  if (healthy_ && SSL_is_init_finished(ssl_) == 1) {
    ERR_clear_error();
    (void)SSL_shutdown(ssl_);
  }
  SSL_free(ssl_);
  ERR_clear_error();
}

TlsStep TlsSession::Outcome(int ret, const char* what, std::string* error) {
  const int e = SSL_get_error(ssl_, ret);
  switch (e) {
    case SSL_ERROR_NONE:
      return TlsStep::kDone;
    case SSL_ERROR_WANT_READ:
      return TlsStep::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return TlsStep::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      clean_close_ = true;
      return TlsStep::kClosed;
    default:
      break;
  }
  healthy_ = false;
  const int saved_errno = errno;
  const unsigned long code = ERR_peek_error();
  // A TCP close without close_notify: OpenSSL 3 reports it as SSL_R_UNEXPECTED_EOF_WHILE_READING,
  // older versions as SSL_ERROR_SYSCALL with an empty queue and ret 0.
  const bool eof = (e == SSL_ERROR_SSL && ERR_GET_LIB(code) == ERR_LIB_SSL &&
                    ERR_GET_REASON(code) == SSL_R_UNEXPECTED_EOF_WHILE_READING) ||
                   (e == SSL_ERROR_SYSCALL && code == 0 && (ret == 0 || saved_errno == 0));
  if (eof) {
    ERR_clear_error();
    return TlsStep::kClosed;
  }
  if (e == SSL_ERROR_SYSCALL && code == 0) {
    *error = std::string(what) + ": " + std::strerror(saved_errno);
  } else {
    *error = std::string(what) + ": " + TakeErrorText("TLS error");
  }
  return TlsStep::kFailed;
}

TlsStep TlsSession::Handshake(std::string* error) {
  ERR_clear_error();
  const int r = SSL_connect(ssl_);
  if (r == 1) return TlsStep::kDone;
  std::string why;
  TlsStep step = Outcome(r, "TLS handshake failed", &why);
  if (step == TlsStep::kWantRead || step == TlsStep::kWantWrite) return step;
  // The instance's certificate was refused: say so, with OpenSSL's reason ("self-signed
  // certificate", "unable to get local issuer certificate", "IP address mismatch", ...).
  const long verify = SSL_get_verify_result(ssl_);
  ERR_clear_error();
  if (verify != X509_V_OK) {
    *error = std::string("TLS certificate verification failed: ") +
             X509_verify_cert_error_string(verify);
  } else if (step == TlsStep::kClosed) {
    *error = "TLS handshake failed: the instance closed the connection";
  } else {
    *error = why;
  }
  healthy_ = false;
  return TlsStep::kFailed;
}

TlsStep TlsSession::Read(char* buf, size_t n, size_t* got, std::string* error) {
  *got = 0;
  ERR_clear_error();
  const int r = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (r > 0) {
    *got = static_cast<size_t>(r);
    return TlsStep::kDone;
  }
  return Outcome(r, "TLS read", error);
}

TlsStep TlsSession::Write(const char* buf, size_t n, size_t* put, std::string* error) {
  *put = 0;
  ERR_clear_error();
  const int r = SSL_write(ssl_, buf, static_cast<int>(std::min<size_t>(n, 1 << 30)));
  if (r > 0) {
    *put = static_cast<size_t>(r);
    return TlsStep::kDone;
  }
  const TlsStep step = Outcome(r, "TLS write", error);
  if (step == TlsStep::kClosed) {
    *error = "TLS write: the instance closed the connection";
    return TlsStep::kFailed;
  }
  return step;
}

bool TlsSession::HasPending() const {
  return SSL_has_pending(ssl_) == 1;
}

Result<std::shared_ptr<const TlsClientContext>> TlsClientContext::Create(
    const std::string& ca_file) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) {
    return Internal("TLS: cannot make an SSL_CTX: " + TakeErrorText("out of memory"));
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  // Partial writes, and a retried write may come from a moved buffer (HttpConn's loop).
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  const int loaded = ca_file.empty() ? SSL_CTX_set_default_verify_paths(ctx)
                                     : SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr);
  if (loaded != 1) {
    const std::string why = TakeErrorText("unknown error");
    SSL_CTX_free(ctx);
    if (ca_file.empty()) return Internal("TLS: cannot load the system's CA store: " + why);
    return InvalidArgument("--ssl-ca-certs " + ca_file +
                           ": cannot load CA certificates (PEM) from it: " + why);
  }
  return std::shared_ptr<const TlsClientContext>(new TlsClientContext(ctx, ca_file));
}

TlsClientContext::~TlsClientContext() {
  SSL_CTX_free(ctx_);
}

std::unique_ptr<TlsSession> TlsClientContext::NewSession(int fd, const std::string& host,
                                                         std::string* error) const {
  ERR_clear_error();
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr) {
    *error = "TLS: SSL_new: " + TakeErrorText("out of memory");
    return nullptr;
  }
  std::unique_ptr<TlsSession> s(new TlsSession(ssl));
  bool ok = SSL_set_fd(ssl, fd) == 1;
  if (IsIpLiteral(host)) {
    // An IP literal: the certificate must carry it as an iPAddress subjectAltName; no SNI
    // (RFC 6066 allows host names only).
    ok = ok && X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str()) == 1;
  } else {
    ok = ok && SSL_set_tlsext_host_name(ssl, host.c_str()) == 1;
    SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
    ok = ok && SSL_set1_host(ssl, host.c_str()) == 1;
  }
  if (!ok) {
    s->Abandon();
    *error = "TLS: cannot set up a session for " + host + ": " + TakeErrorText("unknown error");
    return nullptr;
  }
  SSL_set_connect_state(ssl);
  return s;
}

}  // namespace kvpush::router
