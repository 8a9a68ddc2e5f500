// The per-request handoff timeline (docs/pd_protocol.md §7): the monotonic times at which one P/D
// transfer passed each phase on this instance, kept for the recent transfers and summarised as
// Prometheus histograms per interval. TransferCore fills one HandoffRecord per transfer; the shell
// hands finished ones to a HandoffTimelineLog that the HTTP server exposes
// (GET /debug/handoff_timeline, kvpush_pd_handoff_phase_seconds).
//
// Times are std::chrono::steady_clock nanoseconds, which on Linux is CLOCK_MONOTONIC: one clock
// for every process of a host, so records of the router, P and D on one host line up when joined
// by transfer id (bench/pd_timeline.py does). Across hosts only intervals within a record mean
// anything.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/recent_records.h"
#include "common/thread_annotations.h"
#include "common/histogram.h"

namespace kvpush::connector {

/// A phase of one transfer on one instance. P: the prefill instance (producer), D: the decode
/// instance (consumer).
enum class HandoffPhase : uint8_t {
  kProducerStart,     ///< P: the engine allocated the request's blocks (the prefill starts)
  kTargetAttached,    ///< P, push: D's PUSH_TARGET attached to the request
  kPrefillDone,       ///< P: the engine finished the prefill (first token sampled)
  kFirstWritePosted,  ///< P, push: first KV WRITE posted
  kLastWritePosted,   ///< P, push: last KV WRITE posted
  kKvReadyPosted,     ///< P, push: KV_READY posted (a message, or the last WRITE's notification)
  kWritesDone,        ///< P, push: every WRITE ended
  kPinAnswered,       ///< P, pull: PINNED sent
  kProducerEnd,       ///< P: blocks released, transfer over
  kConsumerStart,     ///< D: blocks reserved for the request's KV
  kRequestSent,       ///< D: PUSH_TARGET (push) or PIN (pull) posted
  kPinnedReceived,    ///< D, pull: PINNED received
  kReadPosted,        ///< D, pull: READ posted
  kKvArrived,         ///< D: KV_READY received (push) or the READ completed (pull)
  kVerified,          ///< D: checksums verified
  kLoadFinished,      ///< D: the load's result handed to the engine
  kCount
};
inline constexpr size_t kNumHandoffPhases = static_cast<size_t>(HandoffPhase::kCount);

/// "producer_start", "target_attached", ... (the JSON keys of HandoffRecord::ToJson).
const char* HandoffPhaseName(HandoffPhase p);

/// One transfer as one instance saw it. Value type.
struct HandoffRecord {
  std::string transfer_id;
  bool producer = false;  ///< P (true) or D (false)
  bool push = true;       ///< push or pull
  bool ok = false;        ///< the KV moved (P: every WRITE done / lease read; D: load verified)
  /// Steady-clock ns of each phase; 0 = not reached.
  std::array<int64_t, kNumHandoffPhases> t_ns{};
  int32_t messages_sent = 0;        ///< control messages sent alone (not on a WRITE)
  int32_t messages_received = 0;    ///< control messages and notifications received
  int32_t writes = 0;               ///< WRITEs posted (P, push)
  int32_t write_notifications = 0;  ///< WRITEs posted with a notification (LAYER_READY, KV_READY)
  int32_t reads = 0;                ///< READs posted (D, pull)
  int32_t blocks = 0;               ///< KV blocks moved
  /// The transfer's KV WRITEs (P, push) or READs (D, pull) as this instance posted them:
  /// descriptors ((layer, K|V, block) chunks), their bytes, and the time spent inside the post
  /// calls (vLLM's nixl_post_time).
  int64_t descriptors = 0;
  int64_t bytes = 0;
  int64_t post_ns = 0;

  /// Sets phase `p` to `ns` unless it was set already (the first time counts).
  void Mark(HandoffPhase p, int64_t ns) {
    auto& slot = t_ns[static_cast<size_t>(p)];
    if (slot == 0) slot = ns;
  }
  int64_t at(HandoffPhase p) const { return t_ns[static_cast<size_t>(p)]; }
  /// {"transfer_id", "role": "prefill"|"decode", "mode", "ok", "t_ns": {phase: ns, ...} (reached
  /// phases only), "messages_sent", ...}.
  nlohmann::json ToJson() const;
};

/// A named interval between two phases of a record, histogrammed by HandoffTimelineLog.
struct HandoffInterval {
  const char* name;
  HandoffPhase from;
  HandoffPhase to;
};
/// The intervals: prefill_compute, target_after_prefill (P, push: only when the target came after
/// the prefill), prefill_tail (P, push: prefill done -> KV_READY posted), writes (P, push: first
/// post -> every WRITE done), decode_request (D: blocks reserved -> PUSH_TARGET/PIN posted),
/// decode_kv_wait (D: request posted -> KV arrived), decode_verify, decode_load (D: blocks
/// reserved -> load handed to the engine).
const std::vector<HandoffInterval>& HandoffIntervals();

/// The recent records (a ring of `capacity`) and one histogram (seconds) per (interval, mode).
/// Thread-safe.
class HandoffTimelineLog {
 public:
  explicit HandoffTimelineLog(size_t capacity = 4096);
  /// Adds a finished record: kept in the ring, its intervals recorded (failed transfers are
  /// kept in the ring but not histogrammed), then handed to the observer, if any.
  void Add(const HandoffRecord& r);
  /// Called with every record Add takes (on Add's thread, no lock held): traces turn records
  /// into spans. Set before the first Add; not thread-safe against Add.
  void SetObserver(std::function<void(const HandoffRecord&)> observer) {
    observer_ = std::move(observer);
  }
  /// The newest `limit` records, oldest first, as a JSON array.
  nlohmann::json Recent(size_t limit) const;
  /// (interval name, "push"|"pull", histogram) of every interval and mode, empty ones included
  /// (a series that exists from the start lets Prometheus's rate() see its first observations).
  struct Series {
    std::string interval;
    std::string mode;
    Histogram histogram;
  };
  std::vector<Series> Histograms() const;
  /// vLLM's NIXL transfer histograms (vllm:nixl_*), over the transfers whose KV this instance
  /// moved itself and that succeeded: P's WRITEs in push, D's READ in pull. xfer_time: first
  /// post -> every op done (push: kFirstWritePosted -> kWritesDone; pull: kReadPosted ->
  /// kKvArrived); post_time: time inside the post calls; bytes and descriptors per transfer.
  struct XferHistograms {
    Histogram xfer_time{Histogram::LatencyBounds()};
    Histogram post_time{Histogram::LatencyBounds()};
    Histogram bytes{ByteBounds()};
    Histogram descriptors{DescriptorBounds()};
  };
  XferHistograms Xfers() const;
  /// 2 KiB .. 8 GiB by factors of 4 (vLLM's nixl_bytes_transferred buckets, 2^11 .. 2^33).
  static std::vector<double> ByteBounds();
  /// 1 .. 4^10 descriptors by factors of 4.
  static std::vector<double> DescriptorBounds();
  /// Buckets (seconds): 50 us .. 10 s; below vLLM's 1 ms TTFT buckets because most handoff
  /// phases are sub-millisecond.
  static std::vector<double> Bounds();

 private:
  RecentRecords<HandoffRecord> ring_;
  mutable Mutex mu_;
  /// [interval index * 2 + (push ? 0 : 1)]
  std::vector<Histogram> hist_ GUARDED_BY(mu_);
  XferHistograms xfers_ GUARDED_BY(mu_);
  std::function<void(const HandoffRecord&)> observer_;

  void AddToHistograms(const HandoffRecord& r);
};

}  // namespace kvpush::connector
