// The run's prefix-cache hits as the servers count them: vLLM's prefix-cache counters (tokens)
// read from /metrics before and after the main run of `kvpush bench` (docs/bench.md,
// "Prefix-cache hits"). vllm bench serve has no such line; back-to-back runs with one seed hit
// the server's cache, and this says how much.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpush::loadgen {

/// vLLM's prefix-cache counters, in tokens, summed over the pages read.
struct PrefixCacheCounters {
  double queries = 0, hits = 0;                    ///< vllm:prefix_cache_{queries,hits}_total
  double external_queries = 0, external_hits = 0;  ///< vllm:external_prefix_cache_*: KV from a peer
  int pages = 0;  ///< pages that had the local counters (a router's page has none)
};

/// Sum of every sample of family `name` in Prometheus text `text` (all label sets); nullopt
/// when no sample has that name. Pure.
std::optional<double> SumSamples(std::string_view text, std::string_view name);

/// Adds `text`'s counters to `*c` (pages counts the pages that had them). Pure.
void AddPrefixCacheCounters(std::string_view text, PrefixCacheCounters* c);

/// GET /metrics of every URL ("http://HOST:PORT[/PREFIX]") with `api_key`, summed.
/// Errors: kInvalidArgument (a URL), kUnavailable / kInternal (a page could not be read).
Result<PrefixCacheCounters> ScrapePrefixCache(const std::vector<std::string>& urls,
                                              const std::string& api_key);

/// The report lines for the run's counters (`after` - `before`), e.g.
/// "Prefix cache hit rate (%):  41.20  (5,120 of 12,427 prompt tokens)", or a line that says
/// why there is none (no page had the counters: a router; pass the instances).
std::string FormatPrefixCacheLines(const PrefixCacheCounters& before,
                                   const PrefixCacheCounters& after,
                                   const std::vector<std::string>& urls);

}  // namespace kvpush::loadgen
