#include "http/front_door.h"

#include <openssl/crypto.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <cctype>
#include <chrono>
#include <exception>
#include <utility>

#include "common/listen_backlog.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "http/api_error.h"
#include "http/task_queue.h"

namespace kvpush::http {
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

/// Whether a client's x-request-id is kept as the request's id: pd::IsValidRequestId's rule, 1..256
/// visible ASCII characters (http/ sits below pd/, docs/architecture.md).
bool KeptRequestId(std::string_view id) {
  if (id.empty() || id.size() > 256) return false;
  for (const char c : id) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

bool IsOpenPath(const std::string& path) {
  for (std::string_view open : kOpenPaths) {
    if (path == open) return true;
  }
  return false;
}

std::unique_ptr<httplib::Server> MakeServer(const FrontDoorOptions& o) {
  if (o.tls_cert_file.empty() || o.tls_key_file.empty()) {
    return std::make_unique<httplib::Server>();
  }
  return std::make_unique<httplib::SSLServer>(o.tls_cert_file.c_str(), o.tls_key_file.c_str());
}

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

void ReplyError(Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(e.ToJson(), "application/json");
}

FrontDoor::FrontDoor(FrontDoorOptions options)
    : options_(std::move(options)), server_(MakeServer(options_)) {}

FrontDoor::~FrontDoor() {
  Stop();
}

void FrontDoor::Get(std::string path, Handler handler) {
  server_->Get(path, std::move(handler));
  routes_.push_back(Route{std::move(path), "GET"});
}

void FrontDoor::Post(std::string path, Handler handler) {
  server_->Post(path, std::move(handler));
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
  server_->set_pre_routing_handler([this](const Request& req, Response& res) {
    t_note = AccessNote{};
    t_start = std::chrono::steady_clock::now();
    const std::string& id = req.get_header_value("x-request-id");
    SetLogRequestId(KeptRequestId(id) ? std::string_view(id) : std::string_view());
    if (options_.api_key.empty() || IsOpenPath(req.path)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string& auth = req.get_header_value("Authorization");
    if (BearerMatches(auth, options_.api_key)) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("WWW-Authenticate", "Bearer");
    ReplyError(res, ApiError{401,
                             auth.empty() ? "no API key given: send Authorization: Bearer <key>"
                                          : "incorrect API key",
                             "invalid_request_error", "", "invalid_api_key"});
    return httplib::Server::HandlerResponse::Handled;
  });
}

void FrontDoor::InstallErrorAnswers() {
  httplib::Server& s = *server_;
  // Wrong method on a known path: 405 with an Allow header.
  for (const Route& r : routes_) {
    const std::string allow = r.method;
    auto not_allowed = [allow](const Request& req, Response& res) {
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
  if (thread_.joinable()) return FailedPrecondition("HTTP front door already started");
  if (options_.tls_cert_file.empty() != options_.tls_key_file.empty()) {
    return InvalidArgument("TLS needs both a certificate file and a key file");
  }
  if (!server_->is_valid()) {
    return InvalidArgument("TLS: cannot load certificate " + options_.tls_cert_file + " and key " +
                           options_.tls_key_file + " (PEM, unencrypted key, matching pair)");
  }
  const size_t workers = options_.worker_threads;
  const size_t extra = options_.max_extra_threads;
  server_->new_task_queue = [workers, extra] { return new ElasticTaskQueue(workers, extra); };
  server_->set_payload_max_length(options_.max_body_bytes);
  server_->set_tcp_nodelay(true);  // SSE chunks go out at once (no Nagle delay on the token path)
  server_->set_keep_alive_max_count(1000);
  if (options_.write_timeout_s > 0) server_->set_write_timeout(options_.write_timeout_s, 0);
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently share its connections. Keep SO_REUSEADDR only (restart over TIME_WAIT sockets), so a
  // port that is in use makes Start() fail.
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  if (!IsRoute("/version")) {
    Get("/version", [this](const Request&, Response& res) {
      res.set_content(options_.build.ToJson(), "application/json");
    });
  }
  InstallErrorAnswers();
  InstallPreRouting();
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.host);
    if (port_ <= 0) return Unavailable("cannot bind " + options_.host + ":<any>");
  } else {
    if (!server_->bind_to_port(options_.host, options_.port)) {
      return Unavailable("cannot bind " + options_.host + ":" + std::to_string(options_.port));
    }
    port_ = options_.port;
  }
  // The library listens with a backlog of 5: too small for bursts of concurrent clients.
  RaiseListenBacklog(port_, options_.listen_backlog);
  thread_ = std::thread([this] {
    SetThreadName("kvp-listen");
    server_->listen_after_bind();
  });
  // httplib's stop() is a no-op until the listen loop runs: wait for it so Stop() cannot race.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->is_running()) return Unavailable("HTTP server did not start listening");
  return Status::Ok();
}

void FrontDoor::Stop() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kvpush::http
