#include "server/completion_handler.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <vector>

#include "connector/pd_connector.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/kv_transfer_params.h"
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
  /// The HTTP request ended: its engine requests leave the transfer registry.
  ~RequestState() {
    if (transfers == nullptr) return;
    for (const auto& h : handles) transfers->Remove(transfer_id, h.id);
  }

  ResponseMeta meta;
  TransferRequests* transfers = nullptr;  ///< set for P/D requests (POST /kv/abort finds them)
  std::string transfer_id;
  bool include_usage = false;
  std::vector<Engine::Handle> handles;
  std::vector<ChoiceResult> choices;
  std::vector<std::string> echo;  ///< per choice: prompt text still to prepend (echo = true)
  std::vector<bool> role_sent;
  size_t num_finished = 0;
  bool done_sent = false;
  ApiError error;  ///< first kError/kAbort seen
  bool failed = false;
  std::string kv_transfer_params;  ///< from a P/D producer's final output (JSON object text)

  /// Applies one output to choice i; returns true when it finished the choice.
  bool Apply(size_t i, const RequestOutput& o) {
    ChoiceResult& c = choices[i];
    c.text += o.text;
    c.tokens.insert(c.tokens.end(), o.tokens.begin(), o.tokens.end());
    c.prompt_tokens = o.num_prompt_tokens;
    c.completion_tokens = o.num_output_tokens;
    c.cached_tokens = o.num_cached_tokens;
    if (!o.finished()) return false;
    c.finish = o.finish_reason;
    c.stop_reason = o.stop_reason;
    c.stop_token_id = o.stop_token_id;
    if (!o.kv_transfer_params.empty()) kv_transfer_params = o.kv_transfer_params;
    ++num_finished;
    if ((o.finish_reason == FinishReason::kError || o.finish_reason == FinishReason::kAbort) &&
        !failed) {
      failed = true;
      error = FromStatus(o.error.ok() ? Aborted("request aborted") : o.error, "");
    }
    return true;
  }
  bool all_finished() const { return num_finished == handles.size(); }
};

/// A P/D leg whose transfer POST /kv/abort already ended.
ApiError TransferAborted(const KvTransferParams& kv) {
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
GenerationRequest MakeGeneration(const OpenAiRequest& r, const KvTransferParams& kv,
                                 std::vector<int32_t> prompt, int32_t max_tokens, uint64_t seed,
                                 int32_t j) {
  GenerationRequest g;
  g.max_tokens = max_tokens;
  // A P leg has max_tokens = 1 from the router; min_tokens still suppresses EOS and the stop
  // ids for its one token (exactly as for the first token of a colocated run), so clamp.
  g.min_tokens = kv.role == KvTransferParams::Role::kProducer ? std::min(r.min_tokens, max_tokens)
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
  g.stop = r.stop;
  g.stop_token_ids = r.stop_token_ids;
  g.ignore_eos = r.ignore_eos;
  g.kv_transfer = kv;
  return g;
}

void AbortUnfinished(Engine& engine, const RequestState& st) {
  for (size_t i = 0; i < st.handles.size(); ++i) {
    if (st.choices[i].finish == FinishReason::kNone) engine.Abort(st.handles[i].id);
  }
}

}  // namespace

void CompletionHandler::Handle(ApiKind kind, const httplib::Request& req, httplib::Response& res) {
  HttpServer& srv = server_;
  Engine& engine = srv.engine_;
  const Tokenizer& tok = engine.tokenizer();

  auto st = std::make_shared<RequestState>();
  st->meta.kind = kind;
  std::string id = req.get_header_value("x-request-id");
  bool id_ok = !id.empty() && id.size() <= 256;
  for (char c : id) id_ok = id_ok && c > 0x20 && c < 0x7f;
  st->meta.id = id_ok ? id : srv.NewRequestId(kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-");
  res.set_header("x-request-id", st->meta.id);
  st->meta.created = static_cast<int64_t>(std::time(nullptr));
  st->meta.model = srv.options_.served_model_name;
  st->meta.system_fingerprint = SystemFingerprint(engine.model_config().fingerprint);
  st->meta.prompt_tokens_details = srv.options_.enable_prompt_tokens_details;

  auto parsed = ParseOpenAiRequest(kind, req.body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return ReplyError(res, *e);
  OpenAiRequest& r = std::get<OpenAiRequest>(parsed);
  if (!r.model.empty() && r.model != srv.options_.served_model_name) {
    return ReplyError(res, ApiError{404, "The model '" + r.model + "' does not exist.",
                                    "invalid_request_error", "model", "model_not_found"});
  }
  auto kv_parsed = ParseKvTransferParams(r.kv_transfer_params);
  if (auto* e = std::get_if<ApiError>(&kv_parsed)) return ReplyError(res, *e);
  KvTransferParams kv = std::get<KvTransferParams>(kv_parsed);
  connector::PdConnector* conn = srv.options_.connector;
  if (kv.role != KvTransferParams::Role::kNone) {
    if (conn == nullptr) {
      return ReplyError(res, ApiError::Invalid("kv_transfer_params: this instance is not a P/D "
                                               "instance (serve --role prefill|decode)",
                                               "kv_transfer_params"));
    }
    if (kind == ApiKind::kCompletion && r.prompts.size() != 1) {
      return ReplyError(res, ApiError::Invalid("kv_transfer_params: a P/D request takes exactly "
                                               "one prompt",
                                               "prompt"));
    }
    if (r.n != 1) {
      return ReplyError(res, ApiError::Invalid("n > 1 is not supported on a P/D leg", "n"));
    }
  }
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
  if (kind == ApiKind::kChat) {
    r.prompts.push_back(PromptInput{false, ApplyDefaultChatTemplate(r.messages), {}});
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
      auto enc = tok.Encode(p.text);
      if (!enc.ok()) return ReplyError(res, ApiError::Invalid(enc.status().message(), "prompt"));
      ids.push_back(tok.bos_id());
      ids.insert(ids.end(), enc->begin(), enc->end());
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
    if (r.min_tokens > max_tokens.back() && kv.role != KvTransferParams::Role::kProducer) {
      return ReplyError(res, ApiError::Invalid("min_tokens must be less than or equal to "
                                               "max_tokens=" +
                                                   std::to_string(max_tokens.back()) + ", got " +
                                                   std::to_string(r.min_tokens),
                                               "min_tokens"));
    }
    if (r.echo) {
      st->echo.insert(st->echo.end(), static_cast<size_t>(r.n),
                      p.is_tokens ? DecodeTokens(tok, ids) : p.text);
    }
    prompts.push_back(std::move(ids));
  }

  if (kv.role != KvTransferParams::Role::kNone) {
    // Role and id first (a D leg sent to a P instance is a 400, not a failed handshake).
    KvTransferParams role_only = kv;
    role_only.mode = KvTransferParams::Mode::kPush;
    if (Status v = conn->ValidateRequest(role_only, prompts[0]); !v.ok()) {
      return ReplyError(res, ApiError::Invalid(v.message(), "kv_transfer_params"));
    }
  }
  if (kv.role == KvTransferParams::Role::kConsumer) {
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
  if (kv.role != KvTransferParams::Role::kNone) {
    if (Status v = conn->ValidateRequest(kv, prompts[0]); !v.ok()) {
      return ReplyError(res, ApiError::Invalid(v.message(), "kv_transfer_params"));
    }
  }

  if (kv.role != KvTransferParams::Role::kNone) {
    if (srv.transfers_.IsAborted(kv.transfer_id)) return ReplyError(res, TransferAborted(kv));
    st->transfers = &srv.transfers_;
    st->transfer_id = kv.transfer_id;
  }
  const uint64_t seed = r.seed ? static_cast<uint64_t>(*r.seed) : srv.RandomSeed();
  std::vector<bool> counts_prompt;
  for (size_t k = 0; k < prompts.size() * static_cast<size_t>(r.n); ++k) {
    const size_t i = k / static_cast<size_t>(r.n);
    const auto j = static_cast<int32_t>(k % static_cast<size_t>(r.n));
    GenerationRequest g = MakeGeneration(r, kv, prompts[i], max_tokens[i], seed, j);
    g.request_id =
        prompts.size() == 1 && r.n == 1 ? st->meta.id : st->meta.id + "-" + std::to_string(k);
    counts_prompt.push_back(j == 0);
    auto h = engine.Submit(std::move(g));
    if (!h.ok()) {
      for (const auto& done : st->handles) engine.Abort(done.id);
      return ReplyError(res, FromStatus(h.status(), "prompt"));
    }
    st->handles.push_back(*h);
    if (st->transfers != nullptr && !st->transfers->Add(st->transfer_id, h->id)) {
      // POST /kv/abort for this transfer came in while it was being submitted.
      st->handles.pop_back();
      engine.Abort(h->id);
      for (const auto& done : st->handles) engine.Abort(done.id);
      return ReplyError(res, TransferAborted(kv));
    }
  }
  st->choices.resize(st->handles.size());
  for (size_t k = 0; k < st->choices.size(); ++k) st->choices[k].counts_prompt = counts_prompt[k];
  st->role_sent.assign(st->handles.size(), false);

  if (!r.stream) {
    // Wait for every choice (bounded by max_tokens); abort if the server stops meanwhile.
    while (!st->all_finished()) {
      if (srv.stopping_.load()) {
        AbortUnfinished(engine, *st);
        return ReplyError(res, ApiError{503, "server is shutting down", "server_error", "", ""});
      }
      bool any = false;
      for (size_t i = 0; i < st->handles.size(); ++i) {
        if (st->choices[i].finish != FinishReason::kNone) continue;
        for (auto& o : st->handles[i].channel->TakeAll()) {
          any = true;
          if (st->choices[i].finish == FinishReason::kNone) st->Apply(i, o);
        }
      }
      if (any || st->all_finished()) continue;
      for (size_t i = 0; i < st->handles.size(); ++i) {  // wait on the first unfinished choice
        if (st->choices[i].finish != FinishReason::kNone) continue;
        if (auto o = st->handles[i].channel->Next(milliseconds(100))) st->Apply(i, *o);
        break;
      }
    }
    if (st->failed) return ReplyError(res, st->error);
    for (size_t k = 0; k < st->echo.size(); ++k) st->choices[k].text.insert(0, st->echo[k]);
    res.status = 200;
    if (st->kv_transfer_params.empty()) {
      res.set_content(BuildResponse(st->meta, st->choices, tok), "application/json");
      return;
    }
    auto body = nlohmann::json::parse(BuildResponse(st->meta, st->choices, tok));
    body["kv_transfer_params"] = nlohmann::json::parse(st->kv_transfer_params);
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
          if (st->choices[i].finish != FinishReason::kNone) continue;
          for (auto& o : st->handles[i].channel->TakeAll()) ready.emplace_back(i, std::move(o));
        }
        if (ready.empty()) {
          for (size_t i = 0; i < st->handles.size(); ++i) {
            if (st->choices[i].finish != FinishReason::kNone) continue;
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
          if (i < st->echo.size() && !st->echo[i].empty()) {
            o.text.insert(0, st->echo[i]);  // echo: the prompt leads the choice's first event
            st->echo[i].clear();
          }
          if (o.text.empty() && !o.finished() && !st->meta.logprobs && !st->meta.token_ids)
            continue;
          if (!write(BuildStreamChunk(st->meta, static_cast<int>(i), o.text, o.tokens,
                                      o.finish_reason, o.stop_reason, o.stop_token_id, false,
                                      st->include_usage, tok))) {
            return false;
          }
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
