// What `kvpush demo` reports beside H: the P/D counters of P's and D's /metrics over the measured
// rounds, and the medians of the handoff timeline's intervals (docs/pd_protocol.md §7).
#pragma once

#include <cstdint>
#include <string>

#include "client/openai_client.h"

namespace kvpush::apps {

/// The P/D counters the demo reports (from an instance's /metrics; absent ones are 0).
struct ConnectorCounters {
  double push_targets = 0, writes = 0, kv_ready = 0, kv_ready_on_write = 0, push_tail_s = 0,
         push_tail_n = 0, reads = 0, read_s = 0, read_n = 0, recomputes = 0, not_needed = 0;
  ConnectorCounters operator-(const ConnectorCounters& o) const;
};

/// The value of the first sample named `name` (any labels) in a Prometheus text body, or 0.
double MetricValue(const std::string& body, const std::string& name);

/// Reads the counters from `client`'s /metrics (all 0 when it cannot be read).
ConnectorCounters ReadConnectorCounters(const OpenAiClient& client);

/// Prints, per push transfer, the WRITEs and how KV_READY travelled, P's tail (prefill done ->
/// KV_READY posted), D's pull READ time, recomputes and full prefix hits.
void PrintTransferCounters(const ConnectorCounters& p, const ConnectorCounters& d);

/// Prints the median (ms) of each handoff interval (connector::HandoffIntervals) of the push and
/// pull transfers that started in [from_ns, until_ns] (steady clock) and moved their KV, from
/// P's and D's GET /debug/handoff_timeline.
void PrintHandoffMedians(const OpenAiClient& p, const OpenAiClient& d, int64_t from_ns,
                         int64_t until_ns);

}  // namespace kvpush::apps
