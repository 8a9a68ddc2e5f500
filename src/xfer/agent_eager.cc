// Agent: eager WRITEs (eager_frame.h, docs/xfer.md "Eager WRITEs"). A small WRITE with a
// notification goes as one frame carrying its data; the target copies it into its own registered
// region after checking every range, queues the notification, and acknowledges; the initiator's
// transfer is done once the backend reported the frame sent and the ack came.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "xfer/agent.h"
#include "xfer/notification_frame.h"

namespace kvpush::xfer {
namespace {

/// How often an ack whose post failed is posted again at once; after that the watchdog thread
/// posts it again with a backoff (AckBackoff) until kAckRetryFor passed. A transport that
/// refuses it for good breaks the connection, and the sender then drops this peer and settles.
constexpr int kAckImmediateAttempts = 3;

/// The wait before retry number `attempts` (> kAckImmediateAttempts) of a refused ack: 1 ms,
/// doubling, at most 100 ms.
std::chrono::milliseconds AckBackoff(int attempts) {
  const int doublings = std::min(attempts - kAckImmediateAttempts, 7);
  return std::min(std::chrono::milliseconds(1) * (1 << std::max(doublings, 0)),
                  std::chrono::milliseconds(100));
}

}  // namespace

bool Agent::AddEagerRange(const Peer& peer, const Entry& r, uint64_t roff, uint64_t n, bool va,
                          std::vector<EagerRange>* ranges) {
  auto it = peer.regions.find(r.region);
  if (it == peer.regions.end()) return false;
  const RegionInfo& info = it->second.info;
  const uint64_t offset = r.addr + roff - (va ? info.base : 0);
  if (!ranges->empty()) {
    EagerRange& last = ranges->back();
    if (last.region_index == r.region && last.offset + last.length == offset) {
      last.length += n;
      return true;
    }
  }
  ranges->push_back(EagerRange{r.region, info.id.generation, offset, n});
  return true;
}

bool Agent::EagerFits(const Transfer& t, size_t notification_bytes) const {
  const BackendCaps& caps = backend_->caps();
  const uint64_t limit = std::min(caps.eager_write_max_bytes, options_.eager_write_max_bytes);
  if (t.batch == nullptr || t.batch->total_bytes == 0 || t.batch->total_bytes > limit) return false;
  const uint64_t frame = EagerWriteHeaderBytes(options_.name.size(), t.eager_ranges.size()) +
                         t.batch->total_bytes + notification_bytes;
  return frame <= caps.max_message_bytes;
}

std::vector<uint8_t> Agent::EagerFrame(const EagerParts& parts, uint64_t token) const {
  std::vector<uint8_t> frame;
  BeginEagerWrite(options_.name, options_.incarnation, parts.target_incarnation, token,
                  parts.ranges, static_cast<uint32_t>(parts.notification.size()), &frame);
  for (const XferOp& op : parts.batch->ops) {
    const auto* p = reinterpret_cast<const uint8_t*>(op.local_addr);
    frame.insert(frame.end(), p, p + op.length);
  }
  frame.insert(frame.end(), parts.notification.begin(), parts.notification.end());
  return frame;
}

void Agent::SettleEagerLocked(Transfer& t) {
  if (!t.eager_sent || !t.eager_acked) return;
  auto pit = peers_.find(t.peer);
  if (t.eager_ack_status.ok() && t.state == TransferState::kInProgress && pit != peers_.end() &&
      pit->second.generation == t.peer_generation) {
    pit->second.last_progress = SteadyClock::now();  // the peer answers: not stalled
  }
  SettleLocked(t, t.eager_ack_status);
}

void Agent::OnEagerWrite(std::span<const uint8_t> frame) {
  auto w =
      DecodeEagerWrite(frame, backend_->caps().max_message_bytes, options_.max_notification_bytes);
  if (!w.ok()) return;  // malformed: dropped, as a malformed notification frame
  StatusCode code = StatusCode::kOk;
  std::shared_ptr<BackendPeer> reply_to;
  {
    MutexLock lock(mu_);
    // Only from a peer this agent loaded and has not dropped, in the incarnation it knows: a
    // frame from a peer it invalidated never lands (docs/xfer.md, "Eager WRITEs").
    auto pit = peers_.find(w->sender);
    if (pit == peers_.end() || !pit->second.alive || pit->second.backend == nullptr ||
        pit->second.incarnation != w->sender_incarnation)
      return;
    reply_to = pit->second.backend;
    std::vector<uint8_t*> dest;
    dest.reserve(w->ranges.size());
    if (w->target_incarnation != options_.incarnation) code = StatusCode::kPeerGone;
    for (const EagerRange& e : w->ranges) {
      if (code != StatusCode::kOk) break;
      Region* r = regions_.Find(RegionId{{e.region_index, e.region_generation}});
      if (r == nullptr) {
        code = StatusCode::kNotFound;
      } else if (e.offset > r->length || e.length > r->length - e.offset) {
        code = StatusCode::kOutOfRange;
      } else {
        dest.push_back(static_cast<uint8_t*>(r->addr) + e.offset);
      }
    }
    if (code == StatusCode::kOk) {
      // Every range checked before any byte is copied; under mu_ so that no region can be
      // deregistered (and its memory given back) in between.
      size_t at = 0;
      for (size_t i = 0; i < dest.size(); ++i) {
        std::memcpy(dest[i], w->data.data() + at, w->ranges[i].length);
        at += w->ranges[i].length;
      }
      if (!w->notification.empty()) {
        notifications_.push_back(
            Notification{w->sender, w->sender_incarnation,
                         std::vector<uint8_t>(w->notification.begin(), w->notification.end()),
                         pit->second.generation});
        cv_.NotifyAll();
        if (options_.on_event) options_.on_event();
      }
    }
  }
  PendingAck ack{std::move(reply_to),
                 EncodeEagerAck(options_.name, options_.incarnation, w->token, code), 0,
                 TimePoint{}, SteadyClock::now() + kAckRetryFor};
  uint32_t id = 0;
  {
    MutexLock lock(mu_);
    if (++ack_seq_ == 0) ++ack_seq_;
    id = ack_seq_;
    pending_acks_.emplace(id, ack);
  }
  PostAck(id, std::move(ack));
}

bool Agent::IsAckToken(uint64_t token) {
  return (token & 0xffffffffu) == kAckTokenIndex;
}

void Agent::PostAck(uint32_t id, PendingAck ack) {
  PostRequest req;
  req.token = (static_cast<uint64_t>(id) << 32) | kAckTokenIndex;
  req.peer = std::move(ack.peer);
  req.batch = std::make_shared<OpBatch>();
  req.notification = std::move(ack.frame);
  req.control = std::make_shared<PostControl>();
  if (Status s = backend_->Post(std::move(req)); !s.ok()) OnAckPosted(id, std::move(s));
}

void Agent::OnAckPosted(uint32_t id, Status status) {
  std::optional<PendingAck> again;
  {
    MutexLock lock(mu_);
    auto it = pending_acks_.find(id);
    if (it == pending_acks_.end()) return;
    // The sender's transfer is done, or settled, only once an ack arrives: a post the transport
    // refused is tried again (a broken connection ends it: the sender drops this peer).
    PendingAck& a = it->second;
    const TimePoint now = SteadyClock::now();
    if (status.ok() || status.code() == StatusCode::kPeerGone || now >= a.give_up_at) {
      pending_acks_.erase(it);
      return;
    }
    if (++a.attempts >= kAckImmediateAttempts) {
      // Refused again and again (a transport out of resources, a link that flaps): the
      // watchdog thread tries it again later (DueAcksLocked).
      a.retry_at = now + AckBackoff(a.attempts);
      watchdog_cv_.NotifyAll();
      return;
    }
    again = a;
  }
  PostAck(id, std::move(*again));
}

std::vector<std::pair<uint32_t, Agent::PendingAck>> Agent::DueAcksLocked(TimePoint now,
                                                                         TimePoint* next) {
  std::vector<std::pair<uint32_t, PendingAck>> due;
  for (auto& [id, a] : pending_acks_) {
    if (a.retry_at == TimePoint{}) continue;
    if (a.retry_at <= now) {
      a.retry_at = TimePoint{};
      due.emplace_back(id, a);
    } else {
      *next = std::min(*next, a.retry_at);
    }
  }
  return due;
}

void Agent::OnEagerAck(std::span<const uint8_t> frame) {
  auto a = DecodeEagerAck(frame);
  if (!a.ok()) return;
  MutexLock lock(mu_);
  Transfer* t = transfers_.AtIndex(static_cast<uint32_t>(a->token & 0xffffffffu));
  // Only for this post of an eager transfer, from the peer it was sent to.
  if (t == nullptr || !t->eager || t->seq != static_cast<uint32_t>(a->token >> 32) ||
      t->peer != a->sender || t->eager_acked)
    return;
  auto pit = peers_.find(a->sender);
  if (pit == peers_.end() || pit->second.incarnation != a->sender_incarnation) return;
  t->eager_acked = true;
  t->eager_ack_status = a->code == StatusCode::kOk
                            ? Status::Ok()
                            : Status(a->code, "eager WRITE refused by peer '" + t->peer + "' (" +
                                                  std::string(StatusCodeName(a->code)) + ")");
  SettleEagerLocked(*t);
}

}  // namespace kvpush::xfer
