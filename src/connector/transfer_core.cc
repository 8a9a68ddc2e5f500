// TransferCore: dispatch of inputs, messages and transfers, tombstones and timers. The producer
// and consumer tables live in transfer_core_producer.cc / transfer_core_consumer.cc.
#include "connector/transfer_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/log.h"
#include "pd/ids.h"

namespace kvpush::connector {

using namespace std::chrono_literals;
using Mode = pd::KvTransferParams::Mode;

const char* ProducerStateName(ProducerState s) {
  switch (s) {
    case ProducerState::kPrefilling:
      return "prefilling";
    case ProducerState::kHeld:
      return "held";
    case ProducerState::kPinned:
      return "pinned";
    case ProducerState::kReadyPosted:
      return "ready_posted";
    case ProducerState::kDropping:
      return "dropping";
  }
  return "?";
}

const char* ConsumerStateName(ConsumerState s) {
  switch (s) {
    case ConsumerState::kAwaitingKv:
      return "awaiting_kv";
    case ConsumerState::kPinSent:
      return "pin_sent";
    case ConsumerState::kReadHanded:
      return "read_handed";
    case ConsumerState::kReading:
      return "reading";
    case ConsumerState::kCancelling:
      return "cancelling";
    case ConsumerState::kQuarantined:
      return "quarantined";
  }
  return "?";
}

TransferCore::TransferCore(KvTransferConfig config, KvLayout layout,
                           std::span<const std::byte> arena, const Clock& clock,
                           const PeerDirectory& peers, CoreActions& actions)
    : config_(std::move(config)),
      layout_(layout),
      arena_(arena),
      clock_(clock),
      peers_(peers),
      actions_(actions) {}

uint32_t TransferCore::EntryIndex(int32_t num_blocks, int32_t layer, KvKind kind, BlockId block) {
  return static_cast<uint32_t>((layer * 2 + static_cast<int32_t>(kind)) * num_blocks + block);
}

bool TransferCore::busy() const {
  return !producers_.empty() || !consumers_.empty() || !pending_targets_.empty();
}

bool TransferCore::wants_layer_events() const {
  if (!pending_targets_.empty()) return true;
  return std::any_of(producers_.begin(), producers_.end(), [](const auto& kv) {
    const Producer& p = kv.second;
    return p.targeted() && !p.engine_done && p.state == ProducerState::kPrefilling;
  });
}

std::vector<TransferToken> TransferCore::OutstandingTokens() const {
  std::vector<TransferToken> out;
  out.reserve(outstanding_.size());
  for (const auto& [token, o] : outstanding_) out.push_back(token);
  return out;
}

ConnectorStats TransferCore::stats() const {
  ConnectorStats s = stats_;
  s.producers_active = static_cast<int64_t>(producers_.size());
  s.consumers_waiting = static_cast<int64_t>(consumers_.size());
  for (const auto& [tid, c] : consumers_) {
    if (c.state != ConsumerState::kQuarantined) continue;
    ++s.consumers_quarantined;
    s.blocks_quarantined += c.num_blocks;
  }
  return s;
}

std::optional<ProducerState> TransferCore::producer_state(const std::string& tid) const {
  auto it = producers_.find(tid);
  if (it == producers_.end()) return std::nullopt;
  return it->second.state;
}

std::optional<ConsumerState> TransferCore::consumer_state(const std::string& tid) const {
  auto it = consumers_.find(tid);
  if (it == consumers_.end()) return std::nullopt;
  return it->second.state;
}

std::string TransferCore::PeerOf(const pd::KvTransferParams& p) const {
  if (!p.remote_engine_id.empty()) return p.remote_engine_id;
  return peers_.EngineIdAt(p.remote_host, p.remote_port);
}

// ---------------------------------------------------------------------------------------------
// Inputs

std::string_view TransferCore::RequestIdOf(const std::string& tid) const {
  if (auto p = producers_.find(tid); p != producers_.end()) return p->second.request_id;
  if (auto c = consumers_.find(tid); c != consumers_.end()) return c->second.request_id;
  return {};
}

std::string_view TransferCore::RequestIdOf(const EngineEvent& ev) const {
  if (const auto* e = std::get_if<ProducerStartEvent>(&ev)) return e->request_id;
  if (const auto* e = std::get_if<ConsumerStartEvent>(&ev)) return e->request_id;
  if (const auto* e = std::get_if<ProducerDoneEvent>(&ev)) {
    auto s = producer_by_seq_.find(e->seq_id);
    return s == producer_by_seq_.end() ? std::string_view() : RequestIdOf(s->second);
  }
  if (const auto* e = std::get_if<ConsumerAbortEvent>(&ev)) return RequestIdOf(e->transfer_id);
  if (const auto* e = std::get_if<ConsumerBlocksEvent>(&ev)) return RequestIdOf(e->transfer_id);
  if (const auto* e = std::get_if<ReadPostedEvent>(&ev)) return RequestIdOf(e->transfer_id);
  if (const auto* e = std::get_if<AbortTransferEvent>(&ev)) return RequestIdOf(e->transfer_id);
  return {};  // steps and layers (several requests: OnLayer names each), status answers
}

void TransferCore::HandleEvent(EngineEvent ev) {
  // Copied: the event's handling may erase the transfer that owns the id.
  LogRequestScope scope(RequestIdOf(ev));
  struct Dispatch {
    TransferCore& core;
    void operator()(ProducerStartEvent& e) const { core.OnProducerStart(e); }
    void operator()(StepEvent& e) const { core.OnStep(e); }
    void operator()(LayerEvent& e) const { core.OnLayer(e.layer); }
    void operator()(ProducerDoneEvent& e) const { core.OnProducerDone(e); }
    void operator()(ConsumerStartEvent& e) const { core.OnConsumerStart(e); }
    void operator()(ConsumerBlocksEvent& e) const { core.OnConsumerBlocks(e); }
    void operator()(ReadPostedEvent& e) const { core.OnReadPosted(e); }
    void operator()(ConsumerNotNeededEvent& e) const {
      core.OnNotNeededOrRejected(e.params, false);
    }
    void operator()(ConsumerRejectedEvent& e) const { core.OnNotNeededOrRejected(e.params, true); }
    void operator()(ConsumerAbortEvent& e) const { core.OnConsumerAbort(e); }
    void operator()(AbortTransferEvent& e) const { core.OnAbortTransfer(e.transfer_id); }
    void operator()(TransferStatusEvent& e) const { core.OnTransferStatus(e); }
  };
  std::visit(Dispatch{*this}, ev);
}

void TransferCore::OnNotNeededOrRejected(const pd::KvTransferParams& params, bool rejected) {
  // Nothing will be read or targeted: P may drop the prefill (push) or free the lease (pull).
  const bool pull = params.mode == Mode::kPull;
  const std::string peer = PeerOf(params);
  if (!peer.empty() && peers_.Find(peer)) {
    if (pull) {
      SendSignal(peer, MsgTag::kRelease, params.transfer_id);
    } else if (rejected) {
      SendFailure(peer, params.transfer_id, StatusCode::kFailedPrecondition,
                  "the decode instance refused the request");
    } else {
      SendSignal(peer, MsgTag::kNotNeeded, params.transfer_id);
    }
  }
  if (!rejected) ++stats_.not_needed;
}

void TransferCore::HandleMessage(const std::string& peer, std::span<const uint8_t> payload,
                                 uint64_t connection) {
  if (auth_ != nullptr) {
    auto opened = auth_->Open(peer, payload);  // a refusal is counted and logged there
    if (!opened.ok()) return;
    payload = *opened;
  }
  auto m = DecodeMessage(payload);
  if (!m.ok()) {
    spdlog::warn("kv connector: dropped a malformed message from '{}': {}", peer,
                 m.status().message());
    ++stats_.bad_messages;
    return;
  }
  HandleDecoded(peer, *m, connection);
}

HandoffRecord* TransferCore::TimelineOf(const std::string& tid) {
  if (auto p = producers_.find(tid); p != producers_.end()) return &p->second.timeline;
  if (auto c = consumers_.find(tid); c != consumers_.end()) return &c->second.timeline;
  return nullptr;
}

void TransferCore::HandleDecoded(const std::string& peer, PdMessage& m, uint64_t connection) {
  LogRequestScope scope(RequestIdOf(m.transfer_id));
  arrived_on_ = connection;
  if (HandoffRecord* r = TimelineOf(m.transfer_id)) ++r->messages_received;
  switch (m.tag) {
    case MsgTag::kPushTarget:
    case MsgTag::kNotNeeded:
    case MsgTag::kCancel:
    case MsgTag::kRelease:
    case MsgTag::kPin:
      OnProducerMessage(peer, m);
      break;
    case MsgTag::kKvReady:
    case MsgTag::kCancelAck:
    case MsgTag::kPinned:
    case MsgTag::kLayerReady:
      OnConsumerMessage(peer, m);
      break;
    case MsgTag::kTransferFailed:
      // Either side may send it: route by who knows the transfer id.
      if (consumers_.count(m.transfer_id) != 0) {
        OnConsumerMessage(peer, m);
      } else {
        OnProducerMessage(peer, m);
      }
      break;
  }
}

void TransferCore::OnTransferDone(TransferToken token, const xfer::TransferStatus& s) {
  auto it = outstanding_.find(token);
  if (it == outstanding_.end()) return;
  const Outstanding o = std::move(it->second);
  outstanding_.erase(it);
  LogRequestScope scope(RequestIdOf(o.tid));
  if (s.state != xfer::TransferState::kDone) ++stats_.transfers_failed;
  switch (o.kind) {
    case XferKind::kWrite:
    case XferKind::kReady:
      OnProducerTransferDone(o, s);
      break;
    case XferKind::kRead:
      OnConsumerTransferDone(o, s);
      break;
    case XferKind::kMessage:
      if (s.state != xfer::TransferState::kDone) {
        ++stats_.messages_failed;
        spdlog::warn("kv connector: message for transfer {} failed: {}", o.tid, s.error.ToString());
        auto c = consumers_.find(o.tid);
        if (c != consumers_.end()) OnConsumerMessageFailed(c->second, s.error);
      }
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Actions

bool TransferCore::PostTracked(const TransferOrder& order, const std::string& tid, XferKind kind,
                               uint64_t bytes, Status* error) {
  const int64_t start_ns = clock_.NowNanos();
  auto t = actions_.PostTransfer(order);
  if (!t.ok()) {
    *error = t.status();
    return false;
  }
  outstanding_[*t] = Outstanding{tid, kind, bytes};
  stats_.descriptors_posted += static_cast<int64_t>(order.local_indices.size());
  NoteKvOpPosted(tid, kind, order, clock_.NowNanos() - start_ns);
  return true;
}

void TransferCore::NoteKvOpPosted(const std::string& tid, XferKind kind, const TransferOrder& order,
                                  int64_t post_ns) {
  HandoffRecord* r = nullptr;
  if (kind == XferKind::kWrite) {
    auto it = producers_.find(tid);
    if (it != producers_.end()) r = &it->second.timeline;
  } else if (kind == XferKind::kRead) {
    auto it = consumers_.find(tid);
    if (it != consumers_.end()) r = &it->second.timeline;
  }
  if (r == nullptr) return;
  const auto n = static_cast<int64_t>(order.local_indices.size());
  r->descriptors += n;
  r->bytes += n * static_cast<int64_t>(layout_.chunk_bytes());
  r->post_ns += post_ns;
}

void TransferCore::SendMessage(const std::string& peer, const PdMessage& m) {
  if (!pd::IsValidTransferId(m.transfer_id)) return;  // a locally dropped duplicate: nobody to tell
  auto t = actions_.SendMessage(peer, m);
  if (!t.ok()) {
    ++stats_.messages_failed;
    spdlog::warn("kv connector: cannot send to '{}': {}", peer, t.status().ToString());
    return;
  }
  outstanding_[*t] = Outstanding{m.transfer_id, XferKind::kMessage, 0};
  if (HandoffRecord* r = TimelineOf(m.transfer_id)) ++r->messages_sent;
}

void TransferCore::SendSignal(const std::string& peer, MsgTag tag, const std::string& tid) {
  PdMessage m;
  m.tag = tag;
  m.transfer_id = tid;
  SendMessage(peer, m);
}

void TransferCore::SendFailure(const std::string& peer, const std::string& tid, StatusCode code,
                               const std::string& why) {
  PdMessage m;
  m.tag = MsgTag::kTransferFailed;
  m.transfer_id = tid;
  m.code = static_cast<uint8_t>(code);
  m.message = why;
  SendMessage(peer, m);
}

void TransferCore::CancelOutstanding(const std::string& tid, XferKind kind) {
  for (const auto& [token, o] : outstanding_) {
    if (o.tid == tid && o.kind == kind) actions_.Cancel(token);
  }
}

// ---------------------------------------------------------------------------------------------
// Tombstones and timers

void TransferCore::Tombstone(const std::string& tid) {
  const TimePoint until =
      clock_.Now() + std::max<std::chrono::milliseconds>(config_.lease * 2, 60s);
  if (tombstones_.emplace(tid, until).second) tombstone_order_.emplace_back(until, tid);
}

bool TransferCore::IsTombstoned(const std::string& tid) const {
  return tombstones_.count(tid) != 0;
}

void TransferCore::Tick() {
  const TimePoint now = clock_.Now();
  if (now < next_timer_check_) return;
  next_timer_check_ = now + 10ms;
  ExpireTimers(now);
  CheckConsumerTimers(now);
  QueryQuarantines(now);
}

void TransferCore::ExpireTimers(TimePoint now) {
  while (!tombstone_order_.empty() && tombstone_order_.front().first <= now) {
    tombstones_.erase(tombstone_order_.front().second);
    tombstone_order_.pop_front();
  }
  for (auto it = pending_targets_.begin(); it != pending_targets_.end();) {
    if (it->second.expiry > now) {
      ++it;
      continue;
    }
    SendFailure(it->second.peer, it->first, StatusCode::kDeadlineExceeded,
                it->second.partial() ? "the push target's last parts never arrived at P"
                                     : "the prefill request for this transfer never arrived at P");
    Tombstone(it->first);
    it = pending_targets_.erase(it);
  }
  // Producers: leases.
  std::vector<std::string> expired;
  for (auto& [tid, p] : producers_) {
    if (p.engine_done && !p.released && p.lease_deadline <= now && p.outstanding == 0) {
      expired.push_back(tid);
    }
  }
  for (const auto& tid : expired) {
    Producer& p = producers_.at(tid);
    LogRequestScope scope(p.request_id);
    spdlog::warn("kv connector: lease of transfer {} expired after {} ms{}; blocks freed", tid,
                 config_.lease.count(),
                 p.targeted() ? " waiting for the rest of the push target" : "");
    ++stats_.leases_expired;
    DropProducer(p, DeadlineExceeded("lease expired"), p.targeted());
  }
}

uint64_t TransferCore::ConnectionTo(const std::string& peer) const {
  auto view = peers_.Find(peer);
  return view ? view->connection : 0;
}

bool TransferCore::ReadOutstanding(const std::string& tid) const {
  return std::any_of(outstanding_.begin(), outstanding_.end(), [&](const auto& kv) {
    return kv.second.kind == XferKind::kRead && kv.second.tid == tid;
  });
}

bool TransferCore::WriteOutstanding(const std::string& tid) const {
  return std::any_of(outstanding_.begin(), outstanding_.end(), [&](const auto& kv) {
    const XferKind k = kv.second.kind;
    return (k == XferKind::kWrite || k == XferKind::kReady) && kv.second.tid == tid;
  });
}

void TransferCore::QueryQuarantines(TimePoint now) {
  // Over HTTP, which a P answers while it lives even when its transfer engine cannot post (its
  // CANCEL_ACKs never leave). Not with --kv-auth-key-file: the answer is not authenticated, and
  // a forged "settled" would release blocks a live P may still write (docs/pd_protocol.md §5).
  if (auth_ != nullptr) return;
  std::unordered_map<std::string, std::vector<Consumer*>> due;
  for (auto& [tid, c] : consumers_) {
    if (c.state != ConsumerState::kQuarantined || c.mode != Mode::kPush || c.peer_port <= 0 ||
        now < c.next_query || status_in_flight_.count(c.peer) != 0) {
      continue;
    }
    if (due[c.peer].size() < kMaxStatusTransfers) due[c.peer].push_back(&c);
  }
  for (auto& [peer, cs] : due) {
    TransferStatusQuery q;  // engine_id: the shell's own
    for (Consumer* c : cs) {
      q.transfer_ids.push_back(c->tid);
      c->next_query = now + c->query_backoff;
      // Asked at least every broken_peer_ms / 2: a P that was stopped or cut off and answers
      // again is heard from soon, not after a long backoff.
      c->query_backoff =
          std::min(c->query_backoff * 2, std::max(config_.cancel_ack, config_.broken_peer / 2));
    }
    status_in_flight_[peer] = true;
    ++stats_.status_queries;
    actions_.QueryTransferStatus(peer, cs.front()->peer_host, cs.front()->peer_port, std::move(q));
  }
}

void TransferCore::OnTransferStatus(TransferStatusEvent& ev) {
  status_in_flight_.erase(ev.peer);
  if (!ev.answer.ok()) {
    spdlog::info("kv connector: '{}' did not answer the status of {} quarantined transfer(s): {}",
                 ev.peer, ev.query.transfer_ids.size(), ev.answer.status().ToString());
    return;
  }
  for (const auto& [tid, settled] : ev.answer->settled) {
    auto it = consumers_.find(tid);
    if (!settled || it == consumers_.end()) continue;
    Consumer& c = it->second;
    LogRequestScope scope(c.request_id);
    const bool waiting =
        c.state == ConsumerState::kQuarantined || c.state == ConsumerState::kCancelling;
    if (c.peer != ev.peer || c.mode != Mode::kPush || !waiting) continue;
    // P cancelled it and none of its WRITEs can land any more: a CANCEL_ACK by another road.
    ++stats_.status_settled;
    CompleteConsumer(c, CancelledLoadStatus(c), std::nullopt);
  }
}

std::optional<std::string> TransferCore::PeerGoneReason(const Consumer& c) const {
  if (auto failure = peers_.Failure(c.peer)) return failure;
  if (c.fence_asked && c.peer_connection != 0 && peers_.Fenced(c.peer, c.peer_connection) &&
      !ReadOutstanding(c.tid)) {
    return "treated as broken (alive, but no answer within " +
           std::to_string(config_.broken_peer.count()) +
           " ms of a quarantine); its connection is fenced, nothing of it can land any more";
  }
  if (c.peer_incarnation == 0) return std::nullopt;
  auto view = peers_.Find(c.peer);
  if (view && view->incarnation != c.peer_incarnation) {
    return "restarted (incarnation " + std::to_string(c.peer_incarnation) + " -> " +
           std::to_string(view->incarnation) + ")";
  }
  return std::nullopt;
}

void TransferCore::CheckConsumerTimers(TimePoint now) {
  // Consumers: watchdog, peer liveness, cancel deadlines, quarantines.
  std::vector<std::string> ids;
  ids.reserve(consumers_.size());
  for (auto& [tid, c] : consumers_) ids.push_back(tid);
  for (const auto& tid : ids) {
    auto it = consumers_.find(tid);
    if (it == consumers_.end()) continue;
    Consumer& c = it->second;
    LogRequestScope scope(c.request_id);
    if (auto gone = PeerGoneReason(c)) {
      // The process that could write into the blocks is gone (its connection broke, it exited
      // or it restarted): nothing of it can land any more.
      ++stats_.transfers_failed;
      CompleteConsumer(c, PeerGone("prefill instance '" + c.peer + "' failed: " + *gone),
                       std::nullopt);
      continue;
    }
    if (c.state == ConsumerState::kQuarantined) {
      // Alive and silent past the bound: broken. Its connection is fenced; the quarantines of
      // that connection end above once the transport confirms nothing of it can land.
      if (!c.fence_asked && now >= c.quarantined_at + config_.broken_peer) FenceBrokenPeer(c);
      if (c.mode == Mode::kPush && now >= c.next_cancel) {
        SendSignal(c.peer, MsgTag::kCancel, tid);  // the first may have been lost: ask again
        c.cancel_backoff = std::min<std::chrono::milliseconds>(c.cancel_backoff * 2, 30s);
        c.next_cancel = now + c.cancel_backoff;
      }
      continue;
    }
    if (c.state == ConsumerState::kCancelling) {
      // P did not acknowledge (push) or the READ has not settled (pull) in time. Invalidating
      // the peer would not stop WRITEs it already issued (they land whatever this side does),
      // so the request goes on without these blocks and they stay out of use until nothing can
      // land.
      if (now >= c.cancel_deadline) Quarantine(c, now);
      continue;
    }
    if (now < c.deadline) continue;
    ++stats_.watchdog_expired;
    spdlog::warn("kv connector: KV of transfer {} did not arrive within {} ms", tid,
                 config_.watchdog.count());
    if (c.mode == Mode::kPush) {
      BeginPushCancel(c, now);
      continue;
    }
    if (c.state == ConsumerState::kPinSent) {
      // Pull, no READ yet (P never answered the PIN): nothing can land.
      CompleteConsumer(c,
                       DeadlineExceeded("the prefill instance did not confirm the lease within " +
                                        std::to_string(config_.watchdog.count()) + " ms"),
                       std::nullopt);
      continue;
    }
    CancelOutstanding(tid, XferKind::kRead);  // pull: the READ is ours to end
    c.state = ConsumerState::kCancelling;
    c.cancel_deadline = now + config_.cancel_ack;
  }
}

void TransferCore::BeginPushCancel(Consumer& c, TimePoint now) {
  SendSignal(c.peer, MsgTag::kCancel, c.tid);
  c.state = ConsumerState::kCancelling;
  c.cancel_deadline = now + config_.cancel_ack;
}

void TransferCore::FenceBrokenPeer(Consumer& c) {
  const std::string peer = c.peer;
  const uint64_t connection = c.peer_connection;
  c.fence_asked = true;
  if (connection == 0) {
    spdlog::warn(
        "kv connector: transfer {}: '{}' left its quarantine unanswered for {} ms, but "
        "the connection its target went over is not known; the blocks stay held until "
        "it answers or is known dead",
        c.tid, peer, config_.broken_peer.count());
    return;
  }
  for (auto& [tid, other] : consumers_) {  // one fence ends them all: ask once
    if (other.peer == peer && other.peer_connection == connection) other.fence_asked = true;
  }
  const std::string why = "no answer to a cancel within " +
                          std::to_string(config_.broken_peer.count()) + " ms of a quarantine";
  Status s = actions_.FencePeer(peer, connection, why);
  if (!s.ok()) {
    spdlog::warn(
        "kv connector: transfer {}: '{}' is alive but left its quarantine unanswered for "
        "{} ms; cannot fence it ({}): its quarantined blocks stay held until it answers "
        "or is known dead",
        c.tid, peer, config_.broken_peer.count(), s.ToString());
    return;
  }
  ++stats_.peers_fenced;
  spdlog::warn(
      "kv connector: '{}' is alive but left transfer {} unanswered for {} ms of "
      "quarantine: treated as broken, its connection is fenced; its quarantines end "
      "once the transport confirms nothing of it can land, and the next request "
      "connects again",
      peer, c.tid, config_.broken_peer.count());
}

void TransferCore::Quarantine(Consumer& c, TimePoint now) {
  ++stats_.quarantines;
  c.state = ConsumerState::kQuarantined;
  c.quarantined_at = now;
  c.next_query = now;  // ask P over HTTP at once (QueryQuarantines), then with backoff
  c.query_backoff = config_.cancel_ack;
  c.cancel_backoff = config_.cancel_ack;
  c.next_cancel = now + c.cancel_backoff;
  spdlog::warn(
      "kv connector: transfer {}: {} within {} ms; its {} blocks are quarantined until "
      "nothing can land in them",
      c.tid,
      c.mode == Mode::kPush ? "no CANCEL_ACK from '" + c.peer + "'"
                            : std::string("the cancelled READ did not end"),
      config_.cancel_ack.count(), c.num_blocks);
  if (c.aborted) return;  // the engine already finished the request and holds its blocks
  c.aborted = true;       // from now on the end releases the blocks the engine keeps for us
  KvLoadResult r;
  r.seq_id = c.seq_id;
  r.recompute = config_.failure_policy == FailurePolicy::kRecompute;
  r.quarantined = true;
  if (!c.cancel_reason.ok()) {
    r.status =
        Status(c.cancel_reason.code(),
               c.cancel_reason.message() + "; the prefill instance did not answer the cancel");
  } else {
    r.status = c.mode == Mode::kPush
                   ? DeadlineExceeded("KV did not arrive within " +
                                      std::to_string(config_.watchdog.count()) +
                                      " ms and the prefill instance did not answer the cancel")
                   : DeadlineExceeded("the READ did not complete within " +
                                      std::to_string(config_.watchdog.count()) + " ms");
  }
  actions_.FinishLoad(std::move(r));
}

}  // namespace kvpush::connector
