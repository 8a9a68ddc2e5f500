#include "router/request_flow.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "pd/ids.h"
#include "pd/legs.h"
#include "router/decode_stream.h"
#include "router/flow_state.h"
#include "router/leg.h"
#include "router/prompt_echo.h"
#include "router/prompt_list.h"
#include "router/router.h"
#include "router/sse_splitter.h"

namespace kvpush::router {
namespace {

using nlohmann::json;

/// A client's body carrying kv_transfer_params: the message the instances give too.
constexpr const char* kClientKvTransferParams =
    "kv_transfer_params is only for the legs of a P/D request, which the router writes; a client "
    "request may not carry it";

std::string Head(const std::string& s, size_t n = 300) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

/// An instance's answer, forwarded as-is.
Reply Forwarded(const LegResult& r) {
  return Reply{r.status, r.body, r.content_type.empty() ? "application/json" : r.content_type};
}

/// The client's answer for a leg to `addr` that gave no usable answer: the instance's own non-200
/// answer as-is; 503 `<role>_unhealthy` when the health checker cut it; StopReply when the
/// router stopped it; 502 `<role>_unreachable` otherwise.
Reply LegFailureReply(const Router& router, Role role, const InstanceAddress& addr,
                      const LegResult& r) {
  const std::string role_name = RoleName(role);
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

/// A leg the instance refused before doing any work for it: it could not be connected to, or
/// it answered 503 `draining` (it is shutting down gracefully). Such a request may be sent to
/// another instance, as long as nothing was written to the client yet.
bool RefusedUnstarted(const LegResult& r) {
  if (!r.answered) return r.connect_failed && r.cut_reason.empty();
  return r.status == 503 && IsDrainingAnswer(r.body);
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

}  // namespace

/// The same failure as one SSE event, for a stream whose 200 was already sent: the body when it
/// is an OpenAI error object, else an error quoting the status.
Reply StopReply(const Router& router) {
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

namespace {

/// Push, streamed: keeps the client's 200 back until D's stream carries output, P's leg ended
/// (well or not) or D's leg ended, so that an early failure of P reaches the client as a plain
/// HTTP error, as colocated serving gives it. Returns the events taken meanwhile, in order.
std::vector<std::string> HoldUntilOutput(const std::function<bool()>& prefill_ended,
                                         DecodeStream& ds) {
  std::vector<std::string> held;
  for (;;) {
    if (prefill_ended()) return held;
    const size_t before = held.size();
    if (ds.TakeEvents(std::chrono::milliseconds(10), &held)) return held;
    for (size_t i = before; i < held.size(); ++i) {
      if (!IsPreambleEvent(held[i])) return held;
    }
  }
}

/// Push with echo and logprobs, streamed: keeps the client's 200 back until P's leg is over, so
/// that its prompt_echo (or its failure) is known before D's first event is relayed. Returns the
/// events taken meanwhile, in order.
std::vector<std::string> HoldUntilPrefillDone(RequestFlow::Transfer& t, DecodeStream& ds,
                                              std::chrono::milliseconds limit) {
  std::vector<std::string> held;
  while (!t.WaitPrefillDone(std::chrono::milliseconds(0))) {
    if (ds.TakeEvents(std::chrono::milliseconds(10), &held)) {
      t.WaitPrefillDone(limit);  // D's stream is over; P's answer follows its KV
      break;
    }
  }
  return held;
}

/// The 502 for a P/D request with echo and logprobs whose P answered no usable prompt_echo.
Reply NoPromptEcho(const RequestFlow::Transfer& t, const std::string& why) {
  return ErrorReply(502, why + " (" + t.p_addr.url + ")", "server_error", "bad_prefill_answer");
}

}  // namespace

void RequestFlow::Handle(const httplib::Request& req, httplib::Response& res) {
  auto t = std::make_shared<Transfer>();
  t->retries_left = kMaxRetries;
  ClientBody body;
  std::string pull_profile;
  if (!router_.options_.colocated()) {
    if (!ParseClient(req, res, t.get(), &body, &pull_profile)) return;
    if (t->path == "/v1/completions" && IsPromptList(body.doc)) {
      t->retries_left = 0;
      return HandlePromptList(*t, body.doc, pull_profile, res);
    }
  }
  for (;;) {
    if (router_.options_.colocated()) {
      HandleColocated(t, req, res);
    } else {
      RunPd(t, body, pull_profile, res, nullptr);
    }
    if (t->retry_url.empty()) return;
    // Refused before any byte of the answer was written: the same request (same seed), a new
    // transfer id, never to an instance that refused it. With no other instance of that role
    // to try, the client gets the refusal as it was.
    std::vector<std::string> exclude = t->exclude;
    exclude.push_back(t->retry_url);
    if (!router_.pool_->AnyHealthy(t->retry_role, exclude)) {
      router_.CountRequest(t->mode, false);
      return t->refused_reply->WriteTo(res);
    }
    router_.CountRetry(t->retry_role);
    spdlog::info("request {}: {} instance {} refused it unstarted; retrying on another instance",
                 t->request_id, RoleName(t->retry_role), t->retry_url);
    auto next = std::make_shared<Transfer>();
    next->request_id = t->request_id;
    next->path = t->path;
    next->mode = t->mode;
    next->stream = t->stream;
    next->exclude = std::move(exclude);
    next->retries_left = t->retries_left - 1;
    next->transfer_id = t->mode == TransferMode::kColocated ? "" : router_.ids_.TransferId();
    t = std::move(next);
  }
}

void RequestFlow::RunPd(const std::shared_ptr<Transfer>& t, const ClientBody& client,
                        const std::string& pull_profile, httplib::Response& res,
                        std::shared_ptr<StreamState>* capture) {
  const json& body = client.doc;
  Router& r = router_;
  const TransferMode tm = t->mode;
  auto fail = [&](int status, const std::string& message, const std::string& code) {
    r.CountRequest(tm, false);
    ErrorReply(status, message, "server_error", code).WriteTo(res);
  };
  Router::PdSelection sel = r.SelectPd(t->path, body, t->exclude);
  if (!sel.d) return fail(503, "no healthy decode instance", "no_healthy_instance");
  t->d_addr = sel.d->address();
  if (sel.skip != SkipReason::kNone) {
    return RunLocalPrefill(t, client, std::move(*sel.d), res, capture);
  }
  if (!sel.p) return fail(503, "no healthy prefill instance", "no_healthy_instance");
  std::optional<InstanceLease>& p_lease = sel.p;
  std::optional<InstanceLease>& d_lease = sel.d;
  t->p_addr = p_lease->address();
  spdlog::debug("request {}: mode={}{} transfer_id={} P={} D={} stream={}", t->request_id,
                TransferModeName(tm), pull_profile.empty() ? "" : "/" + pull_profile,
                t->transfer_id, t->p_addr.url, t->d_addr.url, t->stream);
  t->p_leg = r.NewLeg(t->p_addr, Role::kPrefill);
  // Echo with logprobs: P computes the prompt's logprobs and answers them as prompt_echo; D
  // echoes nothing, and the router puts P's part before D's choices (prompt_echo.h).
  t->echo_logprobs = WantsPromptEcho(t->path, body);
  json d_body;
  if (tm == TransferMode::kPush) {
    t->d_leg = r.NewLeg(t->d_addr, Role::kDecode);  // before P's thread: it may close it
    const json shell = client.Shell();  // leg builders start here: the prompt is not copied
    if (!StartPushPrefill(
            t, std::move(*p_lease),
            ComposeLegBody(pd::MakePrefillBody(shell, PdModeOf(tm), t->transfer_id), client))) {
      r.CountRequest(tm, false);
      return StopReply(r).WriteTo(res);
    }
    d_body = pd::MakeDecodePushBody(shell, t->transfer_id, t->p_addr.host, t->p_addr.port);
    if (t->echo_logprobs) d_body["echo"] = false;
  } else {
    std::optional<json> d = RunPullPrefill(*t, *p_lease, client, pull_profile, res);
    if (!d) return;
    d_body = std::move(*d);
    if (t->echo_logprobs) d_body["echo"] = false;
    t->d_leg = r.NewLeg(t->d_addr, Role::kDecode);
  }
  const std::string d_text = ComposeLegBody(d_body, client);
  if (!t->stream) return AnswerJson(t, d_text, std::move(*d_lease), res);
  AnswerStream(t, d_text, std::move(*d_lease), res, capture);
}

void RequestFlow::RunLocalPrefill(const std::shared_ptr<Transfer>& t, const ClientBody& body,
                                  InstanceLease d_lease, httplib::Response& res,
                                  std::shared_ptr<StreamState>* capture) {
  // No P leg, no transfer: D gets the client's request as a colocated instance would.
  t->local_prefill = true;
  t->d_leg = router_.NewLeg(t->d_addr, Role::kDecode);
  spdlog::debug("request {}: local prefill on D={} (no P leg) stream={}", t->request_id,
                t->d_addr.url, t->stream);
  const std::string text = ComposeLegBody(body.Shell(), body);
  if (!t->stream) return AnswerJson(t, text, std::move(d_lease), res);
  AnswerStream(t, text, std::move(d_lease), res, capture);
}

void RequestFlow::HandleColocated(const std::shared_ptr<Transfer>& t, const httplib::Request& req,
                                  httplib::Response& res) {
  Router& r = router_;
  t->mode = TransferMode::kColocated;
  t->d_role = Role::kColocated;
  t->path = req.path;
  if (t->request_id.empty()) {  // not a retry
    t->request_id = req.get_header_value("x-request-id");
    if (!pd::IsValidRequestId(t->request_id)) {
      t->request_id = r.ids_.RequestId(t->path == "/v1/chat/completions" ? "chatcmpl-" : "cmpl-");
    }
    res.set_header("x-request-id", t->request_id);
  }
  // Parsed only to learn whether the answer streams; the client's bytes are forwarded as-is.
  const json body = ParseJson(req.body);
  if (body.is_discarded() || !body.is_object()) {
    r.CountRequest(t->mode, false);
    return ErrorReply(400,
                      body.is_discarded() ? "request body is not valid JSON"
                                          : "request body must be a JSON object",
                      "invalid_request_error", "invalid_json")
        .WriteTo(res);
  }
  const auto s = body.find("stream");
  t->stream = s != body.end() && s->is_boolean() && s->get<bool>();
  std::optional<InstanceLease> lease = r.pool_->Acquire(Role::kColocated, t->exclude);
  if (!lease) {
    r.CountRequest(t->mode, false);
    return ErrorReply(503, "no healthy colocated instance", "server_error", "no_healthy_instance")
        .WriteTo(res);
  }
  t->d_addr = lease->address();
  t->d_leg = r.NewLeg(t->d_addr, Role::kColocated);
  spdlog::debug("request {}: colocated instance {} stream={}", t->request_id, t->d_addr.url,
                t->stream);
  if (!t->stream) return AnswerJson(t, req.body, std::move(*lease), res);
  AnswerStream(t, req.body, std::move(*lease), res, nullptr);
}

bool RequestFlow::ParseClient(const httplib::Request& req, httplib::Response& res, Transfer* t,
                              ClientBody* client, std::string* pull_profile) {
  Router& r = router_;
  const RouterOptions& o = r.options_;
  t->path = req.path;
  const bool chat = t->path == "/v1/chat/completions";
  t->request_id = req.get_header_value("x-request-id");
  if (!pd::IsValidRequestId(t->request_id)) {
    t->request_id = r.ids_.RequestId(chat ? "chatcmpl-" : "cmpl-");
  }
  res.set_header("x-request-id", t->request_id);

  ModeChoice mode{o.mode, o.mode == TransferMode::kPull ? o.pull_profile : ""};
  auto reject = [&](const std::string& message, const std::string& code,
                    const std::string& param = {}) {
    r.CountRequest(mode.mode, false);
    ErrorReply(400, message, "invalid_request_error", code, param).WriteTo(res);
    return false;
  };
  if (req.has_header("x-kvpush-mode")) {
    auto m = ParseModeHeader(req.get_header_value("x-kvpush-mode"), o.pull_profile);
    if (!m.ok()) return reject(m.status().message(), "invalid_kvpush_mode");
    mode = *m;
  }
  t->mode = mode.mode;
  *pull_profile = mode.pull_profile;
  Result<ClientBody> parsed = ParseClientBody(req.body);
  if (!parsed.ok()) return reject("request body is not valid JSON", "invalid_json");
  *client = std::move(parsed).value();
  json* body = &client->doc;
  if (!body->is_object()) return reject("request body must be a JSON object", "invalid_json");
  if (body->contains("kv_transfer_params")) {
    // The router writes both legs' kv_transfer_params; a client's would be silently replaced.
    // The words of a colocated instance given the same body (one error vocabulary).
    return reject(kClientKvTransferParams, "", "kv_transfer_params");
  }
  if (!body->contains("seed") || (*body)["seed"].is_null()) (*body)["seed"] = r.ids_.Seed();
  t->transfer_id = r.ids_.TransferId();
  const auto s = body->find("stream");
  t->stream = s != body->end() && s->is_boolean() && s->get<bool>();
  return true;
}

bool RequestFlow::StartPushPrefill(std::shared_ptr<Transfer> t, InstanceLease lease,
                                   const std::string& body) {
  Router& r = router_;
  if (!r.BeginBackground()) return false;
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
  const bool queued = r.workers_->Submit([&r, t, held, sent]() mutable {
    RunPushPrefill(r, *t, *held, *sent ? **sent : t->p_leg->ReadAnswer());
    t->MarkPrefillDone();
    // Legs and leases point into the router: let go of them before Stop() may return.
    t.reset();
    held->Release();
    r.EndBackground();
  });
  if (!queued) {
    t->p_leg->Stop();  // written but never read: close it, P aborts
    r.EndBackground();
  }
  return queued;
}

void RequestFlow::RunPushPrefill(Router& r, Transfer& t, InstanceLease& lease,
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

std::optional<json> RequestFlow::RunPullPrefill(Transfer& t, InstanceLease& lease,
                                                const ClientBody& client,
                                                const std::string& pull_profile,
                                                httplib::Response& res) {
  Router& r = router_;
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

bool RequestFlow::PrefillRetry(Transfer& t, const Reply& failure) {
  if (t.retries_left <= 0 || t.mode != TransferMode::kPush || !t.PrefillRefused()) return false;
  t.retry_url = t.p_addr.url;  // P's failure already closed D's leg and aborted its transfer
  t.retry_role = Role::kPrefill;
  t.refused_reply = failure;
  return true;
}

void RequestFlow::AbortPrefill(Router& r, Transfer& t) {
  if (t.mode == TransferMode::kColocated || t.local_prefill) return;  // no P leg, no transfer
  if (t.p_leg) t.p_leg->Stop();                    // push: P's leg may still run
  r.AbortTransfer(t.p_addr, Role::kPrefill, t.transfer_id, t.request_id);
}

void RequestFlow::DecodeFailed(Transfer& t, InstanceLease& d_lease, const LegResult& dr,
                               httplib::Response& res) {
  Router& r = router_;
  const std::string role = RoleName(t.d_role);
  if (dr.answered || !dr.stopped || !dr.cut_reason.empty()) r.CountLegFailure(t.d_role);
  if (dr.connect_failed) d_lease.MarkUnhealthy(role + " leg: " + dr.error);
  const bool retry = RefusedUnstarted(dr) && t.retries_left > 0;
  if (dr.answered && RefusedUnstarted(dr)) d_lease.MarkDraining();
  if (t.mode == TransferMode::kColocated || t.local_prefill) {
    spdlog::warn("request {}: {} leg to {} {}", t.request_id, role, t.d_addr.url, Describe(dr));
  } else {
    spdlog::warn("request {}: decode leg to {} {}; aborting transfer {} on {}", t.request_id,
                 t.d_addr.url, Describe(dr), t.transfer_id, t.p_addr.url);
  }
  AbortPrefill(r, t);
  if (retry) {  // nothing written: Handle retries (or writes refused_reply)
    t.retry_url = t.d_addr.url;
    t.retry_role = t.d_role;
    t.refused_reply = LegFailureReply(r, t.d_role, t.d_addr, dr);
    return;
  }
  r.CountRequest(t.mode, false);
  LegFailureReply(r, t.d_role, t.d_addr, dr).WriteTo(res);
}

void RequestFlow::AnswerJson(const std::shared_ptr<Transfer>& t, const std::string& d_body,
                             InstanceLease d_lease, httplib::Response& res) {
  Router& r = router_;
  t->timeline.Mark(RouterPhase::kDecodeLegWritten);
  const LegResult dr = t->d_leg->Post(t->path, t->request_id, d_body);
  if (t->echo_logprobs && dr.answered && dr.status == 200) {
    // P's answer (its prompt_echo) follows the KV that D already has.
    t->WaitPrefillDone(std::chrono::milliseconds(t->d_leg->io_timeout_ms()));
  }
  if (std::optional<Reply> p_failed = t->Decide(/*streaming=*/false)) {
    if (PrefillRetry(*t, *p_failed)) return;
    r.CountRequest(t->mode, false);
    return p_failed->WriteTo(res);
  }
  if (!dr.answered || dr.status != 200) return DecodeFailed(*t, d_lease, dr, res);
  // A JSON answer is handed to the HTTP layer whole: its first byte goes with the rest.
  t->timeline.Mark(RouterPhase::kFirstOutputRelayed);
  if (t->echo_logprobs) {
    const std::optional<PromptEcho> echo = t->PromptEchoOf();
    json answer = json::parse(dr.body, nullptr, /*allow_exceptions=*/false);
    if (!echo) {
      r.CountLegFailure(Role::kPrefill);
      r.CountRequest(t->mode, false);
      return NoPromptEcho(*t, "prefill instance returned no prompt_echo").WriteTo(res);
    }
    if (!answer.is_object()) {
      r.CountLegFailure(t->d_role);
      r.CountRequest(t->mode, false);
      return ErrorReply(502, "decode instance returned a body that is not a JSON object",
                        "server_error", "bad_decode_answer")
          .WriteTo(res);
    }
    PrependPromptEchoToAnswer(answer, *echo);
    r.CountRequest(t->mode, true);
    Reply merged = Forwarded(dr);
    merged.body = answer.dump(-1, ' ', false, json::error_handler_t::replace);
    RecordTimeline(r, *t, true);
    return merged.WriteTo(res);
  }
  r.CountRequest(t->mode, true);
  RecordTimeline(r, *t, true);
  Forwarded(dr).WriteTo(res);
}

void RequestFlow::RecordTimeline(Router& r, Transfer& t, bool ok) {
  if (t.mode == TransferMode::kColocated || t.local_prefill) return;
  t.timeline.Mark(RouterPhase::kDone);
  r.timelines_.Add(t.timeline.ToJson(t.request_id, t.transfer_id,
                                     t.mode == TransferMode::kPush ? "push" : "pull", ok));
}

void RequestFlow::AnswerStream(const std::shared_ptr<Transfer>& t, const std::string& d_body,
                               InstanceLease d_lease, httplib::Response& res,
                               std::shared_ptr<StreamState>* capture) {
  Router& r = router_;
  auto ds = std::make_shared<DecodeStream>(t->d_leg);
  t->timeline.Mark(RouterPhase::kDecodeLegWritten);
  const int status = ds->Start(t->path, t->request_id, d_body);
  std::vector<std::string> held;
  if (status == 200 && t->mode == TransferMode::kPush && !t->local_prefill) {
    held = t->echo_logprobs
               ? HoldUntilPrefillDone(*t, *ds, std::chrono::milliseconds(t->d_leg->io_timeout_ms()))
               : HoldUntilOutput([&t] { return t->PrefillEnded(); }, *ds);
  }
  if (std::optional<Reply> p_failed = t->Decide(/*streaming=*/status == 200)) {
    if (PrefillRetry(*t, *p_failed)) return;  // ds's destructor closes D's leg
    r.CountRequest(t->mode, false);
    return p_failed->WriteTo(res);  // ds's destructor closes D's leg
  }
  if (status != 200) return DecodeFailed(*t, d_lease, ds->WaitFinished(), res);
  std::optional<PromptEcho> echo;
  if (t->echo_logprobs) {
    echo = t->PromptEchoOf();
    if (!echo) {  // nothing relayed yet: a plain error; ds's destructor closes D's leg
      t->Finish();
      r.CountLegFailure(Role::kPrefill);
      r.CountRequest(t->mode, false);
      return NoPromptEcho(*t, "prefill instance returned no prompt_echo").WriteTo(res);
    }
  }

  auto st = std::make_shared<StreamState>();
  st->t = t;
  st->stream = ds;
  st->decode_lease = std::move(d_lease);
  st->held = std::move(held);
  st->prompt_echo = std::move(echo);
  res.status = 200;
  if (capture != nullptr) {  // one prompt of a list: the merged stream relays it
    *capture = std::move(st);
    return;
  }
  Router* rp = &r;
  res.set_header("Cache-Control", "no-cache");
  std::string content_type = ds->content_type();
  if (content_type.empty()) content_type = "text/event-stream; charset=utf-8";
  res.set_chunked_content_provider(
      content_type,
      [st, rp](size_t, httplib::DataSink& sink) -> bool {
        return Pump(*rp, *st, sink, std::chrono::milliseconds(100));
      },
      [st, rp](bool) { EndStream(*rp, *st); });
}

bool RequestFlow::Pump(Router& r, StreamState& st, httplib::DataSink& sink,
                       std::chrono::milliseconds wait) {
  if (r.stopping_.load()) {
    // Never a silent cut: the client's stream ends with an error event.
    if (!st.terminal_sent) {
      const std::string ev = "data: " + r.StopErrorJson() + "\n\n";
      st.terminal_sent = st.failed = true;
      if (!sink.write(ev.data(), ev.size())) return false;
    }
    st.completed = true;
    sink.done();
    return true;
  }
  std::vector<std::string> events;
  events.swap(st.held);
  const bool finished =
      st.stream->TakeEvents(events.empty() ? wait : std::chrono::milliseconds(0), &events);
  for (const std::string& e : events) {
    if (st.terminal_sent) break;  // nothing may follow [DONE] or an error event
    const SseEventKind kind = ClassifySseEvent(e);
    std::string out;
    if (st.prompt_echo && kind == SseEventKind::kData) {
      // Echo with logprobs: P's prompt part leads each choice's first event.
      json chunk = ParseSseData(e);
      if (PrependPromptEchoToChunk(chunk, *st.prompt_echo, &st.echoed)) out = SseEvent(chunk);
    }
    const std::string& ev = out.empty() ? e : out;
    if (!sink.write(ev.data(), ev.size())) return false;
    if (kind == SseEventKind::kData) st.t->timeline.Mark(RouterPhase::kFirstOutputRelayed);
    if (kind == SseEventKind::kDone) st.terminal_sent = true;
    if (kind == SseEventKind::kError) {
      st.terminal_sent = true;
      st.failed = true;
      r.CountLegFailure(st.t->d_role);
    }
  }
  if (!finished) return true;
  if (!st.terminal_sent) {
    std::string ev;
    if (r.stopping_.load()) {  // Stop() closed D's leg: say why
      ev = "data: " + r.StopErrorJson() + "\n\n";
    } else if (std::optional<Reply> p_failed = st.t->PrefillFailure()) {
      ev = p_failed->AsSseEvent();  // P's leg failed mid-stream and closed D's leg
    } else {
      const LegResult lr = st.stream->result();
      const std::string role = RoleName(st.t->d_role);
      const std::string d = role + " instance " + st.t->d_addr.url;
      const std::string msg = lr.answered ? d + " ended the stream without [DONE]"
                              : !lr.cut_reason.empty()
                                  ? d + " was marked unhealthy mid-stream (" + lr.cut_reason + ")"
                                  : d + " stream broke: " + lr.error;
      spdlog::warn("request {}: {}", st.t->request_id, msg);
      const std::string code = role + (lr.cut_reason.empty() ? "_stream_broken" : "_unhealthy");
      ev = "data: " + ErrorJson(msg, "server_error", code) + "\n\n";
      r.CountLegFailure(st.t->d_role);
    }
    st.failed = true;
    st.terminal_sent = true;
    if (!sink.write(ev.data(), ev.size())) return false;
  }
  st.completed = true;
  sink.done();
  return true;
}

void RequestFlow::EndStream(Router& r, StreamState& st) {
  Transfer& t = *st.t;
  if (!st.completed) {
    // The client went away (or the router is stopping): close D's connection so D aborts.
    spdlog::info("request {}: client disconnected mid-stream; closing the {} leg", t.request_id,
                 RoleName(t.d_role));
    st.stream->Stop();
  }
  t.Finish();
  RecordTimeline(r, t, st.completed && !st.failed);
  // D failed or the client left (not P: P's failure already aborted D): P's part is moot.
  if ((!st.completed || st.failed) && !t.PrefillFailure()) AbortPrefill(r, t);
  r.CountRequest(t.mode, st.completed && !st.failed);
  st.stream.reset();  // waits until the reader task let go of the leg
  st.decode_lease.Release();
}

}  // namespace kvpush::router
