#include "loadgen/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

namespace kvpush::loadgen {

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const auto hi = static_cast<size_t>(std::ceil(rank));
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

MetricSummary Summarize(const std::vector<double>& values_s,
                        const std::vector<double>& percentiles) {
  MetricSummary s;
  if (!values_s.empty()) {
    const auto n = static_cast<double>(values_s.size());
    const double mean = std::accumulate(values_s.begin(), values_s.end(), 0.0) / n;
    double sq = 0;
    for (double v : values_s) sq += (v - mean) * (v - mean);
    s.mean_ms = mean * 1000.0;
    s.std_ms = std::sqrt(sq / n) * 1000.0;
    s.median_ms = Percentile(values_s, 50.0) * 1000.0;
  }
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, Percentile(values_s, p) * 1000.0);
  return s;
}

namespace {

int64_t OutputLen(const RequestOutcome& o) {
  if (o.output_tokens > 0) return o.output_tokens;
  return static_cast<int64_t>(o.itl_s.size()) + 1;  // content chunks (vLLM: tokenizer count)
}

// Peak number of overlapping [start, start + latency) intervals; a departure at the same
// instant as an arrival is counted first (vLLM's sweep line).
int64_t PeakConcurrency(const std::vector<RequestOutcome>& outcomes) {
  std::vector<std::pair<double, int>> events;
  for (const auto& o : outcomes) {
    if (!o.success) continue;
    events.emplace_back(o.start_s, 1);
    events.emplace_back(o.start_s + o.latency_s, -1);
  }
  std::sort(events.begin(), events.end());
  int64_t cur = 0, peak = 0;
  for (const auto& e : events) peak = std::max(peak, cur += e.second);
  return peak;
}

// Most content chunks (vLLM: "tokens", one per chunk) in a 1-second bucket counted from the
// earliest send of a successful request.
double PeakOutputPerSecond(const std::vector<RequestOutcome>& outcomes) {
  double min_start = 0, max_end = 0;
  bool any = false;
  for (const auto& o : outcomes) {
    if (!o.success) continue;
    min_start = any ? std::min(min_start, o.start_s) : o.start_s;
    max_end = any ? std::max(max_end, o.start_s + o.latency_s) : o.start_s + o.latency_s;
    any = true;
  }
  if (!any) return 0.0;
  const auto buckets = static_cast<size_t>(std::ceil(max_end - min_start)) + 1;
  std::vector<double> per_s(buckets, 0.0);
  for (const auto& o : outcomes) {
    if (!o.success) continue;
    double t = o.start_s + o.ttft_s;
    auto add = [&](double at) {
      const double b = std::floor(at - min_start);
      if (b >= 0 && b < static_cast<double>(buckets)) per_s[static_cast<size_t>(b)] += 1;
    };
    add(t);
    for (double g : o.itl_s) add(t += g);
  }
  return *std::max_element(per_s.begin(), per_s.end());
}

}  // namespace

BenchmarkMetrics CalculateMetrics(const std::vector<RequestOutcome>& outcomes, double duration_s,
                                  const std::vector<double>& percentiles, const GoodputSlos& slos,
                                  bool has_max_concurrency, bool finite_rate) {
  BenchmarkMetrics m;
  std::vector<double> ttfts, tpots, itls, e2els, queues, e2els_with_queue;
  int64_t good = 0;
  for (const auto& o : outcomes) {
    if (!o.success) {
      m.output_lens.push_back(0);
      ++m.failed;
      continue;
    }
    const int64_t out_len = OutputLen(o);
    m.output_lens.push_back(out_len);
    m.total_input += o.prompt_len;
    double tpot = 0;
    if (out_len > 1) {
      tpot = (o.latency_s - o.ttft_s) / static_cast<double>(out_len - 1);
      tpots.push_back(tpot);
    }
    itls.insert(itls.end(), o.itl_s.begin(), o.itl_s.end());
    ttfts.push_back(o.ttft_s);
    e2els.push_back(o.latency_s);
    queues.push_back(o.queue_s);
    e2els_with_queue.push_back(o.latency_s + o.queue_s);
    ++m.completed;
    bool is_good = true;
    for (const auto& [name, slo_ms] : slos) {
      const double v = name == "ttft" ? o.ttft_s : name == "tpot" ? tpot : o.latency_s;
      is_good = is_good && slo_ms / 1000.0 >= v;
    }
    if (!slos.empty() && is_good) ++good;
  }
  m.total_output = std::accumulate(m.output_lens.begin(), m.output_lens.end(), int64_t{0});
  const double d = duration_s > 0 ? duration_s : 1e-9;
  m.request_throughput = static_cast<double>(m.completed) / d;
  m.request_goodput = static_cast<double>(good) / d;
  m.output_throughput = static_cast<double>(m.total_output) / d;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / d;
  m.max_output_tokens_per_s = PeakOutputPerSecond(outcomes);
  m.max_concurrent_requests = PeakConcurrency(outcomes);
  m.summaries["ttft"] = Summarize(ttfts, percentiles);
  m.summaries["tpot"] = Summarize(tpots, percentiles);
  m.summaries["itl"] = Summarize(itls, percentiles);
  m.summaries["e2el"] = Summarize(e2els, percentiles);
  if (has_max_concurrency) {
    m.summaries["client_queue_time"] = Summarize(queues, percentiles);
    if (finite_rate) {
      m.summaries["e2el_including_client_queue"] = Summarize(e2els_with_queue, percentiles);
    }
  }
  return m;
}

namespace {

std::vector<std::string> SplitCsv(const std::string& csv) {
  std::vector<std::string> out;
  std::stringstream ss(csv);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    out.push_back(b == std::string::npos ? "" : item.substr(b, e - b + 1));
  }
  return out;
}

// Parses a whole string as a finite double.
bool ParseDouble(const std::string& s, double* out) {
  if (s.empty()) return false;
  size_t used = 0;
  try {
    *out = std::stod(s, &used);
  } catch (...) {
    return false;
  }
  return used == s.size() && std::isfinite(*out);
}

}  // namespace

Result<GoodputSlos> ParseGoodput(const std::vector<std::string>& pairs) {
  GoodputSlos slos;
  for (const auto& p : pairs) {
    const auto colon = p.find(':');
    double v = 0;
    if (colon == std::string::npos || !ParseDouble(p.substr(colon + 1), &v)) {
      return InvalidArgument("--goodput: '" + p +
                             "' is not KEY:VALUE (e.g. ttft:500, a value in milliseconds)");
    }
    const std::string key = p.substr(0, colon);
    if (key != "ttft" && key != "tpot" && key != "e2el") {
      return InvalidArgument("--goodput: unknown metric '" + key + "' (use ttft, tpot, e2el)");
    }
    if (v < 0) return InvalidArgument("--goodput: '" + p + "' must be non-negative");
    slos[key] = v;
  }
  return slos;
}

Result<std::vector<double>> ParsePercentiles(const std::string& csv) {
  std::vector<double> out;
  for (const auto& s : SplitCsv(csv)) {
    double v = 0;
    if (!ParseDouble(s, &v) || v < 0 || v > 100) {
      return InvalidArgument("--metric-percentiles: '" + s + "' is not a number in [0, 100]");
    }
    out.push_back(v);
  }
  return out;
}

Result<std::vector<std::string>> ParsePercentileMetrics(const std::string& csv) {
  static const char* kAllowed[] = {
      "ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue"};
  std::vector<std::string> out = SplitCsv(csv);
  for (const auto& s : out) {
    if (std::find(std::begin(kAllowed), std::end(kAllowed), s) == std::end(kAllowed)) {
      return InvalidArgument("--percentile-metrics: unknown metric '" + s +
                             "' (ttft, tpot, itl, e2el, client_queue_time, "
                             "e2el_including_client_queue)");
    }
  }
  return out;
}

}  // namespace kvpush::loadgen
