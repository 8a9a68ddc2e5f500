// FlowServices: what one request's flow (RequestFlow, request_flow.cc and the files beside it)
// uses of the router that runs it — a narrow interface instead of the router's private members.
// The Router implements it; a flow sees nothing else of the router.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "router/client_latency.h"
#include "router/flow_mode.h"
#include "router/instance_pool.h"
#include "router/leg_registry.h"
#include "router/router_options.h"
#include "router/routing_policy.h"
#include "router/stream_registry.h"
#include "router/worker_pool.h"

namespace kvpush::router {

/// A P/D request's instances (Router::SelectPd, router_select.cc): D always, P unless the
/// request skips its P leg.
struct PdSelection {
  std::optional<InstanceLease> p, d;
  SkipReason skip = SkipReason::kNone;
  int64_t prompt_tokens = -1;  ///< -1: not tokenized
  int64_t cached_tokens = 0;   ///< the chosen D's predicted prefix hit (tokens)
};

/// Thread-safety: every member from any thread, for as long as the router runs (between its
/// Start and the end of its Stop).
class FlowServices {
 public:
  virtual const RouterOptions& options() const = 0;
  virtual InstancePool& pool() = 0;
  virtual IdMinter& ids() = 0;
  virtual LegRegistry& legs() = 0;
  /// The leg worker threads (a push request's wait for P, a list's prompts after the first).
  virtual WorkerPool& workers() = 0;
  /// Streams an operator may move (POST /admin/migrate).
  virtual StreamRegistry& streams() = 0;
  /// Picks P and D (counting the routing decision); `exclude`: URLs not to choose (they refused
  /// an earlier attempt of the request).
  virtual PdSelection SelectPd(const std::string& path, const nlohmann::json& body,
                               const std::vector<std::string>& exclude) = 0;
  /// Queues POST /kv/abort of `transfer_id` on `instance` (TransferAborter).
  virtual void AbortTransfer(const InstanceAddress& instance, Role role,
                             const std::string& transfer_id, const std::string& request_id) = 0;
  /// Adds a finished request's router timeline (RouterTimeline::ToJson) to /debug/handoff_timeline.
  virtual void RecordTimeline(nlohmann::json timeline) = 0;
  virtual void CountRequest(TransferMode mode, bool ok) = 0;
  /// --otlp-traces-endpoint's tracer; null when tracing is off.
  virtual http::Tracer* tracer() = 0;
  /// One client-side latency observation (client_latency.h), seconds.
  virtual void RecordLatency(TransferMode mode, ClientLatency which, double seconds) = 0;
  virtual void CountLegFailure(Role role) = 0;
  virtual void CountRetry(Role refused_by) = 0;
  /// How a request went on on another instance (kvpush_router_continuations_total's kind).
  enum class ContinuationKind {
    kStream,  ///< "stream": mid-stream, resumed; the new instance computed the context
    kWhole,   ///< "whole": a whole answer sent again
    kPushed,  ///< "stream_pushed": resumed with the context's KV pushed by the offering instance
    kWholeResumed,  ///< "whole_resumed": a whole answer a draining instance handed back, resumed
  };
  /// A request continued on another instance after the one of role `failed` failed or offered
  /// it.
  virtual void CountContinuation(Role failed, ContinuationKind kind) = 0;
  /// Stop() began: legs are being closed; a flow says why to its client.
  virtual bool stopping() const = 0;
  /// The error body a request still in flight gets when the router stops (or its drain timed
  /// out).
  virtual std::string StopErrorJson() const = 0;

 protected:
  ~FlowServices() = default;
};

}  // namespace kvpush::router
