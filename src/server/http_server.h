// HttpServer: the OpenAI-compatible HTTP front end of one engine (cpp-httplib). Endpoints,
// errors and metrics are documented in docs/server.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "engine/engine.h"
#include "http/front_door.h"
#include "model/chat_template.h"
#include "server/completion_handler.h"
#include "server/metrics.h"

namespace kvpush::connector {
class PdConnector;
}  // namespace kvpush::connector

namespace kvpush::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                ///< 0 = pick a free port (see HttpServer::port())
  std::string served_model_name;  ///< the `model` name clients use; required
  /// Other names requests may give (vLLM's --served-model-name A B: responses say A).
  std::vector<std::string> served_model_aliases;
  /// vLLM's --seed: unseeded requests draw their sampling seeds from a generator seeded with
  /// it (reproducible for the same requests in the same order); none: a random seed.
  std::optional<uint64_t> seed;
  /// One access-log line per request at info (vLLM's --disable-log-requests turns it off).
  bool log_requests = true;
  int num_threads = 0;            ///< HTTP worker threads; 0 = max(16, max_num_seqs + 8)
  /// Connections that arrive while every worker is busy (each completion holds its worker until
  /// it ends, waiting in the engine too) run on a short-lived thread of their own, at most this
  /// many at once; beyond that they wait for a worker. So GET /health answers at once however
  /// many requests wait, and a router does not take a busy instance for a dead one.
  int max_extra_threads = 1024;
  size_t max_body_bytes = 8u << 20;  ///< larger bodies get 413
  /// vLLM's --enable-prompt-tokens-details: usage gets prompt_tokens_details.cached_tokens.
  bool enable_prompt_tokens_details = false;
  /// How /v1/chat/completions and /tokenize render `messages` (the model's template family,
  /// model/chat_template.h); default: kvpush's plain template.
  ChatTemplate chat_template;
  /// P/D instances (--role prefill|decode): serves POST /kv/handshake and requests with
  /// kv_transfer_params. Null for a colocated instance (such requests get 400). Must outlive
  /// the server.
  connector::PdConnector* connector = nullptr;
  /// vLLM's --api-key: every path but /health, /version and /metrics needs `Authorization:
  /// Bearer <api_key>` (the P/D endpoints /kv/* too); "" = open (http::FrontDoorOptions).
  std::string api_key;
  http::BuildInfo build;  ///< GET /version and kvpush_build_info
  std::string tls_cert_file;  ///< --ssl-certfile (with tls_key_file: HTTPS only)
  std::string tls_key_file;   ///< --ssl-keyfile
  /// --timeout-keep-alive, --request-head-timeout-s, --max-connections (http::ConnectionOptions).
  http::ConnectionOptions connections;
  /// --otlp-traces-endpoint: a span per completion request, its engine phases and (P/D) its
  /// transfer's handoff phases (request_trace.h). Null: no tracing.
  std::shared_ptr<http::Tracer> tracer;
};

/// Serves /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, and on a P/D
/// instance POST /kv/handshake and POST /kv/abort.
/// HTTP handler threads tokenize, submit to the Engine, and read the per-request OutputChannel;
/// they never touch engine state. The engine must outlive the server.
/// Thread-safety: Start/Stop from one controlling thread.
class HttpServer {
 public:
  HttpServer(Engine& engine, ServerOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  /// Binds host:port and starts serving on a background thread. Ignores SIGPIPE process-wide
  /// (a client that goes away must not kill the process). Errors: kUnavailable (bind failed),
  /// kInvalidArgument (no served model name), kFailedPrecondition (already started).
  Status Start();

  /// Stops accepting, aborts in-flight requests and joins the server thread. Idempotent.
  /// A graceful stop calls BeginDrain, waits for inflight() to reach 0 (bounded), then
  /// CutOpenRequests, and only then Stop (apps/cmd_serve.cc, docs/server.md "Graceful drain").
  void Stop();

  /// Drain, step 1: from now on new completion requests get 503 `draining` and GET /health
  /// answers 503 `draining`; requests already admitted go on. Thread-safe, idempotent.
  void BeginDrain() { state_.draining.store(true); }
  /// Drain, step 2 (the drain timeout passed): every completion request still open ends now
  /// with an error — a stream with an SSE error event (code `draining_timeout`) and
  /// `data: [DONE]`, a non-streamed one with 503 `draining_timeout`; their engine requests are
  /// aborted (which releases a D leg's KV reservation). Thread-safe, idempotent.
  void CutOpenRequests() { state_.cut.store(true); }
  bool draining() const { return state_.draining.load(); }
  /// Completion requests admitted and not yet ended (a stream counts until its last byte was
  /// handed to the socket or the client went away). Thread-safe.
  int inflight() const { return state_.inflight.load(); }

  /// The bound port (after Start).
  int port() const { return port_; }

  /// HTTP response counts by (path, status); what /metrics reports. Thread-safe.
  HttpCounters http_counters() const;

 private:
  void Route();
  void CountResponse(const std::string& path, int status);
  std::string NewRequestId(const char* prefix);
  uint64_t RandomSeed();

  Engine& engine_;
  ServerOptions options_;
  ChatPromptBuilder chat_;                 ///< options_.chat_template over the engine's tokenizer
  std::unique_ptr<http::FrontDoor> door_;  ///< made by Start
  int port_ = 0;
  ServingState state_;  ///< stopping, draining, cut, in flight, local prefills

  mutable Mutex mu_;
  HttpCounters counters_ GUARDED_BY(mu_);
  std::mt19937_64 rng_ GUARDED_BY(mu_);       ///< request ids
  std::mt19937_64 seed_rng_ GUARDED_BY(mu_);  ///< seeds of unseeded requests: --seed, or random

  TransferRequests transfers_;    ///< P/D requests in flight, for POST /kv/abort
  RequestParamHistograms param_stats_;  ///< vLLM's request_params_* histograms
  /// Tracing on a P/D instance: shared with the connector's observer (it may outlive us).
  std::shared_ptr<HandoffTraces> handoff_traces_;
  CompletionContext completion_;  ///< what the completion handlers use of this server
};

}  // namespace kvpush::server
