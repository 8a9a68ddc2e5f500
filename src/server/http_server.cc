#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <ctime>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/drain.h"
#include "common/listen_backlog.h"
#include "common/recent_records.h"
#include "connector/pd_connector.h"
#include "pd/ids.h"
#include "server/api_error.h"
#include "server/completion_handler.h"
#include "server/tokenize_handler.h"

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
                                 {"/kv/handshake", "POST"},
                                 {"/kv/abort", "POST"},
                                 {"/debug/handoff_timeline", "GET"},
                                 {"/tokenize", "POST"},
                                 {"/detokenize", "POST"}};

/// httplib's task queue (one task = one connection): `core` worker threads, plus a short-lived
/// thread for each connection that arrives while no worker is idle, at most `max_extra` at once
/// (beyond that, connections wait for a worker as in httplib's ThreadPool). Thread-safe.
class ElasticTaskQueue final : public httplib::TaskQueue {
 public:
  ElasticTaskQueue(size_t core, size_t max_extra) : max_extra_(max_extra) {
    for (size_t i = 0; i < core; ++i) core_.emplace_back([this] { Work(); });
  }
  ~ElasticTaskQueue() override { ElasticTaskQueue::shutdown(); }
  ElasticTaskQueue(const ElasticTaskQueue&) = delete;
  ElasticTaskQueue& operator=(const ElasticTaskQueue&) = delete;

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mu_);
    ReapLocked();
    if (idle_ > jobs_.size() || running_extra_ >= max_extra_ || shutdown_) {
      jobs_.push_back(std::move(fn));
      lock.unlock();
      cv_.notify_one();
      return;
    }
    ++running_extra_;
    Extra& e = extras_.emplace_back();
    e.thread = std::thread([this, &e, fn = std::move(fn)] {
      fn();
      std::lock_guard<std::mutex> done(mu_);
      e.done = true;
      --running_extra_;
      cv_.notify_all();
    });
  }

  /// Lets the workers finish the queued connections, waits for the extra threads, joins all.
  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shut_) return;
      shut_ = shutdown_ = true;
    }
    cv_.notify_all();
    for (auto& t : core_) t.join();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return running_extra_ == 0; });
    ReapLocked();
  }

 private:
  struct Extra {
    std::thread thread;
    bool done = false;
  };

  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return !jobs_.empty() || shutdown_; });
      --idle_;
      if (jobs_.empty()) return;  // shutting down, nothing left
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  /// Joins the extra threads that ended (they are past their last use of mu_).
  void ReapLocked() {
    for (auto it = extras_.begin(); it != extras_.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      it->thread.join();
      it = extras_.erase(it);
    }
  }

  const size_t max_extra_;
  std::mutex mu_;  ///< guards everything below
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::thread> core_;
  std::list<Extra> extras_;
  size_t idle_ = 0;
  size_t running_extra_ = 0;
  bool shutdown_ = false;
  bool shut_ = false;
};

/// 404 for the P/D endpoints of an instance without a connector.
ApiError NotPdInstance() {
  return ApiError{404, "this instance has no KV connector (--role both)", "invalid_request_error",
                  "", "not_pd_instance"};
}

}  // namespace

HttpServer::HttpServer(Engine& engine, ServerOptions options)
    : engine_(engine),
      options_(std::move(options)),
      chat_(options_.chat_template, engine.tokenizer()),
      server_(std::make_unique<httplib::Server>()),
      rng_(std::random_device{}()),
      completion_{engine_,
                  chat_,
                  options_.served_model_name,
                  options_.enable_prompt_tokens_details,
                  options_.connector,
                  transfers_,
                  state_,
                  [this](const char* prefix) { return NewRequestId(prefix); },
                  [this] { return RandomSeed(); }} {}

HttpServer::~HttpServer() {
  Stop();
}

std::string HttpServer::NewRequestId(const char* prefix) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  MutexLock lock(mu_);
  for (int i = 0; i < 2; ++i) {
    uint64_t x = rng_();
    for (int k = 0; k < 16; ++k, x >>= 4) id += kHex[x & 15];
  }
  return id;
}

uint64_t HttpServer::RandomSeed() {
  MutexLock lock(mu_);
  return rng_();
}

void HttpServer::CountResponse(const std::string& path, int status) {
  bool known = false;
  for (const RouteSpec& r : kRoutes) known = known || path == r.path;
  MutexLock lock(mu_);
  ++counters_[{known ? path : std::string("other"), status}];
}

HttpCounters HttpServer::http_counters() const {
  MutexLock lock(mu_);
  return counters_;
}

void HttpServer::Route() {
  httplib::Server& s = *server_;
  auto completions = [this](ApiKind kind) {
    return [this, kind](const httplib::Request& req, httplib::Response& res) {
      CompletionHandler(completion_).Handle(kind, req, res);
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
    if (state_.stopping.load()) {
      ReplyError(res, ApiError{503, "shutting down", "server_error", "", ""});
      return;
    }
    if (state_.draining.load()) {
      ReplyError(res, ApiError{503, kDrainingMessage, "server_error", "", kDrainingCode});
      return;
    }
    // Lock-free (Engine::load() reads atomics): /health stays fast under load. The router's
    // cache-aware policy reads block_size and load (docs/server.md, "/health").
    const Engine::Load l = engine_.load();
    const nlohmann::json body = {
        {"status", "ok"},
        {"block_size", engine_.config().block_size},
        {"load",
         {{"outstanding_prefill_tokens", l.outstanding_prefill_tokens},
          {"running", l.running},
          {"waiting", l.waiting}}}};
    res.status = 200;
    res.set_content(body.dump(), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string text =
        RenderPrometheus(engine_.stats(), http_counters(), options_.served_model_name);
    if (options_.connector != nullptr) {
      text += RenderConnectorMetrics(options_.connector->stats(), options_.served_model_name,
                                     state_.local_prefills.load());
      text += RenderHandoffMetrics(options_.connector->timelines(), options_.served_model_name);
    }
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    const JsonReply r =
        HandleTokenize(TokenizeTarget{engine_.tokenizer(), engine_.config().max_model_len,
                                      options_.served_model_name, &chat_},
                       req.body);
    res.status = r.status;
    res.set_content(r.body, "application/json");
  });
  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    const JsonReply r =
        HandleDetokenize(TokenizeTarget{engine_.tokenizer(), engine_.config().max_model_len,
                                        options_.served_model_name},
                         req.body);
    res.status = r.status;
    res.set_content(r.body, "application/json");
  });
  RouteKv();
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
            msg = "request body too large";  // the router's words (one error vocabulary)
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

void HttpServer::RouteKv() {
  httplib::Server& s = *server_;
  s.Post("/kv/handshake", [this](const httplib::Request& req, httplib::Response& res) {
    if (options_.connector == nullptr) return ReplyError(res, NotPdInstance());
    auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (body.is_discarded()) {
      ReplyError(res, ApiError::Invalid("handshake body is not JSON"));
      return;
    }
    auto r = options_.connector->HandleHandshake(
        body, req.remote_addr + ":" + std::to_string(req.remote_port));
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
  // The handoff timelines of the latest transfers (docs/pd_protocol.md, Handoff timeline).
  s.Get("/debug/handoff_timeline", [this](const httplib::Request& req, httplib::Response& res) {
    if (options_.connector == nullptr) return ReplyError(res, NotPdInstance());
    const auto limit = req.has_param("limit")
                           ? ParseListLimit(req.get_param_value("limit"), 4096)
                           : std::optional<size_t>(256);
    if (!limit) {
      return ReplyError(res, ApiError::Invalid("limit must be an integer in [1, 4096]", "limit",
                                               "invalid_limit"));
    }
    nlohmann::json body = {{"object", "list"},
                           {"data", options_.connector->timelines().Recent(*limit)}};
    res.set_content(body.dump(), "application/json");
  });
  // The router saw the other leg of a transfer fail: end this instance's part of it now.
  s.Post("/kv/abort", [this](const httplib::Request& req, httplib::Response& res) {
    if (options_.connector == nullptr) return ReplyError(res, NotPdInstance());
    auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (!body.is_object()) {
      return ReplyError(res, ApiError::Invalid("abort body must be a JSON object "
                                               "{\"transfer_id\": \"<32 lowercase hex>\"}"));
    }
    const auto it = body.find("transfer_id");
    if (it == body.end() || !it->is_string() || !pd::IsValidTransferId(it->get<std::string>())) {
      return ReplyError(res, ApiError::Invalid("transfer_id must be 32 lowercase hex characters",
                                               "transfer_id", "invalid_transfer_id"));
    }
    const std::string tid = it->get<std::string>();
    const std::vector<int64_t> ids = transfers_.Abort(tid);
    for (int64_t id : ids) engine_.Abort(id);
    options_.connector->AbortTransfer(tid);
    spdlog::info("POST /kv/abort: transfer {} aborted ({} request(s) in flight)", tid, ids.size());
    nlohmann::json out = {{"transfer_id", tid}, {"aborted_requests", ids.size()}};
    res.set_content(out.dump(), "application/json");
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
  const auto extra = static_cast<size_t>(std::max(0, options_.max_extra_threads));
  server_->new_task_queue = [threads, extra] {
    return new ElasticTaskQueue(static_cast<size_t>(threads), extra);
  };
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
  state_.stopping.store(true);
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace kvpush::server
