// Router::RenderMetrics: the router's /metrics page (names in docs/router.md, "Metrics").
#include <vector>

#include "http/prometheus.h"
#include "router/router.h"

namespace kvpush::router {
namespace {

using http::MetricFamily;
using http::PrometheusWriter;

/// A family of one series per role: `label`="<role>" with `values[RoleIndex(role)]`.
void PerRole(PrometheusWriter& w, const MetricFamily& f, const char* label,
             const std::vector<Role>& roles, const int64_t (&values)[3]) {
  w.Family(f);
  for (Role r : roles) w.Sample(f.name, values[RoleIndex(r)], {{label, RoleName(r)}});
}

/// A family of one series per instance of the snapshot (with `role` or not), `value` of each.
template <typename Value>
void PerInstance(PrometheusWriter& w, const MetricFamily& f,
                 const std::vector<InstanceSnapshot>& snap, Value value) {
  w.Family(f);
  for (const auto& i : snap) {
    w.Sample(f.name, static_cast<int64_t>(value(i)), {{"role", RoleName(i.role)}, {"url", i.url}});
  }
}

/// The per-instance families: health, draining, legs in flight, and P's estimated tokens (P/D).
void InstanceRows(PrometheusWriter& w, const std::vector<InstanceSnapshot>& snap, bool colo) {
  PerInstance(
      w,
      {"kvpush_router_instance_healthy", "gauge", "1 when the instance passes its health check."},
      snap, [](const InstanceSnapshot& i) { return i.healthy ? 1 : 0; });
  PerInstance(w,
              {"kvpush_router_instance_draining", "gauge",
               "1 when the instance answered 503 draining (it is shutting down gracefully: no new "
               "legs go there, those in flight finish)."},
              snap, [](const InstanceSnapshot& i) { return i.draining ? 1 : 0; });
  PerInstance(w, {"kvpush_router_instance_outstanding", "gauge", "Legs in flight to the instance."},
              snap, [](const InstanceSnapshot& i) { return i.outstanding; });
  if (!colo) {
    const MetricFamily tokens{
        "kvpush_router_instance_prefill_tokens", "gauge",
        "Estimated prompt tokens queued or being prefilled on the prefill instance (its /health "
        "load plus legs sent since)."};
    w.Family(tokens);
    for (const auto& i : snap) {
      if (i.role == Role::kPrefill) w.Sample(tokens.name, i.prefill_tokens, {{"url", i.url}});
    }
  }
}

}  // namespace

void Router::RenderRoutingMetrics(const RouterCounters& c, PrometheusWriter& w) const {
  const MetricFamily choices{
      "kvpush_router_decode_choices_total", "counter",
      "Decode instance choices by reason: prefix_hit (the router's index says the chosen D holds "
      "a leading block of the prompt), rendezvous (owner of the prompt's first block), "
      "least_outstanding (policy least-outstanding or a prompt shorter than a block), unhashed "
      "(the router could not tokenize the prompt)."};
  w.Family(choices);
  const char* reasons[4] = {"prefix_hit", "rendezvous", "least_outstanding", "unhashed"};
  for (int k = 0; k < 4; ++k) {
    w.Sample(choices.name, c.decode_choices[k],
             {{"policy", RoutingPolicyName(options_.routing)}, {"reason", reasons[k]}});
  }
  w.Family({"kvpush_router_load_cap_overrides_total", "counter",
            "Cache-aware choices that skipped the preferred decode instance because it was over "
            "the load cap."});
  w.Sample("kvpush_router_load_cap_overrides_total", c.load_cap_overrides);
  const MetricFamily skipped{"kvpush_router_prefill_legs_skipped_total", "counter",
                             "P legs not sent (--local-prefill-threshold): threshold (the prompt "
                             "is shorter), cached (its uncached part is)."};
  w.Family(skipped);
  w.Sample(skipped.name, c.prefill_skipped[0], {{"reason", "threshold"}});
  w.Sample(skipped.name, c.prefill_skipped[1], {{"reason", "cached"}});
  w.Family({"kvpush_router_prompt_tokens_total", "counter",
            "Prompt tokens of the requests the router tokenized."});
  w.Sample("kvpush_router_prompt_tokens_total", c.prompt_tokens);
  w.Family({"kvpush_router_predicted_cached_tokens_total", "counter",
            "Of those, the tokens the router's prefix index predicted the chosen decode instance "
            "had cached."});
  w.Sample("kvpush_router_predicted_cached_tokens_total", c.predicted_cached_tokens);
}

std::string Router::RenderMetrics() const {
  const RouterCounters c = counters();
  const bool colo = options_.colocated();
  // Only the rows of this router's mode: push/pull and prefill/decode, or colocated.
  const std::vector<TransferMode> modes =
      colo ? std::vector<TransferMode>{TransferMode::kColocated}
           : std::vector<TransferMode>{TransferMode::kPush, TransferMode::kPull};
  const std::vector<Role> roles =
      colo ? std::vector<Role>{Role::kColocated} : std::vector<Role>{Role::kPrefill, Role::kDecode};
  PrometheusWriter w;
  const MetricFamily requests{"kvpush_router_requests_total", "counter",
                              "Completion requests by transfer mode and outcome."};
  w.Family(requests);
  for (TransferMode m : modes) {
    for (int o = 0; o < 2; ++o) {
      w.Sample(requests.name, c.requests[static_cast<int>(m)][o],
               {{"mode", TransferModeName(m)}, {"outcome", o == 0 ? "ok" : "error"}});
    }
  }
  PerRole(w,
          {"kvpush_router_leg_failures_total", "counter",
           "Legs that failed (unreachable, non-200, broken stream)."},
          "leg", roles, c.leg_failures);
  PerRole(w,
          {"kvpush_router_legs_cut_total", "counter",
           "Legs closed because their instance was marked unhealthy while they were in flight."},
          "leg", roles, c.legs_cut);
  PerRole(w,
          {"kvpush_router_retries_total", "counter",
           "Requests sent again to another instance after the instance in this role refused them "
           "unstarted (connection refused, 503 draining), before any byte reached the client."},
          "refused_by", roles, c.retries);
  {
    const MetricFamily cont{
        "kvpush_router_continuations_total", "counter",
        "Requests continued on another instance after the answering instance failed (crashed, "
        "disconnected, cut by its drain timeout) or offered the stream (drain, POST "
        "/admin/migrate): kind=stream resumed after the last token the client got, "
        "kind=stream_pushed the same with the context's KV pushed by the offering instance, "
        "kind=whole sent again, kind=whole_resumed a whole answer a draining instance handed "
        "back, resumed after what it had generated (--migration-limit)."};
    w.Family(cont);
    // The instance that failed is the answering one: D, or the colocated instance.
    const Role answering = colo ? Role::kColocated : Role::kDecode;
    const char* kinds[] = {"stream", "whole", "stream_pushed", "whole_resumed"};
    for (int k = 0; k < 4; ++k) {
      w.Sample(cont.name, c.continuations[RoleIndex(answering)][k],
               {{"failed", RoleName(answering)}, {"kind", kinds[k]}});
    }
  }
  if (!colo) {
    const AbortCounts a = aborter_->counts();
    const MetricFamily aborts{
        "kvpush_router_transfer_aborts_total", "counter",
        "POST /kv/abort calls to the instance of the other leg after a leg failed."};
    w.Family(aborts);
    for (int k = 0; k < 2; ++k) {
      const char* role = k == 0 ? "prefill" : "decode";
      w.Sample(aborts.name, a.ok[k], {{"role", role}, {"outcome", "ok"}});
      w.Sample(aborts.name, a.failed[k], {{"role", role}, {"outcome", "error"}});
    }
    RenderRoutingMetrics(c, w);
  }
  const ConnectionPoolCounts cc = connections_->counts();
  const MetricFamily connections{
      "kvpush_router_connections_total", "counter",
      "Connections to instances handed to legs: opened (new), reused (idle keep-alive), "
      "discarded (idle ones closed: stale or too old)."};
  w.Family(connections);
  w.Sample(connections.name, cc.opened, {{"event", "opened"}});
  w.Sample(connections.name, cc.reused, {{"event", "reused"}});
  w.Sample(connections.name, cc.discarded, {{"event", "discarded"}});
  w.Family(
      {"kvpush_router_worker_threads", "gauge", "Leg worker threads (created on demand, kept)."});
  w.Sample("kvpush_router_worker_threads", static_cast<int64_t>(worker_threads()));
  latencies_.Render(w, modes);
  InstanceRows(w, Snapshot(), colo);
  http::WriteBuildInfo(w, options_.build);
  if (door_ != nullptr) http::WriteConnectionCounts(w, door_->counts());
  return w.str();
}

}  // namespace kvpush::router
