#include "server/http_server.h"

#include <spdlog/spdlog.h>

#include <csignal>
#include <ctime>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/drain.h"
#include "common/recent_records.h"
#include "connector/pd_connector.h"
#include "http/api_error.h"
#include "pd/ids.h"
#include "server/completion_handler.h"
#include "server/pd_gate.h"
#include "server/tokenize_handler.h"

namespace kvpush::server {
HttpServer::HttpServer(Engine& engine, ServerOptions options)
    : engine_(engine),
      options_(std::move(options)),
      chat_(options_.chat_template, engine.tokenizer()),
      rng_(std::random_device{}()),
      seed_rng_(options_.seed ? *options_.seed : std::random_device{}()),
      param_stats_(engine.config().max_model_len),
      completion_{engine_,
                  chat_,
                  options_.served_model_name,
                  options_.served_model_aliases,
                  options_.enable_prompt_tokens_details,
                  options_.connector,
                  transfers_,
                  state_,
                  [this](const char* prefix) { return NewRequestId(prefix); },
                  [this] { return RandomSeed(); },
                  &param_stats_} {
  if (options_.tracer == nullptr) return;
  completion_.tracer = options_.tracer.get();
  if (options_.connector != nullptr) {
    handoff_traces_ = std::make_shared<HandoffTraces>(options_.tracer);
    completion_.handoff_traces = handoff_traces_.get();
    options_.connector->mutable_timelines().SetObserver(
        [traces = handoff_traces_](const connector::HandoffRecord& r) { traces->OnRecord(r); });
  }
}

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
  return seed_rng_();
}

void HttpServer::CountResponse(const std::string& path, int status) {
  const bool known = door_ != nullptr && door_->IsRoute(path);
  MutexLock lock(mu_);
  ++counters_[{known ? path : std::string("other"), status}];
}

HttpCounters HttpServer::http_counters() const {
  MutexLock lock(mu_);
  return counters_;
}

void HttpServer::Route() {
  http::FrontDoor& s = *door_;
  auto completions = [this](ApiKind kind) {
    return [this, kind](const http::Request& req, http::Response& res) {
      CompletionHandler(completion_).Handle(kind, req, res);
    };
  };
  s.Post("/v1/completions", completions(ApiKind::kCompletion));
  s.Post("/v1/chat/completions", completions(ApiKind::kChat));
  s.Get("/v1/models", [this](const http::Request&, http::Response& res) {
    // One entry per served name, as vLLM lists them; `root` is the first.
    nlohmann::json data = nlohmann::json::array();
    std::vector<std::string> names{options_.served_model_name};
    names.insert(names.end(), options_.served_model_aliases.begin(),
                 options_.served_model_aliases.end());
    for (const std::string& name : names) {
      data.push_back({{"id", name},
                      {"object", "model"},
                      {"created", static_cast<int64_t>(std::time(nullptr))},
                      {"owned_by", "kvpush"},
                      {"root", options_.served_model_name},
                      {"max_model_len", engine_.config().max_model_len}});
    }
    nlohmann::json body = {{"object", "list"}, {"data", data}};
    res.set_content(body.dump(), "application/json");
  });
  s.Get("/health", [this](const http::Request&, http::Response& res) {
    if (state_.stopping.load()) {
      http::ReplyError(res, http::ApiError{503, "shutting down", "server_error", "", ""});
      return;
    }
    if (state_.draining.load()) {
      http::ReplyError(res,
                       http::ApiError{503, kDrainingMessage, "server_error", "", kDrainingCode});
      return;
    }
    // Lock-free (Engine::load() reads atomics): /health stays fast under load. The router's
    // cache-aware policy reads block_size and load (docs/server.md, "/health").
    const Engine::Load l = engine_.load();
    const nlohmann::json body = {{"status", "ok"},
                                 {"block_size", engine_.config().block_size},
                                 {"load",
                                  {{"outstanding_prefill_tokens", l.outstanding_prefill_tokens},
                                   {"running", l.running},
                                   {"waiting", l.waiting}}}};
    res.status = 200;
    res.set_content(body.dump(), "application/json");
  });
  s.Get("/metrics", [this](const http::Request&, http::Response& res) {
    std::string text =
        RenderPrometheus(engine_.stats(), http_counters(), param_stats_.snapshot(),
                         options_.served_model_name);
    text += RenderPdMetrics(options_.connector, options_.served_model_name,
                            state_.local_prefills.load(), state_.prefill_legs_not_needed.load());
    http::PrometheusWriter build(ModelLabel(options_.served_model_name));
    http::WriteBuildInfo(build, options_.build);
    http::WriteConnectionCounts(build, door_->counts());
    text += build.str();
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });
  s.Post("/tokenize", [this](const http::Request& req, http::Response& res) {
    const JsonReply r =
        HandleTokenize(TokenizeTarget{engine_.tokenizer(), engine_.config().max_model_len,
                                      options_.served_model_name, &chat_,
                                      options_.served_model_aliases},
                       req.body);
    res.status = r.status;
    res.set_content(r.body, "application/json");
  });
  s.Post("/detokenize", [this](const http::Request& req, http::Response& res) {
    const JsonReply r =
        HandleDetokenize(TokenizeTarget{engine_.tokenizer(), engine_.config().max_model_len,
                                        options_.served_model_name, nullptr,
                                        options_.served_model_aliases},
                         req.body);
    res.status = r.status;
    res.set_content(r.body, "application/json");
  });
  // vLLM's POST /reset_prefix_cache (e.g. between benchmark runs, so one run does not hit the
  // cache the one before it filled). Refused with 409 while any KV block is in use.
  s.Post("/reset_prefix_cache", [this](const http::Request&, http::Response& res) {
    const Result<int32_t> r = engine_.ResetPrefixCache(std::chrono::seconds(10));
    if (!r.ok()) {
      const bool busy = r.status().code() == StatusCode::kFailedPrecondition;
      return http::ReplyError(res, http::ApiError{busy ? 409 : 503, r.status().message(),
                                                  busy ? "invalid_request_error" : "server_error",
                                                  "", busy ? "prefix_cache_in_use" : ""});
    }
    res.set_content(nlohmann::json{{"reset", true}, {"blocks_freed", *r}}.dump(),
                    "application/json");
  });
  RoutePdEndpoints(*door_, PdEndpoints{options_.connector, engine_, transfers_});
  s.OnResponse([this](const http::Request& req, const http::Response& res) {
    CountResponse(req.path, res.status);
  });
}

Status HttpServer::Start() {
  if (door_ != nullptr) return FailedPrecondition("HttpServer already started");
  if (options_.served_model_name.empty()) return InvalidArgument("served model name is empty");
  std::signal(SIGPIPE, SIG_IGN);
  // Create spdlog's registry here, before any HTTP thread logs: its lazy construction inside the
  // (uninstrumented) shared library is otherwise reported by TSan when two threads log first.
  spdlog::default_logger_raw();
  const int threads = options_.num_threads > 0 ? options_.num_threads
                                               : std::max(16, engine_.config().max_num_seqs + 8);
  door_ = std::make_unique<http::FrontDoor>(http::FrontDoorOptions{
      options_.host, options_.port, options_.max_body_bytes, static_cast<size_t>(threads),
      static_cast<size_t>(std::max(0, options_.max_extra_threads)), /*write_timeout_s=*/0,
      /*listen_backlog=*/1024, options_.build, options_.api_key, options_.log_requests,
      options_.tls_cert_file, options_.tls_key_file, options_.connections});
  Route();
  if (Status st = door_->Start(); !st.ok()) {
    door_.reset();
    return st;
  }
  port_ = door_->port();
  return Status::Ok();
}

void HttpServer::Stop() {
  state_.stopping.store(true);
  if (door_) door_->Stop();
}

}  // namespace kvpush::server
