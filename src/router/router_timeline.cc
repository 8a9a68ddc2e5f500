#include "router/router_timeline.h"

#include "common/clock.h"

namespace kvpush::router {

const char* RouterPhaseName(RouterPhase p) {
  switch (p) {
    case RouterPhase::kReceived:
      return "received";
    case RouterPhase::kPrefillLegWritten:
      return "prefill_leg_written";
    case RouterPhase::kDecodeLegWritten:
      return "decode_leg_written";
    case RouterPhase::kPrefillAnswered:
      return "prefill_answered";
    case RouterPhase::kFirstOutputRelayed:
      return "first_output_relayed";
    case RouterPhase::kDone:
      return "done";
    case RouterPhase::kCount:
      break;
  }
  return "?";
}

void RouterTimeline::Mark(RouterPhase p) {
  int64_t unset = 0;
  t_ns_[static_cast<size_t>(p)].compare_exchange_strong(unset, NowNs(), std::memory_order_relaxed);
}

nlohmann::json RouterTimeline::ToJson(const std::string& request_id, const std::string& transfer_id,
                                      const std::string& mode, bool ok) const {
  nlohmann::json t = nlohmann::json::object();
  for (size_t i = 0; i < kNumRouterPhases; ++i) {
    const int64_t ns = t_ns_[i].load(std::memory_order_relaxed);
    if (ns != 0) t[RouterPhaseName(static_cast<RouterPhase>(i))] = ns;
  }
  return {{"request_id", request_id},
          {"transfer_id", transfer_id},
          {"role", "router"},
          {"mode", mode},
          {"ok", ok},
          {"t_ns", std::move(t)}};
}

}  // namespace kvpush::router
