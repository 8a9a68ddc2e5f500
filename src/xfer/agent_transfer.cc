// Agent: prepared descriptor lists and transfers (validation, coalescing, posting, status).
#include <algorithm>
#include <optional>

#include "xfer/agent.h"
#include "xfer/notification_frame.h"

namespace kvpush::xfer {
namespace {

template <typename E>
void Coalesce(std::vector<E>* runs, const E& e) {
  if (!runs->empty()) {
    E& last = runs->back();
    if (last.region == e.region && last.backend == e.backend && last.addr + last.length == e.addr) {
      last.length += e.length;
      return;
    }
  }
  runs->push_back(e);
}

uint64_t Token(HandleBits h, uint32_t seq) {
  return (static_cast<uint64_t>(seq) << 32) | h.index;
}

/// The batch of a post that moves no RMA op (an eager frame travels as its notification).
std::shared_ptr<const OpBatch> EmptyBatch() {
  static const auto empty = std::make_shared<const OpBatch>();
  return empty;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Lists

Result<ListHandle> Agent::PrepareLocal(std::span<const Desc> descs) {
  if (descs.empty()) return InvalidArgument("PrepareLocal: empty descriptor list");
  List list;
  list.entries.reserve(descs.size());
  MutexLock lock(mu_);
  for (size_t i = 0; i < descs.size(); ++i) {
    const Desc& d = descs[i];
    Region* r = regions_.Find(d.region);
    if (r == nullptr)
      return NotFound("PrepareLocal: descriptor " + std::to_string(i) + ": no local region " +
                      std::to_string(d.region.index) + "/" + std::to_string(d.region.generation));
    if (d.length == 0)
      return InvalidArgument("PrepareLocal: descriptor " + std::to_string(i) + ": zero length");
    if (d.offset > r->length || d.length > r->length - d.offset)
      return OutOfRange("PrepareLocal: descriptor " + std::to_string(i) + ": [" +
                        std::to_string(d.offset) + ", +" + std::to_string(d.length) +
                        ") outside region of " + std::to_string(r->length) + " bytes");
    Entry e{reinterpret_cast<uintptr_t>(r->addr) + d.offset, d.length, d.region.index,
            r->backend.get()};
    list.entries.push_back(e);
    Coalesce(&list.runs, e);
    list.bytes += d.length;
    if (std::find(list.local_regions.begin(), list.local_regions.end(), d.region.index) ==
        list.local_regions.end())
      list.local_regions.push_back(d.region.index);
  }
  for (uint32_t idx : list.local_regions) ++regions_.AtIndex(idx)->list_refs;
  return ListHandle{lists_.Insert(std::move(list))};
}

Result<ListHandle> Agent::PrepareRemote(std::string_view peer, std::span<const Desc> descs) {
  if (descs.empty()) return InvalidArgument("PrepareRemote: empty descriptor list");
  const bool va = backend_->caps().addressing == AddressMode::kVirtualAddress;
  List list;
  list.remote = true;
  list.peer = std::string(peer);
  list.entries.reserve(descs.size());
  MutexLock lock(mu_);
  auto it = peers_.find(peer);
  if (it == peers_.end()) return NotFound("PrepareRemote: unknown peer '" + list.peer + "'");
  Peer& p = it->second;
  if (!p.alive) return p.failure.ok() ? PeerGone("peer '" + list.peer + "' is gone") : p.failure;
  list.peer_generation = p.generation;
  const RemoteRegion* cached = nullptr;
  for (size_t i = 0; i < descs.size(); ++i) {
    const Desc& d = descs[i];
    if (cached == nullptr || cached->info.id.index != d.region.index) {
      auto rit = p.regions.find(d.region.index);
      cached = rit == p.regions.end() ? nullptr : &rit->second;
      if (cached != nullptr && std::find(list.keepalive.begin(), list.keepalive.end(),
                                         cached->backend) == list.keepalive.end())
        list.keepalive.push_back(cached->backend);
    }
    if (cached == nullptr || cached->info.id.generation != d.region.generation)
      return NotFound("PrepareRemote: descriptor " + std::to_string(i) + ": peer '" + list.peer +
                      "' has no region " + std::to_string(d.region.index) + "/" +
                      std::to_string(d.region.generation));
    const uint64_t len = cached->info.length;
    if (d.length == 0)
      return InvalidArgument("PrepareRemote: descriptor " + std::to_string(i) + ": zero length");
    if (d.offset > len || d.length > len - d.offset)
      return OutOfRange("PrepareRemote: descriptor " + std::to_string(i) + ": [" +
                        std::to_string(d.offset) + ", +" + std::to_string(d.length) +
                        ") outside peer '" + list.peer + "' region of " + std::to_string(len) +
                        " bytes");
    Entry e{(va ? cached->info.base : 0) + d.offset, d.length, d.region.index,
            cached->backend.get()};
    list.entries.push_back(e);
    Coalesce(&list.runs, e);
    list.bytes += d.length;
  }
  return ListHandle{lists_.Insert(std::move(list))};
}

Result<ListInfo> Agent::GetListInfo(ListHandle h) {
  MutexLock lock(mu_);
  List* l = lists_.Find(h);
  if (l == nullptr) return NotFound("no prepared list " + std::to_string(h.index));
  return ListInfo{l->entries.size(), l->runs.size(), l->bytes};
}

Status Agent::ReleaseList(ListHandle h) {
  MutexLock lock(mu_);
  List* l = lists_.Find(h);
  if (l == nullptr) return NotFound("ReleaseList: no prepared list " + std::to_string(h.index));
  for (uint32_t idx : l->local_regions) --regions_.AtIndex(idx)->list_refs;
  lists_.Erase(h);
  return Status::Ok();
}

Result<std::vector<Agent::Entry>> Agent::SelectRunsLocked(const List& list,
                                                          const std::vector<uint32_t>& idx,
                                                          const char* side) {
  if (idx.empty()) return list.runs;
  std::vector<Entry> runs;
  runs.reserve(idx.size());
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i] >= list.entries.size())
      return OutOfRange(std::string("CreateTransfer: ") + side + " index #" + std::to_string(i) +
                        " = " + std::to_string(idx[i]) + " >= list size " +
                        std::to_string(list.entries.size()));
    Coalesce(&runs, list.entries[idx[i]]);
  }
  return runs;
}

// ---------------------------------------------------------------------------------------------
// Transfers

Result<TransferHandle> Agent::CreateTransfer(const TransferSpec& spec) {
  const BackendCaps& caps = backend_->caps();
  if ((spec.op == Op::kRead && !caps.read) || (spec.op == Op::kWrite && !caps.write))
    return Unimplemented("CreateTransfer: backend '" + caps.name + "' does not support " +
                         (spec.op == Op::kRead ? "READ" : "WRITE"));
  if (spec.notification.size() > options_.max_notification_bytes)
    return InvalidArgument("CreateTransfer: notification of " +
                           std::to_string(spec.notification.size()) + " bytes > limit " +
                           std::to_string(options_.max_notification_bytes));
  MutexLock lock(mu_);
  List* local = lists_.Find(spec.local);
  List* remote = lists_.Find(spec.remote);
  if (local == nullptr || remote == nullptr)
    return NotFound("CreateTransfer: no such prepared list");
  if (local->remote || !remote->remote)
    return InvalidArgument("CreateTransfer: needs a local list and a remote list");
  auto pit = peers_.find(remote->peer);
  if (pit == peers_.end() || pit->second.generation != remote->peer_generation ||
      !pit->second.alive)
    return PeerGone("CreateTransfer: remote list is stale: peer '" + remote->peer +
                    "' restarted, failed or was invalidated");
  KVP_ASSIGN_OR_RETURN(auto lruns, SelectRunsLocked(*local, spec.local_indices, "local"));
  KVP_ASSIGN_OR_RETURN(auto rruns, SelectRunsLocked(*remote, spec.remote_indices, "remote"));
  auto batch = std::make_shared<OpBatch>();
  batch->ops.reserve(std::max(lruns.size(), rruns.size()));
  Transfer t;
  const bool va = caps.addressing == AddressMode::kVirtualAddress;
  const uint64_t eager_limit = std::min(caps.eager_write_max_bytes, options_.eager_write_max_bytes);
  bool eager_possible = spec.op == Op::kWrite && !spec.notification.empty() && eager_limit > 0;
  size_t li = 0, ri = 0;
  uint64_t loff = 0, roff = 0;
  while (li < lruns.size() && ri < rruns.size()) {
    const Entry& l = lruns[li];
    const Entry& r = rruns[ri];
    uint64_t n = std::min(l.length - loff, r.length - roff);
    batch->ops.push_back(XferOp{l.addr + loff, r.addr + roff, n,
                                static_cast<const BackendRegion*>(l.backend),
                                static_cast<const BackendRemoteRegion*>(r.backend)});
    // The same bytes as the target's (region, offset) ranges, for an eager frame.
    eager_possible = eager_possible && batch->total_bytes + n <= eager_limit &&
                     AddEagerRange(pit->second, r, roff, n, va, &t.eager_ranges);
    batch->total_bytes += n;
    loff += n;
    roff += n;
    if (loff == l.length) ++li, loff = 0;
    if (roff == r.length) ++ri, roff = 0;
  }
  if (li != lruns.size() || ri != rruns.size())
    return InvalidArgument("CreateTransfer: local and remote selections differ in total bytes");
  t.op = spec.op;
  t.peer = remote->peer;
  t.peer_generation = remote->peer_generation;
  t.backend_peer = pit->second.backend;
  t.target_incarnation = pit->second.incarnation;
  t.batch = std::move(batch);
  if (!spec.notification.empty())
    t.notification_frame =
        EncodeNotificationFrame(options_.name, options_.incarnation, spec.notification);
  t.eager = eager_possible && EagerFits(t, spec.notification.size());
  if (t.eager) {
    t.eager_notification = spec.notification;
  } else {
    t.eager_ranges.clear();
  }
  return TransferHandle{transfers_.Insert(std::move(t))};
}

Result<TransferHandle> Agent::CreateNotification(std::string_view peer,
                                                 std::span<const uint8_t> payload) {
  if (payload.size() > options_.max_notification_bytes)
    return InvalidArgument("CreateNotification: payload of " + std::to_string(payload.size()) +
                           " bytes > limit " + std::to_string(options_.max_notification_bytes));
  MutexLock lock(mu_);
  auto pit = peers_.find(peer);
  if (pit == peers_.end())
    return NotFound("CreateNotification: unknown peer '" + std::string(peer) + "'");
  if (!pit->second.alive)
    return PeerGone("CreateNotification: peer '" + std::string(peer) + "' is gone");
  Transfer t;
  t.peer = pit->first;
  t.peer_generation = pit->second.generation;
  t.backend_peer = pit->second.backend;
  t.batch = std::make_shared<OpBatch>();
  t.notification_frame = EncodeNotificationFrame(options_.name, options_.incarnation, payload);
  return TransferHandle{transfers_.Insert(std::move(t))};
}

Result<size_t> Agent::TransferOpCount(TransferHandle h) {
  MutexLock lock(mu_);
  Transfer* t = transfers_.Find(h);
  if (t == nullptr) return NotFound("no transfer " + std::to_string(h.index));
  return t->batch->ops.size();
}

Status Agent::Post(TransferHandle h) {
  PostRequest req;
  std::optional<EagerParts> eager;
  {
    MutexLock lock(mu_);
    Transfer* t = transfers_.Find(h);
    if (t == nullptr) return NotFound("Post: no transfer " + std::to_string(h.index));
    if (t->state == TransferState::kInProgress)
      return FailedPrecondition("Post: transfer already in progress");
    auto pit = peers_.find(t->peer);
    if (pit == peers_.end() || pit->second.generation != t->peer_generation || !pit->second.alive) {
      Status why = (pit != peers_.end() && !pit->second.failure.ok())
                       ? pit->second.failure
                       : PeerGone("Post: peer '" + t->peer + "' restarted or was invalidated");
      return why;
    }
    if (!t->settled)
      return FailedPrecondition("Post: the previous post of this transfer may still land");
    if (++post_seq_ == 0) ++post_seq_;
    t->seq = post_seq_;
    t->state = TransferState::kInProgress;
    t->error = Status::Ok();
    t->settled = false;
    t->deadline = SteadyClock::now() + options_.stall_timeout + TimeAtStallFloor(*t);
    // Reuse the control block when no earlier post still holds it (saves an allocation on the
    // small-post path); copies are only made here, under mu_, so a count of 1 cannot grow.
    if (t->control != nullptr && t->control.use_count() == 1) {
      t->control->state.store(PostControl::kPending, std::memory_order_relaxed);
    } else {
      t->control = std::make_shared<PostControl>();
    }
    ++in_progress_;
    req.token = Token(h, t->seq);
    req.op = t->op;
    req.peer = t->backend_peer;
    req.control = t->control;
    if (t->eager) {
      // One message: the data and the notification (agent_eager.cc); the ack settles it.
      t->eager_sent = t->eager_acked = false;
      t->eager_ack_status = Status::Ok();
      req.batch = EmptyBatch();
      eager = EagerParts{t->batch, t->eager_ranges, t->eager_notification, t->target_incarnation};
    } else {
      req.batch = t->batch;
      req.notification = t->notification_frame;
    }
    if (watchdog_idle_) watchdog_cv_.NotifyOne();
  }
  const uint64_t token = req.token;
  if (eager) req.notification = EagerFrame(*eager, token);  // copies the data: outside mu_
  // Caller-thread fast path first (small posts on an idle backend finish here, without waking a
  // progress thread); otherwise the backend's thread issues it.
  Status inline_status;
  const InlinePost taken = backend_->TryPostInline(req, &inline_status);
  if (taken == InlinePost::kAccepted) return Status::Ok();
  if (taken == InlinePost::kDone) {
    MutexLock lock(mu_);
    Transfer* t = transfers_.AtIndex(h.index);
    if (t != nullptr && Token(h, t->seq) == token) PostEndedLocked(*t, inline_status);
    return Status::Ok();  // the transfer's status carries any error, as for a later failure
  }
  Status s = backend_->Post(std::move(req));
  if (!s.ok()) {
    MutexLock lock(mu_);
    Transfer* t = transfers_.AtIndex(h.index);
    // Never started: the backend reports nothing.
    if (t != nullptr && Token(h, t->seq) == token) SettleLocked(*t, s);
  }
  return s;
}

Result<TransferStatus> Agent::GetStatus(TransferHandle h) {
  MutexLock lock(mu_);
  Transfer* t = transfers_.Find(h);
  if (t == nullptr) return NotFound("GetStatus: no transfer " + std::to_string(h.index));
  return TransferStatus{t->state, t->error, t->settled};
}

std::chrono::nanoseconds Agent::TimeAtStallFloor(const Transfer& t) const {
  if (options_.stall_floor_bytes_per_s == 0 || t.batch == nullptr) return {};
  const double s = static_cast<double>(t.batch->total_bytes) /
                   static_cast<double>(options_.stall_floor_bytes_per_s);
  return std::chrono::nanoseconds(static_cast<int64_t>(s * 1e9));
}

Result<TransferStatus> Agent::Wait(TransferHandle h, TimePoint deadline) {
  if (options_.wait_spin_us > 0) {
    uint64_t seen = finished_.load(std::memory_order_acquire);
    {
      MutexLock lock(mu_);
      Transfer* t = transfers_.Find(h);
      if (t == nullptr) return NotFound("Wait: no transfer " + std::to_string(h.index));
      if (t->state != TransferState::kInProgress)
        return TransferStatus{t->state, t->error, t->settled};
    }
    const int64_t spin_end = NowNs() + int64_t{options_.wait_spin_us} * 1000;
    while (finished_.load(std::memory_order_acquire) == seen && NowNs() < spin_end) {
      backend_->ProgressCaller();  // mu_ is not held: completions may call OnPostDone here
    }
  }
  MutexLock lock(mu_);
  Transfer* t = transfers_.Find(h);
  if (t == nullptr) return NotFound("Wait: no transfer " + std::to_string(h.index));
  while (t != nullptr && t->state == TransferState::kInProgress) {
    const bool woken = cv_.WaitUntil(lock, deadline);
    t = transfers_.Find(h);
    if (!woken) break;
  }
  if (t == nullptr) return NotFound("Wait: transfer released while waiting");
  return TransferStatus{t->state, t->error, t->settled};
}

Status Agent::Cancel(TransferHandle h) {
  MutexLock lock(mu_);
  Transfer* t = transfers_.Find(h);
  if (t == nullptr) return NotFound("Cancel: no transfer " + std::to_string(h.index));
  if (t->state != TransferState::kInProgress)
    return FailedPrecondition(std::string("Cancel: transfer is ") + TransferStateName(t->state));
  if (!t->control->Abort())
    return FailedPrecondition("Cancel: too late, the notification is already committed");
  FinishLocked(*t, Cancelled("transfer to peer '" + t->peer + "' cancelled by caller"));
  backend_->Abort(Token(h, t->seq));
  return Status::Ok();
}

Status Agent::ReleaseTransfer(TransferHandle h) {
  MutexLock lock(mu_);
  Transfer* t = transfers_.Find(h);
  if (t == nullptr) return NotFound("ReleaseTransfer: no transfer " + std::to_string(h.index));
  if (t->state == TransferState::kInProgress) {
    t->control->Abort();
    backend_->Abort(Token(h, t->seq));
    FinishLocked(*t, Cancelled("released"));
  }
  transfers_.Erase(h);
  return Status::Ok();
}

}  // namespace kvpush::xfer
