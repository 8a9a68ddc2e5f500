// Leg: one HTTP call from the router to an instance (a P leg, a D leg, a /v1/models proxy) that
// another thread can stop at any time by closing its connection. Legs of the router borrow a
// keep-alive connection from a ConnectionPool.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "router/connection_pool.h"
#include "router/instance_pool.h"

namespace httplib {
class Client;
struct Request;
}  // namespace httplib

namespace kvpush::router {

/// Outcome of one leg. `answered` is true when a complete HTTP answer arrived (any status).
struct LegResult {
  bool answered = false;
  bool connect_failed = false;  ///< the instance could not be reached (refused, timed out)
  bool stopped = false;         ///< Stop() or Cut() ended it
  std::string cut_reason;       ///< set when Cut() ended it: why the instance is unhealthy
  std::string error;            ///< transport error text when !answered
  int status = 0;               ///< HTTP status; also set when the stream broke after headers
  std::string content_type;
  std::string body;  ///< the body (PostStreaming: only when status != 200)
};

/// One HTTP call to one instance. Calls run on the caller's thread and block; Stop() may be
/// called from any thread, before or during a call, and makes the call return promptly with
/// `stopped` set: a call in flight has its connection shut down (the instance sees it close and
/// aborts the request), and that connection is never reused. A Stop() that races with the start
/// of a call (after its check, before its request is written) is caught when the answer's
/// headers arrive: the call then ends `stopped` and closes its connection.
///
/// With a ConnectionPool, a call borrows a keep-alive connection (ConnectionPool::Take) and gives
/// it back only after a complete answer that nothing stopped; a call is never retried or resent
/// (see ConnectionPool for stale connections). Without one, a fresh connection is opened and
/// closed (no keep-alive).
class Leg {
 public:
  /// Uses `pool` (not owned; must outlive the leg) for its connection.
  Leg(InstanceAddress address, ConnectionPool* pool);
  /// A fresh connection without keep-alive; timeouts: connect `connect_timeout_s`, each
  /// read/write `read_timeout_s`.
  Leg(InstanceAddress address, double connect_timeout_s, double read_timeout_s);
  ~Leg();
  Leg(const Leg&) = delete;
  Leg& operator=(const Leg&) = delete;

  /// POSTs `body` (JSON) with `x-request-id: request_id` and reads the whole answer.
  LegResult Post(const std::string& path, const std::string& request_id, const std::string& body);

  /// GET `path`, reading the whole answer.
  LegResult Get(const std::string& path, const std::string& request_id);

  /// POSTs `body` and streams the answer: `on_headers(status, content_type)` once when the
  /// status line and headers arrived, then, when the status is 200, `on_data` for each piece of
  /// the body as it arrives (other statuses collect the body into the result). Either callback
  /// returning false stops the call (result `stopped`).
  LegResult PostStreaming(const std::string& path, const std::string& request_id,
                          const std::string& body,
                          const std::function<bool(int, const std::string&)>& on_headers,
                          const std::function<bool(const char*, size_t)>& on_data);

  /// Closes the connection (if any) and makes every later call fail at once. Thread-safe,
  /// idempotent.
  void Stop();
  /// Stop() because the instance was marked unhealthy; the call's result carries `reason` in
  /// `cut_reason` (the first reason given wins). Thread-safe, idempotent.
  void Cut(const std::string& reason);
  bool stopped() const { return stopped_.load(); }
  /// True once a call on this leg returned (a leg makes one call).
  bool finished() const { return finished_.load(); }
  /// The reason given to Cut(), or "" when it was not cut. Thread-safe.
  std::string cut_reason() const;
  const InstanceAddress& address() const { return address_; }

 private:
  /// Runs `req` on a borrowed (or fresh) connection and collects the answer.
  LegResult Send(httplib::Request& req);
  std::unique_ptr<httplib::Client> Borrow();
  void GiveBack(std::unique_ptr<httplib::Client> cli, bool clean);

  InstanceAddress address_;
  ConnectionPool* pool_ = nullptr;  ///< null: one fresh connection per call
  double connect_timeout_s_ = 5.0, read_timeout_s_ = 600.0;
  std::atomic<bool> stopped_{false};
  std::atomic<bool> finished_{false};
  mutable std::mutex mu_;              ///< guards cut_reason_, active_
  std::string cut_reason_;
  httplib::Client* active_ = nullptr;  ///< the connection of the call in flight
};

}  // namespace kvpush::router
