#include "loadgen/runner.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "common/clock.h"

namespace kvpush::loadgen {

Result<Target> ParseBaseUrl(const std::string& base_url, const std::string& endpoint) {
  const std::string scheme = "http://";
  if (base_url.rfind(scheme, 0) != 0) {
    return InvalidArgument("--base-url '" + base_url +
                           "' must start with http:// (https is not supported)");
  }
  std::string rest = base_url.substr(scheme.size());
  const auto slash = rest.find('/');
  std::string prefix = slash == std::string::npos ? "" : rest.substr(slash);
  std::string hostport = rest.substr(0, slash);
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  Target t;
  std::string port_str;
  if (!hostport.empty() && hostport.front() == '[') {  // [v6]:port
    const auto close = hostport.find(']');
    if (close == std::string::npos) return InvalidArgument("--base-url: unclosed '['");
    t.host = hostport.substr(1, close - 1);
    if (close + 1 < hostport.size() && hostport[close + 1] == ':') {
      port_str = hostport.substr(close + 2);
    }
  } else {
    const auto colon = hostport.rfind(':');
    t.host = hostport.substr(0, colon);
    if (colon != std::string::npos) port_str = hostport.substr(colon + 1);
  }
  if (t.host.empty()) return InvalidArgument("--base-url '" + base_url + "' has no host");
  if (!port_str.empty()) {
    const bool digits = std::all_of(port_str.begin(), port_str.end(), ::isdigit);
    const int port = digits && port_str.size() <= 5 ? std::stoi(port_str) : -1;
    if (port < 1 || port > 65535) return InvalidArgument("--base-url: bad port '" + port_str + "'");
    t.port = port;
  }
  t.path = prefix + (endpoint.empty() || endpoint.front() == '/' ? "" : "/") + endpoint;
  return t;
}

ApiKind ApiKindOf(const std::string& path) {
  const std::string chat = "chat/completions";
  const bool is_chat =
      path.size() >= chat.size() && path.compare(path.size() - chat.size(), chat.size(), chat) == 0;
  return is_chat ? ApiKind::kChat : ApiKind::kCompletions;
}

Result<nlohmann::json> BuildRequestBody(const SampleRequest& r, const BodyOptions& o) {
  nlohmann::json body = nlohmann::json::object();
  if (!o.model.empty()) body["model"] = o.model;
  if (o.kind == ApiKind::kChat) {
    if (!r.prompt.is_string()) {
      return InvalidArgument(
          "the chat API takes text prompts: give --tokenizer MODEL.gguf (the random dataset "
          "then sends text, as vLLM's does) or use --dataset-name sharegpt");
    }
    body["messages"] = nlohmann::json::array({{{"role", "user"}, {"content", r.prompt}}});
    body["max_completion_tokens"] = r.expected_output_len;
  } else {
    body["prompt"] = r.prompt;
    body["max_tokens"] = r.expected_output_len;
  }
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (o.temperature) body["temperature"] = *o.temperature;
  if (o.top_p) body["top_p"] = *o.top_p;
  if (o.top_k) body["top_k"] = *o.top_k;
  for (const auto& [k, v] : o.extra_body.items()) body[k] = v;
  return body;
}

RequestOutcome OutcomeFromStream(const Result<StreamedCompletion>& r, int64_t dataset_prompt_len,
                                 int64_t bench_start_ns, int64_t arrival_ns) {
  RequestOutcome o;
  o.prompt_len = dataset_prompt_len;
  if (!r.ok()) {
    o.error = r.status().message();
    return o;
  }
  const StreamedCompletion& s = *r;
  o.start_s = NsToSeconds(s.start_ns - bench_start_ns);
  o.queue_s = NsToSeconds(std::max<int64_t>(s.start_ns - arrival_ns, 0));
  if (s.prompt_tokens >= 0) o.prompt_len = s.prompt_tokens;
  o.output_tokens = s.completion_tokens;
  o.generated_text = s.text;
  if (s.http_status != 200) {
    o.error = "HTTP " + std::to_string(s.http_status) + ": " + s.error;
    return o;
  }
  if (!s.error.empty()) {
    o.error = s.error;
    return o;
  }
  if (s.chunk_ns.empty()) {
    o.error = "Never received a valid chunk to calculate TTFT.";
    return o;
  }
  o.success = true;
  o.ttft_s = NsToSeconds(s.chunk_ns.front() - s.start_ns);
  for (size_t i = 1; i < s.chunk_ns.size(); ++i) {
    o.itl_s.push_back(NsToSeconds(s.chunk_ns[i] - s.chunk_ns[i - 1]));
  }
  o.latency_s = NsToSeconds(s.chunk_ns.back() - s.start_ns);
  return o;
}

namespace {

// Indices of requests whose arrival time has come, in arrival order; closed after the last.
class ArrivalQueue {
 public:
  void Push(size_t i, int64_t arrival_ns) {
    {
      std::lock_guard<std::mutex> l(mu_);
      q_.emplace_back(i, arrival_ns);
    }
    cv_.notify_one();
  }
  void Close() {
    {
      std::lock_guard<std::mutex> l(mu_);
      closed_ = true;
    }
    cv_.notify_all();
  }
  // False once closed and drained.
  bool Pop(size_t* i, int64_t* arrival_ns) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return closed_ || !q_.empty(); });
    if (q_.empty()) return false;
    std::tie(*i, *arrival_ns) = q_.front();
    q_.pop_front();
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<size_t, int64_t>> q_;
  bool closed_ = false;
};

}  // namespace

std::vector<RequestOutcome> RunRequests(const RunnerOptions& o,
                                        const std::vector<nlohmann::json>& bodies,
                                        const std::vector<int64_t>& prompt_lens,
                                        const std::vector<double>& arrivals_s,
                                        const std::function<void(size_t)>& on_done,
                                        double* duration_s) {
  std::vector<RequestOutcome> outcomes(bodies.size());
  ArrivalQueue queue;
  std::mutex done_mu;
  size_t done = 0;
  const int64_t start_ns = NowNs();
  std::vector<std::thread> workers;
  const size_t n_workers = std::max<size_t>(1, std::min(o.num_workers, bodies.size()));
  for (size_t w = 0; w < n_workers; ++w) {
    workers.emplace_back([&] {
      OpenAiClient client(o.target.host, o.target.port, o.timeout_s);
      size_t i = 0;
      int64_t arrival_ns = 0;
      while (queue.Pop(&i, &arrival_ns)) {
        auto r = client.Stream(o.target.path, bodies[i], o.headers);
        outcomes[i] = OutcomeFromStream(r, prompt_lens[i], start_ns, arrival_ns);
        std::lock_guard<std::mutex> l(done_mu);
        ++done;
        if (on_done) on_done(done);
      }
    });
  }
  for (size_t i = 0; i < bodies.size(); ++i) {
    const auto at_ns = start_ns + static_cast<int64_t>(arrivals_s[i] * 1e9);
    const int64_t now = NowNs();
    if (at_ns > now) std::this_thread::sleep_for(std::chrono::nanoseconds(at_ns - now));
    queue.Push(i, NowNs());  // vLLM's request_arrival_time: when the request is released
  }
  queue.Close();
  for (auto& t : workers) t.join();
  if (duration_s != nullptr) *duration_s = NsToSeconds(NowNs() - start_ns);
  return outcomes;
}

}  // namespace kvpush::loadgen
