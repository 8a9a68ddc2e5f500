// HttpServer: the OpenAI-compatible HTTP front end of one engine (cpp-httplib). Endpoints,
// errors and metrics are documented in docs/server.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "common/status.h"
#include "engine/engine.h"
#include "server/metrics.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kvpush::connector {
class PdConnector;
}  // namespace kvpush::connector

namespace kvpush::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                   ///< 0 = pick a free port (see HttpServer::port())
  std::string served_model_name;     ///< the `model` name clients use; required
  int num_threads = 0;               ///< HTTP worker threads; 0 = max(16, max_num_seqs + 8)
  size_t max_body_bytes = 8u << 20;  ///< larger bodies get 413
  /// P/D instances (--role prefill|decode): serves POST /kv/handshake and requests with
  /// kv_transfer_params. Null for a colocated instance (such requests get 400). Must outlive
  /// the server.
  connector::PdConnector* connector = nullptr;
};

/// Serves /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics.
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
  void Stop();

  /// The bound port (after Start).
  int port() const { return port_; }

  /// HTTP response counts by (path, status); what /metrics reports. Thread-safe.
  HttpCounters http_counters() const;

 private:
  friend class CompletionHandler;
  void Route();
  void CountResponse(const std::string& path, int status);
  std::string NewRequestId(const char* prefix);
  uint64_t RandomSeed();

  Engine& engine_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};

  mutable std::mutex mu_;  ///< guards counters_ and rng_
  HttpCounters counters_;
  std::mt19937_64 rng_;
};

}  // namespace kvpush::server
