#include "http/front_door.h"

#include <openssl/crypto.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>
#include <utility>

#include "common/encoding.h"
#include "common/log.h"
#include "http/api_error.h"
#include "http/connection.h"
#include "http/connection_loop.h"
#include "http/listener.h"
#include "http/prometheus.h"
#include "http/request_head.h"
#include "http/task_queue.h"

namespace kvpush::http {

/// cpp-httplib's server with its one-request entry point opened: it parses, routes and answers
/// one request read from any Stream (the front door's connection loop does the rest).
class RequestServer final : public httplib::Server {
 public:
  using httplib::Server::process_request;

  /// cpp-httplib ends a chunked (streamed) answer early once its listening socket is invalid
  /// (its stop()): mark it listening while the front door serves, and stopped by Stop(), so
  /// streams behave as they did under cpp-httplib's own loop.
  void SetServing(int listen_fd) { svr_sock_ = listen_fd; }
  void SetStopped() { svr_sock_ = INVALID_SOCKET; }
};

namespace {

/// The message of an error cpp-httplib answers without a body (one vocabulary for the instances
/// and the router: docs/server.md, "Errors").
std::string BodylessErrorMessage(const Request& req, int status) {
  switch (status) {
    case 404:
      return "no route for " + req.method + " " + req.path;
    case 400:
      return "malformed HTTP request (unreadable body, headers or content encoding; send a "
             "JSON body with Content-Type: application/json)";
    case 413:
      return "request body too large";
    case 414:
      return "request URI too long";
    default:
      return "HTTP error " + std::to_string(status);
  }
}

/// The current request of this connection thread (see CurrentAccessNote).
thread_local AccessNote t_note;
thread_local std::chrono::steady_clock::time_point t_start;
/// True once the calling request thread answered a request the library itself could not read
/// whole (its own bodyless 400, 413, 414 or 431): what follows in the buffer is not known to
/// start a request, so the connection closes (RFC 9112 §9.3). A handler's own 4xx (an API
/// error with a body) is well framed and keeps the connection.
thread_local bool t_unframed = false;
/// Whether the calling request thread's current request may use a path behind --api-key: set
/// before routing (InstallPreRouting), checked once its body was read (RefusedUnauthorized).
thread_local bool t_authorized = true;
/// The 401's message for the current request: no key, or a wrong one.
thread_local bool t_key_given = false;

/// Answers 401 when the current request may not use its path (--api-key): the body was read
/// already, so the connection stays usable (docs/server.md, "Early answers"). Returns whether
/// it answered.
bool RefusedUnauthorized(Response& res) {
  if (t_authorized) return false;
  res.set_header("WWW-Authenticate", "Bearer");
  ReplyError(res, ApiError{401,
                           t_key_given ? "incorrect API key"
                                       : "no API key given: send Authorization: Bearer <key>",
                           "invalid_request_error", "", "invalid_api_key"});
  return true;
}

/// True for the statuses cpp-httplib answers on its own when it could not read a request whole.
bool IsFramingStatus(int status) {
  return status == 400 || status == 413 || status == 414 || status == 431;
}

bool IsOpenPath(const std::string& path) {
  for (std::string_view open : kOpenPaths) {
    if (path == open) return true;
  }
  return false;
}

/// The longest request head the loop buffers (cpp-httplib itself answers 414 over 8 KiB of URI).
constexpr size_t kMaxHeadBytes = 64u << 10;

}  // namespace

AccessNote& CurrentAccessNote() {
  return t_note;
}

void SetCurrentRequestId(const std::string& request_id) {
  t_note.request_id = request_id;
  SetLogRequestId(request_id);
}

std::chrono::steady_clock::time_point CurrentRequestStart() {
  return t_start;
}

bool BearerMatches(std::string_view authorization, std::string_view api_key) {
  constexpr std::string_view kScheme = "Bearer ";
  if (authorization.size() < kScheme.size()) return false;
  // The scheme is case-insensitive (RFC 9110, 11.1).
  for (size_t i = 0; i < kScheme.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(authorization[i])) !=
        std::tolower(static_cast<unsigned char>(kScheme[i]))) {
      return false;
    }
  }
  const std::string_view token = authorization.substr(kScheme.size());
  // OpenSSL's constant-time compare, as peer_auth.cc checks its MACs.
  return token.size() == api_key.size() &&
         CRYPTO_memcmp(token.data(), api_key.data(), api_key.size()) == 0;
}

void WriteConnectionCounts(PrometheusWriter& w, const ConnectionCounts& c) {
  w.Scalar({"kvpush_http_connections_open", "gauge",
            "Client connections open (idle, sending a request, or being answered)."},
           static_cast<double>(c.open));
  w.Scalar({"kvpush_http_connections_max", "gauge",
            "Client connections allowed at once (--max-connections, or 3/4 of the open-file "
            "limit)."},
           static_cast<double>(c.max_connections));
  w.Scalar({"kvpush_http_connections_refused_total", "counter",
            "Client connections refused at accept: over the limit (503) or no descriptor left."},
           static_cast<double>(c.refused));
  w.Scalar({"kvpush_http_connections_timed_out_total", "counter",
            "Client connections closed with 408: TLS handshake, request head or body too slow."},
           static_cast<double>(c.timed_out));
}

void ReplyError(Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(e.ToJson(), "application/json");
}

FrontDoor::FrontDoor(FrontDoorOptions options)
    : options_(std::move(options)), server_(std::make_unique<RequestServer>()) {}

FrontDoor::~FrontDoor() {
  Stop();
  if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
}

namespace {
/// `handler`, behind the api key (RefusedUnauthorized).
Handler Guarded(Handler handler) {
  return [handler = std::move(handler)](const Request& req, Response& res) {
    if (!RefusedUnauthorized(res)) handler(req, res);
  };
}
}  // namespace

void FrontDoor::Get(std::string path, Handler handler) {
  server_->Get(path, Guarded(std::move(handler)));
  routes_.push_back(Route{std::move(path), "GET"});
}

void FrontDoor::Post(std::string path, Handler handler) {
  server_->Post(path, Guarded(std::move(handler)));
  routes_.push_back(Route{std::move(path), "POST"});
}

void FrontDoor::OnResponse(ResponseHook hook) {
  hook_ = std::move(hook);
}

bool FrontDoor::IsRoute(std::string_view path) const {
  for (const Route& r : routes_) {
    if (r.path == path) return true;
  }
  return false;
}

void FrontDoor::InstallPreRouting() {
  server_->set_pre_routing_handler([this](const Request& req, Response& /*res*/) {
    t_note = AccessNote{};
    t_start = std::chrono::steady_clock::now();
    const std::string& id = req.get_header_value("x-request-id");
    SetLogRequestId(IsVisibleAsciiId(id) ? std::string_view(id) : std::string_view());
    // Never answered here: the body is not read yet, and an answer now would leave it on the
    // connection to be read as the next request. The 401 comes once it was read (Guarded, the
    // 405 and 404 answers).
    const std::string& auth = req.get_header_value("Authorization");
    t_key_given = !auth.empty();
    t_authorized =
        options_.api_key.empty() || IsOpenPath(req.path) || BearerMatches(auth, options_.api_key);
    return httplib::Server::HandlerResponse::Unhandled;
  });
}

void FrontDoor::InstallErrorAnswers() {
  httplib::Server& s = *server_;
  // Wrong method on a known path: 405 with an Allow header.
  for (const Route& r : routes_) {
    const std::string allow = r.method;
    auto not_allowed = [allow](const Request& req, Response& res) {
      if (RefusedUnauthorized(res)) return;
      res.set_header("Allow", allow);
      ReplyError(res, ApiError{405,
                               "method " + req.method + " is not allowed on " + req.path +
                                   " (use " + allow + ")",
                               "invalid_request_error", "", "method_not_allowed"});
    };
    if (allow != "GET") s.Get(r.path, not_allowed);
    if (allow != "POST") s.Post(r.path, not_allowed);
    s.Put(r.path, not_allowed);
    s.Delete(r.path, not_allowed);
    s.Patch(r.path, not_allowed);
    s.Options(r.path, not_allowed);
  }
  // Errors without a body (unknown path -> 404, 413, httplib's own 400s) get an OpenAI body.
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const Request& req, Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    // No route: a client without the key learns nothing of the paths behind it.
    if (res.status == 404 && RefusedUnauthorized(res)) {
      return httplib::Server::HandlerResponse::Handled;
    }
    if (IsFramingStatus(res.status)) {
      // Say so: a client that reused the connection would otherwise lose its next request.
      t_unframed = true;
      res.set_header("Connection", "close");
    }
    ReplyError(res, ApiError{res.status, BodylessErrorMessage(req, res.status),
                             res.status >= 500 ? "server_error" : "invalid_request_error", "",
                             res.status == 404 ? "not_found" : ""});
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const Request&, Response& res, const std::exception_ptr& ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    ReplyError(res, ApiError{500, what, "server_error", "", ""});
  });
  s.set_logger([this](const Request& req, const Response& res) {
    if (hook_) hook_(req, res);
    LogAccess(req, res);
    // A request cpp-httplib refuses before routing (a malformed one) has no start of its own.
    t_start = {};
    t_note = AccessNote{};
    SetLogRequestId("");
  });
}

void FrontDoor::LogAccess(const Request& req, const Response& res) const {
  const bool open = IsOpenPath(req.path);
  const auto level = options_.access_log && !open ? spdlog::level::info : spdlog::level::debug;
  if (!spdlog::should_log(level)) return;
  const AccessNote& n = t_note;
  std::string line = fmt::format("{} {} {}", req.method, req.path, res.status);
  if (t_start != std::chrono::steady_clock::time_point{}) {
    line += fmt::format(" {:.1f} ms", std::chrono::duration<double, std::milli>(
                                          std::chrono::steady_clock::now() - t_start)
                                          .count());
  }
  std::string id = n.request_id;
  if (id.empty()) id = res.get_header_value("x-request-id");
  if (id.empty()) id = req.get_header_value("x-request-id");
  if (!id.empty()) line += " request_id=" + id;
  if (!n.mode.empty()) line += " mode=" + n.mode;
  if (n.prompt_tokens >= 0) line += fmt::format(" prompt_tokens={}", n.prompt_tokens);
  if (n.output_tokens >= 0) line += fmt::format(" output_tokens={}", n.output_tokens);
  if (n.ttft_ms >= 0) line += fmt::format(" ttft_ms={:.1f}", n.ttft_ms);
  line += " client=" + req.remote_addr;
  spdlog::log(level, "{}", line);
}

Status FrontDoor::Start() {
  if (loop_ != nullptr) return FailedPrecondition("HTTP front door already started");
  KVP_RETURN_IF_ERROR(options_.connections.Validate());
  if (options_.tls_cert_file.empty() != options_.tls_key_file.empty()) {
    return InvalidArgument("TLS needs both a certificate file and a key file");
  }
  if (!options_.tls_cert_file.empty() && ssl_ctx_ == nullptr) {
    KVP_ASSIGN_OR_RETURN(ssl_ctx_,
                         LoadServerTlsContext(options_.tls_cert_file, options_.tls_key_file));
  }
  const size_t open_files = RaiseOpenFileLimit();
  max_connections_ = options_.connections.max_connections > 0 ? options_.connections.max_connections
                                                              : open_files / 4 * 3;
  if (max_connections_ + 64 > open_files) {
    spdlog::warn(
        "--max-connections {} is near the open-file limit {}: connections past it are "
        "refused without an answer",
        max_connections_, open_files);
  }
  server_->set_payload_max_length(options_.max_body_bytes);
  if (!IsRoute("/version")) {
    Get("/version", [this](const Request&, Response& res) {
      res.set_content(options_.build.ToJson(), "application/json");
    });
  }
  InstallErrorAnswers();
  InstallPreRouting();
  KVP_ASSIGN_OR_RETURN(const int listen_fd,
                       ListenTcp(options_.host, options_.port, options_.listen_backlog));
  port_ = BoundPort(listen_fd);
  server_->SetServing(listen_fd);
  workers_ =
      std::make_unique<ElasticTaskQueue>(options_.worker_threads, options_.max_extra_threads);
  ConnectionLoopOptions lo;
  lo.listen_fd = listen_fd;
  lo.ssl_ctx = ssl_ctx_;
  lo.keep_alive_timeout_s = options_.connections.keep_alive_timeout_s;
  lo.header_timeout_s = options_.connections.header_timeout_s;
  lo.max_connections = max_connections_;
  lo.max_head_bytes = kMaxHeadBytes;
  lo.max_body_bytes = options_.max_body_bytes;
  loop_ = std::make_unique<ConnectionLoop>(lo, [this](std::unique_ptr<Connection> conn) {
    // std::function needs a copyable callable: the connection travels as a shared_ptr's payload.
    auto owned = std::make_shared<std::unique_ptr<Connection>>(std::move(conn));
    workers_->enqueue([this, owned] { Serve(std::move(*owned)); });
  });
  if (Status st = loop_->Start(); !st.ok()) {
    loop_.reset();
    workers_->shutdown();
    workers_.reset();
    return st;
  }
  return Status::Ok();
}

void FrontDoor::Serve(std::unique_ptr<Connection> conn) {
  const int write_timeout_s = options_.write_timeout_s > 0 ? options_.write_timeout_s : 5;
  bool closed = false;
  bool ok = false;
  t_unframed = false;
  t_authorized = true;
  // The request as the loop saw it when it dispatched the connection (the same limits).
  const size_t start = conn->in_off;
  const RequestScan scan = ScanRequest(conn->unread(), kMaxHeadBytes, options_.max_body_bytes);
  size_t consumed = 0;
  {
    ConnectionStream stream(*conn, options_.connections.header_timeout_s, write_timeout_s);
    SSL* ssl = conn->ssl();
    ok = server_->process_request(stream, stopping_.load(), closed,
                                  [ssl](Request& req) { req.ssl = ssl; });
    consumed = stream.consumed();
  }
  if (!ok) conn->MarkBroken();
  // After an answer to a request the library could not read whole (malformed, body too large,
  // URI or headers too long), what is left in the buffer is not known to start a request:
  // reading it as one would answer bytes of the last request's body (RFC 9112 §9.3 closes).
  // An API error a handler answered (a 400 with its body) keeps the connection: closing it
  // unannounced lost the next request of a client that reused it (the router's pool).
  bool keep = ok && !closed && !t_unframed && !stopping_.load();
  if (keep) keep = SkipUnreadBody(*conn, scan, start, consumed);
  conn->Compact();
  loop_->Return(std::move(conn), keep);
}

bool FrontDoor::SkipUnreadBody(Connection& conn, const RequestScan& scan, size_t start,
                               size_t consumed) {
  // Every answer reads the body first (the 401 included), so this changes nothing today; it
  // keeps any future answer given before the body from having the body read as a request.
  const NextRequest next = NextRequestStart(scan, consumed);
  if (next.close) {
    spdlog::warn(
        "HTTP front door: a request was answered before its body ({}) was read; "
        "closing the connection",
        scan.has_body ? "chunked or after Expect: 100-continue" : "none");
    return false;
  }
  if (next.start > consumed) {
    spdlog::debug("HTTP front door: discarded {} unread body byte(s) after the answer",
                  next.start - consumed);
    conn.in_off = std::min(conn.in.size(), start + next.start);
  }
  return true;
}

void FrontDoor::Stop() {
  stopping_.store(true);
  server_->SetStopped();  // streams in flight end at their next chunk, as with cpp-httplib's stop
  if (loop_) loop_->Stop();            // no new connections; idle ones closed
  if (workers_) workers_->shutdown();  // requests in flight and queued finish
}

ConnectionCounts FrontDoor::counts() const {
  if (loop_ == nullptr) return {};
  return ConnectionCounts{loop_->open_connections(), loop_->refused(), loop_->timed_out(),
                          max_connections_};
}

}  // namespace kvpush::http
