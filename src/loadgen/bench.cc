#include "loadgen/bench.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "client/openai_client.h"
#include "loadgen/arrival.h"
#include "loadgen/dataset.h"
#include "loadgen/metrics.h"
#include "loadgen/report.h"
#include "loadgen/runner.h"
#include "loadgen/server_counters.h"

namespace kvpush::loadgen {

namespace {

// Splits "KEY=VALUE" items (whitespace around both trimmed). Errors: kInvalidArgument.
Result<std::vector<std::pair<std::string, std::string>>> ParseKeyValues(
    const std::vector<std::string>& items, const std::string& flag) {
  auto trim = [](const std::string& s) {
    const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
  };
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& it : items) {
    const auto eq = it.find('=');
    if (eq == std::string::npos || trim(it.substr(0, eq)).empty()) {
      std::string msg = flag;
      msg += ": '" + it + "' is not KEY=VALUE";
      return InvalidArgument(msg);
    }
    out.emplace_back(trim(it.substr(0, eq)), trim(it.substr(eq + 1)));
  }
  return out;
}

// --tokenizer: each random prompt's ids become text as vLLM's random dataset makes them: decode,
// re-encode (ids that decode to text may encode to another count), truncate to the drawn
// length, decode again; the length is that of the re-encoded ids.
Status ToTextPrompts(const BenchConfig& c, std::vector<SampleRequest>* reqs) {
  for (SampleRequest& r : *reqs) {
    std::vector<int32_t> ids = r.prompt.get<std::vector<int32_t>>();
    KVP_ASSIGN_OR_RETURN(std::vector<int32_t> again, c.tokenize(c.detokenize(ids)));
    if (again.size() > ids.size()) again.resize(ids.size());
    r.prompt = c.detokenize(again);
    r.prompt_len = static_cast<int64_t>(again.size());
  }
  return Status::Ok();
}

Result<std::vector<SampleRequest>> MakeDataset(const BenchConfig& c) {
  if (c.dataset_name == "random") {
    if (!c.dataset_path.empty()) {
      return InvalidArgument("--dataset-path cannot be used with --dataset-name random");
    }
    RandomDatasetOptions o;
    o.num_prompts = c.num_prompts;
    o.input_len = c.random_input_len;
    o.output_len = c.random_output_len;
    o.prefix_len = c.random_prefix_len;
    o.range_ratio = c.random_range_ratio;
    o.vocab_size = c.random_vocab_size;
    o.seed = c.seed;
    KVP_ASSIGN_OR_RETURN(std::vector<SampleRequest> reqs, SampleRandomDataset(o));
    if (c.detokenize) KVP_RETURN_IF_ERROR(ToTextPrompts(c, &reqs));
    return reqs;
  }
  if (c.dataset_name == "sharegpt") {
    if (c.dataset_path.empty())
      return InvalidArgument("--dataset-name sharegpt needs --dataset-path");
    ShareGptOptions o;
    o.path = c.dataset_path;
    o.num_prompts = c.num_prompts;
    o.output_len = c.sharegpt_output_len;
    o.seed = c.seed;
    o.chars_per_token = c.sharegpt_chars_per_token;
    return LoadShareGptDataset(o);
  }
  return InvalidArgument("--dataset-name '" + c.dataset_name +
                         "' is not supported (kvpush bench has: random, sharegpt)");
}

// (model name sent in the body, model id for the report): --served-model-name / --model, or
// the first /v1/models entry's id and root, as vLLM's get_first_model_from_server.
Result<std::pair<std::string, std::string>> ResolveModel(const BenchConfig& c, const Target& t,
                                                         const std::string& models_path) {
  if (!c.model.empty()) {
    return std::make_pair(c.served_model_name.empty() ? c.model : c.served_model_name, c.model);
  }
  OpenAiClient client(t.host, t.port, 30.0);
  client.set_api_key(c.api_key);
  KVP_ASSIGN_OR_RETURN(std::string body, client.Get(models_path));
  auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.contains("data") || !j["data"].is_array() || j["data"].empty() ||
      !j["data"][0].contains("id") || !j["data"][0]["id"].is_string()) {
    return Unavailable("no model listed by GET " + models_path + "; pass --model");
  }
  const auto& m = j["data"][0];
  std::string id = m["id"].get<std::string>();
  std::string root =
      m.contains("root") && m["root"].is_string() ? m["root"].get<std::string>() : id;
  return std::make_pair(c.served_model_name.empty() ? id : c.served_model_name, root);
}

// A tqdm-like one-line bar, redrawn in place, on a terminal; elsewhere (a log, a pipe) a line at
// every 10 % of the requests.
class ProgressBar {
 public:
  ProgressBar(FILE* out, size_t total, bool enabled, bool tty)
      : out_(out), total_(total), on_(enabled), tty_(tty) {}
  void Update(size_t done) {
    if (!on_) return;
    if (!tty_) {
      const size_t tenth = total_ == 0 ? 10 : done * 10 / total_;
      if (tenth > last_tenth_ || done == total_) {
        last_tenth_ = std::max(tenth, last_tenth_ + 1);
        std::fprintf(out_, "progress: %zu/%zu requests done (%zu%%)\n", done, total_,
                     total_ ? done * 100 / total_ : 100);
        std::fflush(out_);
      }
      return;
    }
    constexpr size_t kWidth = 40;
    const size_t filled = total_ == 0 ? kWidth : done * kWidth / total_;
    std::fprintf(out_, "\r%3zu%%|%s%s| %zu/%zu", total_ ? done * 100 / total_ : 100,
                 std::string(filled, '#').c_str(), std::string(kWidth - filled, ' ').c_str(), done,
                 total_);
    if (done == total_) std::fprintf(out_, "\n");
    std::fflush(out_);
  }

 private:
  FILE* out_;
  size_t total_;
  bool on_;
  bool tty_;
  size_t last_tenth_ = 0;
};

// --reset-prefix-cache: the server's (instance or router) POST /reset_prefix_cache.
Status ResetPrefixCache(const BenchConfig& c, const Target& root, FILE* out) {
  OpenAiClient client(root.host, root.port, 60.0);
  client.set_api_key(c.api_key);
  int status = 0;
  auto r = client.PostJson(root.path + "/reset_prefix_cache", nlohmann::json::object(), &status);
  if (!r.ok()) return r.status();
  if (status != 200) {
    return FailedPrecondition("--reset-prefix-cache: HTTP " + std::to_string(status) + ": " +
                              r->dump());
  }
  std::fprintf(out, "Prefix cache reset.\n");
  return Status::Ok();
}

std::string NowDate() {
  char buf[32];
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

Status SaveResult(const BenchConfig& c, const RunInfo& info, nlohmann::ordered_json j, FILE* out) {
  KVP_ASSIGN_OR_RETURN(auto meta, ParseKeyValues(c.metadata, "--metadata"));
  for (const auto& [k, v] : meta) j[k] = v;
  std::filesystem::path path =
      c.result_filename.empty() ? DefaultResultFilename(info) : c.result_filename;
  if (!c.result_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(c.result_dir, ec);
    if (ec) return IoError("--result-dir '" + c.result_dir + "': " + ec.message());
    path = std::filesystem::path(c.result_dir) / path;
  }
  std::ofstream f(path);
  f << j.dump();
  f.close();
  if (!f) return IoError("cannot write result file '" + path.string() + "'");
  std::fprintf(out, "Result saved to %s\n", path.string().c_str());
  return Status::Ok();
}

// Bodies and dataset prompt lengths for `reqs`.
Status BuildBodies(const std::vector<SampleRequest>& reqs, const BodyOptions& bo,
                   std::vector<nlohmann::json>* bodies, std::vector<int64_t>* lens) {
  for (const auto& r : reqs) {
    KVP_ASSIGN_OR_RETURN(nlohmann::json b, BuildRequestBody(r, bo));
    bodies->push_back(std::move(b));
    lens->push_back(r.prompt_len);
  }
  return Status::Ok();
}

Result<BodyOptions> MakeBodyOptions(const BenchConfig& c, const Target& t, std::string model) {
  BodyOptions bo;
  bo.kind = ApiKindOf(t.path);
  bo.model = std::move(model);
  // vLLM: the random dataset always ignores EOS so outputs run to their requested length.
  bo.ignore_eos = c.ignore_eos || c.dataset_name == "random";
  bo.temperature = c.temperature;
  bo.top_p = c.top_p;
  bo.top_k = c.top_k;
  if (!c.extra_body.empty()) {
    bo.extra_body = nlohmann::json::parse(c.extra_body, nullptr, /*allow_exceptions=*/false);
    if (!bo.extra_body.is_object()) return InvalidArgument("--extra-body must be a JSON object");
  }
  return bo;
}

void PrintErrors(const std::vector<RequestOutcome>& outcomes, FILE* out) {
  size_t shown = 0;
  for (const auto& o : outcomes) {
    if (o.success) continue;
    if (shown == 0)
      std::fprintf(out, "Failed requests during benchmark run detected (capping to 10):\n");
    if (shown == 10) break;
    std::fprintf(out, "Error %zu: %s\n", shown++, o.error.c_str());
  }
}

/// What a run adds to vLLM's report and result JSON: its request headers, and the servers'
/// prefix-cache counters before and after it.
struct RunExtras {
  std::vector<std::pair<std::string, std::string>> headers;
  const Result<PrefixCacheCounters>* before;
  const Result<PrefixCacheCounters>* after;
  std::vector<std::string> metrics_urls;
  bool counted() const { return before->ok() && after->ok(); }
};

void PrintPrefixCache(const RunExtras& e, FILE* out) {
  if (e.counted()) {
    std::fputs(FormatPrefixCacheLines(**e.before, **e.after, e.metrics_urls).c_str(), out);
    return;
  }
  const Status& why = e.before->ok() ? e.after->status() : e.before->status();
  std::fprintf(out, "Prefix cache hits: /metrics unreadable: %s\n", why.ToString().c_str());
}

nlohmann::ordered_json WithExtras(const BenchConfig& c, nlohmann::ordered_json j,
                                  const RunExtras& e) {
  // The request headers of the run (e.g. x-kvpush-mode: push), so results say what they ran.
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  for (const auto& [k, v] : e.headers) h[k] = v;
  j["headers"] = h;
  j["reset_prefix_cache"] = c.reset_prefix_cache;
  if (e.counted() && (*e.after)->pages > 0) {
    const PrefixCacheCounters& b = **e.before;
    const PrefixCacheCounters& a = **e.after;
    j["prefix_cache_queried_tokens"] = a.queries - b.queries;
    j["prefix_cache_hit_tokens"] = a.hits - b.hits;
    j["external_prefix_cache_queried_tokens"] = a.external_queries - b.external_queries;
    j["external_prefix_cache_hit_tokens"] = a.external_hits - b.external_hits;
  }
  if (!c.tokenizer.empty()) j["tokenizer"] = c.tokenizer;
  return j;
}

RunInfo MakeRunInfo(const BenchConfig& c, std::string model_id,
                    std::vector<std::string> metric_names, std::vector<double> percentiles,
                    bool has_goodput) {
  RunInfo info;
  info.date = NowDate();
  info.backend = c.backend;
  info.label = c.label;
  info.model_id = std::move(model_id);
  info.num_prompts = c.num_prompts;
  info.request_rate = c.request_rate;
  info.burstiness = c.burstiness;
  info.max_concurrency = c.max_concurrency;
  info.percentile_metrics = std::move(metric_names);
  info.percentiles = std::move(percentiles);
  info.has_goodput = has_goodput;
  info.save_detailed = c.save_detailed;
  return info;
}

}  // namespace

Status RunBench(const BenchConfig& c, FILE* out) {
  if (c.max_concurrency && *c.max_concurrency <= 0) {
    return InvalidArgument("--max-concurrency must be greater than 0");
  }
  const std::string base =
      c.base_url.empty() ? "http://" + c.host + ":" + std::to_string(c.port) : c.base_url;
  KVP_ASSIGN_OR_RETURN(Target target, ParseBaseUrl(base, c.endpoint));
  KVP_ASSIGN_OR_RETURN(auto headers, ParseKeyValues(c.headers, "--header"));
  const auto client_headers = headers;  // for the result JSON (the API key is left out)
  if (!c.api_key.empty()) headers.emplace_back("Authorization", "Bearer " + c.api_key);
  KVP_ASSIGN_OR_RETURN(GoodputSlos slos, ParseGoodput(c.goodput));
  KVP_ASSIGN_OR_RETURN(std::vector<double> percentiles, ParsePercentiles(c.metric_percentiles));
  KVP_ASSIGN_OR_RETURN(auto metric_names, ParsePercentileMetrics(c.percentile_metrics));
  if (c.backend != "openai" && c.backend != "vllm" && c.backend != "openai-chat") {
    return InvalidArgument("--backend '" + c.backend +
                           "' is not supported (openai, vllm, openai-chat)");
  }
  KVP_ASSIGN_OR_RETURN(std::vector<SampleRequest> reqs, MakeDataset(c));
  KVP_ASSIGN_OR_RETURN(std::vector<double> arrivals,
                       ArrivalSchedule(reqs.size(), c.request_rate, c.burstiness, c.seed));
  KVP_ASSIGN_OR_RETURN(Target root, ParseBaseUrl(base, ""));
  KVP_ASSIGN_OR_RETURN(auto model, ResolveModel(c, target, root.path + "/v1/models"));
  KVP_ASSIGN_OR_RETURN(BodyOptions bo, MakeBodyOptions(c, target, model.first));
  std::vector<nlohmann::json> bodies;
  std::vector<int64_t> lens;
  KVP_RETURN_IF_ERROR(BuildBodies(reqs, bo, &bodies, &lens));

  RunnerOptions ro{target, headers,
                   c.max_concurrency ? static_cast<size_t>(*c.max_concurrency) : c.max_workers,
                   c.request_timeout_s};
  const bool tty = isatty(fileno(out)) == 1;
  if (c.num_warmups > 0) {
    std::fprintf(out, "Warming up with %lld requests...\n", static_cast<long long>(c.num_warmups));
    const auto n = static_cast<size_t>(c.num_warmups);
    ProgressBar bar(out, n, !c.disable_tqdm, tty);
    RunRequests(
        ro, std::vector<nlohmann::json>(n, bodies[0]), std::vector<int64_t>(n, lens[0]),
        std::vector<double>(n, 0.0), [&](size_t d) { bar.Update(d); }, nullptr);
    std::fprintf(out, "Warmup run completed.\n");
  }
  if (c.reset_prefix_cache) KVP_RETURN_IF_ERROR(ResetPrefixCache(c, root, out));
  const std::vector<std::string> metrics_urls =
      c.metrics_urls.empty() ? std::vector<std::string>{base} : c.metrics_urls;
  // Read before and after the run; a page that cannot be read costs the line, not the run.
  const Result<PrefixCacheCounters> cache_before = ScrapePrefixCache(metrics_urls, c.api_key);
  std::fprintf(out, "Starting main benchmark run...\nTraffic request rate: %s\n",
               PyFloatStr(c.request_rate).c_str());
  std::fprintf(out, "Burstiness factor: %s (%s)\nMaximum request concurrency: %s\n",
               PyFloatStr(c.burstiness).c_str(),
               c.burstiness == 1.0 ? "Poisson process" : "Gamma distribution",
               c.max_concurrency ? std::to_string(*c.max_concurrency).c_str() : "None");
  std::fflush(out);
  ProgressBar bar(out, bodies.size(), !c.disable_tqdm, tty);
  RunInfo info = MakeRunInfo(c, model.second, metric_names, percentiles, !slos.empty());
  auto outcomes = RunRequests(
      ro, bodies, lens, arrivals, [&](size_t d) { bar.Update(d); }, &info.duration_s);

  const BenchmarkMetrics m =
      CalculateMetrics(outcomes, info.duration_s, percentiles, slos, c.max_concurrency.has_value(),
                       !std::isinf(c.request_rate));
  PrintErrors(outcomes, out);
  info.date = NowDate();  // when the run ended, as vLLM dates it
  const Result<PrefixCacheCounters> cache_after = ScrapePrefixCache(metrics_urls, c.api_key);
  std::fputs(FormatReport(m, info).c_str(), out);
  const RunExtras extras{client_headers, &cache_before, &cache_after, metrics_urls};
  PrintPrefixCache(extras, out);
  if (c.save_result) {
    KVP_RETURN_IF_ERROR(SaveResult(c, info, WithExtras(c, ResultJson(m, outcomes, info), extras), out));
  }
  if (m.completed == 0) return Aborted("every request failed (first errors above)");
  return Status::Ok();
}

}  // namespace kvpush::loadgen
