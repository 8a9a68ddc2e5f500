// The router's answers for failed legs and the checks of a leg's answer (flow_state.h).
#include <nlohmann/json.hpp>

#include "common/drain.h"
#include "router/flow_services.h"
#include "router/flow_state.h"

namespace kvpush::router {

using nlohmann::json;

Reply StopReply(const FlowServices& router) {
  return Reply{503, router.StopErrorJson(), "application/json"};
}

std::string Reply::AsSseEvent() const {
  const json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error")) {
    return "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
  }
  return "data: " +
         ErrorJson("HTTP " + std::to_string(status) + ": " + Head(body), "server_error") + "\n\n";
}

std::string Head(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

/// An instance's answer, forwarded as-is.
Reply Forwarded(const LegResult& r) {
  return Reply{r.status, r.body, r.content_type.empty() ? "application/json" : r.content_type};
}

/// The client's answer for a leg to `addr` that gave no usable answer: the instance's own non-200
/// answer as-is, but 502 `upstream_auth_failed` for its 401 or 403; 503 `<role>_unhealthy` when
/// the health checker cut it; StopReply when the router stopped it; 502 `<role>_unreachable`
/// otherwise.
Reply LegFailureReply(const FlowServices& router, Role role, const InstanceAddress& addr,
                      const LegResult& r) {
  const std::string role_name = RoleName(role);
  if (r.answered && (r.status == 401 || r.status == 403)) {
    // The instance refused the router's credentials: the deployment is misconfigured, which
    // the client can do nothing about (never the client's own 4xx).
    return ErrorReply(502,
                      role_name + " instance " + addr.url +
                          " refused the router's credentials (HTTP " + std::to_string(r.status) +
                          "): start the router with --instance-api-key set to the instances' "
                          "--api-key",
                      "server_error", "upstream_auth_failed");
  }
  if (r.answered) return Forwarded(r);
  if (!r.cut_reason.empty()) {
    return ErrorReply(503,
                      role_name + " instance " + addr.url +
                          " was marked unhealthy while the request was in flight (" + r.cut_reason +
                          ")",
                      "server_error", role_name + "_unhealthy");
  }
  if (r.stopped) return StopReply(router);
  return ErrorReply(502, role_name + " instance " + addr.url + " unreachable: " + r.error,
                    "server_error", role_name + "_unreachable");
}

Reply NoHealthyReply(const InstancePool& pool, Role role, const std::vector<std::string>& exclude) {
  const std::string name = RoleName(role);
  const std::string tls = pool.TlsFailure(role, exclude);
  if (!tls.empty()) {
    return ErrorReply(502,
                      "no usable " + name + " instance: " + tls +
                          " (the router verifies https instances against --ssl-ca-certs, or the "
                          "system's CAs without it)",
                      "server_error", name + "_tls_failed");
  }
  return ErrorReply(503, "no healthy " + name + " instance", "server_error", "no_healthy_instance");
}

/// A leg the instance refused before doing any work for it: it could not be connected to, or
/// it answered 503 `draining` (it is shutting down gracefully). Such a request may be sent to
/// another instance, as long as nothing was written to the client yet.
bool RefusedUnstarted(const LegResult& r) {
  if (!r.answered) return r.connect_failed && r.cut_reason.empty();
  return r.status == 503 && IsDrainingAnswer(r.body);
}

bool UnstartedRetryable(const RequestFlow::Transfer& t, const LegResult& r) {
  // A stream's status line is the first byte the client gets: before it, a leg that broke,
  // stalled or was cut is as unstarted for the client as one refused (docs/router.md, *Retries*).
  // A whole answer that failed so is continued instead (ResendWhole), within --migration-limit.
  return RefusedUnstarted(r) || (t.stream && ContinuableFailure(r));
}

/// What a failed leg's log line says about it.
std::string Describe(const LegResult& r) {
  if (r.answered) return "answered HTTP " + std::to_string(r.status) + ": " + Head(r.body);
  if (!r.cut_reason.empty()) return "cut (" + r.cut_reason + ")";
  return "failed: " + r.error;
}

/// True for P's answer when its prefill was dropped on request: 503 `aborted` (D said the
/// prefill was not needed, or cancelled it) or 409 `transfer_aborted` (the router aborted the
/// transfer). D's answer decides the request then.
bool IsDroppedPrefillAnswer(const LegResult& r) {
  if (!r.answered || (r.status != 503 && r.status != 409)) return false;
  const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) return false;
  const json& code = j["error"]["code"];
  if (!code.is_string()) return false;
  return r.status == 503 ? code == "aborted" : code == "transfer_aborted";
}

/// The 502 for a P/D request with echo and logprobs whose P answered no usable prompt_echo.
Reply NoPromptEcho(const RequestFlow::Transfer& t, const std::string& why) {
  return ErrorReply(502, why + " (" + t.p_addr.url + ")", "server_error", "bad_prefill_answer");
}

}  // namespace kvpush::router
