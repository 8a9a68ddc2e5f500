// The state of one completion request while its choices run (shared by the handler's steps and
// the SSE content provider), and the one reader both responders take the choices' outputs with.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "engine/engine.h"
#include "http/api_error.h"
#include "pd/kv_transfer_params.h"
#include "server/metrics.h"
#include "server/openai_response.h"
#include "server/request_trace.h"
#include "server/transfer_requests.h"

namespace kvpush::server {

/// Maps an engine Submit/finish error to an HTTP error: kInvalidArgument 400 naming `param`,
/// kResourceExhausted 400 kv_cache_too_small, kUnavailable 503 overloaded, kAborted 503
/// aborted, anything else 500.
http::ApiError FromStatus(const Status& st, const std::string& param);

/// 409 transfer_aborted: a P/D leg whose transfer POST /kv/abort already ended.
http::ApiError TransferAborted(const std::string& transfer_id);

/// All per-request state, shared by the handler and the SSE content provider (one thread at a
/// time: the HTTP thread that serves the request).
struct CompletionState {
  CompletionState() = default;
  CompletionState(const CompletionState&) = delete;
  CompletionState& operator=(const CompletionState&) = delete;
  /// The HTTP request ended: its engine requests leave the transfer registry, it no longer
  /// counts as in flight (HttpServer::inflight()), and, when every choice finished, its
  /// parameters are recorded (param_stats: one observation per prompt, as vLLM counts them).
  ~CompletionState();

  ResponseMeta meta;
  std::atomic<int>* inflight = nullptr;   ///< ServingState::inflight, counted while this lives
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
  std::string prompt_echo;        ///< P leg with echo and logprobs: the prompt text
  std::vector<bool> role_sent;
  /// Streamed with `x-kvpush-resume-info: 1` (the router asks it, docs/reliability.md,
  /// "Continuation"): every output of a choice carries a `: kvpush-resume {...}` comment line
  /// with its token ids and the choice's text bytes so far (`text_bytes`, per choice,
  /// continuing a resumed choice's count), so that a router can continue the stream elsewhere.
  bool resume_info = false;
  bool drain_offered = false;  ///< `: kvpush-draining` was written (resume_info streams only)
  /// Admitted while draining because it named itself a migration's P leg (header
  /// kMigrationSourceHeader); refused once parsed unless it is one.
  bool migration_while_draining = false;
  /// A whole answer whose router asked for `x-kvpush-resume-info: 1`: when this instance begins
  /// draining, the answer so far is handed back (kHandBackCode) instead of waited for.
  bool handback = false;
  /// The request's seed (the client's, or the one this instance drew): the resume comments
  /// carry it, so that a continuation of an unseeded request samples as this run would.
  uint64_t seed = 0;
  std::vector<int64_t> text_bytes;
  size_t num_finished = 0;
  bool done_sent = false;
  http::ApiError error;  ///< first kError/kAbort seen
  bool failed = false;
  std::optional<pd::PullAnswer> pull_answer;  ///< from a pull producer's final output
  /// Set at submission: where the request's parameters are recorded when it ends (all its
  /// choices finished), its n, and each prompt's max_tokens (choices are prompt-major).
  RequestParamHistograms* param_stats = nullptr;
  int32_t n = 1;
  std::vector<int32_t> max_tokens;
  /// Tracing (--otlp-traces-endpoint): the request's span, exported when it ends with its
  /// engine phases (choice 0's times, `timing`) as children (request_trace.h).
  http::Tracer* tracer = nullptr;
  std::optional<RequestTrace> trace;
  RequestOutput timing;  ///< choice 0's final output's times

  /// Applies one output to choice i; returns true when it finished the choice. Also notes the
  /// request's id, first-token time and (once all finished) usage for the access log
  /// (http::CurrentAccessNote: call on the request's HTTP thread).
  bool Apply(size_t i, const RequestOutput& o);
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

 private:
  bool ApplyChoice(size_t i, const RequestOutput& o);
  void RecordParams() const;
  void RecordSpans() const;
  void NoteAccess(const RequestOutput& o) const;
};

/// The one reader of a request's n choices (as llama.cpp's server_response_reader): every output
/// ready now on any running choice, in choice order; when none is, the next output of the first
/// running choice, waiting at most `wait`. Empty when nothing came. Outputs are not applied.
std::vector<std::pair<size_t, RequestOutput>> ReadChoices(CompletionState& st,
                                                          std::chrono::milliseconds wait);

/// Aborts every choice still running in the engine.
void AbortUnfinished(Engine& engine, const CompletionState& st);

/// P/D decode leg with n > 1 (docs/server.md, "n on a P/D decode instance"): once choice 0 has
/// its first token, its prompt's full blocks are in this instance's prefix cache (committed when
/// the KV arrived), and choices 1..n-1 are submitted as local requests that share them and
/// recompute only the tail to sample their own first token with seed + j, as colocated. If
/// choice 0 failed first, they fail with it (its error answers the request). Returns false
/// (st.error set) when a fork could not be submitted; every submitted choice is then aborted.
bool SubmitForks(Engine& engine, CompletionState& st);

}  // namespace kvpush::server
