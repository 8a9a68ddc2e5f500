// Agent: regions, metadata, peers, backend events and the stall watchdog.
// Descriptor lists and transfers are in agent_transfer.cc.
#include "xfer/agent.h"

#include <algorithm>
#include <random>

#include "common/thread_name.h"
#include "xfer/eager_frame.h"
#include "xfer/notification_frame.h"

namespace kvpush::xfer {

const char* TransferStateName(TransferState s) {
  switch (s) {
    case TransferState::kIdle:
      return "idle";
    case TransferState::kInProgress:
      return "in_progress";
    case TransferState::kDone:
      return "done";
    case TransferState::kError:
      return "error";
  }
  return "unknown";
}

namespace {
uint64_t RandomIncarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(NowNs());
  return v;
}
}  // namespace

Result<std::unique_ptr<Agent>> Agent::Create(AgentOptions options,
                                             std::unique_ptr<Backend> backend) {
  if (options.name.empty() || options.name.size() > 255)
    return InvalidArgument("agent name must be 1..255 bytes");
  if (options.stall_timeout.count() <= 0) return InvalidArgument("stall_timeout must be > 0");
  if (backend == nullptr) return InvalidArgument("agent needs a backend");
  if (options.max_notification_bytes > backend->caps().max_message_bytes - 300)
    options.max_notification_bytes = backend->caps().max_message_bytes - 300;
  if (options.incarnation == 0) options.incarnation = RandomIncarnation();
  return std::unique_ptr<Agent>(new Agent(std::move(options), std::move(backend)));
}

Agent::Agent(AgentOptions options, std::unique_ptr<Backend> backend)
    : options_(std::move(options)), backend_(std::move(backend)) {
  backend_->SetSink(this);
  watchdog_ = std::thread([this] {
    SetThreadName("kvp-xfer-watch");
    WatchdogLoop();
  });
}

Agent::~Agent() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  watchdog_cv_.NotifyAll();
  watchdog_.join();
  std::vector<
      std::pair<std::shared_ptr<BackendPeer>, std::vector<std::shared_ptr<BackendRemoteRegion>>>>
      peers;
  std::vector<std::unique_ptr<BackendRegion>> regions;
  {
    MutexLock lock(mu_);
    for (auto& [name, p] : peers_) {
      if (!p.backend) continue;
      std::vector<std::shared_ptr<BackendRemoteRegion>> rr;
      for (auto& [idx, r] : p.regions) rr.push_back(std::move(r.backend));
      peers.emplace_back(std::move(p.backend), std::move(rr));
    }
    peers_.clear();
    regions_.ForEach([&](HandleBits, Region& r) { regions.push_back(std::move(r.backend)); });
  }
  for (auto& [peer, rr] : peers) backend_->Disconnect(std::move(peer), std::move(rr));
  for (auto& r : regions) backend_->ReleaseMemory(std::move(r));
  backend_.reset();  // joins backend threads; no sink call after this
}

// ---------------------------------------------------------------------------------------------
// Regions

Result<RegionId> Agent::RegisterRegion(void* addr, uint64_t length, MemoryType type) {
  if (addr == nullptr || length == 0) return InvalidArgument("RegisterRegion: null or empty range");
  if (reinterpret_cast<uintptr_t>(addr) + length < reinterpret_cast<uintptr_t>(addr))
    return InvalidArgument("RegisterRegion: range wraps the address space");
  KVP_ASSIGN_OR_RETURN(auto br, backend_->RegisterMemory(addr, length, type));
  MutexLock lock(mu_);
  HandleBits h = regions_.Insert(Region{addr, length, type, false, 0, std::move(br)});
  return RegionId{h};
}

Result<AllocatedRegion> Agent::AllocateRegion(uint64_t length, MemoryType type) {
  if (length == 0) return InvalidArgument("AllocateRegion: zero length");
  void* addr = nullptr;
  KVP_ASSIGN_OR_RETURN(auto br, backend_->AllocateMemory(length, type, &addr));
  MutexLock lock(mu_);
  HandleBits h = regions_.Insert(Region{addr, length, type, true, 0, std::move(br)});
  return AllocatedRegion{RegionId{h}, static_cast<std::byte*>(addr), length};
}

Status Agent::DeregisterRegion(RegionId id) {
  std::unique_ptr<BackendRegion> br;
  {
    MutexLock lock(mu_);
    Region* r = regions_.Find(id);
    if (r == nullptr) return NotFound("DeregisterRegion: no region " + std::to_string(id.index));
    if (r->list_refs > 0)
      return FailedPrecondition("DeregisterRegion: region " + std::to_string(id.index) +
                                " is used by " + std::to_string(r->list_refs) +
                                " prepared list(s)");
    br = std::move(r->backend);
    regions_.Erase(id);
  }
  backend_->ReleaseMemory(std::move(br));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Metadata and peers

Result<std::vector<uint8_t>> Agent::ExportMetadata() {
  AgentMetadata md;
  md.name = options_.name;
  md.incarnation = options_.incarnation;
  md.backend = backend_->caps().name;
  md.address = backend_->LocalAddress();
  {
    MutexLock lock(mu_);
    regions_.ForEach([&](HandleBits h, Region& r) {
      RegionInfo ri;
      ri.id = RegionId{h};
      ri.memory_type = r.type;
      ri.length = r.length;
      ri.base = reinterpret_cast<uintptr_t>(r.addr);
      ri.key = r.backend->key;
      md.regions.push_back(std::move(ri));
    });
  }
  return EncodeMetadata(md);
}

void Agent::FinishLocked(Transfer& t, Status status) {
  if (t.state != TransferState::kInProgress) return;
  t.state = status.ok() ? TransferState::kDone : TransferState::kError;
  t.error = std::move(status);
  --in_progress_;
  finished_.fetch_add(1, std::memory_order_release);
  cv_.NotifyAll();
  if (options_.on_event) options_.on_event();
}

void Agent::SettleLocked(Transfer& t, Status status) {
  t.settled = true;
  if (t.state == TransferState::kInProgress) return FinishLocked(t, std::move(status));
  // Ended early (cancel, stall deadline, peer dropped): now nothing of it can land any more.
  cv_.NotifyAll();
  if (options_.on_event) options_.on_event();
}

void Agent::FailPeerTransfersLocked(const std::string& peer, const Status& why) {
  std::vector<uint64_t> aborted;
  transfers_.ForEach([&](HandleBits h, Transfer& t) {
    mu_.AssertHeld();  // ForEach calls back synchronously, under the caller's lock
    if (t.peer != peer) return;
    // An eager frame already sent waits only for its ack, which cannot come now: settled.
    if (t.eager && t.eager_sent && !t.settled) {
      FinishLocked(t, why);
      SettleLocked(t, why);
      return;
    }
    if (t.state != TransferState::kInProgress) return;
    if (t.control) t.control->Abort();
    aborted.push_back((static_cast<uint64_t>(t.seq) << 32) | h.index);
    FinishLocked(t, why);
  });
  // Backend Abort never calls the sink synchronously, so it is safe under mu_.
  for (uint64_t token : aborted) backend_->Abort(token);
}

void Agent::DropPeerLocked(const std::string& name, Peer& peer, const Status& why, Drop how) {
  FailPeerTransfersLocked(name, why);
  const uint64_t connection = peer.alive ? peer.generation : 0;
  peer.alive = false;
  peer.failure = why;
  peer.dropped_here = how != Drop::kEvidence;
  peer.generation = next_peer_generation_++;
  if (peer.backend) {
    std::vector<std::shared_ptr<BackendRemoteRegion>> rr;
    for (auto& [idx, r] : peer.regions) rr.push_back(std::move(r.backend));
    peer.regions.clear();
    if (how == Drop::kFence) {
      fencing_[peer.backend.get()] = {name, connection};
      backend_->Fence(std::move(peer.backend), std::move(rr));
    } else {
      backend_->Disconnect(std::move(peer.backend), std::move(rr));
    }
    peer.backend.reset();
  }
}

Result<PeerLoadResult> Agent::LoadRemoteMetadata(std::span<const uint8_t> blob) {
  KVP_ASSIGN_OR_RETURN(AgentMetadata md, DecodeMetadata(blob));
  if (md.name == options_.name) return InvalidArgument("metadata: peer has this agent's own name");
  if (md.backend != backend_->caps().name)
    return InvalidArgument("metadata: peer '" + md.name + "' uses backend '" + md.backend +
                           "', this agent '" + backend_->caps().name + "'");
  PeerLoadResult result;
  std::shared_ptr<BackendPeer> bp;
  {
    MutexLock lock(mu_);
    auto retired = retired_incarnations_.find(md.name);
    if (retired != retired_incarnations_.end() && retired->second.count(md.incarnation))
      return FailedPrecondition("metadata: peer '" + md.name + "' incarnation " +
                                std::to_string(md.incarnation) + " is retired (it restarted)");
    auto it = peers_.find(md.name);
    if (it == peers_.end()) {
      result.new_peer = true;
    } else if (it->second.incarnation != md.incarnation) {
      result.restarted = true;
      result.previous_incarnation = it->second.incarnation;
      retired_incarnations_[md.name].insert(it->second.incarnation);
      DropPeerLocked(md.name, it->second,
                     PeerGone("peer '" + md.name + "' restarted (incarnation " +
                              std::to_string(it->second.incarnation) + " -> " +
                              std::to_string(md.incarnation) + ")"));
    } else if (it->second.alive && it->second.backend) {
      bp = it->second.backend;  // same incarnation: refresh the region table only
    }
  }
  if (!bp) {
    auto c = backend_->Connect(md.address);
    if (!c.ok()) return c.status().WithContext("connect to '" + md.name + "'");
    bp = std::move(c).value();
  }
  std::map<uint32_t, RemoteRegion> regions;
  for (RegionInfo& ri : md.regions) {
    auto rr = backend_->ImportRegion(bp.get(), ri.key, ri.base, ri.length);
    if (!rr.ok())
      return rr.status().WithContext("peer '" + md.name + "' region " +
                                     std::to_string(ri.id.index));
    uint32_t idx = ri.id.index;
    regions.emplace(idx, RemoteRegion{std::move(ri), std::move(rr).value()});
  }
  MutexLock lock(mu_);
  Peer& p = peers_[md.name];
  uint32_t restarts = p.restarts + (result.restarted ? 1 : 0);
  if (p.backend && p.backend != bp) {  // raced with another load: keep the newest connection
    std::vector<std::shared_ptr<BackendRemoteRegion>> rr;
    for (auto& [i, r] : p.regions) rr.push_back(std::move(r.backend));
    backend_->Disconnect(std::move(p.backend), std::move(rr));
  }
  bool same = p.backend == bp && p.alive;
  p.incarnation = md.incarnation;
  if (!same) p.generation = next_peer_generation_++;
  p.alive = true;
  p.dropped_here = false;
  p.failure = Status::Ok();
  p.restarts = restarts;
  p.backend = std::move(bp);
  p.regions = std::move(regions);
  return result;
}

Status Agent::InvalidatePeer(std::string_view peer, std::string_view reason) {
  MutexLock lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end())
    return NotFound("InvalidatePeer: unknown peer '" + std::string(peer) + "'");
  DropPeerLocked(it->first, it->second,
                 PeerGone("peer '" + std::string(peer) + "': " + std::string(reason)), Drop::kHere);
  return Status::Ok();
}

Result<PeerInfo> Agent::GetPeer(std::string_view peer) {
  MutexLock lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return NotFound("unknown peer '" + std::string(peer) + "'");
  const Peer& p = it->second;
  return PeerInfo{p.incarnation,
                  p.alive,
                  p.failure,
                  p.restarts,
                  p.regions.size(),
                  p.alive ? p.generation : 0,
                  !p.alive && p.dropped_here};
}

Status Agent::FencePeer(std::string_view peer, uint64_t connection, std::string_view reason) {
  if (!backend_->caps().fences_peers) {
    return Unimplemented("FencePeer: the " + backend_->caps().name +
                         " backend cannot fence a peer (a WRITE it issued could still land)");
  }
  MutexLock lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return NotFound("FencePeer: unknown peer '" + std::string(peer) + "'");
  Peer& p = it->second;
  if (!p.alive || p.generation != connection || !p.backend) return Status::Ok();
  DropPeerLocked(it->first, p,
                 PeerGone("peer '" + std::string(peer) + "' fenced: " + std::string(reason)),
                 Drop::kFence);
  return Status::Ok();
}

bool Agent::PeerFenced(std::string_view peer, uint64_t connection) {
  MutexLock lock(mu_);
  auto it = fenced_.find(peer);
  if (it == fenced_.end()) return false;
  return std::find(it->second.begin(), it->second.end(), connection) != it->second.end();
}

void Agent::OnPeerFenced(const BackendPeer* peer) {
  {
    MutexLock lock(mu_);
    auto it = fencing_.find(peer);
    if (it == fencing_.end()) return;
    auto& done = fenced_[it->second.first];
    done.push_back(it->second.second);
    if (done.size() > kFencedKept) done.pop_front();
    fencing_.erase(it);
    cv_.NotifyAll();
    if (options_.on_event) options_.on_event();
  }
}

// ---------------------------------------------------------------------------------------------
// Backend events

void Agent::OnPostDone(uint64_t token, Status status) {
  if (IsAckToken(token)) return OnAckPosted(static_cast<uint32_t>(token >> 32), std::move(status));
  HandleBits h{static_cast<uint32_t>(token & 0xffffffffu), 0};
  uint32_t seq = static_cast<uint32_t>(token >> 32);
  MutexLock lock(mu_);
  Transfer* t = transfers_.AtIndex(h.index);
  if (t == nullptr || t->seq != seq) return;  // released or re-posted since: stale completion
  PostEndedLocked(*t, std::move(status));
}

void Agent::PostEndedLocked(Transfer& t, Status status) {
  if (t.eager && status.ok()) {
    // The frame left; it is done (or, ended early, settled) once the target acknowledged the
    // copy, unless its peer was dropped meanwhile: then nothing more of it can arrive.
    auto pit = peers_.find(t.peer);
    const bool peer_kept =
        pit != peers_.end() && pit->second.alive && pit->second.generation == t.peer_generation;
    if (peer_kept) {
      t.eager_sent = true;
      return SettleEagerLocked(t);
    }
  }
  if (status.ok() && t.state == TransferState::kInProgress) {
    // Progress on the connection: transfers queued behind this one are not stalled.
    auto pit = peers_.find(t.peer);
    if (pit != peers_.end() && pit->second.generation == t.peer_generation) {
      pit->second.last_progress = SteadyClock::now();
    }
  }
  SettleLocked(t, std::move(status));
}

void Agent::OnMessage(std::span<const uint8_t> frame) {
  switch (PeekFrameKind(frame)) {
    case FrameKind::kEagerWrite:
      return OnEagerWrite(frame);
    case FrameKind::kEagerAck:
      return OnEagerAck(frame);
    case FrameKind::kNotification:
    case FrameKind::kUnknown:
      break;
  }
  auto n = DecodeNotificationFrame(frame, options_.max_notification_bytes);
  if (!n.ok()) return;  // malformed frames are dropped (counted in a later issue)
  MutexLock lock(mu_);
  auto retired = retired_incarnations_.find(n->peer);
  if (retired != retired_incarnations_.end() && retired->second.count(n->peer_incarnation)) return;
  auto it = peers_.find(n->peer);
  if (it != peers_.end() && it->second.incarnation != n->peer_incarnation) {
    // The sender restarted: everything of the old incarnation is void.
    retired_incarnations_[n->peer].insert(it->second.incarnation);
    Peer& p = it->second;
    DropPeerLocked(it->first, p,
                   PeerGone("peer '" + n->peer + "' restarted (notification from incarnation " +
                            std::to_string(n->peer_incarnation) + ")"));
    ++p.restarts;
    p.incarnation = n->peer_incarnation;
  }
  if (it != peers_.end() && it->second.alive) n->connection = it->second.generation;
  notifications_.push_back(std::move(n).value());
  cv_.NotifyAll();
  if (options_.on_event) options_.on_event();
}

void Agent::OnPeerError(const BackendPeer* peer, Status status) {
  MutexLock lock(mu_);
  for (auto& [name, p] : peers_) {
    if (p.backend.get() != peer) continue;
    DropPeerLocked(name, p, PeerGone("peer '" + name + "': " + status.ToString()));
    return;
  }
}

std::vector<Notification> Agent::TakeNotifications() {
  MutexLock lock(mu_);
  std::vector<Notification> out(std::make_move_iterator(notifications_.begin()),
                                std::make_move_iterator(notifications_.end()));
  notifications_.clear();
  return out;
}

std::vector<Notification> Agent::WaitNotifications(size_t min_count, TimePoint deadline) {
  MutexLock lock(mu_);
  while (notifications_.size() < min_count) {
    if (!cv_.WaitUntil(lock, deadline)) break;
  }
  std::vector<Notification> out(std::make_move_iterator(notifications_.begin()),
                                std::make_move_iterator(notifications_.end()));
  notifications_.clear();
  return out;
}

// ---------------------------------------------------------------------------------------------
// Stall watchdog: fails every transfer still in progress past its deadline.

void Agent::WatchdogLoop() {
  MutexLock lock(mu_);
  while (!stopping_) {
    TimePoint now = SteadyClock::now();
    TimePoint next = TimePoint::max();
    std::vector<uint64_t> expired;
    transfers_.ForEach([&](HandleBits h, Transfer& t) {
      mu_.AssertHeld();  // ForEach calls back synchronously, under the caller's lock
      if (t.state != TransferState::kInProgress) return;
      auto pit = peers_.find(t.peer);
      if (pit != peers_.end() && pit->second.generation == t.peer_generation) {
        t.deadline = std::max(t.deadline, pit->second.last_progress + options_.stall_timeout);
      }
      if (t.deadline <= now) {
        bool before_notify = t.control == nullptr || t.control->Abort();
        expired.push_back((static_cast<uint64_t>(t.seq) << 32) | h.index);
        FinishLocked(t,
                     DeadlineExceeded("transfer to peer '" + t.peer + "' not complete within the " +
                                      std::to_string(options_.stall_timeout.count()) +
                                      " ms stall deadline (plus its bytes' time at " +
                                      std::to_string(options_.stall_floor_bytes_per_s / 1000000) +
                                      " MB/s; no post to this peer completed meanwhile)" +
                                      (before_notify ? " (notification not sent)"
                                                     : " (notification may have been sent)")));
      } else if (t.deadline < next) {
        next = t.deadline;
      }
    });
    for (uint64_t token : expired) backend_->Abort(token);
    std::vector<std::pair<uint32_t, PendingAck>> due = DueAcksLocked(now, &next);
    if (!due.empty()) {
      lock.Unlock();  // PostAck may report a refusal at once (OnAckPosted takes mu_)
      for (auto& [id, ack] : due) PostAck(id, std::move(ack));
      lock.Lock();
      continue;  // look again: a post refused at once has set its next retry
    }
    if (next == TimePoint::max()) {
      watchdog_idle_ = true;
      watchdog_cv_.Wait(lock);
      watchdog_idle_ = false;
    } else {
      watchdog_cv_.WaitUntil(lock, next);
    }
  }
}

}  // namespace kvpush::xfer
