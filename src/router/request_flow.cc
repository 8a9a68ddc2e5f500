#include "router/request_flow.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>

#include "common/json_parse.h"
#include "http/front_door.h"
#include "pd/ids.h"
#include "pd/legs.h"
#include "router/decode_stream.h"
#include "router/flow_services.h"
#include "router/flow_state.h"
#include "router/leg.h"
#include "router/prompt_echo.h"
#include "router/prompt_list.h"
#include "router/sse_splitter.h"

namespace kvpush::router {

std::shared_ptr<Leg> OpenLeg(FlowServices& r, const RequestFlow::Transfer& t,
                             const InstanceAddress& addr, Role role) {
  std::shared_ptr<Leg> leg = r.legs().NewLeg(addr, role);
  if (t.trace) leg->set_traceparent(http::FormatTraceparent(*t.trace));
  // The answering leg of a continuable request reports what it delivered (ResumeLedger; a whole
  // answer is handed back when its instance begins draining: RequestFlow::FinishWhole).
  if (t.continuable && role != Role::kPrefill) leg->set_resume_info();
  return leg;
}

namespace {

using nlohmann::json;

/// A client's body carrying kv_transfer_params: the message the instances give too.
constexpr const char* kClientKvTransferParams =
    "kv_transfer_params is only for the legs of a P/D request, which the router writes; a client "
    "request may not carry it";
/// A client's body carrying kvpush_resume: the router writes it (a continuation).
constexpr const char* kClientResume =
    "kvpush_resume is only for the router's continuations of a request on another instance; a "
    "client request through the router may not carry it";

}  // namespace

void RequestFlow::Handle(const httplib::Request& req, httplib::Response& res) {
  auto t = std::make_shared<Transfer>();
  t->retries_left = kMaxRetries;
  auto body = std::make_shared<ClientBody>();
  std::string pull_profile;
  if (!router_.options().colocated()) {
    if (!ParseClient(req, res, t.get(), body.get(), &pull_profile)) return;
    if (t->path == "/v1/completions" && IsPromptList(body->doc)) {
      t->retries_left = 0;
      return HandlePromptList(*t, body->doc, pull_profile, res);
    }
  }
  const int migration_limit = router_.options().migration_limit;
  for (;;) {
    t->continuable = migration_limit > 0;
    t->continuations_left = migration_limit;
    if (router_.options().colocated()) {
      if (migration_limit > 0) t->client_text = req.body;
      HandleColocated(t, req, res);
    } else {
      t->client = body;
      RunPd(t, *body, pull_profile, res, nullptr);
    }
    if (t->retry_url.empty()) return;
    // Refused before any byte of the answer was written: the same request (same seed), a new
    // transfer id, never to an instance that refused it. With no other instance of that role
    // to try, the client gets the refusal as it was.
    std::vector<std::string> exclude = t->exclude;
    exclude.push_back(t->retry_url);
    if (!router_.pool().AnyHealthy(t->retry_role, exclude)) {
      router_.CountRequest(t->mode, false);
      return t->refused_reply->WriteTo(res);
    }
    router_.CountRetry(t->retry_role);
    spdlog::info("request {}: {} instance {} {}; retrying on another instance", t->request_id,
                 RoleName(t->retry_role), t->retry_url, t->retry_why);
    auto next = std::make_shared<Transfer>();
    next->request_id = t->request_id;
    next->path = t->path;
    next->mode = t->mode;
    next->stream = t->stream;
    next->exclude = std::move(exclude);
    next->retries_left = t->retries_left - 1;
    next->transfer_id = t->mode == TransferMode::kColocated ? "" : router_.ids().TransferId();
    t = std::move(next);
  }
}

void RequestFlow::RunPd(const std::shared_ptr<Transfer>& t, const ClientBody& client,
                        const std::string& pull_profile, httplib::Response& res,
                        std::shared_ptr<StreamState>* capture) {
  const json& body = client.doc;
  FlowServices& r = router_;
  const TransferMode tm = t->mode;
  auto none = [&](Role role) {
    r.CountRequest(tm, false);
    NoHealthyReply(r.pool(), role, t->exclude).WriteTo(res);
  };
  PdSelection sel = r.SelectPd(t->path, body, t->exclude);
  if (!sel.d) return none(Role::kDecode);
  t->d_addr = sel.d->address();
  if (sel.skip != SkipReason::kNone) {
    return RunLocalPrefill(t, client, std::move(*sel.d), res, capture);
  }
  if (!sel.p) return none(Role::kPrefill);
  std::optional<InstanceLease>& p_lease = sel.p;
  std::optional<InstanceLease>& d_lease = sel.d;
  t->p_addr = p_lease->address();
  spdlog::debug("request {}: mode={}{} transfer_id={} P={} D={} stream={}", t->request_id,
                TransferModeName(tm), pull_profile.empty() ? "" : "/" + pull_profile,
                t->transfer_id, t->p_addr.url, t->d_addr.url, t->stream);
  t->p_leg = OpenLeg(r, *t, t->p_addr, Role::kPrefill);
  // Echo with logprobs: P computes the prompt's logprobs and answers them as prompt_echo; D
  // echoes nothing, and the router puts P's part before D's choices (prompt_echo.h).
  t->echo_logprobs = WantsPromptEcho(t->path, body);
  // The router merges P's prompt_echo into D's answer; a continuation's would echo its own.
  if (t->echo_logprobs) t->continuable = false;
  std::string d_text;
  if (tm == TransferMode::kPush) {
    t->d_leg = OpenLeg(r, *t, t->d_addr, Role::kDecode);  // before P's thread: it may close it
    const json shell = client.Shell();  // leg builders start here: the prompt is not copied
    json d_body = pd::MakeDecodePushBody(shell, t->transfer_id, t->p_addr.host, t->p_addr.port,
                                         t->p_addr.https);
    if (t->echo_logprobs) d_body["echo"] = false;
    d_text = ComposeLegBody(d_body, client);
    // D's leg is written first: its PUSH_TARGET is what a short prefill waits for (D's leg, an
    // engine step, the connector, a message), while one more write delays P's prefill by
    // microseconds. A failed write is read where D's answer is (AnswerJson, AnswerStream).
    t->timeline.Mark(RouterPhase::kDecodeLegWritten);
    t->d_leg->SendAhead("POST", t->path, t->request_id, d_text, /*sse=*/t->stream);
    if (!StartPushPrefill(
            t, std::move(*p_lease),
            ComposeLegBody(pd::MakePrefillBody(shell, PdModeOf(tm), t->transfer_id), client))) {
      r.CountRequest(tm, false);
      return StopReply(r).WriteTo(res);
    }
  } else {
    std::optional<json> d = RunPullPrefill(*t, *p_lease, client, pull_profile, res);
    if (!d) return;
    if (t->echo_logprobs) (*d)["echo"] = false;
    d_text = ComposeLegBody(*d, client);
    t->d_leg = OpenLeg(r, *t, t->d_addr, Role::kDecode);
  }
  if (!t->stream) return AnswerJson(t, d_text, std::move(*d_lease), res);
  AnswerStream(t, d_text, std::move(*d_lease), res, capture);
}

void RequestFlow::RunLocalPrefill(const std::shared_ptr<Transfer>& t, const ClientBody& body,
                                  InstanceLease d_lease, httplib::Response& res,
                                  std::shared_ptr<StreamState>* capture) {
  // No P leg, no transfer: D gets the client's request as a colocated instance would.
  t->local_prefill = true;
  t->d_leg = OpenLeg(router_, *t, t->d_addr, Role::kDecode);
  spdlog::debug("request {}: local prefill on D={} (no P leg) stream={}", t->request_id,
                t->d_addr.url, t->stream);
  const std::string text = ComposeLegBody(body.Shell(), body);
  if (!t->stream) return AnswerJson(t, text, std::move(d_lease), res);
  AnswerStream(t, text, std::move(d_lease), res, capture);
}

void RequestFlow::HandleColocated(const std::shared_ptr<Transfer>& t, const httplib::Request& req,
                                  httplib::Response& res) {
  FlowServices& r = router_;
  t->mode = TransferMode::kColocated;
  t->d_role = Role::kColocated;
  t->path = req.path;
  if (t->request_id.empty()) {  // not a retry
    t->request_id = req.get_header_value("x-request-id");
    if (!pd::IsValidRequestId(t->request_id)) {
      t->request_id = r.ids().RequestId(t->path == "/v1/chat/completions" ? "chatcmpl-" : "cmpl-");
    }
    res.set_header("x-request-id", t->request_id);
    http::SetCurrentRequestId(t->request_id);
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
  if (body.contains("kvpush_resume")) {
    r.CountRequest(t->mode, false);
    return ErrorReply(400, kClientResume, "invalid_request_error", "", "kvpush_resume").WriteTo(res);
  }
  const auto s = body.find("stream");
  t->stream = s != body.end() && s->is_boolean() && s->get<bool>();
  std::optional<InstanceLease> lease = r.pool().Acquire(Role::kColocated, t->exclude);
  if (!lease) {
    r.CountRequest(t->mode, false);
    return NoHealthyReply(r.pool(), Role::kColocated, t->exclude).WriteTo(res);
  }
  t->d_addr = lease->address();
  t->d_leg = OpenLeg(r, *t, t->d_addr, Role::kColocated);
  spdlog::debug("request {}: colocated instance {} stream={}", t->request_id, t->d_addr.url,
                t->stream);
  if (!t->stream) return AnswerJson(t, req.body, std::move(*lease), res);
  AnswerStream(t, req.body, std::move(*lease), res, nullptr);
}

bool RequestFlow::ParseClient(const httplib::Request& req, httplib::Response& res, Transfer* t,
                              ClientBody* client, std::string* pull_profile) {
  FlowServices& r = router_;
  const RouterOptions& o = r.options();
  t->path = req.path;
  const bool chat = t->path == "/v1/chat/completions";
  t->request_id = req.get_header_value("x-request-id");
  if (!pd::IsValidRequestId(t->request_id)) {
    t->request_id = r.ids().RequestId(chat ? "chatcmpl-" : "cmpl-");
  }
  res.set_header("x-request-id", t->request_id);
  http::SetCurrentRequestId(t->request_id);

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
  http::AccessNote& note = http::CurrentAccessNote();
  if (http::Tracer* tracer = r.tracer()) {
    const auto parent = http::ParseTraceparent(req.get_header_value("traceparent"));
    t->trace = tracer->NewSpan(parent);
    if (parent) t->client_span = parent->span_id;
  }
  note.mode = TransferModeName(mode.mode);
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
  if (body->contains("kvpush_resume")) return reject(kClientResume, "", "kvpush_resume");
  if (!body->contains("seed") || (*body)["seed"].is_null()) (*body)["seed"] = r.ids().Seed();
  t->transfer_id = r.ids().TransferId();
  const auto s = body->find("stream");
  t->stream = s != body->end() && s->is_boolean() && s->get<bool>();
  return true;
}

}  // namespace kvpush::router
