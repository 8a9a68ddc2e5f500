#include "router/health_check.h"

#include "router/http_conn.h"

namespace kvpush::router {

HealthAnswer CheckHealth(const InstanceAddress& address,
                         const std::shared_ptr<const TlsClientContext>& tls, int timeout_ms) {
  HealthAnswer a;
  HttpConn conn(address, tls);
  const double timeout_s = timeout_ms / 1000.0;
  HttpHead head;
  if (!conn.Connect(timeout_s) ||
      !conn.WriteRequest("GET", "/health", "Connection: close\r\n", "", timeout_s) ||
      !conn.ReadHead(timeout_s, &head)) {
    a.error = conn.error();
    a.tls_failed = conn.tls_failed();
    return a;
  }
  bool ended = false;
  while (!ended) {
    const BodyRead r = conn.ReadBody(timeout_ms, &a.body, &ended);
    if (r == BodyRead::kTimeout) {
      a.error = "read timed out";
      return a;
    }
    if (r == BodyRead::kFailed) {
      a.error = conn.error();
      return a;
    }
    if (a.body.size() > (1u << 20)) {
      a.error = "answer body larger than 1 MiB";
      return a;
    }
  }
  a.answered = true;
  a.status = head.status;
  return a;
}

}  // namespace kvpush::router
