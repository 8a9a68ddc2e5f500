#include "connector/handoff_timeline.h"

#include <algorithm>

namespace kvpush::connector {

const char* HandoffPhaseName(HandoffPhase p) {
  switch (p) {
    case HandoffPhase::kProducerStart:
      return "producer_start";
    case HandoffPhase::kTargetAttached:
      return "target_attached";
    case HandoffPhase::kPrefillDone:
      return "prefill_done";
    case HandoffPhase::kFirstWritePosted:
      return "first_write_posted";
    case HandoffPhase::kLastWritePosted:
      return "last_write_posted";
    case HandoffPhase::kKvReadyPosted:
      return "kv_ready_posted";
    case HandoffPhase::kWritesDone:
      return "writes_done";
    case HandoffPhase::kPinAnswered:
      return "pin_answered";
    case HandoffPhase::kProducerEnd:
      return "producer_end";
    case HandoffPhase::kConsumerStart:
      return "consumer_start";
    case HandoffPhase::kRequestSent:
      return "request_sent";
    case HandoffPhase::kPinnedReceived:
      return "pinned_received";
    case HandoffPhase::kReadPosted:
      return "read_posted";
    case HandoffPhase::kKvArrived:
      return "kv_arrived";
    case HandoffPhase::kVerified:
      return "verified";
    case HandoffPhase::kLoadFinished:
      return "load_finished";
    case HandoffPhase::kCount:
      break;
  }
  return "?";
}

nlohmann::json HandoffRecord::ToJson() const {
  nlohmann::json t = nlohmann::json::object();
  for (size_t i = 0; i < kNumHandoffPhases; ++i) {
    if (t_ns[i] != 0) t[HandoffPhaseName(static_cast<HandoffPhase>(i))] = t_ns[i];
  }
  return {{"transfer_id", transfer_id},
          {"role", producer ? "prefill" : "decode"},
          {"mode", push ? "push" : "pull"},
          {"ok", ok},
          {"t_ns", std::move(t)},
          {"messages_sent", messages_sent},
          {"messages_received", messages_received},
          {"writes", writes},
          {"write_notifications", write_notifications},
          {"reads", reads},
          {"blocks", blocks}};
}

const std::vector<HandoffInterval>& HandoffIntervals() {
  using P = HandoffPhase;
  static const std::vector<HandoffInterval> intervals = {
      {"prefill_compute", P::kProducerStart, P::kPrefillDone},
      {"target_after_prefill", P::kPrefillDone, P::kTargetAttached},
      {"prefill_tail", P::kPrefillDone, P::kKvReadyPosted},
      {"writes", P::kFirstWritePosted, P::kWritesDone},
      {"decode_request", P::kConsumerStart, P::kRequestSent},
      {"decode_kv_wait", P::kRequestSent, P::kKvArrived},
      {"decode_verify", P::kKvArrived, P::kVerified},
      {"decode_load", P::kConsumerStart, P::kLoadFinished},
  };
  return intervals;
}

std::vector<double> HandoffTimelineLog::Bounds() {
  return {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04,
          0.06,    0.08,   0.1,     0.25,   0.5,   0.75,   1.0,   2.5,  5.0,  10.0};
}

HandoffTimelineLog::HandoffTimelineLog(size_t capacity)
    : ring_(capacity), hist_(HandoffIntervals().size() * 2, Histogram(Bounds())) {}

void HandoffTimelineLog::Add(const HandoffRecord& r) {
  ring_.Add(r);
  if (r.ok) AddToHistograms(r);
  if (observer_) observer_(r);
}

void HandoffTimelineLog::AddToHistograms(const HandoffRecord& r) {
  MutexLock lock(mu_);
  const auto& intervals = HandoffIntervals();
  for (size_t i = 0; i < intervals.size(); ++i) {
    const int64_t from = r.at(intervals[i].from);
    const int64_t to = r.at(intervals[i].to);
    // Only intervals whose order holds: "target_after_prefill" exists only for a late target.
    if (from == 0 || to == 0 || to < from) continue;
    hist_[i * 2 + (r.push ? 0 : 1)].Record(static_cast<double>(to - from) * 1e-9);
  }
  // The instance that posted the KV ops: P in push, D in pull.
  if (r.producer != r.push) return;
  const int64_t first = r.at(r.push ? HandoffPhase::kFirstWritePosted : HandoffPhase::kReadPosted);
  const int64_t done = r.at(r.push ? HandoffPhase::kWritesDone : HandoffPhase::kKvArrived);
  if (first == 0 || done < first) return;
  xfers_.xfer_time.Record(static_cast<double>(done - first) * 1e-9);
  xfers_.post_time.Record(static_cast<double>(r.post_ns) * 1e-9);
  xfers_.bytes.Record(static_cast<double>(r.bytes));
  xfers_.descriptors.Record(static_cast<double>(r.descriptors));
}

HandoffTimelineLog::XferHistograms HandoffTimelineLog::Xfers() const {
  MutexLock lock(mu_);
  return xfers_;
}

std::vector<double> HandoffTimelineLog::ByteBounds() {
  std::vector<double> out;
  for (int e = 11; e <= 33; e += 2) out.push_back(static_cast<double>(int64_t{1} << e));
  return out;
}

std::vector<double> HandoffTimelineLog::DescriptorBounds() {
  std::vector<double> out;
  for (int e = 0; e <= 20; e += 2) out.push_back(static_cast<double>(int64_t{1} << e));
  return out;
}

nlohmann::json HandoffTimelineLog::Recent(size_t limit) const {
  nlohmann::json out = nlohmann::json::array();
  for (const HandoffRecord& r : ring_.Newest(limit)) out.push_back(r.ToJson());
  return out;
}

std::vector<HandoffTimelineLog::Series> HandoffTimelineLog::Histograms() const {
  std::vector<Series> out;
  MutexLock lock(mu_);
  const auto& intervals = HandoffIntervals();
  for (size_t i = 0; i < hist_.size(); ++i) {
    out.push_back(Series{intervals[i / 2].name, i % 2 == 0 ? "push" : "pull", hist_[i]});
  }
  return out;
}

}  // namespace kvpush::connector
