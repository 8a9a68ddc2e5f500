// RequestFlow, pull: P's leg first, its answer becomes D's leg (docs/router.md, "Pull").
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

std::optional<json> RequestFlow::RunPullPrefill(Transfer& t, InstanceLease& lease,
                                                const ClientBody& client,
                                                const std::string& pull_profile,
                                                httplib::Response& res) {
  FlowServices& r = router_;
  t.timeline.Mark(RouterPhase::kPrefillLegWritten);
  const json shell = client.Shell();
  const LegResult pr = t.p_leg->Post(
      t.path, t.request_id,
      ComposeLegBody(pd::MakePrefillBody(shell, PdModeOf(t.mode), t.transfer_id), client));
  if (pr.answered) t.timeline.Mark(RouterPhase::kPrefillAnswered);
  t.p_leg.reset();
  if (pr.connect_failed) lease.MarkUnhealthy("prefill leg: " + pr.error);
  if (pr.answered && RefusedUnstarted(pr)) lease.MarkDraining();
  lease.Release();
  if (!pr.answered || pr.status != 200) {
    if (pr.answered || !pr.stopped || !pr.cut_reason.empty()) r.CountLegFailure(Role::kPrefill);
    spdlog::warn("request {}: prefill leg to {} {}", t.request_id, t.p_addr.url, Describe(pr));
    if (RefusedUnstarted(pr) && t.retries_left > 0) {
      t.retry_url = t.p_addr.url;
      t.retry_role = Role::kPrefill;
      t.refused_reply = LegFailureReply(r, Role::kPrefill, t.p_addr, pr);
      return std::nullopt;  // nothing written: Handle retries (or writes refused_reply)
    }
    r.CountRequest(t.mode, false);
    LegFailureReply(r, Role::kPrefill, t.p_addr, pr).WriteTo(res);
    return std::nullopt;
  }
  const json answer = json::parse(pr.body, nullptr, false);
  auto d = pd::MakeDecodePullBody(shell, answer, pd::ParsePullProfile(pull_profile));
  if (d.ok() && t.echo_logprobs) {
    auto echo = ParsePromptEcho(answer);
    if (!echo.ok()) {
      d = echo.status();
    } else {
      t.SettlePrefill(std::move(echo).value());
      t.MarkPrefillDone();
    }
  }
  if (!d.ok()) {
    r.CountLegFailure(Role::kPrefill);
    r.CountRequest(t.mode, false);
    ErrorReply(502, d.status().message() + " (" + t.p_addr.url + ")", "server_error",
               "bad_prefill_answer")
        .WriteTo(res);
    return std::nullopt;
  }
  return std::move(d).value();
}

}  // namespace kvpush::router
