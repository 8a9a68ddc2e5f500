// Sends the benchmark's requests on schedule through src/client and records what each one
// produced (RequestOutcome). The only part of src/loadgen that does I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "client/openai_client.h"
#include "common/status.h"
#include "loadgen/dataset.h"
#include "loadgen/metrics.h"

namespace kvpush::loadgen {

/// Where requests go, parsed from --base-url (or --host/--port) and --endpoint.
struct Target {
  std::string host;
  int port = 80;
  std::string path;  ///< base URL path + endpoint, e.g. "/v1/completions"
};

/// Parses "http://HOST[:PORT][/PREFIX]" and appends `endpoint`. IPv6 hosts in brackets.
/// Errors: kInvalidArgument (not http://, bad port; https is not supported).
Result<Target> ParseBaseUrl(const std::string& base_url, const std::string& endpoint);

/// Which OpenAI API the endpoint speaks: chosen by the path ending in "chat/completions".
enum class ApiKind { kCompletions, kChat };
ApiKind ApiKindOf(const std::string& path);

/// Request body fields besides the prompt. Unset optionals are not sent (server defaults, as
/// vllm bench serve since it stopped forcing temperature 0).
struct BodyOptions {
  ApiKind kind = ApiKind::kCompletions;
  std::string model;  ///< empty: no "model" field
  bool ignore_eos = false;
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  nlohmann::json extra_body = nlohmann::json::object();  ///< merged last (--extra-body)
};

/// The JSON body for one request: completions {"prompt", "max_tokens"}, chat {"messages":
/// [{"role": "user", "content": prompt}], "max_completion_tokens"}; stream fields are added by
/// OpenAiClient::Stream. Errors: kInvalidArgument for a token-id prompt on the chat API.
Result<nlohmann::json> BuildRequestBody(const SampleRequest& r, const BodyOptions& o);

/// Turns one streamed completion into a RequestOutcome. Success = the call reached the server,
/// HTTP 200, no error event, and at least one content chunk (vLLM fails a stream without one).
/// TTFT = first content chunk − send; ITL = gaps between content chunks; E2EL = last content
/// chunk − send (vLLM's `latency`). `bench_start_ns`, `arrival_ns`: NowNs() of the benchmark
/// start and of the request's scheduled arrival. Prompt length from usage when present.
RequestOutcome OutcomeFromStream(const Result<StreamedCompletion>& r, int64_t dataset_prompt_len,
                                 int64_t bench_start_ns, int64_t arrival_ns);

/// How RunRequests sends.
struct RunnerOptions {
  Target target;
  std::vector<std::pair<std::string, std::string>> headers;  ///< --header KEY=VALUE
  size_t num_workers = 1;  ///< threads = the concurrency cap (--max-concurrency)
  double timeout_s = 600;  ///< per request connect/read timeout
};

/// Sends bodies[i] at arrivals_s[i] seconds after the start (a dispatcher thread sleeps until
/// then and queues it) to a pool of `num_workers` threads, each with its own OpenAiClient, so at
/// most num_workers requests are in flight; a request that waits for a worker has that wait in
/// its queue_s. Blocks until every request ends. `on_done(count)` is called after each request,
/// serialized (never concurrently). `*duration_s` = first dispatch → last completion.
/// Thread-safe to call; it owns its threads. Sizes of bodies, prompt_lens, arrivals_s match.
std::vector<RequestOutcome> RunRequests(const RunnerOptions& o,
                                        const std::vector<nlohmann::json>& bodies,
                                        const std::vector<int64_t>& prompt_lens,
                                        const std::vector<double>& arrivals_s,
                                        const std::function<void(size_t)>& on_done,
                                        double* duration_s);

}  // namespace kvpush::loadgen
