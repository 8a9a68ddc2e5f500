// `kvpush bench`: the load generator with `vllm bench serve`'s flags, metrics and result JSON
// (docs/bench.md). BenchConfig mirrors the flags; RunBench runs one benchmark end to end.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <span>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush::loadgen {

/// Every flag of `kvpush bench` (vLLM's names; kvpush-only ones marked).
struct BenchConfig {
  std::string backend = "openai";  ///< openai | vllm | openai-chat: a label only
  std::string label;
  std::string base_url;  ///< empty: http://host:port
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string endpoint = "/v1/completions";
  std::vector<std::string> headers;  ///< KEY=VALUE
  std::string api_key;  ///< --api-key / $OPENAI_API_KEY: every request's Bearer token
  /// --reset-prefix-cache: POST /reset_prefix_cache on the server after the warm-ups, so the
  /// run does not hit what an earlier run (or the warm-ups) cached.
  bool reset_prefix_cache = false;
  /// --metrics-url (kvpush): servers whose /metrics give the run's prefix-cache hits (vLLM's
  /// token counters, read before and after the main run). Empty: the server itself (an instance;
  /// a router's page has none, so pass its instances).
  std::vector<std::string> metrics_urls;
  /// --tokenizer (kvpush; vLLM's flag): the model file whose tokenizer turns the random
  /// dataset's token ids into text, as vLLM's random dataset sends them (decode, re-encode,
  /// truncate to the drawn length, decode again). Needed for the chat endpoint. The command
  /// loads it and sets both functions (thread-safety: called on the calling thread only).
  std::string tokenizer;
  std::function<std::string(std::span<const int32_t>)> detokenize;
  std::function<Result<std::vector<int32_t>>(const std::string&)> tokenize;
  std::optional<int64_t> max_concurrency;
  std::string model;  ///< empty: first /v1/models entry
  std::string served_model_name;
  std::string dataset_name = "random";
  std::string dataset_path;
  int64_t num_prompts = 1000;
  int64_t random_input_len = 1024;
  int64_t random_output_len = 128;
  double random_range_ratio = 0.0;
  int64_t random_prefix_len = 0;
  int32_t random_vocab_size = 512;  ///< kvpush
  int64_t sharegpt_output_len = -1;
  double sharegpt_chars_per_token = 4.0;  ///< kvpush
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  uint64_t seed = 0;
  int64_t num_warmups = 0;
  bool ignore_eos = false;
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  std::string extra_body;  ///< JSON object
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  std::vector<std::string> goodput;  ///< KEY:VALUE (ms)
  bool disable_tqdm = false;
  bool save_result = false;
  bool save_detailed = false;
  std::string result_dir;
  std::string result_filename;
  std::vector<std::string> metadata;  ///< KEY=VALUE, added to the result JSON
  double request_timeout_s = 600;     ///< kvpush: per request
  size_t max_workers = 256;           ///< kvpush: threads when --max-concurrency is unset
};

/// Runs the benchmark: builds the dataset and arrival schedule, sends warm-ups then the requests,
/// prints vLLM's result table (and the first 10 errors) to `out`, and writes the result JSON
/// when save_result. Progress goes to `out` unless disable_tqdm: a bar on a terminal, else a line
/// at every 10 % of the requests (and at the end).
/// Errors: kInvalidArgument (flags), kUnavailable (server unreachable for /v1/models),
/// kIoError (result file), kAborted (every request failed).
Status RunBench(const BenchConfig& c, FILE* out);

}  // namespace kvpush::loadgen
