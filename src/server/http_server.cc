#include "server/http_server.h"

#include <httplib.h>

#include "common/listen_backlog.h"
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <chrono>
#include <csignal>
#include <ctime>
#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "connector/pd_connector.h"
#include "server/completion_handler.h"

namespace kvpush::server {
namespace {

void ReplyError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(e.ToJson(), "application/json");
}

/// Paths with a handler and the one method each accepts; other methods get 405.
struct RouteSpec {
  const char* path;
  const char* method;
};
constexpr RouteSpec kRoutes[] = {{"/v1/completions", "POST"},
                                 {"/v1/chat/completions", "POST"},
                                 {"/v1/models", "GET"},
                                 {"/health", "GET"},
                                 {"/metrics", "GET"},
                                 {"/kv/handshake", "POST"}};

}  // namespace

HttpServer::HttpServer(Engine& engine, ServerOptions options)
    : engine_(engine),
      options_(std::move(options)),
      server_(std::make_unique<httplib::Server>()),
      rng_(std::random_device{}()) {}

HttpServer::~HttpServer() {
  Stop();
}

std::string HttpServer::NewRequestId(const char* prefix) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < 2; ++i) {
    uint64_t x = rng_();
    for (int k = 0; k < 16; ++k, x >>= 4) id += kHex[x & 15];
  }
  return id;
}

uint64_t HttpServer::RandomSeed() {
  std::lock_guard<std::mutex> lock(mu_);
  return rng_();
}

void HttpServer::CountResponse(const std::string& path, int status) {
  bool known = false;
  for (const RouteSpec& r : kRoutes) known = known || path == r.path;
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_[{known ? path : std::string("other"), status}];
}

HttpCounters HttpServer::http_counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

void HttpServer::Route() {
  httplib::Server& s = *server_;
  auto completions = [this](ApiKind kind) {
    return [this, kind](const httplib::Request& req, httplib::Response& res) {
      CompletionHandler(*this).Handle(kind, req, res);
    };
  };
  s.Post("/v1/completions", completions(ApiKind::kCompletion));
  s.Post("/v1/chat/completions", completions(ApiKind::kChat));
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    nlohmann::json m = {{"id", options_.served_model_name},
                        {"object", "model"},
                        {"created", static_cast<int64_t>(std::time(nullptr))},
                        {"owned_by", "kvpush"},
                        {"root", options_.served_model_name},
                        {"max_model_len", engine_.config().max_model_len}};
    nlohmann::json body = {{"object", "list"}, {"data", nlohmann::json::array({m})}};
    res.set_content(body.dump(), "application/json");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping_.load()) {
      ReplyError(res, ApiError{503, "shutting down", "server_error", "", ""});
      return;
    }
    res.status = 200;
    res.set_content("", "text/plain");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string text =
        RenderPrometheus(engine_.stats(), http_counters(), options_.served_model_name);
    if (options_.connector != nullptr) {
      text += RenderConnectorMetrics(options_.connector->stats(), options_.served_model_name);
    }
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Post("/kv/handshake", [this](const httplib::Request& req, httplib::Response& res) {
    if (options_.connector == nullptr) {
      ReplyError(res, ApiError{404, "this instance has no KV connector (--role both)",
                               "invalid_request_error", "", "not_pd_instance"});
      return;
    }
    auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (body.is_discarded()) {
      ReplyError(res, ApiError::Invalid("handshake body is not JSON"));
      return;
    }
    auto r = options_.connector->HandleHandshake(body);
    if (!r.ok()) {
      const int code = r.status().code() == StatusCode::kFailedPrecondition ? 409
                       : r.status().code() == StatusCode::kInvalidArgument  ? 400
                                                                            : 503;
      ReplyError(res, ApiError{code, r.status().message(),
                               code == 503 ? "server_error" : "invalid_request_error", "",
                               code == 409 ? "incompatible_peer" : ""});
      return;
    }
    res.set_content(r->dump(), "application/json");
  });
  // Wrong method on a known path: 405 with an Allow header.
  for (const RouteSpec& r : kRoutes) {
    const std::string allow = r.method;
    auto not_allowed = [allow](const httplib::Request& req, httplib::Response& res) {
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
  s.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string msg;
        switch (res.status) {
          case 404:
            msg = "no route for " + req.method + " " + req.path;
            break;
          case 400:
            msg =
                "malformed HTTP request (unreadable body, headers or content encoding; send a "
                "JSON body with Content-Type: application/json)";
            break;
          case 413:
            msg =
                "request body too large (bodies sent as form data are limited to 8 KiB by the "
                "HTTP library: send Content-Type: application/json)";
            break;
          case 414:
            msg = "request URI too long";
            break;
          default:
            msg = "HTTP error " + std::to_string(res.status);
            break;
        }
        ApiError e{res.status, msg, res.status >= 500 ? "server_error" : "invalid_request_error",
                   "", res.status == 404 ? "not_found" : ""};
        res.set_content(e.ToJson(), "application/json");
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, const std::exception_ptr& ep) {
        std::string what = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        ReplyError(res, ApiError{500, what, "server_error", "", ""});
      });
  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    CountResponse(req.path, res.status);
    spdlog::debug("{} {} -> {}", req.method, req.path, res.status);
  });
}

Status HttpServer::Start() {
  if (thread_.joinable()) return FailedPrecondition("HttpServer already started");
  if (options_.served_model_name.empty()) return InvalidArgument("served model name is empty");
  std::signal(SIGPIPE, SIG_IGN);
  // Create spdlog's registry here, before any HTTP thread logs: its lazy construction inside the
  // (uninstrumented) shared library is otherwise reported by TSan when two threads log first.
  spdlog::default_logger_raw();
  int threads = options_.num_threads > 0 ? options_.num_threads
                                         : std::max(16, engine_.config().max_num_seqs + 8);
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(options_.max_body_bytes);
  server_->set_tcp_nodelay(true);  // SSE chunks go out at once (no Nagle delay on the token path)
  server_->set_keep_alive_max_count(1000);
  // httplib's default also sets SO_REUSEPORT, which lets a second server bind the same port and
  // silently share its connections. Keep SO_REUSEADDR only (restart over TIME_WAIT sockets), so a
  // port that is in use makes Start() fail.
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  Route();
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
  RaiseListenBacklog(port_, 1024);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() is a no-op until the listen loop runs: wait for it so Stop() cannot race.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!server_->is_running() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->is_running()) return Unavailable("HTTP server did not start listening");
  return Status::Ok();
}

void HttpServer::Stop() {
  stopping_.store(true);
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kvpush::server
