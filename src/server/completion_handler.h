// CompletionHandler: serves one /v1/completions or /v1/chat/completions request as a pipeline of
// named steps (docs/server.md):
//   admit    request id, in-flight count, refusal while draining
//   prepare  body -> token ids and limits (completion_prepare.h; pure)
//   P/D gate a leg checked against the connector and the transfer registry (pd_gate.h)
//   submit   one engine request per choice (D's forks deferred until choice 0's KV is in)
//   respond  one JSON body, or an SSE stream; both read the choices with one ChoiceReader
// Each step either continues or answers (an http::ApiError); none reaches into the HTTP server.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>
#include <string>

#include "engine/engine.h"
#include "model/chat_template.h"
#include "server/metrics.h"
#include "server/request_trace.h"
#include "server/openai_request.h"
#include "server/transfer_requests.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace kvpush::connector {
class PdConnector;
}  // namespace kvpush::connector

namespace kvpush::server {

/// The serving state an HttpServer shares with its handlers. Thread-safe (atomics).
struct ServingState {
  std::atomic<bool> stopping{false};  ///< Stop(): open requests end, streams are cut
  std::atomic<bool> draining{false};  ///< BeginDrain: refuse new completions, /health 503
  std::atomic<bool> cut{false};       ///< CutOpenRequests: end open completions with an error
  std::atomic<int> inflight{0};       ///< completion requests admitted, not yet ended
  /// P/D instance: requests admitted without kv_transfer_params (prefilled here, no P leg).
  std::atomic<int64_t> local_prefills{0};
  /// P/D instance: push P legs answered without a prefill (SkipUnneededPrefill).
  std::atomic<int64_t> prefill_legs_not_needed{0};
};

/// What the completion handler uses of the instance that serves it. The HttpServer owns every
/// referent and outlives the handlers; each is thread-safe for the handler's use.
struct CompletionContext {
  Engine& engine;
  const ChatPromptBuilder& chat;  ///< the served model's chat template over its tokenizer
  std::string served_model_name;
  std::vector<std::string> served_model_aliases;  ///< other names requests may give
  bool prompt_tokens_details = false;  ///< usage carries prompt_tokens_details.cached_tokens
  connector::PdConnector* connector = nullptr;  ///< null: colocated (no kv_transfer_params)
  TransferRequests& transfers;                  ///< P/D requests in flight, for POST /kv/abort
  ServingState& state;
  /// `prefix` + 32 random hex digits (a request id the client did not give). Thread-safe.
  std::function<std::string(const char* prefix)> new_request_id;
  /// A random sampling seed (a request without `seed`). Thread-safe.
  std::function<uint64_t()> random_seed;
  /// vLLM's request-parameter histograms (metrics.h); null: not kept. Thread-safe.
  RequestParamHistograms* param_stats = nullptr;
  /// --otlp-traces-endpoint (null: off), and the P/D transfers' handoff spans (null: colocated
  /// or off). Thread-safe.
  http::Tracer* tracer = nullptr;
  HandoffTraces* handoff_traces = nullptr;
};

/// Stateless apart from the context; one call per HTTP request, on an HTTP thread.
class CompletionHandler {
 public:
  explicit CompletionHandler(const CompletionContext& context) : context_(context) {}

  /// Fills `res` (status, headers, body or chunked SSE provider). Never throws.
  void Handle(ApiKind kind, const httplib::Request& req, httplib::Response& res) const;

 private:
  const CompletionContext& context_;
};

}  // namespace kvpush::server
