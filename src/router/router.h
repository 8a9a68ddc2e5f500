// Router: the OpenAI-compatible front door of disaggregated serving. Per request it picks a
// prefill (P) and a decode (D) instance, runs the push or pull flow of docs/pd_protocol.md §1,
// and relays D's answer (SSE streamed through as it arrives). Endpoints, selection, failure
// mapping and metrics: docs/router.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/recent_records.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "http/front_door.h"
#include "http/prometheus.h"
#include "router/connection_pool.h"
#include "router/flow_mode.h"
#include "router/flow_services.h"
#include "router/instance_pool.h"
#include "router/leg_registry.h"
#include "router/router_options.h"
#include "router/router_timeline.h"
#include "router/routing_policy.h"
#include "router/tls_client.h"
#include "router/transfer_aborter.h"
#include "router/worker_pool.h"

namespace kvpush::discovery {
class MembershipWatcher;
}  // namespace kvpush::discovery

namespace kvpush::router {

class Leg;

/// Counters /metrics reports. Value type.
struct RouterCounters {
  /// [mode push=0/pull=1/colocated=2][outcome ok=0/error=1]
  int64_t requests[3][2] = {{0, 0}, {0, 0}, {0, 0}};
  int64_t leg_failures[3] = {0, 0, 0};  ///< [RoleIndex]
  int64_t legs_cut[3] = {0, 0, 0};      ///< [RoleIndex] legs closed: instance marked unhealthy
  /// [RoleIndex of the instance that refused] requests sent again to another instance after one
  /// refused them unstarted (connection refused, 503 draining) before the client saw a byte.
  int64_t retries[3] = {0, 0, 0};
  /// [RoleIndex of the instance that failed] requests continued on another instance after the
  /// one answering them failed with part of the answer already sent (docs/reliability.md,
  /// "Continuation"): [0] streams (resumed after the last relayed token), [1] whole answers
  /// (sent again; nothing had reached the client).
  int64_t continuations[3][4] = {};  ///< [role][ContinuationKind]
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
class Router final : private FlowServices {
 public:
  explicit Router(RouterOptions options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  /// Validates the options, checks every instance's /health once, binds host:port and serves
  /// on background threads. Ignores SIGPIPE process-wide. Errors: kInvalidArgument (options,
  /// or a --ssl-ca-certs file that cannot be loaded), kUnavailable (bind failed),
  /// kFailedPrecondition (already started).
  Status Start();

  /// Stops accepting, closes every in-flight leg (instances see their connections close; a
  /// client's open stream gets an SSE error event, an open non-streamed request a 503, with
  /// StopErrorJson), joins the server, the health thread and every leg thread. Idempotent.
  void Stop();

  /// Graceful drain (kvpush router on SIGTERM): from now on new completion requests and /health
  /// get 503 `draining`; requests in flight go on. Thread-safe.
  void BeginDrain() { draining_.store(true); }
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
  // FlowServices (what a RequestFlow uses of the router).
  const RouterOptions& options() const override { return options_; }
  InstancePool& pool() override { return *pool_; }
  IdMinter& ids() override { return ids_; }
  LegRegistry& legs() override { return *legs_; }
  WorkerPool& workers() override { return *workers_; }
  StreamRegistry& streams() override { return streams_; }
  PdSelection SelectPd(const std::string& path, const nlohmann::json& body,
                       const std::vector<std::string>& exclude) override;  // router_select.cc
  void AbortTransfer(const InstanceAddress& instance, Role role, const std::string& transfer_id,
                     const std::string& request_id) override;
  void RecordTimeline(nlohmann::json timeline) override { timelines_.Add(std::move(timeline)); }
  void CountRequest(TransferMode mode, bool ok) override;
  http::Tracer* tracer() override { return options_.tracer.get(); }
  void RecordLatency(TransferMode mode, ClientLatency which, double seconds) override {
    latencies_.Record(mode, which, seconds);
  }
  void CountLegFailure(Role role) override;
  void CountRetry(Role refused_by) override;
  void CountContinuation(Role failed, ContinuationKind kind) override;
  bool stopping() const override { return stopping_.load(); }
  std::string StopErrorJson() const override;

  /// The routing rows of /metrics (router_metrics.cc).
  void RenderRoutingMetrics(const RouterCounters& c, http::PrometheusWriter& w) const;
  std::string RenderMetrics() const;  // router_metrics.cc
  void Route();
  void RouteHealth();
  void RouteModels();
  /// POST /reset_prefix_cache: every instance's, then the router's PrefixIndexes (router.cc).
  void RouteResetPrefixCache();
  /// POST /admin/migrate {"request_id"}: moves that stream to another instance (docs/router.md).
  void RouteMigrate();
  /// Creates and starts membership_ (options_.discovery), feeding pool_. Errors: its Create's.
  Status StartDiscovery();
  /// The pool's unhealthy callback: cuts every leg in flight to `url`.
  void CutLegsTo(Role role, const std::string& url, const std::string& reason);

  RouterOptions options_;
  /// Why tls_ could not be made (the --ssl-ca-certs file did not load); Start() fails with it.
  Status tls_status_;
  /// The TLS settings of every call to an https instance (legs, health checks, aborts): made by
  /// the constructor when an instance may be https (an https URL, --ssl-ca-certs, discovery).
  std::shared_ptr<const TlsClientContext> tls_;
  std::unique_ptr<InstancePool> pool_;
  std::unique_ptr<discovery::MembershipWatcher> membership_;  ///< with options_.discovery
  std::unique_ptr<http::FrontDoor> door_;                     ///< made by Start
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> draining_{false};  ///< BeginDrain: new completions and /health get 503
  IdMinter ids_;
  std::unique_ptr<TransferAborter> aborter_;
  std::unique_ptr<ConnectionPool> connections_;
  std::unique_ptr<WorkerPool> workers_;  ///< created by Start()
  /// The router timelines (RouterTimeline::ToJson) of the last 4,096 P/D requests.
  RecentRecords<nlohmann::json> timelines_{4096};
  ClientLatencies latencies_;  ///< the client-side TTFT/ITL/e2e histograms

  mutable Mutex mu_;  ///< guards counters_
  RouterCounters counters_ GUARDED_BY(mu_);

  std::unique_ptr<LegRegistry> legs_;  ///< every leg in flight; made by the constructor
  StreamRegistry streams_;             ///< streams an operator may move
};

}  // namespace kvpush::router
