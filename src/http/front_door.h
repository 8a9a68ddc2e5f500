// FrontDoor: the HTTP scaffold that both kvpush front doors (the instance's server/ and the
// router/) register their routes on. It owns everything that is not a handler: the listening
// socket, the connection loop (ConnectionLoop: idle and slow clients hold no thread), the request
// threads (ElasticTaskQueue) that run cpp-httplib's parsing, routing and response writing, the 405
// answer of a known path, OpenAI-style bodies for 404/400/413/414 and for a handler's exception,
// and a hook called after every response (counters, access log).
// docs/architecture.md, "The front door (src/http/)".
#pragma once

#include <httplib.h>
#include <openssl/ssl.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "http/api_error.h"
#include "http/build_info.h"
#include "http/connection_options.h"
#include "http/request_head.h"

namespace kvpush::http {

class Connection;
class ConnectionLoop;
class RequestServer;

/// A handler sees cpp-httplib's request and response (streams use its chunked content provider);
/// how connections are accepted and which thread runs a handler is the front door's business.
using Request = httplib::Request;
using Response = httplib::Response;
using Handler = std::function<void(const Request&, Response&)>;
/// Called once a response was written (or the connection failed): method, path, status.
using ResponseHook = std::function<void(const Request&, const Response&)>;

class PrometheusWriter;

/// Answers `res` with `e`: its HTTP status and its OpenAI error body (application/json).
void ReplyError(Response& res, const ApiError& e);

struct FrontDoorOptions {
  std::string host = "127.0.0.1";
  int port = 0;                      ///< 0: a free port, see FrontDoor::port()
  size_t max_body_bytes = 8u << 20;  ///< larger bodies get 413
  /// Request threads kept running. A thread serves one request (its streamed body included),
  /// never an idle connection.
  size_t worker_threads = 16;
  /// Requests that arrive while no worker is idle run on a short-lived thread of their own, at
  /// most this many at once; beyond that they wait for a worker (0: a fixed pool).
  size_t max_extra_threads = 0;
  int write_timeout_s = 0;  ///< a socket write's limit (seconds); 0: 5 s (cpp-httplib's default)
  int listen_backlog = 1024;
  BuildInfo build;  ///< answered on GET /version
  /// vLLM's --api-key: when non-empty, every path but the open ones (kOpenPaths: /health,
  /// /version, /metrics) needs `Authorization: Bearer <api_key>`, or gets 401 `invalid_api_key`.
  std::string api_key;
  /// One access-log line per request at info (requests to the open paths at debug): method,
  /// path, status, milliseconds to the response's end, and the AccessNote's fields.
  bool access_log = false;
  /// vLLM's --ssl-certfile / --ssl-keyfile: both set, the door serves HTTPS only (OpenSSL through
  /// cpp-httplib's SSLServer); PEM files, the key unencrypted. One set without the other, or files
  /// OpenSSL cannot load: Start() fails.
  std::string tls_cert_file;
  std::string tls_key_file;
  ConnectionOptions connections;  ///< idle and slow clients, the connection cap
};

/// What the front door's connections came to since Start (for /metrics and tests).
struct ConnectionCounts {
  size_t open = 0;             ///< connections open now (idle, reading, or being served)
  uint64_t refused = 0;        ///< refused at accept: over max_connections or no descriptor left
  uint64_t timed_out = 0;      ///< closed with 408: handshake, head or body too slow
  size_t max_connections = 0;  ///< the limit in force (after Start)
};

/// Writes `c` as kvpush_http_connections_open / _max (gauges) and
/// kvpush_http_connections_refused_total / _timed_out_total (counters), the same families on the
/// instances' and the router's /metrics.
void WriteConnectionCounts(PrometheusWriter& w, const ConnectionCounts& c);

/// What a handler adds to its request's access-log line. Unset fields (empty, negative) are left
/// out of the line.
struct AccessNote {
  std::string request_id;      ///< the request's id (else its x-request-id header is logged)
  std::string mode;            ///< router: push | pull | colocated
  int64_t prompt_tokens = -1;  ///< usage.prompt_tokens
  int64_t output_tokens = -1;  ///< usage.completion_tokens
  double ttft_ms = -1;         ///< from the request's arrival to its first token
};

/// The AccessNote of the request the calling thread serves. cpp-httplib runs one request's
/// routing, handler, streamed body and logger on one request thread, so a handler (and its
/// content provider) fills this and the front door's logger reads it; it is reset when the next
/// request's routing starts. Call only from a handler or content provider.
AccessNote& CurrentAccessNote();

/// Names the request the calling thread serves: the id of its access-log line, and the id every
/// log line of this thread carries until that line is written (common/log.h, LogRequestScope).
/// The front door starts each request with its x-request-id header when the header is a valid id
/// (1..256 visible ASCII characters, pd/ids.h's rule), so a handler calls this once it has chosen
/// the id it answers with. Call only from a handler or content provider.
void SetCurrentRequestId(const std::string& request_id);

/// When the calling thread's current request arrived (its routing began). Same rules.
std::chrono::steady_clock::time_point CurrentRequestStart();

/// Paths a front door answers without its API key: what load balancers, orchestrators and
/// Prometheus poll (vLLM leaves them open too).
inline constexpr std::string_view kOpenPaths[] = {"/health", "/version", "/metrics"};

/// Whether `authorization` (an Authorization header's value, "" when absent) carries `api_key`
/// as a Bearer token. The comparison takes the same time wherever the first difference is. Pure.
bool BearerMatches(std::string_view authorization, std::string_view api_key);

/// The HTTP front door of one process. Register routes, then Start(); each path takes one method
/// and every other method on it gets 405 with an Allow header. Error bodies are OpenAI errors
/// ({"error": {"message", "type", "param", "code"}}, http/api_error.h): 404 `not_found` for an
/// unknown path, 405 `method_not_allowed`, 400 for a request cpp-httplib cannot read, 413 for a
/// body over max_body_bytes, 414, and 500 `server_error` with the exception's message when a
/// handler throws. A handler's own non-empty body is never replaced. Every front door answers
/// GET /version with its options' BuildInfo.
/// Connections: one loop thread (ConnectionLoop) accepts and holds every connection that is idle
/// or still sending its request; a worker thread gets a connection only with a complete request
/// and gives it back after the response (keep-alive), so idle and slow clients cost no thread.
/// Thread-safety: Get/Post/OnResponse and Start/Stop from one controlling thread, before and
/// around serving; handlers and the hook run on the request threads, concurrently; counts() from
/// any thread.
class FrontDoor {
 public:
  explicit FrontDoor(FrontDoorOptions options);
  ~FrontDoor();  ///< Stop()
  FrontDoor(const FrontDoor&) = delete;
  FrontDoor& operator=(const FrontDoor&) = delete;

  /// Registers `handler` for GET / POST on exactly `path` (no patterns). Before Start.
  void Get(std::string path, Handler handler);
  void Post(std::string path, Handler handler);
  /// Sets the hook called after every response, known path or not. Before Start.
  void OnResponse(ResponseHook hook);

  /// Raises the open-file limit, binds host:port (listen backlog `listen_backlog`) and starts the
  /// connection loop and the request threads; returns once connections are accepted. Errors:
  /// kUnavailable (bind or epoll failed), kFailedPrecondition (already started),
  /// kInvalidArgument (TLS files: one without the other, or not loadable).
  Status Start();
  /// Stops accepting and closes the idle connections at once, lets the requests in flight (and
  /// those queued) finish, closes their connections after, joins every thread. Idempotent.
  void Stop();

  /// The bound port (after Start).
  int port() const { return port_; }
  /// Whether `path` has a handler (for counters that fold unknown paths into one label).
  bool IsRoute(std::string_view path) const;
  /// The connection counters (zeros before Start).
  ConnectionCounts counts() const;

 private:
  struct Route {
    std::string path;
    const char* method;
  };
  void InstallErrorAnswers();
  /// On a request thread: serves the one complete request `conn` brought, then gives `conn`
  /// back to the loop (or closes it).
  void Serve(std::unique_ptr<Connection> conn);
  /// After the answer to the request `scan` describes (scanned at dispatch, from `start` in
  /// `conn.in`; the library consumed `consumed` bytes of it): drops what is left of its body
  /// (NextRequestStart) and returns true, or returns false when the connection must close.
  static bool SkipUnreadBody(Connection& conn, const RequestScan& scan, size_t start,
                             size_t consumed);
  void InstallPreRouting();
  /// The access-log line of one answered request.
  void LogAccess(const Request& req, const Response& res) const;

  FrontDoorOptions options_;
  std::unique_ptr<RequestServer> server_;
  std::vector<Route> routes_;
  ResponseHook hook_;
  SSL_CTX* ssl_ctx_ = nullptr;  ///< TLS only; freed by the destructor
  std::unique_ptr<httplib::TaskQueue> workers_;
  std::unique_ptr<ConnectionLoop> loop_;
  std::atomic<bool> stopping_{false};  ///< responses from now on carry Connection: close
  size_t max_connections_ = 0;
  int port_ = 0;
};

}  // namespace kvpush::http
