#include "apps/demo_report.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <vector>

#include "connector/handoff_timeline.h"

namespace kvpush::apps {

ConnectorCounters ConnectorCounters::operator-(const ConnectorCounters& o) const {
  return {push_targets - o.push_targets,
          writes - o.writes,
          kv_ready - o.kv_ready,
          kv_ready_on_write - o.kv_ready_on_write,
          push_tail_s - o.push_tail_s,
          push_tail_n - o.push_tail_n,
          reads - o.reads,
          read_s - o.read_s,
          read_n - o.read_n,
          recomputes - o.recomputes,
          not_needed - o.not_needed};
}

double MetricValue(const std::string& body, const std::string& name) {
  size_t pos = 0;
  while ((pos = body.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || body[pos - 1] == '\n';
    const size_t after = pos + name.size();
    if (line_start && after < body.size() && (body[after] == ' ' || body[after] == '{')) {
      size_t eol = body.find('\n', after);
      if (eol == std::string::npos) eol = body.size();
      const size_t value = body.rfind(' ', eol);  // the value ends the line, after any labels
      if (value != std::string::npos && value >= after) {
        return std::strtod(body.c_str() + value + 1, nullptr);
      }
    }
    pos = after;
  }
  return 0.0;
}

ConnectorCounters ReadConnectorCounters(const OpenAiClient& client) {
  ConnectorCounters c;
  auto m = client.Get("/metrics");
  if (!m.ok()) return c;
  const std::string k = "kvpush_kv_transfer_";
  c.push_targets = MetricValue(*m, k + "push_targets_sent_total") +
                   MetricValue(*m, k + "push_targets_received_total");
  c.writes = MetricValue(*m, k + "writes_total");
  c.kv_ready = MetricValue(*m, k + "kv_ready_sent_total");
  c.kv_ready_on_write = MetricValue(*m, k + "kv_ready_on_write_total");
  c.push_tail_s = MetricValue(*m, k + "push_tail_seconds_sum");
  c.push_tail_n = MetricValue(*m, k + "push_tail_seconds_count");
  c.reads = MetricValue(*m, k + "reads_total");
  c.read_s = MetricValue(*m, k + "read_seconds_sum");
  c.read_n = MetricValue(*m, k + "read_seconds_count");
  c.recomputes = MetricValue(*m, "kvpush_kv_load_recomputes_total");
  c.not_needed = MetricValue(*m, k + "not_needed_total");
  return c;
}

// What the measured rounds moved, from P's and D's counters: per push request the WRITEs and how
// KV_READY travelled, P's push tail (engine done -> KV_READY posted) and D's pull READ time.
void PrintTransferCounters(const ConnectorCounters& p, const ConnectorCounters& d) {
  std::printf("\nTransfers in the measured rounds (P's and D's /metrics):\n");
  if (p.kv_ready > 0) {
    std::printf(
        "  push: %.0f transfers, %.2f WRITEs each, KV_READY as the last WRITE's "
        "notification in %.0f%%; P's tail (prefill done -> KV_READY posted) mean %.3f "
        "ms\n",
        p.kv_ready, p.writes / p.kv_ready, 100.0 * p.kv_ready_on_write / p.kv_ready,
        p.push_tail_n > 0 ? 1e3 * p.push_tail_s / p.push_tail_n : 0.0);
  }
  if (d.read_n > 0) {
    std::printf("  pull: %.0f READs, mean %.3f ms from post to completion (D)\n", d.read_n,
                1e3 * d.read_s / d.read_n);
  }
  std::printf(
      "  decode recomputes after a failed load: %.0f; full prefix hits (no KV moved): "
      "%.0f\n",
      d.recomputes, d.not_needed);
}

namespace {

// Records of GET /debug/handoff_timeline on `client`, or an empty array.
nlohmann::json Timelines(const OpenAiClient& client) {
  auto body = client.Get("/debug/handoff_timeline?limit=4096");
  if (!body.ok()) return nlohmann::json::array();
  auto j = nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("data") || !j["data"].is_array()) {
    return nlohmann::json::array();
  }
  return j["data"];
}

double Median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void PrintHandoffMedians(const OpenAiClient& p, const OpenAiClient& d, int64_t from_ns,
                         int64_t until_ns) {
  using connector::HandoffPhaseName;
  // (mode, interval) -> milliseconds of every ok record that started in the measured window.
  std::map<std::pair<std::string, std::string>, std::vector<double>> ms;
  for (const nlohmann::json& records : {Timelines(p), Timelines(d)}) {
    for (const auto& r : records) {
      if (!r.value("ok", false) || !r.contains("t_ns")) continue;
      const auto& t = r["t_ns"];
      const char* start = r.value("role", "") == "prefill" ? "producer_start" : "consumer_start";
      if (!t.contains(start)) continue;
      const int64_t started = t[start].get<int64_t>();
      if (started < from_ns || started > until_ns) continue;
      for (const auto& iv : connector::HandoffIntervals()) {
        const char* a = HandoffPhaseName(iv.from);
        const char* b = HandoffPhaseName(iv.to);
        if (!t.contains(a) || !t.contains(b)) continue;
        const int64_t dt = t[b].get<int64_t>() - t[a].get<int64_t>();
        if (dt >= 0) ms[{r.value("mode", ""), iv.name}].push_back(static_cast<double>(dt) * 1e-6);
      }
    }
  }
  if (ms.empty()) return;
  std::printf(
      "\nHandoff timeline of the measured rounds, median ms per interval (count), from P's and "
      "D's /debug/handoff_timeline:\n");
  for (const char* mode : {"push", "pull"}) {
    std::printf("  %s:", mode);
    for (const auto& iv : connector::HandoffIntervals()) {
      auto it = ms.find({mode, iv.name});
      if (it == ms.end()) continue;
      std::printf(" %s %.3f (%zu)", iv.name, Median(it->second), it->second.size());
    }
    std::printf("\n");
  }
}

}  // namespace kvpush::apps
