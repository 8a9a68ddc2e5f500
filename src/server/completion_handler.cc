#include "server/completion_handler.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <optional>
#include <vector>

#include "common/drain.h"
#include "connector/pd_connector.h"
#include "pd/ids.h"
#include "pd/kv_transfer_params.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/openai_response.h"

namespace kvpush::server {
namespace {

using std::chrono::milliseconds;

void ReplyError(httplib::Response& res, const ApiError& e) {
  res.status = e.http_status;
  res.set_content(e.ToJson(), "application/json");
}

/// Maps an engine Submit/finish error to an HTTP error.
ApiError FromStatus(const Status& st, const std::string& param) {
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
      return ApiError::Invalid(st.message(), param);
    case StatusCode::kResourceExhausted:
      return ApiError::Invalid(st.message(), param, "kv_cache_too_small");
    case StatusCode::kUnavailable:
      return ApiError{503, st.message(), "server_error", "", "overloaded"};
    case StatusCode::kAborted:
      return ApiError{503, st.message(), "server_error", "", "aborted"};
    default:
      return ApiError{500, st.ToString(), "server_error", "", ""};
  }
}

/// All per-request state, shared by the handler and the SSE content provider.
struct RequestState {
  RequestState() = default;
  RequestState(const RequestState&) = delete;
  RequestState& operator=(const RequestState&) = delete;
  /// The HTTP request ended: its engine requests leave the transfer registry, and it no longer
  /// counts as in flight (HttpServer::inflight()).
  ~RequestState() {
    if (transfers != nullptr) {
      for (const auto& h : handles) {
        if (h.channel) transfers->Remove(transfer_id, h.id);
      }
    }
    if (inflight != nullptr) inflight->fetch_sub(1);
  }

  ResponseMeta meta;
  std::atomic<int>* inflight = nullptr;   ///< HttpServer::inflight_, counted while this lives
  TransferRequests* transfers = nullptr;  ///< set for P/D requests (POST /kv/abort finds them)
  std::string transfer_id;
  bool include_usage = false;
  std::vector<Engine::Handle> handles;  ///< per choice; no channel = not submitted yet (deferred)
  std::vector<ChoiceResult> choices;
  /// P/D decode leg with n > 1: choices 1..n-1 (index, request), submitted once choice 0's KV
  /// arrived (SubmitForks).
  std::vector<std::pair<size_t, GenerationRequest>> deferred;
  std::vector<std::string> echo;  ///< per choice: prompt text still to prepend (echo = true)
  std::vector<bool> echo_sent;    ///< streamed: the choice's first event (echo) was written
  std::string prompt_echo;  ///< P leg with echo and logprobs: BuildPromptEcho (JSON object text)
  std::vector<bool> role_sent;
  size_t num_finished = 0;
  bool done_sent = false;
  ApiError error;  ///< first kError/kAbort seen
  bool failed = false;
  std::optional<pd::PullAnswer> pull_answer;  ///< from a pull producer's final output

  /// Applies one output to choice i; returns true when it finished the choice.
  bool Apply(size_t i, const RequestOutput& o) {
    ChoiceResult& c = choices[i];
    c.text += o.text;
    c.tokens.insert(c.tokens.end(), o.tokens.begin(), o.tokens.end());
    if (!o.prompt_logprobs.empty()) c.prompt.scored = o.prompt_logprobs;
    c.prompt_tokens = o.num_prompt_tokens;
    c.completion_tokens = o.num_output_tokens;
    c.cached_tokens = o.num_cached_tokens;
    if (!o.finished()) return false;
    c.finish = o.finish_reason;
    c.stop_reason = o.stop_reason;
    c.stop_token_id = o.stop_token_id;
    if (o.pull_answer) pull_answer = o.pull_answer;
    ++num_finished;
    if ((o.finish_reason == FinishReason::kError || o.finish_reason == FinishReason::kAbort) &&
        !failed) {
      failed = true;
      error = FromStatus(o.error.ok() ? Aborted("request aborted") : o.error, "");
    }
    return true;
  }
  bool all_finished() const { return num_finished == handles.size(); }
  /// Choice i is running in the engine (submitted, not finished; `choices` may not be sized yet).
  bool pending(size_t i) const {
    return handles[i].channel && (i >= choices.size() || choices[i].finish == FinishReason::kNone);
  }
  /// The deferred forks may be submitted: choice 0 has its first token (its KV is in place) or
  /// ended.
  bool forks_due() const {
    return !deferred.empty() &&
           (!choices[0].tokens.empty() || choices[0].finish != FinishReason::kNone);
  }
};

/// A new request on a draining instance (HttpServer::BeginDrain).
ApiError Draining() {
  return ApiError{503, kDrainingMessage, "server_error", "", kDrainingCode};
}

/// A request still open when the drain timeout passed (HttpServer::CutOpenRequests).
ApiError DrainTimeout() {
  return ApiError{503, kDrainTimeoutMessage, "server_error", "", kDrainTimeoutCode};
}

/// A P/D leg whose transfer POST /kv/abort already ended.
ApiError TransferAborted(const pd::KvTransferParams& kv) {
  return ApiError{409, "transfer " + kv.transfer_id + " was aborted (POST /kv/abort)",
                  "invalid_request_error", "kv_transfer_params.transfer_id", "transfer_aborted"};
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
  g.min_tokens = kv.role == pd::KvTransferParams::Role::kProducer
                     ? std::min(r.min_tokens, max_tokens)
                     : r.min_tokens;
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

/// What `echo` puts before a choice's text: the prompt (completions; a token prompt decoded);
/// for chat, vLLM's rule: the last message's content when it is the assistant's (the role of the
/// reply), else nothing.
std::string EchoText(const OpenAiRequest& r, const PromptInput& p, const Tokenizer& tok,
                     const std::vector<int32_t>& ids) {
  if (r.kind == ApiKind::kChat) {
    return !r.messages.empty() && r.messages.back().role == "assistant" ? r.messages.back().content
                                                                        : "";
  }
  return p.is_tokens ? DecodeTokens(tok, ids) : p.text;
}

void AbortUnfinished(Engine& engine, const RequestState& st) {
  for (size_t i = 0; i < st.handles.size(); ++i) {
    if (st.pending(i)) engine.Abort(st.handles[i].id);
  }
}

/// P/D decode leg with n > 1 (docs/server.md, "n on a P/D decode instance"): once choice 0 has
/// its first token, its prompt's full blocks are in this instance's prefix cache (committed when
/// the KV arrived), and choices 1..n-1 are submitted as local requests that share them and
/// recompute only the tail to sample their own first token with seed + j, as colocated. If
/// choice 0 failed first, they fail with it (its error answers the request). Returns false
/// (st.error set) when a fork could not be submitted; every submitted choice is then aborted.
bool SubmitForks(Engine& engine, RequestState& st) {
  if (!st.forks_due()) return true;
  std::vector<std::pair<size_t, GenerationRequest>> forks;
  forks.swap(st.deferred);
  const bool choice0_failed = st.failed;
  for (auto& [k, g] : forks) {
    if (st.failed) {  // choice 0 failed: its error answers the request
      st.choices[k].finish = FinishReason::kError;
      ++st.num_finished;
      continue;
    }
    auto h = engine.Submit(std::move(g));
    if (!h.ok() || (st.transfers != nullptr && !st.transfers->Add(st.transfer_id, h->id))) {
      if (h.ok()) engine.Abort(h->id);
      st.failed = true;
      st.error = h.ok() ? ApiError{409, "transfer " + st.transfer_id + " was aborted",
                                   "invalid_request_error", "kv_transfer_params.transfer_id",
                                   "transfer_aborted"}
                        : FromStatus(h.status(), "prompt");
      st.choices[k].finish = FinishReason::kError;
      ++st.num_finished;
      continue;
    }
    st.handles[k] = *h;
  }
  if (st.failed && !choice0_failed) {
    AbortUnfinished(engine, st);
    return false;
  }
  return true;
}

}  // namespace

void CompletionHandler::Handle(ApiKind kind, const httplib::Request& req, httplib::Response& res) {
  HttpServer& srv = server_;
  Engine& engine = srv.engine_;
  const Tokenizer& tok = engine.tokenizer();

  auto st = std::make_shared<RequestState>();
  st->meta.kind = kind;
  std::string id = req.get_header_value("x-request-id");
  st->meta.id = pd::IsValidRequestId(id)
                    ? id
                    : srv.NewRequestId(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-");
  res.set_header("x-request-id", st->meta.id);
  st->meta.created = static_cast<int64_t>(std::time(nullptr));
  st->meta.model = srv.options_.served_model_name;
  st->meta.system_fingerprint = SystemFingerprint(engine.model_config().fingerprint);
  st->meta.prompt_tokens_details = srv.options_.enable_prompt_tokens_details;
  // Counted before the drain check, so that a drain that begins now waits for this request.
  srv.inflight_.fetch_add(1);
  st->inflight = &srv.inflight_;
  if (srv.draining_.load()) return ReplyError(res, Draining());

  auto parsed = ParseOpenAiRequest(kind, req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return ReplyError(res, *e);
  OpenAiRequest& r = std::get<OpenAiRequest>(parsed);
  if (!r.model.empty() && r.model != srv.options_.served_model_name) {
    return ReplyError(res, ApiError{404, "The model '" + r.model + "' does not exist.",
                                    "invalid_request_error", "model", "model_not_found"});
  }
  auto kv_parsed = pd::ParseKvTransferParams(r.kv_transfer_params);
  if (auto* e = std::get_if<pd::ParamError>(&kv_parsed)) {
    return ReplyError(res, ApiError::Invalid(e->message, e->param));
  }
  pd::KvTransferParams kv = std::get<pd::KvTransferParams>(kv_parsed);
  connector::PdConnector* conn = srv.options_.connector;
  if (kv.role != pd::KvTransferParams::Role::kNone) {
    if (conn == nullptr) {
      // The router's words for a client body carrying it (one error vocabulary): only the
      // router's legs to P/D instances (serve --role prefill|decode) may.
      return ReplyError(res, ApiError::Invalid("kv_transfer_params is only for the legs of a P/D "
                                               "request, which the router writes; a client "
                                               "request may not carry it",
                                               "kv_transfer_params"));
    }
    if (kind == ApiKind::kCompletion && r.prompts.size() != 1) {
      return ReplyError(res, ApiError::Invalid("kv_transfer_params: a P/D request takes exactly "
                                               "one prompt",
                                               "prompt"));
    }
  }
  // Echo with logprobs needs the prompt's logits, which P computes: the router gives D echo
  // false and puts P's `prompt_echo` before D's choices (docs/router.md).
  const bool echo_logprobs = kind == ApiKind::kCompletion && r.echo && r.logprobs >= 0;
  if (echo_logprobs && kv.role == pd::KvTransferParams::Role::kConsumer) {
    return ReplyError(res, ApiError::Invalid("echo with logprobs on a P/D decode leg: the prompt "
                                             "logprobs are computed by the prefill instance (the "
                                             "router sends D echo false and merges P's "
                                             "prompt_echo)",
                                             "echo"));
  }
  // n > 1 on a P/D request: P prefills once and samples choice 0's first token (seed + 0); D
  // forks the other choices after the KV arrived (SubmitForks).
  if (kv.role == pd::KvTransferParams::Role::kProducer) r.n = 1;
  st->meta.logprobs = r.logprobs >= 0;
  st->meta.token_ids = r.return_token_ids;
  st->include_usage = r.include_usage;

  // Token ids the engine would refuse, named by their own field (the engine's Submit error
  // would be reported against `prompt`).
  const int32_t vocab = engine.model_config().vocab_size;
  for (const auto& [tid, bias] : r.logit_bias) {
    if (tid >= vocab) {
      return ReplyError(res, ApiError::Invalid("logit_bias: token id " + std::to_string(tid) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(vocab) + ")",
                                               "logit_bias"));
    }
  }
  for (int32_t tid : r.stop_token_ids) {
    if (tid >= vocab) {
      return ReplyError(res, ApiError::Invalid("stop_token_ids: token id " + std::to_string(tid) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(vocab) + ")",
                                               "stop_token_ids"));
    }
  }

  // Tokenize every prompt (BOS + text; token-id prompts are used as given).
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> max_tokens;  ///< per prompt: the request's, or the default
  if (kind == ApiKind::kChat) {     // the model's chat template (server/chat_template.h)
    auto chat_ids = srv.chat_.Build(r.messages, r.chat_template);
    if (!chat_ids.ok()) {
      return ReplyError(res, ApiError::Invalid(chat_ids.status().message(), "messages"));
    }
    r.prompts.push_back(PromptInput{true, "", std::move(*chat_ids)});
  }
  const ModelConfig& model = engine.model_config();
  const int32_t max_len = engine.config().max_model_len;
  for (const PromptInput& p : r.prompts) {
    std::vector<int32_t> ids;
    if (p.is_tokens) {
      ids = p.tokens;
      for (int32_t t : ids) {
        if (t < 0 || t >= model.vocab_size) {
          return ReplyError(res, ApiError::Invalid("token id " + std::to_string(t) +
                                                       " is outside the vocabulary [0, " +
                                                       std::to_string(model.vocab_size) + ")",
                                                   "prompt"));
        }
      }
    } else {
      // BOS when the vocabulary adds one (vLLM's add_special_tokens = true): Llama yes, Qwen no.
      auto enc = TokenizePrompt(tok, p.text, /*add_special_tokens=*/true);
      if (!enc.ok()) return ReplyError(res, ApiError::Invalid(enc.status().message(), "prompt"));
      ids = std::move(*enc);
    }
    const int64_t n = static_cast<int64_t>(ids.size());
    const char* what = kind == ApiKind::kChat ? "messages" : "prompt";
    if (n + 1 > max_len) {
      return ReplyError(
          res,
          ApiError::Invalid("This model's maximum context length is " + std::to_string(max_len) +
                                " tokens. However, your " + what + " has " + std::to_string(n) +
                                " tokens (at least one " + "token must be generated).",
                            what, "context_length_exceeded"));
    }
    if (r.max_tokens && n + *r.max_tokens > max_len) {
      return ReplyError(
          res, ApiError::Invalid("This model's maximum context length is " +
                                     std::to_string(max_len) + " tokens. However, you requested " +
                                     std::to_string(n + *r.max_tokens) + " tokens (" +
                                     std::to_string(n) + " in the " + what + ", " +
                                     std::to_string(*r.max_tokens) + " in the completion).",
                                 "max_tokens", "context_length_exceeded"));
    }
    const auto room = static_cast<int32_t>(max_len - n);
    max_tokens.push_back(r.max_tokens ? *r.max_tokens
                                      : (kind == ApiKind::kChat ? room : std::min(16, room)));
    if (r.min_tokens > max_tokens.back() && kv.role != pd::KvTransferParams::Role::kProducer) {
      return ReplyError(res, ApiError::Invalid("min_tokens must be less than or equal to "
                                               "max_tokens=" +
                                                   std::to_string(max_tokens.back()) + ", got " +
                                                   std::to_string(r.min_tokens),
                                               "min_tokens"));
    }
    if (r.echo) {
      st->echo.insert(st->echo.end(), static_cast<size_t>(r.n), EchoText(r, p, tok, ids));
    }
    if (echo_logprobs && kv.role == pd::KvTransferParams::Role::kProducer) {
      st->prompt_echo = EchoText(r, p, tok, ids);  // text for now; the JSON once computed
    }
    prompts.push_back(std::move(ids));
  }

  if (kv.role != pd::KvTransferParams::Role::kNone) {
    // Role and id first (a D leg sent to a P instance is a 400, not a failed handshake).
    pd::KvTransferParams role_only = kv;
    role_only.mode = pd::KvTransferParams::Mode::kPush;
    if (Status v = conn->ValidateRequest(role_only, prompts[0]); !v.ok()) {
      return ReplyError(res, ApiError::Invalid(v.message(), "kv_transfer_params"));
    }
  }
  if (kv.role == pd::KvTransferParams::Role::kConsumer) {
    // Know P before the engine admits the request (cached after the first request).
    auto peer = conn->EnsurePeer(kv.remote_host, kv.remote_port);
    if (!peer.ok()) {
      return ReplyError(
          res, ApiError{502,
                        "prefill instance " + kv.remote_host + ":" +
                            std::to_string(kv.remote_port) + ": " + peer.status().message(),
                        "server_error", "kv_transfer_params", "kv_peer_unavailable"});
    }
    if (!kv.remote_engine_id.empty() && kv.remote_engine_id != *peer) {
      return ReplyError(
          res, ApiError::Invalid("kv_transfer_params.remote_engine_id '" + kv.remote_engine_id +
                                     "' is not the instance at " + kv.remote_host + ":" +
                                     std::to_string(kv.remote_port) + " ('" + *peer + "')",
                                 "kv_transfer_params.remote_engine_id"));
    }
    kv.remote_engine_id = *peer;
  }
  if (kv.role != pd::KvTransferParams::Role::kNone) {
    if (Status v = conn->ValidateRequest(kv, prompts[0]); !v.ok()) {
      return ReplyError(res, ApiError::Invalid(v.message(), "kv_transfer_params"));
    }
  }

  if (conn != nullptr && kv.role == pd::KvTransferParams::Role::kNone) srv.local_prefills_++;
  if (kv.role != pd::KvTransferParams::Role::kNone) {
    if (srv.transfers_.IsAborted(kv.transfer_id)) return ReplyError(res, TransferAborted(kv));
    st->transfers = &srv.transfers_;
    st->transfer_id = kv.transfer_id;
  }
  const uint64_t seed = r.seed ? static_cast<uint64_t>(*r.seed) : srv.RandomSeed();
  std::vector<bool> counts_prompt;
  for (size_t k = 0; k < prompts.size() * static_cast<size_t>(r.n); ++k) {
    const size_t i = k / static_cast<size_t>(r.n);
    const auto j = static_cast<int32_t>(k % static_cast<size_t>(r.n));
    const bool fork = j > 0 && kv.role == pd::KvTransferParams::Role::kConsumer;
    GenerationRequest g =
        MakeGeneration(r, fork ? pd::KvTransferParams{} : kv, prompts[i], max_tokens[i], seed, j);
    g.request_id =
        prompts.size() == 1 && r.n == 1 ? st->meta.id : st->meta.id + "-" + std::to_string(k);
    counts_prompt.push_back(j == 0);
    if (fork) {
      st->deferred.emplace_back(k, std::move(g));
      st->handles.emplace_back();  // submitted by SubmitForks
      continue;
    }
    auto h = engine.Submit(std::move(g));
    if (!h.ok()) {
      AbortUnfinished(engine, *st);
      return ReplyError(res, FromStatus(h.status(), "prompt"));
    }
    st->handles.push_back(*h);
    if (st->transfers != nullptr && !st->transfers->Add(st->transfer_id, h->id)) {
      // POST /kv/abort for this transfer came in while it was being submitted.
      st->handles.pop_back();
      engine.Abort(h->id);
      AbortUnfinished(engine, *st);
      return ReplyError(res, TransferAborted(kv));
    }
  }
  st->choices.resize(st->handles.size());
  for (size_t k = 0; k < st->choices.size(); ++k) {
    st->choices[k].counts_prompt = counts_prompt[k];
    if (echo_logprobs) st->choices[k].prompt.ids = prompts[k / static_cast<size_t>(r.n)];
  }
  st->role_sent.assign(st->handles.size(), false);
  st->echo_sent.assign(st->handles.size(), false);

  if (!r.stream) {
    // Wait for every choice (bounded by max_tokens); abort if the server stops meanwhile.
    while (!st->all_finished()) {
      if (srv.stopping_.load() || srv.cut_.load()) {
        AbortUnfinished(engine, *st);
        return ReplyError(res, srv.cut_.load() ? DrainTimeout()
                                               : ApiError{503, "server is shutting down",
                                                          "server_error", "", ""});
      }
      bool any = false;
      for (size_t i = 0; i < st->handles.size(); ++i) {
        if (!st->pending(i)) continue;
        for (auto& o : st->handles[i].channel->TakeAll()) {
          any = true;
          if (st->choices[i].finish == FinishReason::kNone) st->Apply(i, o);
        }
      }
      SubmitForks(engine, *st);
      if (any || st->all_finished()) continue;
      for (size_t i = 0; i < st->handles.size(); ++i) {  // wait on the first unfinished choice
        if (!st->pending(i)) continue;
        if (auto o = st->handles[i].channel->Next(milliseconds(100))) st->Apply(i, *o);
        break;
      }
      SubmitForks(engine, *st);
    }
    if (st->failed) return ReplyError(res, st->error);
    for (size_t k = 0; k < st->echo.size(); ++k) st->choices[k].text.insert(0, st->echo[k]);
    res.status = 200;
    const bool prompt_echo = echo_logprobs && kv.role == pd::KvTransferParams::Role::kProducer;
    if (!st->pull_answer && !prompt_echo) {
      res.set_content(BuildResponse(st->meta, st->choices, tok), "application/json");
      return;
    }
    auto body = nlohmann::json::parse(BuildResponse(st->meta, st->choices, tok));
    if (st->pull_answer) body["kv_transfer_params"] = pd::ToJson(*st->pull_answer);
    if (prompt_echo) {
      // P/D internal: the prompt's part of the answer, which the router puts before D's.
      body["prompt_echo"] =
          nlohmann::json::parse(BuildPromptEcho(st->prompt_echo, st->choices[0].prompt, tok));
    }
    res.set_content(body.dump(), "application/json");
    return;
  }

  // SSE: the provider is called repeatedly on this HTTP thread until it calls sink.done() or
  // returns false (write failed: the client went away). The releaser aborts what is unfinished.
  Engine* eng = &engine;
  HttpServer* server = &srv;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream; charset=utf-8",
      [st, eng, server, &tok](size_t, httplib::DataSink& sink) -> bool {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        if (st->done_sent) return true;
        if (server->cut_.load()) {
          // Drain timeout: an error event, never a silent cut; the releaser aborts the rest.
          if (!write("data: " + DrainTimeout().ToJson() + "\n\ndata: [DONE]\n\n")) return false;
          st->done_sent = true;
          sink.done();
          return true;
        }
        if (server->stopping_.load()) return false;
        if (st->meta.kind == ApiKind::kChat) {
          for (size_t i = 0; i < st->handles.size(); ++i) {
            if (st->role_sent[i]) continue;
            st->role_sent[i] = true;
            if (!write(BuildStreamChunk(st->meta, static_cast<int>(i), "", {}, FinishReason::kNone,
                                        "", -1, true, st->include_usage, tok))) {
              return false;
            }
          }
        }
        // Gather what is ready; if nothing is, wait briefly on the first unfinished choice.
        std::vector<std::pair<size_t, RequestOutput>> ready;
        for (size_t i = 0; i < st->handles.size(); ++i) {
          if (!st->pending(i)) continue;
          for (auto& o : st->handles[i].channel->TakeAll()) ready.emplace_back(i, std::move(o));
        }
        if (ready.empty()) {
          for (size_t i = 0; i < st->handles.size(); ++i) {
            if (!st->pending(i)) continue;
            if (auto o = st->handles[i].channel->Next(milliseconds(50))) {
              ready.emplace_back(i, std::move(*o));
            }
            break;
          }
        }
        for (auto& [i, o] : ready) {
          if (st->choices[i].finish != FinishReason::kNone) continue;
          st->Apply(i, o);
          if (o.finish_reason == FinishReason::kError || o.finish_reason == FinishReason::kAbort) {
            ApiError e = FromStatus(o.error.ok() ? Aborted("request aborted") : o.error, "");
            if (!write("data: " + e.ToJson() + "\n\n")) return false;
            continue;
          }
          // Echo: the prompt (and with logprobs its part of them) leads the choice's first event.
          PromptLogprobs prompt;
          const bool first = !st->echo_sent[i];
          st->echo_sent[i] = true;
          if (first && i < st->echo.size()) o.text.insert(0, st->echo[i]);
          if (first && !st->choices[i].prompt.ids.empty()) {
            prompt.ids = st->choices[i].prompt.ids;
            prompt.scored = std::move(o.prompt_logprobs);
          }
          if (o.text.empty() && !o.finished() && !st->meta.logprobs && !st->meta.token_ids)
            continue;
          if (!write(BuildStreamChunk(st->meta, static_cast<int>(i), o.text, o.tokens,
                                      o.finish_reason, o.stop_reason, o.stop_token_id, false,
                                      st->include_usage, tok,
                                      prompt.ids.empty() ? nullptr : &prompt))) {
            return false;
          }
        }
        if (!SubmitForks(*eng, *st)) {
          if (!write("data: " + st->error.ToJson() + "\n\n")) return false;
        }
        if (st->all_finished()) {
          if (st->include_usage) {
            if (!write(BuildUsageChunk(st->meta, SumUsage(st->choices)))) return false;
          }
          if (!write("data: [DONE]\n\n")) return false;
          st->done_sent = true;
          sink.done();
        }
        return true;
      },
      [st, eng](bool success) {
        if (!success || !st->all_finished()) {
          spdlog::debug("request {}: stream ended early; aborting", st->meta.id);
          AbortUnfinished(*eng, *st);
        }
      });
}

}  // namespace kvpush::server
