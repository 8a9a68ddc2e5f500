// ConnectionPool: idle keep-alive HTTP connections from the router to its instances, so that a
// leg reuses a warm TCP connection instead of opening one per leg (docs/router.md, "Connections
// and threads").
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "router/http_conn.h"
#include "router/instance_pool.h"
#include "router/tls_client.h"

namespace kvpush::router {

/// Settings of the pool.
struct ConnectionPoolOptions {
  /// Idle connections kept per instance; a connection given back beyond this is closed.
  size_t max_idle_per_instance = 64;
  /// A connection idle longer than this is closed instead of reused. Must stay below the
  /// instances' own keep-alive timeout (httplib's default: 5 s), so that the instance never
  /// closes a connection the router is about to reuse.
  double max_idle_s = 2.0;
  /// The router's TLS settings, given to every new connection (an https instance's connections
  /// are TLS ones, kept alive and reused as plain ones). Null: no https instance.
  std::shared_ptr<const TlsClientContext> tls;
};

/// What the pool did, for /metrics. Value type.
struct ConnectionPoolCounts {
  int64_t opened = 0;     ///< new connections handed out (their TCP connect happens on first use)
  int64_t reused = 0;     ///< idle connections handed out again
  int64_t discarded = 0;  ///< idle connections closed: the instance closed them, stale data, or
                          ///< idle longer than max_idle_s
};

/// Idle connections per instance URL. A caller Take()s a connection for one HTTP exchange and
/// Put()s it back only when that exchange completed cleanly (a whole answer read, the connection
/// still open, nothing stopped it); any other outcome destroys it, which closes its socket.
///
/// Stale connections: Take() hands out an idle connection only when it was idle for at most
/// `max_idle_s` and its socket has nothing to read (poll() with a zero timeout: no EOF, no error,
/// no stray bytes). A connection that fails this check is closed and the next one (or a new one)
/// is tried; no request was written on it, so nothing is ever sent twice. The pool never resends
/// a request: a call that fails after its request may have been written fails the leg (P/D legs
/// are not idempotent). Thread-safety: all methods may be called from any thread.
class ConnectionPool {
 public:
  explicit ConnectionPool(ConnectionPoolOptions options);
  ~ConnectionPool();
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  /// A live idle keep-alive connection to `address`, or a new one (not yet connected:
  /// HttpConn::connected() is false). Never null.
  std::unique_ptr<HttpConn> Take(const InstanceAddress& address);

  /// Gives back a connection after a clean exchange. Closed instead when it is not reusable
  /// (answer not read to its end, or the instance answered `Connection: close`), when
  /// `max_idle_per_instance` are already idle, or after Close() ran.
  void Put(const InstanceAddress& address, std::unique_ptr<HttpConn> conn);

  /// Closes every idle connection to `url` (the instance was marked unhealthy).
  void Clear(const std::string& url);

  /// Closes the idle connections older than `max_idle_s`, so that the instances' workers they
  /// hold (an httplib server keeps one worker per open connection) are freed promptly.
  void CloseExpired();

  /// Closes every idle connection; later Put()s close theirs. Idempotent.
  void Close();

  ConnectionPoolCounts counts() const;

  /// Connections idle now to `url`.
  size_t idle(const std::string& url) const;

 private:
  struct Idle {
    std::unique_ptr<HttpConn> conn;
    int64_t since_ns = 0;
  };

  ConnectionPoolOptions options_;
  mutable Mutex mu_;  ///< guards everything below
  std::unordered_map<std::string, std::deque<Idle>> idle_
      GUARDED_BY(mu_);  ///< by URL; most recent at the back
  ConnectionPoolCounts counts_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
};

}  // namespace kvpush::router
