#include "server/completion_state.h"

#include <algorithm>

#include "http/front_door.h"

namespace kvpush::server {

http::ApiError FromStatus(const Status& st, const std::string& param) {
  switch (st.code()) {
    case StatusCode::kInvalidArgument:
      return http::ApiError::Invalid(st.message(), param);
    case StatusCode::kResourceExhausted:
      return http::ApiError::Invalid(st.message(), param, "kv_cache_too_small");
    case StatusCode::kUnavailable:
      return http::ApiError{503, st.message(), "server_error", "", "overloaded"};
    case StatusCode::kAborted:
      return http::ApiError{503, st.message(), "server_error", "", "aborted"};
    default:
      return http::ApiError{500, st.ToString(), "server_error", "", ""};
  }
}

http::ApiError TransferAborted(const std::string& transfer_id) {
  return http::ApiError{409, "transfer " + transfer_id + " was aborted (POST /kv/abort)",
                        "invalid_request_error", "kv_transfer_params.transfer_id",
                        "transfer_aborted"};
}

CompletionState::~CompletionState() {
  if (transfers != nullptr) {
    for (const auto& h : handles) {
      if (h.channel) transfers->Remove(transfer_id, h.id);
    }
  }
  if (inflight != nullptr) inflight->fetch_sub(1);
  RecordParams();
  RecordSpans();
}

void CompletionState::RecordSpans() const {
  if (tracer == nullptr || !trace) return;
  std::vector<http::SpanAttribute> attrs = {
      {"http.request.method", std::string("POST")},
      {"kvpush.request_id", meta.id},
      {"http.response.status_code", static_cast<int64_t>(failed ? error.http_status : 200)}};
  if (!transfer_id.empty()) attrs.push_back({"kvpush.transfer_id", transfer_id});
  if (all_finished() && !choices.empty()) {
    const UsageCounts u = SumUsage(choices);
    attrs.push_back({"gen_ai.usage.input_tokens", static_cast<int64_t>(u.prompt_tokens)});
    attrs.push_back({"gen_ai.usage.output_tokens", static_cast<int64_t>(u.completion_tokens)});
  }
  const std::string route =
      meta.kind == ApiKind::kChat ? "POST /v1/chat/completions" : "POST /v1/completions";
  RecordRequestSpans(*tracer, *trace, route, std::move(attrs), failed ? error.message : "",
                     timing.arrival_ns != 0 ? &timing : nullptr);
}

void CompletionState::RecordParams() const {
  if (param_stats == nullptr || handles.empty() || !all_finished() || n < 1) return;
  const auto per_prompt = static_cast<size_t>(n);
  for (size_t p = 0; p < max_tokens.size(); ++p) {
    int64_t longest = 0;
    for (size_t k = p * per_prompt; k < (p + 1) * per_prompt && k < choices.size(); ++k) {
      longest = std::max<int64_t>(longest, choices[k].completion_tokens);
    }
    param_stats->Record(n, max_tokens[p], longest);
  }
}

void CompletionState::NoteAccess(const RequestOutput& o) const {
  http::AccessNote& note = http::CurrentAccessNote();
  const auto start = http::CurrentRequestStart();
  if (note.ttft_ms < 0 && !o.tokens.empty() && start != std::chrono::steady_clock::time_point{}) {
    note.ttft_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count();
  }
  if (all_finished()) {
    const UsageCounts u = SumUsage(choices);
    note.prompt_tokens = u.prompt_tokens;
    note.output_tokens = u.completion_tokens;
  }
}

bool CompletionState::Apply(size_t i, const RequestOutput& o) {
  const bool done = ApplyChoice(i, o);
  NoteAccess(o);
  return done;
}

bool CompletionState::ApplyChoice(size_t i, const RequestOutput& o) {
  ChoiceResult& c = choices[i];
  c.text += o.text;
  c.tokens.insert(c.tokens.end(), o.tokens.begin(), o.tokens.end());
  if (!o.prompt_logprobs.empty()) c.prompt.scored = o.prompt_logprobs;
  c.prompt_tokens = o.num_prompt_tokens;
  c.completion_tokens = o.num_output_tokens;
  c.cached_tokens = o.num_cached_tokens;
  if (!o.finished()) return false;
  if (i == 0) {
    timing.arrival_ns = o.arrival_ns;
    timing.first_scheduled_ns = o.first_scheduled_ns;
    timing.first_token_ns = o.first_token_ns;
    timing.last_token_ns = o.last_token_ns;
  }
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

std::vector<std::pair<size_t, RequestOutput>> ReadChoices(CompletionState& st,
                                                          std::chrono::milliseconds wait) {
  std::vector<std::pair<size_t, RequestOutput>> ready;
  for (size_t i = 0; i < st.handles.size(); ++i) {
    if (!st.pending(i)) continue;
    for (auto& o : st.handles[i].channel->TakeAll()) ready.emplace_back(i, std::move(o));
  }
  if (!ready.empty()) return ready;
  for (size_t i = 0; i < st.handles.size(); ++i) {  // wait on the first unfinished choice
    if (!st.pending(i)) continue;
    if (auto o = st.handles[i].channel->Next(wait)) ready.emplace_back(i, std::move(*o));
    break;
  }
  return ready;
}

void AbortUnfinished(Engine& engine, const CompletionState& st) {
  for (size_t i = 0; i < st.handles.size(); ++i) {
    if (st.pending(i)) engine.Abort(st.handles[i].id);
  }
}

bool SubmitForks(Engine& engine, CompletionState& st) {
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
      st.error = h.ok() ? http::ApiError{409, "transfer " + st.transfer_id + " was aborted",
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

}  // namespace kvpush::server
