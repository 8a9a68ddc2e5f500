// RouterOptions: the router's configuration (`kvpush router` flags, docs/configuration.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "http/build_info.h"
#include "http/connection_options.h"
#include "router/flow_mode.h"
#include "router/instance_pool.h"
#include "router/routing_policy.h"
#include "router/transfer_aborter.h"
#include "http/tracing.h"

namespace kvpush::router {

/// The token ids the instances give the model for a completion (`path` "/v1/completions") or chat
/// (`path` "/v1/chat/completions") request body, the same way (tokenizer, chat template, BOS);
/// nullopt when the body's prompt cannot be tokenized here (the request then falls back to
/// least-outstanding routing and always gets a P leg). Called concurrently from HTTP worker
/// threads: must be thread-safe. The router library has no tokenizer of its own: `kvpush
/// router --tokenizer` builds one from the model's (apps/router_tokenizer.h).
using PromptTokenizer = std::function<std::optional<std::vector<int32_t>>(
    const std::string& path, const nlohmann::json& body)>;

/// Router configuration; validated by Router::Start (and Validate()).
struct RouterOptions {
  /// "http://HOST:PORT" or "https://HOST:PORT" (TLS, tls_ca_file), at least one (P/D mode).
  std::vector<std::string> prefill_urls;
  std::vector<std::string> decode_urls;  ///< as prefill_urls, at least one (P/D mode)
  /// Role-both instances, "http[s]://HOST:PORT": when set, the router is a round-robin front
  /// door over them (no P/D; prefill_urls and decode_urls must be empty).
  std::vector<std::string> colocated_urls;
  /// etcd discovery (docs/deployment.md): "etcd://HOST:PORT[,HOST:PORT...]", "" = none. The
  /// registered P and D instances join the pool at run time, besides any static URLs (then
  /// prefill_urls/decode_urls may be empty). Not with colocated_urls.
  std::string discovery;
  std::string discovery_prefix = "/kvpush/";  ///< key prefix the instances register under
  std::string discovery_model;  ///< only this served model's instances ("" = every model)
  TransferMode mode = TransferMode::kPush;
  std::string pull_profile;  ///< "vllm" | "fast" | "" (D's default) for pull requests
  std::string host = "127.0.0.1";
  int port = 8000;                     ///< 0 = pick a free port (see Router::port())
  int health_interval_ms = 1000;       ///< time between two health rounds
  int health_timeout_ms = 1000;        ///< connect + read timeout of one GET /health
  double request_timeout_s = 600.0;    ///< read/write timeout of each leg
  double connect_timeout_s = 5.0;      ///< connect timeout of each leg
  int max_concurrent_streams = 256;    ///< HTTP worker threads = this + 16
  size_t max_body_bytes = 8u << 20;    ///< larger client bodies get 413
  size_t max_idle_connections = 64;    ///< idle keep-alive connections kept per instance
  double max_idle_connection_s = 2.0;  ///< idle connections older than this are not reused
  AbortOptions abort;                  ///< POST /kv/abort calls to the other leg's instance
  /// `--routing` (docs/router.md, "Routing policies"); cache-aware needs `prompt_tokenizer`.
  RoutingPolicy routing = RoutingPolicy::kLeastOutstanding;
  CacheAwareOptions cache_aware;  ///< `--cache-aware-load-cap`
  /// `--local-prefill-threshold` (tokens, 0 = off): a request whose uncached prompt part is below
  /// this gets no P leg (D prefills it as a colocated instance would); needs `prompt_tokenizer`.
  int64_t local_prefill_threshold = 0;
  /// `--migration-limit` (Dynamo's name): how many times one request may be continued on another
  /// decode (or colocated) instance after the one answering it failed — a broken connection or
  /// stream, a cut by the health checker or by the instance's drain timeout
  /// (docs/reliability.md, "Continuation"). 0 = never: such a failure reaches the client.
  int migration_limit = 3;
  /// `--migration-transfer`: how a stream its instance offered (drain, POST /admin/migrate) moves
  /// in P/D mode (docs/reliability.md, *Migration*). true ("push", the default): the offering
  /// instance computes the context from its prefix cache and pushes its KV to the new one;
  /// false ("recompute"): the new instance computes the whole context itself, as after a crash.
  bool migration_push = true;
  /// `--block-size`: tokens per KV block for the router's prefix hashes; 0 = the block size the
  /// decode instances report in /health.
  int32_t block_size = 0;
  size_t prefix_index_blocks = 65536;  ///< `--prefix-index-blocks`: PrefixIndex size per D
  std::string tokenizer_path;          ///< `--tokenizer` (shown by ToString)
  /// `--api-key`: clients need `Authorization: Bearer <api_key>` on every path but /health,
  /// /version and /metrics ("" = open; http::FrontDoorOptions::api_key).
  std::string api_key;
  /// `--instance-api-key`: the Bearer token of every leg and /kv/abort call to an instance (their
  /// --api-key; "" = none).
  std::string instance_api_key;
  http::BuildInfo build;  ///< GET /version and kvpush_build_info
  bool log_requests = true;  ///< one access-log line per request at info
  std::string tls_cert_file;  ///< --ssl-certfile: clients reach the router over HTTPS only
  std::string tls_key_file;   ///< --ssl-keyfile
  /// --timeout-keep-alive, --request-head-timeout-s, --max-connections (http::ConnectionOptions).
  http::ConnectionOptions connections;
  /// --otlp-traces-endpoint: spans of every request (and its legs' phases) go there; the legs
  /// carry `traceparent` so the instances' spans join the same trace. Null: no tracing.
  std::shared_ptr<http::Tracer> tracer;
  /// --ssl-ca-certs: PEM CA certificates that https instances' certificates must chain to ("" =
  /// the system's default store). Loaded by the Router's constructor; a file that cannot be
  /// loaded fails Start() (kInvalidArgument).
  std::string tls_ca_file;
  PromptTokenizer prompt_tokenizer;    ///< see PromptTokenizer; null: none

  bool colocated() const { return !colocated_urls.empty(); }
  bool discovered() const { return !discovery.empty(); }

  /// Errors: kInvalidArgument naming the first bad field (URLs, mode, profile, ranges).
  Status Validate() const;
  /// One line, for the start-up log.
  std::string ToString() const;
};

}  // namespace kvpush::router
