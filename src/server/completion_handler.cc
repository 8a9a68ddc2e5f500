#include "server/completion_handler.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "common/drain.h"
#include "http/front_door.h"
#include "pd/ids.h"
#include "pd/kv_transfer_params.h"
#include "server/completion_prepare.h"
#include "server/completion_state.h"
#include "server/openai_response.h"
#include "server/pd_gate.h"

namespace kvpush::server {
namespace {

using std::chrono::milliseconds;
using Role = pd::KvTransferParams::Role;

/// A new request on a draining instance (HttpServer::BeginDrain).
http::ApiError Draining() {
  return http::ApiError{503, kDrainingMessage, "server_error", "", kDrainingCode};
}

/// A request still open when the drain timeout passed (HttpServer::CutOpenRequests).
http::ApiError DrainTimeout() {
  return http::ApiError{503, kDrainTimeoutMessage, "server_error", "", kDrainTimeoutCode};
}

/// "fp_" + the model fingerprint in 16 hex digits (ResponseMeta::system_fingerprint).
std::string SystemFingerprint(uint64_t model_fingerprint) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "fp_%016llx", static_cast<unsigned long long>(model_fingerprint));
  return buf;
}

/// The engine request of sample `j` of a prompt: the request's sampling parameters, seed + j
/// (vLLM's per-choice seeds for n > 1, vllm/v1/engine/parallel_sampling.py).
GenerationRequest MakeGeneration(const OpenAiRequest& r, const pd::KvTransferParams& kv,
                                 std::vector<int32_t> prompt, int32_t max_tokens, uint64_t seed,
                                 int32_t j) {
  GenerationRequest g;
  g.max_tokens = max_tokens;
  // A P leg has max_tokens = 1 from the router; min_tokens still suppresses EOS and the stop
  // ids for its one token (exactly as for the first token of a colocated run), so clamp.
  g.min_tokens = kv.role == Role::kProducer ? std::min(r.min_tokens, max_tokens) : r.min_tokens;
  g.prompt_tokens = std::move(prompt);
  g.sampling.temperature = r.temperature;
  g.sampling.top_p = r.top_p;
  g.sampling.top_k = r.top_k;
  g.sampling.min_p = r.min_p;
  g.sampling.presence_penalty = r.presence_penalty;
  g.sampling.frequency_penalty = r.frequency_penalty;
  g.sampling.repetition_penalty = r.repetition_penalty;
  g.sampling.logit_bias = r.logit_bias;
  g.sampling.seed = seed + static_cast<uint64_t>(j);
  g.seed_given = r.seed.has_value();
  g.sampling.logprobs = r.logprobs;
  // Echo with logprobs: the prompt's logprobs, top `logprobs` each (vLLM's completions set
  // prompt_logprobs = logprobs when echo is on).
  if (r.kind == ApiKind::kCompletion && r.echo && r.logprobs >= 0) g.prompt_logprobs = r.logprobs;
  g.stop = r.stop;
  g.stop_token_ids = r.stop_token_ids;
  g.ignore_eos = r.ignore_eos;
  g.kv_transfer = kv;
  return g;
}

/// Step "admit": the request's id (the client's x-request-id when valid), its response meta, and
/// its place among the requests in flight. Null (and `res` answered) while draining.
std::shared_ptr<CompletionState> Admit(const CompletionContext& c, ApiKind kind,
                                       const httplib::Request& req, httplib::Response& res) {
  auto st = std::make_shared<CompletionState>();
  st->meta.kind = kind;
  const std::string id = req.get_header_value("x-request-id");
  st->meta.id = pd::IsValidRequestId(id)
                    ? id
                    : c.new_request_id(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-");
  res.set_header("x-request-id", st->meta.id);
  http::SetCurrentRequestId(st->meta.id);
  st->meta.created = static_cast<int64_t>(std::time(nullptr));
  st->meta.model = c.served_model_name;
  st->meta.system_fingerprint = SystemFingerprint(c.engine.model_config().fingerprint);
  st->meta.prompt_tokens_details = c.prompt_tokens_details;
  if (c.tracer != nullptr) {
    // The router's span (or the client's) is this request's parent (W3C traceparent).
    const auto parent = http::ParseTraceparent(req.get_header_value("traceparent"));
    st->tracer = c.tracer;
    st->trace = RequestTrace{c.tracer->NewSpan(parent), parent ? parent->span_id : http::SpanId{},
                             NowNs()};
  }
  // Counted before the drain check, so that a drain that begins now waits for this request.
  c.state.inflight.fetch_add(1);
  st->inflight = &c.state.inflight;
  if (c.state.draining.load()) {
    if (req.get_header_value(kMigrationSourceHeader) != "1") {
      http::ReplyError(res, Draining());
      return nullptr;
    }
    st->migration_while_draining = true;
  }
  return st;
}

/// A continuation's choice `k` (OpenAiRequest::resume): its start was streamed already (no role
/// or echo again), its text count continues, and one that ended there counts as finished here
/// with its tokens in usage.
void PrimeResumed(const ResumedChoice& rc, size_t prompt_tokens, bool whole, CompletionState& st,
                  size_t k) {
  st.role_sent[k] = true;
  st.echo_sent[k] = !rc.token_ids.empty();
  st.text_bytes[k] = rc.text_bytes;
  ChoiceResult& c = st.choices[k];
  if (whole) {
    // A whole answer: what the instance that handed it back generated leads this one's.
    c.text = rc.text;
    for (size_t i = 0; i < rc.token_ids.size(); ++i) {
      TokenOutput t;
      t.id = rc.token_ids[i];
      if (i < rc.logprobs.size()) {
        t.logprob = rc.logprobs[i].logprob;
        t.top_logprobs = rc.logprobs[i].top;
      }
      c.tokens.push_back(std::move(t));
    }
  }
  if (!rc.finished) return;
  c.finish = !whole || rc.finish_reason == "stop" ? FinishReason::kStop : FinishReason::kLength;
  c.stop_reason = rc.stop_reason;
  c.stop_token_id = rc.stop_token_id;
  c.prompt_tokens = static_cast<int32_t>(prompt_tokens);
  c.completion_tokens = static_cast<int32_t>(rc.token_ids.size());
  ++st.num_finished;
}

/// The answer so far of a whole answer handed back (CompletionState::handback): HTTP 503
/// kHandBackCode with `kvpush_resume` {whole, choices: [{index, token_ids, text_bytes, text,
/// finished, logprobs?, finish_reason?, stop_reason?, stop_token_id?}]} and `kvpush_seed`.
void ReplyHandBack(const CompletionState& st, httplib::Response& res) {
  nlohmann::json choices = nlohmann::json::array();
  for (size_t k = 0; k < st.choices.size(); ++k) {
    const ChoiceResult& c = st.choices[k];
    std::vector<int32_t> ids;
    nlohmann::json logprobs = nlohmann::json::array();
    for (const TokenOutput& t : c.tokens) {
      ids.push_back(t.id);
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [id, lp] : t.top_logprobs) top.push_back({id, lp});
      logprobs.push_back({t.logprob, std::move(top)});
    }
    nlohmann::json e = {{"index", k},          {"token_ids", ids},
                        {"text_bytes", c.text.size()}, {"text", c.text},
                        {"finished", c.finish != FinishReason::kNone}};
    if (st.meta.logprobs) e["logprobs"] = std::move(logprobs);
    if (c.finish != FinishReason::kNone) {
      e["finish_reason"] = FinishReasonString(c.finish);
      e["stop_reason"] = c.stop_reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(c.stop_reason);
      e["stop_token_id"] = c.stop_token_id;
    }
    choices.push_back(std::move(e));
  }
  nlohmann::json body = nlohmann::json::parse(
      http::ApiError{503, kHandBackMessage, "server_error", "", kHandBackCode}.ToJson());
  body["kvpush_resume"] = {{"whole", true}, {"choices", std::move(choices)}};
  body["kvpush_seed"] = static_cast<int64_t>(st.seed);  // as the resume comments: a valid `seed`
  res.status = 503;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

/// Step "submit": one engine request per choice (prompt-major, n per prompt). A D leg's choices
/// 1..n-1 wait in `deferred` for choice 0's KV (SubmitForks). On an error every choice already
/// submitted is aborted.
std::optional<http::ApiError> Submit(const CompletionContext& c, PreparedRequest& p,
                                     CompletionState& st) {
  const OpenAiRequest& r = p.request;
  const pd::KvTransferParams& kv = p.kv;
  if (kv.role != Role::kNone) {
    st.transfers = &c.transfers;
    st.transfer_id = kv.transfer_id;
  }
  const uint64_t seed = r.seed ? static_cast<uint64_t>(*r.seed) : c.random_seed();
  st.seed = seed;
  const auto n = static_cast<size_t>(r.n);
  st.param_stats = c.param_stats;
  if (kv.role != Role::kNone && c.handoff_traces != nullptr && st.trace) {
    c.handoff_traces->Register(kv.transfer_id, st.trace->context);
  }
  st.n = r.n;
  st.max_tokens = p.max_tokens;
  std::vector<bool> counts_prompt;
  std::vector<const ResumedChoice*> resumed(p.prompts.size() * n, nullptr);
  for (const ResumedChoice& rc : r.resume) resumed[static_cast<size_t>(rc.index)] = &rc;
  for (size_t k = 0; k < p.prompts.size() * n; ++k) {
    const size_t i = k / n;
    const auto j = static_cast<int32_t>(k % n);
    const bool fork = j > 0 && kv.role == Role::kConsumer;
    GenerationRequest g = MakeGeneration(r, fork ? pd::KvTransferParams{} : kv, p.prompts[i],
                                         p.max_tokens[i], seed, j);
    g.request_id =
        p.prompts.size() == 1 && r.n == 1 ? st.meta.id : st.meta.id + "-" + std::to_string(k);
    counts_prompt.push_back(j == 0);
    if (resumed[k] != nullptr && resumed[k]->finished) {
      if (resumed[k]->token_ids.size() > static_cast<size_t>(p.max_tokens[i])) {
        AbortUnfinished(c.engine, st);
        return http::ApiError::Invalid(
            "kvpush_resume: finished choice " + std::to_string(k) + " has more tokens than "
            "max_tokens", "kvpush_resume");
      }
      st.handles.emplace_back();  // ended on the earlier instance: nothing to run
      continue;
    }
    if (resumed[k] != nullptr) {
      g.resume_output_tokens = resumed[k]->token_ids;
      g.resume_text_bytes = resumed[k]->text_bytes;
    }
    if (fork) {
      st.deferred.emplace_back(k, std::move(g));
      st.handles.emplace_back();  // submitted by SubmitForks
      continue;
    }
    auto h = c.engine.Submit(std::move(g));
    if (!h.ok()) {
      AbortUnfinished(c.engine, st);
      const bool resume = h.status().message().rfind("kvpush_resume", 0) == 0;
      return FromStatus(h.status(), resume ? "kvpush_resume" : "prompt");
    }
    st.handles.push_back(*h);
    if (st.transfers != nullptr && !st.transfers->Add(st.transfer_id, h->id)) {
      // POST /kv/abort for this transfer came in while it was being submitted.
      st.handles.pop_back();
      c.engine.Abort(h->id);
      AbortUnfinished(c.engine, st);
      return TransferAborted(kv.transfer_id);
    }
  }
  st.choices.resize(st.handles.size());
  for (size_t k = 0; k < st.choices.size(); ++k) {
    st.choices[k].counts_prompt = counts_prompt[k];
    if (p.echo_logprobs) st.choices[k].prompt.ids = p.prompts[k / n];
  }
  st.role_sent.assign(st.handles.size(), false);
  st.echo_sent.assign(st.handles.size(), false);
  st.text_bytes.assign(st.handles.size(), 0);
  for (size_t k = 0; k < st.choices.size(); ++k) {
    if (resumed[k] != nullptr) {
      PrimeResumed(*resumed[k], p.prompts[k / n].size(), r.resume_whole, st, k);
    }
  }
  st.echo = std::move(p.echo);
  st.prompt_echo = std::move(p.prompt_echo);
  return std::nullopt;
}

/// Step "respond", one JSON body: waits for every choice (bounded by max_tokens), aborting them
/// if the server stops or cuts open requests meanwhile.
void RespondJson(const CompletionContext& c, const PreparedRequest& p, CompletionState& st,
                 httplib::Response& res) {
  while (!st.all_finished()) {
    if (st.handback && c.state.draining.load() && !c.state.cut.load()) {
      AbortUnfinished(c.engine, st);
      return ReplyHandBack(st, res);
    }
    if (c.state.stopping.load() || c.state.cut.load()) {
      AbortUnfinished(c.engine, st);
      return http::ReplyError(
          res, c.state.cut.load()
                   ? DrainTimeout()
                   : http::ApiError{503, "server is shutting down", "server_error", "", ""});
    }
    for (auto& [i, o] : ReadChoices(st, milliseconds(100))) {
      if (st.choices[i].finish == FinishReason::kNone) st.Apply(i, o);
    }
    SubmitForks(c.engine, st);
  }
  if (st.failed) return http::ReplyError(res, st.error);
  for (size_t k = 0; k < st.echo.size(); ++k) st.choices[k].text.insert(0, st.echo[k]);
  const Tokenizer& tok = c.engine.tokenizer();
  res.status = 200;
  const bool prompt_echo = p.echo_logprobs && p.kv.role == Role::kProducer;
  if (!st.pull_answer && !prompt_echo) {
    res.set_content(BuildResponse(st.meta, st.choices, tok), "application/json");
    return;
  }
  auto body = nlohmann::json::parse(BuildResponse(st.meta, st.choices, tok));
  if (st.pull_answer) body["kv_transfer_params"] = pd::ToJson(*st.pull_answer);
  if (prompt_echo) {
    // P/D internal: the prompt's part of the answer, which the router puts before D's.
    body["prompt_echo"] =
        nlohmann::json::parse(BuildPromptEcho(st.prompt_echo, st.choices[0].prompt, tok));
  }
  res.set_content(body.dump(), "application/json");
}

/// Step "respond", an SSE stream: the content provider, called repeatedly on the request's HTTP
/// thread until it calls sink.done() or returns false (a write failed: the client went away).
class StreamResponder {
 public:
  StreamResponder(const CompletionContext& c, std::shared_ptr<CompletionState> st)
      : c_(c), st_(std::move(st)) {}

  bool operator()(size_t /*offset*/, httplib::DataSink& sink) {
    CompletionState& st = *st_;
    if (st.done_sent) return true;
    if (c_.state.cut.load()) {
      // Drain timeout: an error event, never a silent cut; the releaser aborts the rest.
      if (!Write(sink, "data: " + DrainTimeout().ToJson() + "\n\ndata: [DONE]\n\n")) return false;
      st.done_sent = true;
      sink.done();
      return true;
    }
    if (c_.state.stopping.load()) return false;
    if (st.resume_info && !st.drain_offered && c_.state.draining.load()) {
      // The router may continue this stream on another instance at once (docs/reliability.md,
      // "Continuation"); else it stays, bounded by the drain timeout as any other.
      st.drain_offered = true;
      if (!Write(sink, ": kvpush-draining\n\n")) return false;
    }
    if (!WriteRoles(sink)) return false;
    for (auto& [i, o] : ReadChoices(st, milliseconds(50))) {
      if (st.choices[i].finish != FinishReason::kNone) continue;
      if (!WriteOutput(sink, i, o)) return false;
    }
    if (!SubmitForks(c_.engine, st)) {
      if (!Write(sink, "data: " + st.error.ToJson() + "\n\n")) return false;
    }
    if (!st.all_finished()) return true;
    if (st.include_usage && !Write(sink, BuildUsageChunk(st.meta, SumUsage(st.choices)))) {
      return false;
    }
    if (!Write(sink, "data: [DONE]\n\n")) return false;
    st.done_sent = true;
    sink.done();
    return true;
  }

  /// The releaser: a stream that ended early aborts what is unfinished.
  static void Release(Engine& engine, const CompletionState& st, bool success) {
    if (!success || !st.all_finished()) {
      spdlog::debug("request {}: stream ended early; aborting", st.meta.id);
      AbortUnfinished(engine, st);
    }
  }

 private:
  static bool Write(httplib::DataSink& sink, const std::string& s) {
    return sink.write(s.data(), s.size());
  }

  /// Chat: each choice's first event carries the assistant role alone.
  bool WriteRoles(httplib::DataSink& sink) {
    CompletionState& st = *st_;
    if (st.meta.kind != ApiKind::kChat) return true;
    for (size_t i = 0; i < st.handles.size(); ++i) {
      if (st.role_sent[i]) continue;
      st.role_sent[i] = true;
      if (!Write(sink, WithResumeInfo(BuildStreamChunk(st.meta, static_cast<int>(i), "", {},
                                                       FinishReason::kNone, "", -1, true,
                                                       st.include_usage, c_.engine.tokenizer()),
                                      i, {}, false))) {
        return false;
      }
    }
    return true;
  }

  /// One output of choice i as an event (an error event for a failed choice); the echo leads
  /// the choice's first event.
  bool WriteOutput(httplib::DataSink& sink, size_t i, RequestOutput& o) {
    CompletionState& st = *st_;
    st.Apply(i, o);
    if (o.finish_reason == FinishReason::kError || o.finish_reason == FinishReason::kAbort) {
      http::ApiError e = FromStatus(o.error.ok() ? Aborted("request aborted") : o.error, "");
      return Write(sink, "data: " + e.ToJson() + "\n\n");
    }
    PromptLogprobs prompt;
    const bool first = !st.echo_sent[i];
    st.echo_sent[i] = true;
    st.text_bytes[i] += static_cast<int64_t>(o.text.size());  // before the echo: output only
    if (first && i < st.echo.size()) o.text.insert(0, st.echo[i]);
    if (first && !st.choices[i].prompt.ids.empty()) {
      prompt.ids = st.choices[i].prompt.ids;
      prompt.scored = std::move(o.prompt_logprobs);
    }
    if (o.text.empty() && !o.finished() && !st.meta.logprobs && !st.meta.token_ids) {
      // No event for the client; a router that asked still learns the token.
      return !st.resume_info || Write(sink, WithResumeInfo("\n", i, o.tokens, false));
    }
    return Write(sink, WithResumeInfo(BuildStreamChunk(st.meta, static_cast<int>(i), o.text,
                                                       o.tokens, o.finish_reason, o.stop_reason,
                                                       o.stop_token_id, false, st.include_usage,
                                                       c_.engine.tokenizer(),
                                                       prompt.ids.empty() ? nullptr : &prompt),
                                      i, o.tokens, o.finished()));
  }

  /// `event` ("data: ...\n\n", or "\n" for none) with choice i's `: kvpush-resume` comment line
  /// when the request asked for it (CompletionState::resume_info); `event` as-is otherwise.
  std::string WithResumeInfo(const std::string& event, size_t i,
                             const std::vector<TokenOutput>& tokens, bool finished) const {
    const CompletionState& st = *st_;
    if (!st.resume_info) return event;
    nlohmann::json ids = nlohmann::json::array();
    for (const TokenOutput& t : tokens) ids.push_back(t.id);
    // The seed as the API's signed 64-bit `seed` (the same bits: ParseOpenAiRequest's int64).
    const nlohmann::json info = {{"index", i},
                                 {"token_ids", std::move(ids)},
                                 {"text_bytes", st.text_bytes[i]},
                                 {"finished", finished},
                                 {"seed", static_cast<int64_t>(st.seed)}};
    // The comment line goes inside the event (before its blank line): one event, one write.
    return event.substr(0, event.size() - 1) + ": kvpush-resume " + info.dump() + "\n\n";
  }

  const CompletionContext& c_;
  std::shared_ptr<CompletionState> st_;
};

void RespondStream(const CompletionContext& c, const std::shared_ptr<CompletionState>& st,
                   httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  Engine* engine = &c.engine;
  res.set_chunked_content_provider(
      "text/event-stream; charset=utf-8", StreamResponder(c, st),
      [st, engine](bool success) { StreamResponder::Release(*engine, *st, success); });
}

}  // namespace

void CompletionHandler::Handle(ApiKind kind, const httplib::Request& req,
                               httplib::Response& res) const {
  const CompletionContext& c = context_;
  std::shared_ptr<CompletionState> st = Admit(c, kind, req, res);
  if (!st) return;
  const PrepareContext prepare{c.engine.tokenizer(),    c.chat,
                               c.engine.model_config(), c.engine.config().max_model_len,
                               c.served_model_name,     c.connector != nullptr,
                               c.served_model_aliases};
  auto prepared = PrepareCompletion(kind, req.body, prepare);
  if (auto* e = std::get_if<http::ApiError>(&prepared)) return http::ReplyError(res, *e);
  PreparedRequest& p = std::get<PreparedRequest>(prepared);
  if (st->migration_while_draining && !p.request.resume_whole &&
      (p.kv.role != Role::kProducer || p.request.resume.empty())) {
    return http::ReplyError(res, Draining());
  }
  st->meta.logprobs = p.request.logprobs >= 0;
  st->meta.token_ids = p.request.return_token_ids;
  // A continuation whose client already got the usage chunk does not get it again.
  st->include_usage = p.request.include_usage && !p.request.resume_usage_sent;
  const bool resume_info = req.get_header_value("x-kvpush-resume-info") == "1";
  st->resume_info = p.request.stream && resume_info;
  // A whole answer is handed back on a drain unless it came to a draining instance (handed
  // back to it already: it finishes here) or carries prompt logprobs (echo: not in the hand-back).
  st->handback = !p.request.stream && resume_info && !st->migration_while_draining &&
                 p.kv.role != Role::kProducer && !p.echo_logprobs;
  if (auto e = PassPdGate(c, p)) return http::ReplyError(res, *e);
  if (auto e = SkipUnneededPrefill(c, p)) return http::ReplyError(res, *e);
  if (auto e = Submit(c, p, *st)) return http::ReplyError(res, *e);
  if (!p.request.stream) return RespondJson(c, p, *st, res);
  RespondStream(c, st, res);
}

}  // namespace kvpush::server
