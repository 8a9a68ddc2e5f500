#include "loadgen/report.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace kvpush::loadgen {

std::string PyFloatStr(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip, like repr
  std::string s(buf, end);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

namespace {

std::string Center(const std::string& s, size_t width, char fill) {
  if (s.size() >= width) return s;
  const size_t left = (width - s.size()) / 2;  // Python's str.format '^': extra fill right
  return std::string(left, fill) + s + std::string(width - s.size() - left, fill);
}

std::string Line(const std::string& label, const std::string& value) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-40s %-10s\n", label.c_str(), value.c_str());
  return buf;
}

std::string Fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

// "99" for 99.0, "99.9" for 99.9 (vLLM's p_word).
std::string PWord(double p) {
  if (std::floor(p) == p) return std::to_string(static_cast<int64_t>(p));
  return PyFloatStr(p);
}

struct MetricNames {
  const char* key;
  const char* name;
  const char* header;
};
constexpr MetricNames kMetricNames[] = {
    {"ttft", "TTFT", "Time to First Token"},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
    {"itl", "ITL", "Inter-token Latency"},
    {"e2el", "E2EL", "End-to-end Latency"},
    {"client_queue_time", "Client Queue Time", "Client-side Queueing"},
    {"e2el_including_client_queue", "E2EL incl. Client Queue",
     "Queue-inclusive End-to-end Latency"},
};

bool Selected(const RunInfo& info, const std::string& key) {
  for (const auto& k : info.percentile_metrics) {
    if (k == key) return true;
  }
  return false;
}

}  // namespace

std::string FormatReport(const BenchmarkMetrics& m, const RunInfo& info) {
  std::string out = Center(" Serving Benchmark Result ", 50, '=') + "\n";
  out += Line("Successful requests:", std::to_string(m.completed));
  out += Line("Failed requests:", std::to_string(m.failed));
  if (info.max_concurrency) {
    out += Line("Maximum request concurrency:", std::to_string(*info.max_concurrency));
  }
  if (!std::isinf(info.request_rate)) {
    out += Line("Request rate configured (RPS):", Fixed2(info.request_rate));
  }
  out += Line("Benchmark duration (s):", Fixed2(info.duration_s));
  out += Line("Total input tokens:", std::to_string(m.total_input));
  out += Line("Total generated tokens:", std::to_string(m.total_output));
  out += Line("Request throughput (req/s):", Fixed2(m.request_throughput));
  if (info.has_goodput) out += Line("Request goodput (req/s):", Fixed2(m.request_goodput));
  out += Line("Output token throughput (tok/s):", Fixed2(m.output_throughput));
  out += Line("Peak output token throughput (tok/s):", Fixed2(m.max_output_tokens_per_s));
  out += Line("Peak concurrent requests:", Fixed2(static_cast<double>(m.max_concurrent_requests)));
  out += Line("Total Token throughput (tok/s):", Fixed2(m.total_token_throughput));
  for (const auto& n : kMetricNames) {
    auto it = m.summaries.find(n.key);
    if (!Selected(info, n.key) || it == m.summaries.end()) continue;
    out += Center(n.header, 50, '-') + "\n";
    out += Line(std::string("Mean ") + n.name + " (ms):", Fixed2(it->second.mean_ms));
    out += Line(std::string("Median ") + n.name + " (ms):", Fixed2(it->second.median_ms));
    for (const auto& [p, v] : it->second.percentiles_ms) {
      out += Line("P" + PWord(p) + " " + n.name + " (ms):", Fixed2(v));
    }
  }
  out += std::string(50, '=') + "\n";
  return out;
}

nlohmann::ordered_json ResultJson(const BenchmarkMetrics& m,
                                  const std::vector<RequestOutcome>& outcomes,
                                  const RunInfo& info) {
  nlohmann::ordered_json j;
  j["date"] = info.date;
  j["endpoint_type"] = info.backend;
  j["backend"] = info.backend;
  j["label"] = info.label.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(info.label);
  j["model_id"] = info.model_id;
  j["tokenizer_id"] = nullptr;
  j["num_prompts"] = info.num_prompts;
  if (std::isinf(info.request_rate)) {
    j["request_rate"] = "inf";
  } else {
    j["request_rate"] = info.request_rate;
  }
  j["burstiness"] = info.burstiness;
  j["max_concurrency"] =
      info.max_concurrency ? nlohmann::ordered_json(*info.max_concurrency) : nullptr;
  j["duration"] = info.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] =
      info.has_goodput ? nlohmann::ordered_json(m.request_goodput) : nlohmann::ordered_json();
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  auto per_request = [&](auto get) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& o : outcomes) a.push_back(get(o));
    return a;
  };
  if (info.save_detailed) {
    j["input_lens"] = per_request([](const RequestOutcome& o) { return o.prompt_len; });
    j["output_lens"] = m.output_lens;
    j["ttfts"] = per_request([](const RequestOutcome& o) { return o.ttft_s; });
    j["itls"] = per_request([](const RequestOutcome& o) { return o.itl_s; });
    j["start_times"] = per_request([](const RequestOutcome& o) { return o.start_s; });
    j["generated_texts"] = per_request([](const RequestOutcome& o) { return o.generated_text; });
    j["errors"] = per_request([](const RequestOutcome& o) { return o.error; });
  }
  j["latencies"] = per_request([](const RequestOutcome& o) { return o.latency_s; });
  j["queue_times"] = per_request([](const RequestOutcome& o) { return o.queue_s; });
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  j["rtfx"] = 0.0;
  for (const auto& n : kMetricNames) {
    auto it = m.summaries.find(n.key);
    if (!Selected(info, n.key) || it == m.summaries.end()) continue;
    const std::string k = n.key;
    j["mean_" + k + "_ms"] = it->second.mean_ms;
    j["median_" + k + "_ms"] = it->second.median_ms;
    j["std_" + k + "_ms"] = it->second.std_ms;
    for (const auto& [p, v] : it->second.percentiles_ms) j["p" + PWord(p) + "_" + k + "_ms"] = v;
  }
  return j;
}

std::string DefaultResultFilename(const RunInfo& info) {
  std::string model = info.model_id;
  if (auto slash = model.rfind('/'); slash != std::string::npos) model = model.substr(slash + 1);
  std::string name = (info.label.empty() ? info.backend : info.label) + "-" +
                     PyFloatStr(info.request_rate) + "qps";
  if (info.max_concurrency) name += "-concurrency" + std::to_string(*info.max_concurrency);
  return name + "-" + model + "-" + info.date + ".json";
}

}  // namespace kvpush::loadgen
