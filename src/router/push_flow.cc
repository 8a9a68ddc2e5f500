// RequestFlow, push: P's leg written on the handler's thread and awaited on a worker; what its
// answer decides (docs/router.md, "Push").
#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "pd/ids.h"
#include "pd/legs.h"
#include "router/decode_stream.h"
#include "router/flow_services.h"
#include "router/flow_state.h"
#include "router/leg.h"
#include "router/prompt_echo.h"
#include "router/prompt_list.h"
#include "router/request_flow.h"
#include "router/sse_splitter.h"

namespace kvpush::router {

using nlohmann::json;

bool RequestFlow::StartPushPrefill(std::shared_ptr<Transfer> t, InstanceLease lease,
                                   const std::string& body) {
  FlowServices& r = router_;
  if (!r.legs().BeginBackground()) return false;
  // P's request is written here, on the handler thread, before D's: no hand-off delays it. Its
  // answer (after the prefill) is awaited on a worker.
  auto sent = std::make_shared<std::optional<LegResult>>();
  LegResult failed;
  if (!t->p_leg->Send("POST", t->path, t->request_id, body, /*sse=*/false, &failed)) {
    *sent = std::move(failed);
  } else {
    t->timeline.Mark(RouterPhase::kPrefillLegWritten);
  }
  // std::function needs a copyable callable: the move-only lease travels in a shared_ptr.
  auto held = std::make_shared<InstanceLease>(std::move(lease));
  t->SetPrefillInBackground(true);
  const bool queued = r.workers().Submit([&r, t, held, sent]() mutable {
    RunPushPrefill(r, *t, *held, *sent ? **sent : t->p_leg->ReadAnswer());
    if (const std::optional<bool> ok = t->MarkPrefillDone()) WriteRecords(r, *t, *ok);
    // Legs and leases point into the router: let go of them before Stop() may return.
    t.reset();
    held->Release();
    r.legs().EndBackground();
  });
  if (!queued) {
    t->SetPrefillInBackground(false);
    t->p_leg->Stop();  // written but never read: close it, P aborts
    r.legs().EndBackground();
  }
  return queued;
}

void RequestFlow::RunPushPrefill(FlowServices& r, Transfer& t, InstanceLease& lease,
                                 const LegResult& pr) {
  if (pr.answered) t.timeline.Mark(RouterPhase::kPrefillAnswered);
  if (pr.answered && (pr.status == 200 || IsDroppedPrefillAnswer(pr))) {
    spdlog::debug("request {}: prefill leg answered HTTP {}: {}", t.request_id, pr.status,
                  Head(pr.body));
    std::optional<PromptEcho> echo;
    if (t.echo_logprobs && pr.status == 200) {
      auto e = ParsePromptEcho(json::parse(pr.body, nullptr, /*allow_exceptions=*/false));
      if (e.ok()) echo = std::move(e).value();
    }
    t.SettlePrefill(std::move(echo));
    return;
  }
  if (!pr.answered && pr.stopped && pr.cut_reason.empty()) {
    // The router closed it: D's leg failed, the client left, or the router is stopping.
    spdlog::debug("request {}: prefill leg to {} stopped", t.request_id, t.p_addr.url);
    return;
  }
  if (pr.connect_failed) lease.MarkUnhealthy("prefill leg: " + pr.error);
  const bool refused = RefusedUnstarted(pr);
  if (refused && pr.answered) lease.MarkDraining();
  r.CountLegFailure(Role::kPrefill);
  if (!t.RecordPrefillFailure(LegFailureReply(r, Role::kPrefill, t.p_addr, pr), refused)) {
    spdlog::warn("request {}: prefill leg to {} {} (after D's answer was complete)", t.request_id,
                 t.p_addr.url, Describe(pr));
    return;
  }
  // The client gets P's failure (or, mid-stream, an error event): D's work is moot.
  spdlog::warn(
      "request {}: prefill leg to {} {}; closing the decode leg and aborting transfer {} "
      "on {}",
      t.request_id, t.p_addr.url, Describe(pr), t.transfer_id, t.d_addr.url);
  t.d_leg->Stop();
  r.AbortTransfer(t.d_addr, Role::kDecode, t.transfer_id, t.request_id);
}

bool RequestFlow::PrefillRetry(Transfer& t, const Reply& failure) {
  if (t.retries_left <= 0 || t.mode != TransferMode::kPush || !t.PrefillRefused()) return false;
  t.retry_url = t.p_addr.url;  // P's failure already closed D's leg and aborted its transfer
  t.retry_role = Role::kPrefill;
  t.refused_reply = failure;
  return true;
}

void RequestFlow::AbortPrefill(FlowServices& r, Transfer& t) {
  if (t.mode == TransferMode::kColocated || t.local_prefill) return;  // no P leg, no transfer
  if (t.p_leg) t.p_leg->Stop();                                       // push: P's leg may still run
  r.AbortTransfer(t.p_addr, Role::kPrefill, t.transfer_id, t.request_id);
}

}  // namespace kvpush::router
