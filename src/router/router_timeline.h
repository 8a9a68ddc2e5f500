// The router's part of the per-request handoff timeline (docs/pd_protocol.md §7): when it got a
// P/D request, wrote each leg, had P's answer and relayed the first output, on the steady clock
// (CLOCK_MONOTONIC on Linux: the clock P's and D's records use on the same host). Joined with
// theirs by transfer id (bench/pd_timeline.py); GET /debug/handoff_timeline on the router.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace kvpush::router {

/// A phase of one P/D request on the router.
enum class RouterPhase : uint8_t {
  kReceived,            ///< the request's transfer was set up (after parsing the client's body)
  kPrefillLegWritten,   ///< P's leg was written (pull: about to be written; its answer follows)
  kDecodeLegWritten,    ///< D's leg is being written
  kPrefillAnswered,     ///< P's answer was read (push: P's leg ended; pull: before D's leg)
  kFirstOutputRelayed,  ///< the first byte of the answer went to the client (stream: first event)
  kDone,                ///< the client's answer ended
  kCount
};
inline constexpr size_t kNumRouterPhases = static_cast<size_t>(RouterPhase::kCount);

/// "received", "prefill_leg_written", ... (JSON keys).
const char* RouterPhaseName(RouterPhase p);

/// One request's router timeline. Mark is thread-safe (the handler thread, a push request's P-leg
/// worker and the stream provider mark phases of the same request).
class RouterTimeline {
 public:
  /// Sets `p` to now (steady clock ns) unless it was set already.
  void Mark(RouterPhase p);
  /// When `p` was reached (steady clock ns); 0: not reached.
  int64_t at(RouterPhase p) const {
    return t_ns_[static_cast<size_t>(p)].load(std::memory_order_relaxed);
  }
  /// {"request_id", "transfer_id", "role": "router", "mode", "ok", "t_ns": {phase: ns}} with
  /// the phases reached.
  nlohmann::json ToJson(const std::string& request_id, const std::string& transfer_id,
                        const std::string& mode, bool ok) const;

 private:
  std::array<std::atomic<int64_t>, kNumRouterPhases> t_ns_{};
};

}  // namespace kvpush::router
