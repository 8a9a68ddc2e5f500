// OpenAiClient: a small blocking HTTP client for kvpush's (and any) OpenAI-compatible server,
// used by the demo, the benchmarks and tests. Streams SSE completions and records per-chunk
// arrival times so TTFT / TPOT / ITL can be computed client-side (vllm bench serve definitions).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush {

/// Outcome of one streamed completion. Times are NowNs() readings (steady clock, ns).
struct StreamedCompletion {
  int http_status = 0;
  std::string text;            ///< concatenated text deltas
  std::string finish_reason;   ///< from the last choice chunk ("stop", "length", ...)
  std::string error;           ///< error message from an error body or SSE error event
  int64_t prompt_tokens = -1;  ///< from the usage chunk (include_usage), -1 if absent
  int64_t completion_tokens = -1;
  int64_t start_ns = 0;           ///< request sent
  int64_t end_ns = 0;             ///< [DONE] received / stream closed
  std::vector<int64_t> chunk_ns;  ///< arrival of each chunk carrying generated text or a token
  std::vector<int32_t> token_ids;  ///< generated ids, when the server sends "token_ids" (vLLM)

  /// TTFT in ms: first content chunk minus start; -1 when nothing arrived.
  double TtftMs() const;
  /// TPOT in ms: (end of last chunk - first chunk) / (completion_tokens - 1); -1 if < 2 tokens.
  double TpotMs() const;
};

/// Blocking client bound to one host:port. Thread-compatible: use one instance per thread.
class OpenAiClient {
 public:
  /// `host` is an IP or name on loopback/test namespaces; `timeout_s` bounds connect/read.
  OpenAiClient(std::string host, int port, double timeout_s = 120.0);

  /// Every later request carries `Authorization: Bearer api_key` ("" = none). Not thread-safe
  /// with requests in flight; call before sharing the client.
  void set_api_key(std::string api_key) { api_key_ = std::move(api_key); }

  /// GET `path`; returns the body when the status is 200.
  /// Errors: kUnavailable (connection failed), kInternal with the status and body otherwise.
  Result<std::string> Get(const std::string& path) const;

  /// POST JSON to `path` (non-streaming); returns the parsed body for any HTTP status, with the
  /// status in `*status`. Errors: kUnavailable (connection), kDataLoss (body is not JSON).
  Result<nlohmann::json> PostJson(const std::string& path, const nlohmann::json& body,
                                  int* status) const;

  /// POSTs `body` to `path` with "stream": true and stream_options.include_usage set, and reads
  /// the SSE stream to the end. HTTP errors and SSE error events are reported in the result's
  /// http_status / error, not as a Status. Errors: kUnavailable (connection failed or dropped).
  /// `headers`: extra request headers (e.g. x-request-id, x-kvpush-mode).
  Result<StreamedCompletion> Stream(
      const std::string& path, nlohmann::json body,
      const std::vector<std::pair<std::string, std::string>>& headers = {}) const;

 private:
  std::string host_;
  int port_;
  double timeout_s_;
  std::string api_key_;
};

}  // namespace kvpush
