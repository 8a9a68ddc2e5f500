#include "loadgen/server_counters.h"

#include <cstdio>
#include <cstdlib>

#include "client/openai_client.h"
#include "loadgen/runner.h"

namespace kvpush::loadgen {

std::optional<double> SumSamples(std::string_view text, std::string_view name) {
  std::optional<double> sum;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty() || line[0] == '#' || line.substr(0, name.size()) != name) continue;
    if (line.size() <= name.size() || (line[name.size()] != '{' && line[name.size()] != ' ')) {
      continue;
    }
    const size_t sp = line.rfind(' ');
    const std::string value(line.substr(sp + 1));
    char* parse_end = nullptr;
    const double v = std::strtod(value.c_str(), &parse_end);
    if (parse_end == value.c_str()) continue;
    sum = sum.value_or(0.0) + v;
  }
  return sum;
}

void AddPrefixCacheCounters(std::string_view text, PrefixCacheCounters* c) {
  const auto queries = SumSamples(text, "vllm:prefix_cache_queries_total");
  const auto hits = SumSamples(text, "vllm:prefix_cache_hits_total");
  if (!queries || !hits) return;
  ++c->pages;
  c->queries += *queries;
  c->hits += *hits;
  c->external_queries += SumSamples(text, "vllm:external_prefix_cache_queries_total").value_or(0);
  c->external_hits += SumSamples(text, "vllm:external_prefix_cache_hits_total").value_or(0);
}

Result<PrefixCacheCounters> ScrapePrefixCache(const std::vector<std::string>& urls,
                                              const std::string& api_key) {
  PrefixCacheCounters c;
  for (const std::string& url : urls) {
    KVP_ASSIGN_OR_RETURN(Target t, ParseBaseUrl(url, "/metrics"));
    OpenAiClient client(t.host, t.port, 10.0);
    client.set_api_key(api_key);
    KVP_ASSIGN_OR_RETURN(std::string page, client.Get(t.path));
    AddPrefixCacheCounters(page, &c);
  }
  return c;
}

std::string FormatPrefixCacheLines(const PrefixCacheCounters& before,
                                   const PrefixCacheCounters& after,
                                   const std::vector<std::string>& urls) {
  if (after.pages == 0) {
    std::string list;
    for (const std::string& u : urls) list += (list.empty() ? "" : ", ") + u;
    return "Prefix cache hits: not reported by " + list +
           " (no vllm:prefix_cache_* counters: a router? pass the instances with --metrics-url)\n";
  }
  char buf[256];
  std::string out;
  const double q = after.queries - before.queries, h = after.hits - before.hits;
  std::snprintf(buf, sizeof buf, "%-40s%-10.2f (%.0f of %.0f prompt tokens)\n",
                "Prefix cache hit rate (%):", q > 0 ? 100.0 * h / q : 0.0, h, q);
  out += buf;
  const double eq = after.external_queries - before.external_queries;
  const double eh = after.external_hits - before.external_hits;
  if (eq > 0) {
    std::snprintf(buf, sizeof buf, "%-40s%-10.2f (%.0f of %.0f prompt tokens)\n",
                  "KV from a peer (%):", 100.0 * eh / eq, eh, eq);
    out += buf;
  }
  return out;
}

}  // namespace kvpush::loadgen
