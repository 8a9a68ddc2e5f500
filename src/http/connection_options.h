// ConnectionOptions: how a front door treats connections that send nothing or send slowly, and
// how many it holds. docs/reliability.md, "Idle and slow clients"; docs/configuration.md.
#pragma once

#include <cstddef>

#include "common/status.h"

namespace kvpush::http {

/// How a front door treats connections that send nothing or send slowly (docs/reliability.md,
/// "Idle and slow clients"; flags in docs/configuration.md). Value type.
struct ConnectionOptions {
  /// --timeout-keep-alive (uvicorn's and vLLM's name): seconds a connection may wait for its next
  /// request (after accept or a response) before it is closed, silently. It holds no thread.
  int keep_alive_timeout_s = 5;
  /// --request-head-timeout-s: seconds a request's head (and a TLS handshake) may take from its
  /// first byte; a Content-Length body must then keep coming (no gap over this), and a body the
  /// worker reads itself (chunked, Expect: 100-continue) must be read within it. Expiry: 408
  /// `request_timeout`, then close. Slow (slowloris) clients cost a socket, never a thread.
  int header_timeout_s = 10;
  /// --max-connections: open connections at most; one more is answered 503
  /// `too_many_connections` (plain HTTP; TLS: closed) at once. 0: 3/4 of the open-file limit
  /// (raised to its hard limit by Start), the rest left for legs, peers and files.
  size_t max_connections = 0;

  /// Errors: kInvalidArgument naming the flag (timeouts below 1 s or over a day).
  Status Validate() const;
};

}  // namespace kvpush::http
