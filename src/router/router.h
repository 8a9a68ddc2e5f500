// Router: the OpenAI-compatible front door of disaggregated serving. Per request it picks a
// prefill (P) and a decode (D) instance, runs the push or pull flow of docs/pd_protocol.md §1,
// and relays D's answer (SSE streamed through as it arrives). Endpoints, selection, failure
// mapping and metrics: docs/router.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/recent_records.h"
#include "common/status.h"
#include "router/connection_pool.h"
#include "router/flow_mode.h"
#include "router/instance_pool.h"
#include "router/router_timeline.h"
#include "router/routing_policy.h"
#include "router/transfer_aborter.h"
#include "router/worker_pool.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace kvpush::discovery {
class MembershipWatcher;
}  // namespace kvpush::discovery

namespace kvpush::router {

class Leg;

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
  std::vector<std::string> prefill_urls;  ///< "http://HOST:PORT", at least one (P/D mode)
  std::vector<std::string> decode_urls;   ///< "http://HOST:PORT", at least one (P/D mode)
  /// Role-both instances, "http://HOST:PORT": when set, the router is a round-robin front door
  /// over them (no P/D; prefill_urls and decode_urls must be empty).
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
  /// `--block-size`: tokens per KV block for the router's prefix hashes; 0 = the block size the
  /// decode instances report in /health.
  int32_t block_size = 0;
  size_t prefix_index_blocks = 65536;  ///< `--prefix-index-blocks`: PrefixIndex size per D
  std::string tokenizer_path;          ///< `--tokenizer` (shown by ToString)
  PromptTokenizer prompt_tokenizer;    ///< see PromptTokenizer; null: none

  bool colocated() const { return !colocated_urls.empty(); }
  bool discovered() const { return !discovery.empty(); }

  /// Errors: kInvalidArgument naming the first bad field (URLs, mode, profile, ranges).
  Status Validate() const;
  /// One line, for the start-up log.
  std::string ToString() const;
};

/// Counters /metrics reports. Value type.
struct RouterCounters {
  /// [mode push=0/pull=1/colocated=2][outcome ok=0/error=1]
  int64_t requests[3][2] = {{0, 0}, {0, 0}, {0, 0}};
  int64_t leg_failures[3] = {0, 0, 0};  ///< [RoleIndex]
  int64_t legs_cut[3] = {0, 0, 0};      ///< [RoleIndex] legs closed: instance marked unhealthy
  /// [RoleIndex of the instance that refused] requests sent again to another instance after one
  /// refused them unstarted (connection refused, 503 draining) before the client saw a byte.
  int64_t retries[3] = {0, 0, 0};
  /// Decode choices by DecodeReason (prefix_hit, rendezvous, least_outstanding), plus [3]:
  /// requests whose prompt the router could not hash (no tokenizer answer or block size).
  int64_t decode_choices[4] = {0, 0, 0, 0};
  int64_t load_cap_overrides = 0;       ///< cache-aware: the preferred D was over the load cap
  int64_t prefill_skipped[2] = {0, 0};  ///< P legs not sent: [0] threshold, [1] cached
  int64_t prompt_tokens = 0;            ///< prompt tokens of the requests the router tokenized
  int64_t predicted_cached_tokens = 0;  ///< of which the chosen D's PrefixIndex predicted cached
};

/// Serves /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics on one port.
/// Each request is handled on an HTTP worker thread; a push request's P leg and a streamed leg's
/// reader (DecodeStream) run on the router's WorkerPool, whose threads live as long as the
/// router (none is created per request). Legs borrow keep-alive connections from a
/// ConnectionPool. When one leg of a request fails the other is closed and its instance gets
/// POST /kv/abort (TransferAborter, a fixed pool of threads); a leg in flight to an instance the
/// health checker marks unhealthy is cut at once. With `colocated_urls`, each request goes whole
/// to the next healthy colocated instance (round robin) instead. The router keeps no state
/// across requests except instance health, outstanding counts and idle connections.
/// Thread-safety: Start/Stop from one controlling thread; counters()/Snapshot() from any.
class Router {
 public:
  explicit Router(RouterOptions options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  /// Validates the options, checks every instance's /health once, binds host:port and serves
  /// on background threads. Ignores SIGPIPE process-wide. Errors: kInvalidArgument (options),
  /// kUnavailable (bind failed), kFailedPrecondition (already started).
  Status Start();

  /// Stops accepting, closes every in-flight leg (instances see their connections close; a
  /// client's open stream gets an SSE error event, an open non-streamed request a 503, with
  /// StopErrorJson), joins the server, the health thread and every leg thread. Idempotent.
  void Stop();

  /// Graceful drain (kvpush router on SIGTERM): from now on new completion requests and /health
  /// get 503 `draining`; requests in flight go on. Thread-safe.
  void BeginDrain() { draining_.store(true); }
  /// The OpenAI error body a request still in flight gets when Stop() cuts it (HTTP 503, or an
  /// SSE error event): after BeginDrain the drain ran out, so code `draining_timeout` with the
  /// words an instance uses (common/drain.h); otherwise `shutting_down`. Thread-safe.
  std::string StopErrorJson() const;
  /// Legs in flight (each streamed answer's D leg counts until its stream ended) plus push P
  /// legs still awaited; 0 = no client request in flight. Thread-safe.
  size_t inflight();

  /// The bound port (after Start).
  int port() const { return port_; }

  RouterCounters counters() const;
  std::vector<InstanceSnapshot> Snapshot() const;
  /// What the connection pool did so far.
  ConnectionPoolCounts connection_counts() const { return connections_->counts(); }
  /// Leg worker threads created so far (they live until Stop()).
  size_t worker_threads() const { return workers_ ? workers_->threads() : 0; }

 private:
  friend class RequestFlow;
  /// A P/D request's instances (router_select.cc): D always, P unless the request skips its P
  /// leg. Counts the routing decision.
  struct PdSelection {
    std::optional<InstanceLease> p, d;
    SkipReason skip = SkipReason::kNone;
    int64_t prompt_tokens = -1;  ///< -1: not tokenized
    int64_t cached_tokens = 0;   ///< the chosen D's predicted prefix hit (tokens)
  };
  /// `exclude`: instance URLs not to choose (they refused an earlier attempt of the request).
  PdSelection SelectPd(const std::string& path, const nlohmann::json& body,
                       const std::vector<std::string>& exclude = {});
  /// The routing rows of /metrics (router_select.cc).
  void RenderRoutingMetrics(const RouterCounters& c, std::ostringstream& s) const;
  void Route();
  void RouteHealth();
  void RouteModels();
  std::string RenderMetrics() const;
  void CountRequest(TransferMode mode, bool ok);
  void CountLegFailure(Role role);
  void CountRetry(Role refused_by);
  /// Creates and starts membership_ (options_.discovery), feeding pool_. Errors: its Create's.
  Status StartDiscovery();

  /// Registers a leg so Stop() can close it and so it is cut (Leg::Cut) when its instance is
  /// marked unhealthy; a leg created after Stop() began is stopped at once, one to an instance
  /// that is unhealthy by then is cut at once.
  std::shared_ptr<Leg> NewLeg(const InstanceAddress& address, Role role);
  void ForgetLeg(Leg* leg);
  /// The pool's unhealthy callback: cuts every leg in flight to `url`.
  void CutLegsTo(Role role, const std::string& url, const std::string& reason);
  /// Queues POST /kv/abort of `transfer_id` on `instance` (TransferAborter).
  void AbortTransfer(const InstanceAddress& instance, Role role, const std::string& transfer_id,
                     const std::string& request_id);
  /// Background (push P leg) tasks: Stop() waits until none is left.
  bool BeginBackground();
  void EndBackground();

  RouterOptions options_;
  std::unique_ptr<InstancePool> pool_;
  std::unique_ptr<discovery::MembershipWatcher> membership_;  ///< with options_.discovery
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};  ///< BeginDrain: new completions and /health get 503
  IdMinter ids_;
  std::unique_ptr<TransferAborter> aborter_;
  std::unique_ptr<ConnectionPool> connections_;
  std::unique_ptr<WorkerPool> workers_;  ///< created by Start()
  /// The router timelines (RouterTimeline::ToJson) of the last 4,096 P/D requests.
  RecentRecords<nlohmann::json> timelines_{4096};

  mutable std::mutex mu_;  ///< guards counters_
  RouterCounters counters_;

  std::mutex legs_mu_;  ///< guards legs_, background_
  std::condition_variable legs_cv_;
  std::unordered_map<Leg*, Role> legs_;  ///< every leg in flight, with its instance's role
  int background_ = 0;
};

}  // namespace kvpush::router
