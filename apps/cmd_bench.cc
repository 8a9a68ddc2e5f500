// kvpush bench: the load generator with `vllm bench serve`'s flags, metrics and result JSON
// (docs/bench.md). The logic is in src/loadgen; this file only maps flags.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "apps/commands.h"
#include "apps/router_tokenizer.h"
#include "loadgen/bench.h"

namespace kvpush::apps {

namespace {

// A double flag that also takes "inf" (CLI11's number parsing is not relied on for it).
double ParseRate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "INF") return INFINITY;
  size_t used = 0;
  double v = std::stod(s, &used);
  if (used != s.size()) throw CLI::ValidationError("--request-rate", "'" + s + "' is not a number");
  return v;
}

void AddTrafficFlags(CLI::App* cmd, loadgen::BenchConfig& c, std::string& rate) {
  cmd->add_option("--request-rate", rate, "requests per second; inf = all at time 0")
      ->capture_default_str();
  cmd->add_option("--burstiness", c.burstiness, "gamma shape of inter-arrival gaps; 1 = Poisson")
      ->capture_default_str();
  cmd->add_option("--seed", c.seed, "seed of the dataset and the arrival schedule")
      ->capture_default_str();
  cmd->add_option("--num-warmups", c.num_warmups,
                  "warm-up requests (the first prompt), not counted")
      ->capture_default_str();
  cmd->add_option("--goodput", c.goodput, "SLOs KEY:VALUE in ms (ttft, tpot, e2el)")
      ->expected(1, -1);
  cmd->add_option("--percentile-metrics", c.percentile_metrics,
                  "metrics to report: ttft,tpot,itl,e2el,client_queue_time,"
                  "e2el_including_client_queue")
      ->capture_default_str();
  cmd->add_option("--metric-percentiles", c.metric_percentiles, "percentiles, e.g. 50,90,99")
      ->capture_default_str();
  cmd->add_option("--request-timeout", c.request_timeout_s,
                  "kvpush: per-request connect/read timeout in s")
      ->capture_default_str();
}

void AddDatasetFlags(CLI::App* cmd, loadgen::BenchConfig& c) {
  cmd->add_option("--dataset-name", c.dataset_name, "random | sharegpt")->capture_default_str();
  cmd->add_option("--dataset-path", c.dataset_path, "ShareGPT-format JSON file");
  cmd->add_option("--num-prompts", c.num_prompts, "requests to send")->capture_default_str();
  cmd->add_option("--random-input-len", c.random_input_len, "input tokens after the prefix")
      ->capture_default_str();
  cmd->add_option("--random-output-len", c.random_output_len, "output tokens (max_tokens)")
      ->capture_default_str();
  cmd->add_option("--random-range-ratio", c.random_range_ratio,
                  "lengths uniform in [len*(1-r), len*(1+r)], r in [0, 1)")
      ->capture_default_str();
  cmd->add_option("--random-prefix-len", c.random_prefix_len, "tokens shared by every prompt")
      ->capture_default_str();
  cmd->add_option("--random-vocab-size", c.random_vocab_size,
                  "kvpush: token ids are drawn from [3, this)")
      ->capture_default_str();
  cmd->add_option("--sharegpt-output-len", c.sharegpt_output_len,
                  "fixed output tokens for ShareGPT (default: estimated from the reply)");
  cmd->add_option("--sharegpt-chars-per-token", c.sharegpt_chars_per_token,
                  "kvpush: bytes per token of the ShareGPT length estimate")
      ->capture_default_str();
}

void AddRequestFlags(CLI::App* cmd, loadgen::BenchConfig& c) {
  cmd->add_option("--backend", c.backend, "openai | vllm | openai-chat (a label)")
      ->capture_default_str();
  cmd->add_option("--label", c.label, "prefix of the result file name");
  cmd->add_option("--base-url", c.base_url, "server URL, e.g. http://127.0.0.1:8000");
  cmd->add_option("--host", c.host, "server host when --base-url is unset")->capture_default_str();
  cmd->add_option("--port", c.port, "server port when --base-url is unset")->capture_default_str();
  cmd->add_option("--endpoint", c.endpoint, "/v1/completions or /v1/chat/completions")
      ->capture_default_str();
  cmd->add_option("--header", c.headers,
                  "extra request headers KEY=VALUE "
                  "(e.g. x-kvpush-mode=pull through kvpush router)")
      ->expected(1, -1);
  cmd->add_option("--api-key", c.api_key,
                  "Bearer token of every request (default: $OPENAI_API_KEY, as vLLM's bench)")
      ->envname("OPENAI_API_KEY");
  cmd->add_flag("--reset-prefix-cache", c.reset_prefix_cache,
                "POST /reset_prefix_cache on the server after the warm-ups, so this run does not "
                "hit what an earlier run cached");
  cmd->add_option("--metrics-url", c.metrics_urls,
                  "kvpush: servers whose /metrics give the run's prefix-cache hits (default: the "
                  "server; through a router, its instances)")
      ->expected(1, -1);
  cmd->add_option("--tokenizer", c.tokenizer,
                  "model file (.gguf) whose tokenizer turns random prompts into text, as vLLM's "
                  "random dataset sends them (needed for /v1/chat/completions)");
  cmd->add_option("--model", c.model, "model id; default: the first of GET /v1/models");
  cmd->add_option("--served-model-name", c.served_model_name, "model name sent in requests");
  cmd->add_flag("--ignore-eos", c.ignore_eos, "send ignore_eos (always on for random)");
  cmd->add_option("--extra-body", c.extra_body, "JSON object merged into every request body");
}

/// --tokenizer: loads the model file's tokenizer into the config's detokenize/tokenize.
Status SetTokenizer(loadgen::BenchConfig& c) {
  if (c.tokenizer.empty()) return Status::Ok();
  auto tok = LoadTokenizerFile(c.tokenizer, nullptr);
  if (!tok.ok()) return Status(tok.status().code(), "--tokenizer: " + tok.status().message());
  std::shared_ptr<Tokenizer> t = std::move(tok).value();
  c.detokenize = [t](std::span<const int32_t> ids) { return DecodeTokens(*t, ids); };
  c.tokenize = [t](const std::string& text) { return t->Encode(text); };
  return Status::Ok();
}

}  // namespace

void RegisterBenchCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "bench", "Load generator with vllm bench serve's flags, metrics and result JSON");
  auto c = std::make_shared<loadgen::BenchConfig>();
  auto rate = std::make_shared<std::string>("inf");
  auto max_conc = std::make_shared<int64_t>(0);
  auto temperature = std::make_shared<double>(0), top_p = std::make_shared<double>(0);
  auto top_k = std::make_shared<int64_t>(0);
  AddRequestFlags(cmd, *c);
  AddDatasetFlags(cmd, *c);
  AddTrafficFlags(cmd, *c, *rate);
  auto* mc = cmd->add_option("--max-concurrency", *max_conc, "most requests in flight");
  auto* t = cmd->add_option("--temperature", *temperature, "sampling temperature (server default)");
  auto* tp = cmd->add_option("--top-p", *top_p, "top-p (server default)");
  auto* tk = cmd->add_option("--top-k", *top_k, "top-k (server default)");
  cmd->add_flag("--disable-tqdm", c->disable_tqdm, "no progress bar");
  cmd->add_flag("--save-result", c->save_result, "write the result JSON");
  cmd->add_flag("--save-detailed", c->save_detailed, "keep per-request arrays in the JSON");
  cmd->add_option("--result-dir", c->result_dir, "folder of the result JSON");
  cmd->add_option("--result-filename", c->result_filename, "file name of the result JSON");
  cmd->add_option("--metadata", c->metadata, "KEY=VALUE pairs added to the result JSON")
      ->expected(1, -1);
  cmd->callback([=] {
    c->request_rate = ParseRate(*rate);
    if (mc->count() > 0) c->max_concurrency = *max_conc;
    if (t->count() > 0) c->temperature = *temperature;
    if (tp->count() > 0) c->top_p = *top_p;
    if (tk->count() > 0) c->top_k = *top_k;
    Status s = SetTokenizer(*c);
    if (s.ok()) s = loadgen::RunBench(*c, stdout);
    if (!s.ok()) {
      std::fprintf(stderr, "kvpush bench: %s\n", s.ToString().c_str());
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace kvpush::apps
