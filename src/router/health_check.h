// One GET /health from the router to an instance (plain HTTP or TLS, through HttpConn), as the
// InstancePool's health thread runs it every --health-interval-ms (docs/router.md).
#pragma once

#include <memory>
#include <string>

#include "router/instance_pool.h"
#include "router/tls_client.h"

namespace kvpush::router {

/// What one GET /health gave. Value type.
struct HealthAnswer {
  bool answered = false;    ///< a whole HTTP answer arrived (any status)
  int status = 0;           ///< its status
  std::string body;         ///< its body (at most 1 MiB)
  std::string error;        ///< why there is no answer ("connect: Connection refused", ...)
  bool tls_failed = false;  ///< no answer because the TLS handshake failed (the instance's
                            ///< certificate refused, or the port does not speak TLS)
};

/// GET /health on a fresh connection to `address` (closed after the answer), each wait at most
/// `timeout_ms`. `tls`: the router's TLS settings, needed for an https address (else the check
/// fails). Blocking, on the caller's thread; thread-safe (no shared state).
HealthAnswer CheckHealth(const InstanceAddress& address,
                         const std::shared_ptr<const TlsClientContext>& tls, int timeout_ms);

}  // namespace kvpush::router
