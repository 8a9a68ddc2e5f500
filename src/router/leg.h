// Leg: one HTTP call from the router to an instance (a P leg, a D leg, a /v1/models proxy, a
// /kv/abort) that another thread can stop at any time by closing its connection. Legs of the
// router borrow keep-alive connections from a ConnectionPool.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "router/connection_pool.h"
#include "router/http_conn.h"
#include "router/instance_pool.h"

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
  std::string body;  ///< the body (a streamed 200: not collected)
};

/// One HTTP call to one instance, made either whole (Post, Get) or step by step (Send, then
/// ReadHead / ReadBody, or ReadAnswer) so that the steps may run on different threads (one at a
/// time; the hand-off between them must synchronize, e.g. through a WorkerPool queue). Every
/// step blocks on the caller's thread, each wait bounded by `io_timeout_s` (connect:
/// `connect_timeout_s`).
///
/// Stop() may be called from any thread, before or during the call, and makes it end promptly
/// with `stopped` set: the connection is shut down (the instance sees it close and aborts the
/// request) and never reused; a call not yet written is never sent.
///
/// Connections: with a ConnectionPool, the call borrows a keep-alive connection
/// (ConnectionPool::Take) and gives it back only after a complete answer that nothing stopped;
/// a call is never retried or resent (stale idle connections: see ConnectionPool). Without one,
/// a fresh connection is opened and closed after the call.
class Leg {
 public:
  /// `pool`: not owned, must outlive the leg; null for a fresh connection per call. `api_key`:
  /// sent as `Authorization: Bearer <api_key>` on every call ("" = none; the instances'
  /// --api-key). `tls`: the TLS settings of a fresh connection to an https instance (with a
  /// pool, the pool's are used).
  Leg(InstanceAddress address, ConnectionPool* pool, double connect_timeout_s, double io_timeout_s,
      const std::string& api_key = {}, std::shared_ptr<const TlsClientContext> tls = nullptr);
  /// Closes the connection of a call that did not end (an abandoned stream).
  ~Leg();
  Leg(const Leg&) = delete;
  Leg& operator=(const Leg&) = delete;

  /// Every later call of this leg carries `traceparent: value` (W3C Trace Context; the
  /// router's span of the request). Call before the leg's first call.
  void set_traceparent(const std::string& value) {
    trace_header_ = "traceparent: " + value + "\r\n";
  }

  /// Every later call of this leg carries `x-kvpush-resume-info: 1`: an instance's stream then
  /// carries a `: kvpush-resume` comment per output (docs/reliability.md, "Continuation").
  void set_resume_info() { resume_header_ = "x-kvpush-resume-info: 1\r\n"; }

  /// Every later call of this leg carries `x-kvpush-migration-source: 1` (kMigrationSourceHeader):
  /// a migration's P leg, which a draining instance still takes (docs/reliability.md,
  /// *Migration*).
  void set_migration_source() { resume_header_ += "x-kvpush-migration-source: 1\r\n"; }

  /// POSTs `body` (JSON) with `x-request-id: request_id` and reads the whole answer.
  LegResult Post(const std::string& path, const std::string& request_id, const std::string& body);
  /// GET `path`, reading the whole answer.
  LegResult Get(const std::string& path, const std::string& request_id);

  /// Step 1: writes the request (connecting first when needed); `body` is JSON (ignored for
  /// GET); `sse` adds `Accept: text/event-stream`. False when it failed; `*failed` then holds the
  /// result and the call has ended.
  bool Send(const std::string& method, const std::string& path, const std::string& request_id,
            const std::string& body, bool sse, LegResult* failed);
  /// Step 2, after Send: the status and headers into r->status and r->content_type. False when
  /// it failed (`*r` is then the failure and the call has ended).
  bool ReadHead(LegResult* r);
  /// Step 3, after ReadHead: appends the next decoded piece of the body to `*out`, waiting at
  /// most `timeout_ms`. `*ended` once the body is complete (the call has ended). On kFailed,
  /// `*failed` holds the failure (the call has ended).
  BodyRead ReadBody(int timeout_ms, std::string* out, bool* ended, LegResult* failed);
  /// Steps 2 and 3 whole, after Send: the complete answer (or the failure).
  LegResult ReadAnswer();

  /// Step 1 ahead of the code that reads the answer: Send now (push: D's leg before P's), and
  /// the first Post or DecodeStream::Start of this leg then only reads (or returns the write's
  /// failure). False when the write failed.
  bool SendAhead(const std::string& method, const std::string& path, const std::string& request_id,
                 const std::string& body, bool sse);
  /// What SendAhead did, for the code that reads the answer: nothing (kNone: send as usual),
  /// wrote the request (kWritten: read the answer), or failed (kFailed: `*failed` holds the
  /// failure; the call has ended). Consumes the mark.
  enum class Ahead { kNone, kWritten, kFailed };
  Ahead TakeSentAhead(LegResult* failed);

  /// Shuts the connection down (if any) and makes every later step fail at once. Thread-safe,
  /// idempotent.
  void Stop();
  /// Stop() because the instance was marked unhealthy; the call's result carries `reason` in
  /// `cut_reason` (the first reason given wins). Thread-safe, idempotent.
  void Cut(const std::string& reason);
  bool stopped() const { return stopped_.load(); }
  /// True once the call ended (answer read, failed or stopped).
  bool finished() const { return finished_.load(); }
  /// The reason given to Cut(), or "" when it was not cut. Thread-safe.
  std::string cut_reason() const;
  const InstanceAddress& address() const { return address_; }
  /// The bound of each wait, in ms.
  int io_timeout_ms() const { return static_cast<int>(std::min(io_timeout_s_ * 1000.0, 2.0e9)); }

 private:
  /// The failure result of the call's connection; ends the call.
  LegResult Failed(const std::string& fallback_error);
  /// Ends the call: the connection goes back to the pool when reusable and not stopped.
  void End();

  InstanceAddress address_;
  ConnectionPool* pool_ = nullptr;
  double connect_timeout_s_ = 5.0;
  double io_timeout_s_ = 600.0;
  std::string auth_header_;                      ///< "Authorization: Bearer ...\r\n" or ""
  std::string trace_header_;                     ///< "traceparent: ...\r\n" or empty
  std::string resume_header_;  ///< x-kvpush-resume-info / x-kvpush-migration-source lines, or empty
  std::shared_ptr<const TlsClientContext> tls_;  ///< for a fresh connection (no pool)
  std::atomic<bool> stopped_{false};
  std::atomic<bool> finished_{false};
  mutable Mutex mu_;  ///< guards cut_reason_ and the conn_ pointer against Stop()
  std::string cut_reason_ GUARDED_BY(mu_);
  /// The call's connection, from Send until the call ends. Set and reset by the owner under
  /// mu_ (Stop() reads it under mu_); the owner also reads it without mu_, so not GUARDED_BY.
  std::unique_ptr<HttpConn> conn_;
  /// SendAhead's outcome until TakeSentAhead consumes it (owner thread only).
  bool sent_ahead_ = false;
  std::optional<LegResult> ahead_failure_;
};

}  // namespace kvpush::router
