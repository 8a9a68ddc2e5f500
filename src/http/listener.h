// What a front door listens with: its TCP socket, its TLS context, and the process's open-file
// limit raised so that many connections fit. docs/architecture.md, "The front door (src/http/)".
#pragma once

#include <openssl/ssl.h>

#include <cstddef>
#include <string>

#include "common/status.h"

namespace kvpush::http {

/// A non-blocking TCP socket bound to `host`:`port` (0: a free port; the first address
/// getaddrinfo gives that binds) and listening with `backlog` (the kernel clamps it to
/// net.core.somaxconn). SO_REUSEADDR only, never SO_REUSEPORT, so a port in use fails. Returns
/// the socket (the caller closes it). Errors: kUnavailable naming host and port.
Result<int> ListenTcp(const std::string& host, int port, int backlog);

/// The bound port of a listening socket (0 when unknown).
int BoundPort(int fd);

/// An SSL_CTX serving `cert_file` (PEM, its chain after it) with `key_file` (PEM, unencrypted),
/// TLS 1.2 at least, as cpp-httplib's SSLServer sets it up. The caller frees it (SSL_CTX_free).
/// Errors: kInvalidArgument naming both files when OpenSSL cannot load them or they do not match.
Result<SSL_CTX*> LoadServerTlsContext(const std::string& cert_file, const std::string& key_file);

/// Raises this process's soft RLIMIT_NOFILE to its hard limit (once; logged at info the first
/// time) and returns the soft limit in force. Thread-safe.
size_t RaiseOpenFileLimit();

}  // namespace kvpush::http
