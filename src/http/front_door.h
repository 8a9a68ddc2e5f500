// FrontDoor: the HTTP scaffold that both kvpush front doors (the instance's server/ and the
// router/) register their routes on. It owns the cpp-httplib server and everything that is not a
// handler: bind and socket options, the listen backlog, the connection threads (ElasticTaskQueue),
// the 405 answer of a known path, OpenAI-style bodies for 404/400/413/414 and for a handler's
// exception, and a hook called after every response (counters, access log).
// docs/architecture.md, "The front door (src/http/)".
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/status.h"
#include "http/api_error.h"
#include "http/build_info.h"

namespace kvpush::http {

/// A handler sees cpp-httplib's request and response (streams use its chunked content provider);
/// how connections are accepted and which thread runs a handler is the front door's business.
using Request = httplib::Request;
using Response = httplib::Response;
using Handler = std::function<void(const Request&, Response&)>;
/// Called once a response was written (or the connection failed): method, path, status.
using ResponseHook = std::function<void(const Request&, const Response&)>;

/// Answers `res` with `e`: its HTTP status and its OpenAI error body (application/json).
void ReplyError(Response& res, const ApiError& e);

struct FrontDoorOptions {
  std::string host = "127.0.0.1";
  int port = 0;                      ///< 0: a free port, see FrontDoor::port()
  size_t max_body_bytes = 8u << 20;  ///< larger bodies get 413
  size_t worker_threads = 16;        ///< connection threads kept running
  /// Connections that arrive while no worker is idle run on a short-lived thread of their own, at
  /// most this many at once; beyond that they wait for a worker (0: a fixed pool).
  size_t max_extra_threads = 0;
  int write_timeout_s = 0;  ///< a socket write's limit; 0: cpp-httplib's default (5 s)
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
};

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
/// routing, handler, streamed body and logger on one connection thread, so a handler (and its
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
/// Thread-safety: Get/Post/OnResponse and Start/Stop from one controlling thread, before and
/// around serving; handlers and the hook run on the connection threads, concurrently.
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

  /// Binds host:port, raises the listen backlog and serves on a background thread; returns once
  /// the listen loop runs. Errors: kUnavailable (bind failed, or the loop did not start within
  /// 10 s), kFailedPrecondition (already started), kInvalidArgument (TLS files: one without the
  /// other, or not loadable).
  Status Start();
  /// Stops accepting, lets the connection threads finish, joins them. Idempotent.
  void Stop();

  /// The bound port (after Start).
  int port() const { return port_; }
  /// Whether `path` has a handler (for counters that fold unknown paths into one label).
  bool IsRoute(std::string_view path) const;

 private:
  struct Route {
    std::string path;
    const char* method;
  };
  void InstallErrorAnswers();
  void InstallPreRouting();
  /// The access-log line of one answered request.
  void LogAccess(const Request& req, const Response& res) const;

  FrontDoorOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::vector<Route> routes_;
  ResponseHook hook_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace kvpush::http
