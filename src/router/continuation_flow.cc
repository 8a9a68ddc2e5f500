// RequestFlow, continuation: a request whose answering instance (D, or a colocated instance)
// fails mid-answer goes on on another one — a stream resumed after the last token the client got,
// a whole answer sent again (docs/reliability.md, "Continuation"; --migration-limit).
#include <spdlog/spdlog.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/drain.h"
#include "router/decode_stream.h"
#include "router/flow_services.h"
#include "router/flow_state.h"
#include "router/leg.h"
#include "router/request_flow.h"
#include "router/resume_ledger.h"

namespace kvpush::router {

using nlohmann::json;

namespace {

/// The body of a continuation: the client's request as a colocated instance takes it (P/D: the
/// parsed body with the router's seed; colocated: the client's bytes), plus `kvpush_resume`
/// when a stream is resumed. "" when the colocated body cannot be parsed (it was forwarded
/// as-is: the instance refused it, nothing to continue).
std::string ContinuationBody(const RequestFlow::Transfer& t, const ResumeLedger* ledger) {
  // A stream's continuation: what the client got, and the seed the failed instance sampled with
  // when the request named none (--colocated forwards the client's body without one).
  auto resume = [ledger](json& leg) {
    leg["kvpush_resume"] = ledger->ToJson();
    const auto seed = leg.find("seed");
    if ((seed == leg.end() || seed->is_null()) && ledger->seed()) leg["seed"] = *ledger->seed();
  };
  if (t.client) {
    json leg = t.client->Shell();
    if (ledger != nullptr) resume(leg);
    return ComposeLegBody(leg, *t.client);
  }
  if (ledger == nullptr) return t.client_text;
  Result<ClientBody> parsed = ParseClientBody(t.client_text);
  if (!parsed.ok() || !parsed->doc.is_object()) return {};
  json leg = parsed->doc;
  resume(leg);
  return ComposeLegBody(leg, *parsed);
}

/// The instances of the answering role a continuation may not go to: those that refused or
/// failed this request.
std::vector<std::string> Excluded(const RequestFlow::Transfer& t, const std::string& failed) {
  std::vector<std::string> exclude = t.exclude;
  exclude.push_back(failed);
  return exclude;
}

}  // namespace

void RequestFlow::AnswerMove(FlowServices& r, StreamState& st) {
  MoveOutcome o;
  o.from = st.answering.url;
  if (st.terminal_sent) {
    o.error = "its stream is ending";
  } else if (ContinueStream(r, st, "an operator asked: POST /admin/migrate", /*offered=*/true)) {
    o.moved = true;
    o.to = st.answering.url;
  } else {
    o.error = "no other healthy instance took it, its --migration-limit is spent, or its output "
              "cannot be resumed";
  }
  st.move->Answer(std::move(o));
}

bool ContinuableFailure(const LegResult& r) {
  if (r.answered) {
    return r.status == 503 && r.body.find(kDrainTimeoutCode) != std::string::npos;
  }
  // Broken mid-answer (reset, closed, timed out) or cut by the health checker; not a refusal
  // to connect (retried as such) and not the router's own Stop().
  return !r.connect_failed && (!r.stopped || !r.cut_reason.empty());
}

bool RequestFlow::ContinueStream(FlowServices& r, StreamState& st, const std::string& why,
                                 bool offered) {
  Transfer& t = *st.t;
  if (!t.continuable || t.continuations_left <= 0 || r.stopping() || st.ledger.broken()) {
    return false;
  }
  const std::string body = ContinuationBody(t, &st.ledger);
  if (body.empty()) return false;
  const std::string failed_url = st.answering.url;
  st.failed_urls.push_back(failed_url);
  std::vector<std::string> exclude = t.exclude;
  exclude.insert(exclude.end(), st.failed_urls.begin(), st.failed_urls.end());
  while (t.continuations_left > 0 && !r.stopping()) {
    std::optional<InstanceLease> lease = r.pool().Acquire(t.d_role, exclude);
    if (!lease) break;
    --t.continuations_left;
    const InstanceAddress addr = lease->address();
    auto ds = std::make_shared<DecodeStream>(OpenLeg(r, t, addr, t.d_role));
    const int status = ds->Start(t.path, t.request_id, body);
    if (status == 200) {
      spdlog::warn("request {}: {} instance {} {} ({}) after {} token(s); continuing on {}",
                   t.request_id, RoleName(t.d_role), failed_url,
                   offered ? "offered the stream" : "failed mid-stream", why, st.ledger.tokens(),
                   addr.url);
      r.CountContinuation(t.d_role, /*streamed=*/true);
      // P's leg (push) is moot from now on: the continuation computes the whole context itself.
      t.ForgetPrefill();
      AbortPrefill(r, t);
      st.stream = std::move(ds);  // the failed one's destructor closes its leg (it aborts)
      st.decode_lease.Release();
      st.decode_lease = std::move(*lease);
      st.answering = addr;
      return true;
    }
    const LegResult lr = ds->WaitFinished();
    spdlog::warn("request {}: continuation on {} failed: {}", t.request_id, addr.url,
                 Describe(lr));
    exclude.push_back(addr.url);
  }
  if (offered) {
    st.failed_urls.pop_back();  // it did not fail: it may still be chosen later
    spdlog::info("request {}: {} instance {} offered the stream ({}); no other instance took "
                 "it, it stays there", t.request_id, RoleName(t.d_role), failed_url, why);
  } else {
    spdlog::warn("request {}: {} instance {} failed mid-stream ({}); no continuation possible",
                 t.request_id, RoleName(t.d_role), failed_url, why);
  }
  return false;
}

LegResult RequestFlow::ResendWhole(Transfer& t, InstanceLease& d_lease, LegResult failed) {
  FlowServices& r = router_;
  if (!t.continuable || r.stopping()) return failed;
  const std::string body = ContinuationBody(t, nullptr);
  std::vector<std::string> exclude = Excluded(t, t.d_addr.url);
  t.ForgetPrefill();
  AbortPrefill(r, t);
  while (t.continuations_left > 0 && !r.stopping() &&
         (ContinuableFailure(failed) || RefusedUnstarted(failed))) {
    std::optional<InstanceLease> lease = r.pool().Acquire(t.d_role, exclude);
    if (!lease) break;
    --t.continuations_left;
    const InstanceAddress addr = lease->address();
    spdlog::warn("request {}: {} instance failed mid-answer ({}); sending it again to {}",
                 t.request_id, RoleName(t.d_role), Describe(failed), addr.url);
    r.CountContinuation(t.d_role, /*streamed=*/false);
    failed = OpenLeg(r, t, addr, t.d_role)->Post(t.path, t.request_id, body);
    d_lease.Release();
    d_lease = std::move(*lease);
    exclude.push_back(addr.url);
  }
  return failed;
}

}  // namespace kvpush::router
