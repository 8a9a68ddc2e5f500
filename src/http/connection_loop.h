// ConnectionLoop: the front door's event loop. One thread (epoll) owns the listening socket and
// every connection that is idle or still sending its request, so an idle or slow client costs a
// socket and a few hundred bytes, never a thread; a connection goes to a worker only with a
// complete request. docs/architecture.md, "The front door (src/http/)"; docs/reliability.md.
#pragma once

#include <openssl/ssl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "http/connection.h"

namespace kvpush::http {

struct ConnectionLoopOptions {
  int listen_fd = -1;          ///< bound, listening; taken (closed by Stop)
  SSL_CTX* ssl_ctx = nullptr;  ///< TLS: the handshake runs on the loop; null: plain HTTP
  /// Seconds a connection may wait for its next request (after accept or after a response)
  /// before the loop closes it, silently (uvicorn's --timeout-keep-alive).
  int keep_alive_timeout_s = 5;
  /// Seconds a request's head (and a TLS handshake) may take from its first byte; a Content-Length
  /// body must then keep arriving (no gap over this). Expiry: 408, then close.
  int header_timeout_s = 10;
  /// Open connections at most (those with a worker included); one over: a short 503 (plain HTTP)
  /// or a bare close (TLS), at accept.
  size_t max_connections = 10000;
  size_t max_head_bytes = 64u << 10;  ///< a head still unfinished at this size: 431, then close
  size_t max_body_bytes = 8u << 20;   ///< Content-Length bodies up to this are read by the loop
};

/// The loop. Start() runs it on its own thread; each connection with a complete request is moved
/// to `dispatch` (on the loop thread: it must only queue the work), and the worker hands it back
/// with Return() after the response. Thread-safety: Start/Stop from one controlling thread;
/// Return and the counters from any thread.
class ConnectionLoop {
 public:
  using Dispatch = std::function<void(std::unique_ptr<Connection>)>;

  ConnectionLoop(ConnectionLoopOptions options, Dispatch dispatch);
  ~ConnectionLoop();  ///< Stop()
  ConnectionLoop(const ConnectionLoop&) = delete;
  ConnectionLoop& operator=(const ConnectionLoop&) = delete;

  /// Creates the epoll set and starts the loop thread. Errors: kUnavailable (epoll/eventfd).
  Status Start();
  /// Stops accepting (closes the listening socket), closes every connection the loop holds (idle
  /// or mid-request-head), joins the loop thread. Connections with a worker are closed when they
  /// come back. Idempotent.
  void Stop();

  /// A worker is done with `conn`: with `keep_alive`, the loop waits for its next request (bytes
  /// it already has go first); else, or once stopped, it is closed here.
  void Return(std::unique_ptr<Connection> conn, bool keep_alive);

  size_t open_connections() const { return open_.load(std::memory_order_relaxed); }
  /// Connections refused at accept (over max_connections, or no file descriptor left).
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }
  /// Connections closed with 408 because their handshake, head or body took too long.
  uint64_t timed_out() const { return timed_out_.load(std::memory_order_relaxed); }

 private:
  using Clock = Connection::Clock;

  void Run();
  void AcceptAll();
  /// Refuses an accepted socket over the cap: a 503 (plain HTTP) and close.
  void Refuse(int fd);
  /// Moves `fd`'s connection on: handshake, read, then dispatch, answer, close or wait.
  void Advance(int fd);
  /// Registers `c` for `events` (EPOLLIN or EPOLLOUT), or (0) unregisters it.
  void Watch(Connection& c, uint32_t events);
  /// Closes `fd`'s connection; `answer`, when not empty, is written first (best effort).
  void Close(int fd, std::string_view answer);
  void TakeReturned();
  /// Closes the connections past their deadline; sets next_sweep_.
  void Sweep();
  void SetDeadline(Connection& c, Clock::time_point t);
  void Discard(std::unique_ptr<Connection> conn);

  const ConnectionLoopOptions options_;
  const Dispatch dispatch_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;   ///< eventfd: Return and Stop wake the loop
  int spare_fd_ = -1;  ///< kept open to free when accept hits EMFILE (then refuse politely)
  std::thread thread_;
  // Owned by the loop thread.
  std::unordered_map<int, std::unique_ptr<Connection>> conns_;
  Clock::time_point next_sweep_ = Clock::time_point::max();
  Clock::time_point next_refusal_log_{};

  Mutex mu_;
  std::vector<std::unique_ptr<Connection>> returned_ GUARDED_BY(mu_);
  bool stopped_ GUARDED_BY(mu_) = false;

  std::atomic<size_t> open_{0};
  std::atomic<uint64_t> refused_{0};
  std::atomic<uint64_t> timed_out_{0};
};

}  // namespace kvpush::http
