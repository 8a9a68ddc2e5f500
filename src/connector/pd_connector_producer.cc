// PdConnector, prefill (P) side: layer-wise push WRITEs, KV_READY, pull leases.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "connector/pd_connector.h"
#include "kv/block_checksum.h"

namespace kvpush::connector {

using Mode = KvTransferParams::Mode;

void PdConnector::OnProducerStart(Event& ev) {
  const std::string& tid = ev.params.transfer_id;
  if (IsTombstoned(tid) || producers_.count(tid) != 0) {
    // D already said it needs nothing (or a duplicate id): drop the prefill if it has not run.
    spdlog::info("kv connector: prefill of transfer {} is not needed; aborting it", tid);
    if (abort_request_) abort_request_(ev.seq_id);
    Producer p;  // tracked only so that its blocks are released when the engine finishes it
    p.seq_id = ev.seq_id;
    p.tid = tid + "#dropped" + std::to_string(ev.seq_id);
    p.dropped = true;
    producer_by_seq_[ev.seq_id] = p.tid;
    producers_.emplace(p.tid, std::move(p));
    return;
  }
  spdlog::debug("kv connector: producer {} started (seq {}, {} tokens, {})", tid, ev.seq_id,
                ev.num_prompt_tokens, ev.params.mode == Mode::kPush ? "push" : "pull");
  Producer p;
  p.seq_id = ev.seq_id;
  p.tid = tid;
  p.mode = ev.params.mode;
  p.n = ev.num_prompt_tokens;
  p.prompt_hash = ev.prompt_hash;
  p.blocks = std::move(ev.blocks);
  p.layer_done.assign(static_cast<size_t>(options_.layout.num_layers), 0);
  p.layer_sent.assign(static_cast<size_t>(options_.layout.num_layers), 0);
  if (p.mode == Mode::kPush) {
    const int32_t bs = options_.layout.block_size;
    p.chunk_sums.assign(static_cast<size_t>((p.n + bs - 1) / bs) * 2 *
                            static_cast<size_t>(options_.layout.num_layers),
                        0);
  }
  // A prefix-cache hit on P: those tokens' K/V are already in the blocks for every layer.
  producer_by_seq_[ev.seq_id] = tid;
  auto [it, inserted] = producers_.emplace(tid, std::move(p));
  (void)inserted;
  auto pending = pending_targets_.find(tid);
  if (pending != pending_targets_.end()) {
    PendingTarget t = std::move(pending->second);
    pending_targets_.erase(pending);
    AttachTarget(it->second, t.peer, t.msg);
  }
}

void PdConnector::OnStep(Event& ev) {
  step_chunks_ = std::move(ev.chunks);
  for (const StepChunk& c : step_chunks_) {
    auto s = producer_by_seq_.find(c.seq_id);
    if (s == producer_by_seq_.end()) continue;
    auto p = producers_.find(s->second);
    if (p != producers_.end()) p->second.blocks = c.blocks;
  }
}

void PdConnector::OnLayer(int32_t layer) {
  for (const StepChunk& c : step_chunks_) {
    auto s = producer_by_seq_.find(c.seq_id);
    if (s == producer_by_seq_.end()) continue;
    auto it = producers_.find(s->second);
    if (it == producers_.end()) continue;
    Producer& p = it->second;
    if (layer < 0 || layer >= static_cast<int32_t>(p.layer_done.size())) continue;
    p.layer_done[static_cast<size_t>(layer)] = c.end_pos;
    TryPostLayer(p, layer);
  }
}

void PdConnector::OnProducerDone(Event& ev) {
  auto s = producer_by_seq_.find(ev.seq_id);
  if (s == producer_by_seq_.end()) {
    // Finished before the connector thread saw it start (cannot happen: events are ordered),
    // or never announced: release at once.
    std::lock_guard lock(out_mu_);
    release_ids_.push_back(ev.seq_id);
    return;
  }
  const std::string tid = s->second;
  auto early_pin = std::exchange(producers_.at(tid).early_pin, std::nullopt);
  FinishProducer(producers_.at(tid), ev);
  // Answered (or refused) now that the prefill's outcome is known; p may be gone.
  if (early_pin) OnPin(early_pin->first, early_pin->second);
}

void PdConnector::FinishProducer(Producer& p, Event& ev) {
  spdlog::debug("kv connector: producer {} finished (ok={}, target={}, dropped={})", p.tid, ev.ok,
                p.has_target, p.dropped);
  p.finished = true;
  p.finished_ok = ev.ok;
  p.token = ev.token;
  p.blocks = std::move(ev.blocks);
  if (p.dropped) {
    AdvanceProducer(p);
    return;
  }
  if (!ev.ok) {
    DropProducer(p,
                 ev.error.ok() ? Aborted("the prefill request was aborted")
                               : Status(ev.error.code(), "prefill failed: " + ev.error.message()),
                 true);
    return;
  }
  // Every layer of every prompt token is computed now (the request finished after its prefill).
  std::fill(p.layer_done.begin(), p.layer_done.end(), p.n);
  p.finished_ns = NowNs();
  p.lease_deadline = SteadyClock::now() + options_.config.lease;
  if (p.mode == Mode::kPull) {
    // The blocks are final and held: checksum them now, off the PIN round trip.
    const int32_t bs = options_.layout.block_size;
    const int32_t nblocks = std::min<int32_t>((p.n + bs - 1) / bs,
                                              static_cast<int32_t>(p.blocks.size()));
    p.block_sums.resize(static_cast<size_t>(nblocks));
    for (int32_t i = 0; i < nblocks; ++i) {
      p.block_sums[static_cast<size_t>(i)] =
          KvBlockChecksum(options_.layout, arena_, p.blocks[static_cast<size_t>(i)]);
    }
    std::lock_guard lock(stats_mu_);
    stats_.checksum_ns_sum += NowNs() - p.finished_ns;
  }
  if (p.mode == Mode::kPush && p.has_target) TryPostAll(p);
  AdvanceProducer(p);
}

void PdConnector::OnProducerMessage(const std::string& peer, PdMessage& m) {
  switch (m.tag) {
    case MsgTag::kPushTarget:
      OnPushTarget(peer, m);
      return;
    case MsgTag::kPin:
      OnPin(peer, m);
      return;
    case MsgTag::kNotNeeded: {
      auto it = producers_.find(m.transfer_id);
      Tombstone(m.transfer_id);
      pending_targets_.erase(m.transfer_id);
      if (it == producers_.end()) return;  // the P leg has not arrived yet: it will be dropped
      Producer& p = it->second;
      if (!p.finished && abort_request_) abort_request_(p.seq_id);
      DropProducer(p, Cancelled("decode instance has the whole prefix cached"), false);
      return;
    }
    case MsgTag::kCancel: {
      Tombstone(m.transfer_id);
      pending_targets_.erase(m.transfer_id);
      auto it = producers_.find(m.transfer_id);
      if (it == producers_.end()) {
        SendSignal(peer, MsgTag::kCancelAck, m.transfer_id);
        return;
      }
      Producer& p = it->second;
      if (!p.finished && abort_request_) abort_request_(p.seq_id);
      p.cancel_ack_due = p.has_target && p.peer == peer;
      if (!p.cancel_ack_due) SendSignal(peer, MsgTag::kCancelAck, m.transfer_id);
      DropProducer(p, Cancelled("cancelled by the decode instance"), false);
      return;
    }
    case MsgTag::kRelease: {
      auto it = producers_.find(m.transfer_id);
      Tombstone(m.transfer_id);
      if (it == producers_.end()) return;
      Producer& p = it->second;
      if (p.mode != Mode::kPull || (p.pinned && p.peer != peer)) {
        std::lock_guard lock(stats_mu_);
        ++stats_.bad_messages;
        return;
      }
      p.dropped = true;
      AdvanceProducer(p);
      return;
    }
    case MsgTag::kTransferFailed: {
      auto it = producers_.find(m.transfer_id);
      Tombstone(m.transfer_id);
      if (it == producers_.end()) return;
      Producer& p = it->second;
      if ((p.has_target || p.pinned) && p.peer != peer) {  // not the D of this transfer
        std::lock_guard lock(stats_mu_);
        ++stats_.bad_messages;
        return;
      }
      if (!p.finished && abort_request_) abort_request_(p.seq_id);
      DropProducer(p, Cancelled("decode instance gave up: " + m.message), false);
      return;
    }
    default:
      return;
  }
}

void PdConnector::OnAbortTransfer(const std::string& tid) {
  Tombstone(tid);
  bool found = false;
  auto pending = pending_targets_.find(tid);
  if (pending != pending_targets_.end()) {
    SendFailure(pending->second.peer, tid, StatusCode::kCancelled, "transfer aborted");
    pending_targets_.erase(pending);
    found = true;
  }
  auto it = producers_.find(tid);
  if (it != producers_.end()) {
    Producer& p = it->second;
    found = true;
    if (!p.finished && abort_request_) abort_request_(p.seq_id);
    DropProducer(p, Cancelled("transfer aborted"), true);
  }
  if (found) {
    spdlog::info("kv connector: transfer {} aborted on request; its blocks are freed", tid);
    std::lock_guard lock(stats_mu_);
    ++stats_.transfers_aborted;
  }
}

void PdConnector::OnPushTarget(const std::string& peer, PdMessage& m) {
  {
    std::lock_guard lock(stats_mu_);
    ++stats_.push_targets_received;
  }
  spdlog::debug("kv connector: push target {} from '{}' ({} blocks from {})", m.transfer_id, peer,
                m.block_ids.size(), m.first_block);
  if (IsTombstoned(m.transfer_id)) {
    const char* why = "unknown or expired transfer (its lease ran out or it already ended)";
    spdlog::warn("kv connector: refusing push target {} from '{}': {}", m.transfer_id, peer, why);
    SendFailure(peer, m.transfer_id, StatusCode::kFailedPrecondition, why);
    return;
  }
  auto it = producers_.find(m.transfer_id);
  if (it == producers_.end()) {
    // Target first, prefill request later: keep it until the request arrives (bounded by the lease).
    const std::string tid = m.transfer_id;  // (the right side of = is evaluated first)
    pending_targets_[tid] = PendingTarget{peer, std::move(m), SteadyClock::now() + options_.config.lease};
    return;
  }
  AttachTarget(it->second, peer, m);
}

void PdConnector::AttachTarget(Producer& p, const std::string& peer, PdMessage& m) {
  auto fail = [&](const std::string& why) {
    spdlog::warn("kv connector: refusing push target {} from '{}': {}", p.tid, peer, why);
    SendFailure(peer, p.tid, StatusCode::kInvalidArgument, why);
  };
  if (p.has_target || p.dropped) {
    fail(p.has_target ? "a target for this transfer was already received" : "transfer dropped");
    return;
  }
  if (p.mode != Mode::kPush) return fail("the prefill request is not in push mode");
  auto ps = FindPeer(peer);
  if (!ps) return fail("no handshake with '" + peer + "'");
  const int32_t bs = options_.layout.block_size;
  const int32_t nblocks = (p.n + bs - 1) / bs;
  if (static_cast<int32_t>(m.num_prompt_tokens) != p.n || m.prompt_hash != p.prompt_hash) {
    return fail("the target's prompt (" + std::to_string(m.num_prompt_tokens) +
                " tokens) is not the prompt computed here (" + std::to_string(p.n) + " tokens)");
  }
  if (static_cast<int32_t>(m.first_block) >= nblocks ||
      static_cast<int32_t>(m.block_ids.size()) != nblocks - static_cast<int32_t>(m.first_block)) {
    return fail("target covers blocks [" + std::to_string(m.first_block) + ", +" +
                std::to_string(m.block_ids.size()) + ") of a " + std::to_string(nblocks) +
                "-block prompt");
  }
  for (int32_t b : m.block_ids) {
    if (b < 0 || b >= ps->info.layout.num_blocks) {
      return fail("target block " + std::to_string(b) + " is outside the decode pool");
    }
  }
  p.has_target = true;
  p.peer = peer;
  p.first_block = m.first_block;
  p.dst = std::move(m.block_ids);
  for (auto& s : p.layer_sent) s = std::max(s, static_cast<int32_t>(p.first_block));
  TryPostAll(p);
  AdvanceProducer(p);
}

void PdConnector::TryPostAll(Producer& p) {
  for (int32_t layer = 0; layer < static_cast<int32_t>(p.layer_done.size()); ++layer) {
    TryPostLayer(p, layer);
  }
}

void PdConnector::TryPostLayer(Producer& p, int32_t layer) {
  if (!p.has_target || p.dropped || p.mode != Mode::kPush) return;
  if (!options_.config.layerwise && !p.finished) return;
  const int32_t bs = options_.layout.block_size;
  const int32_t nblocks = (p.n + bs - 1) / bs;
  const int32_t done = p.layer_done[static_cast<size_t>(layer)];
  const int32_t upto = done >= p.n ? nblocks : done / bs;  // a partial block goes at the end
  int32_t& sent = p.layer_sent[static_cast<size_t>(layer)];
  if (upto <= sent) return;
  if (static_cast<int32_t>(p.blocks.size()) < upto) {
    DropProducer(p, Internal("block table shorter than the computed tokens"), true);
    return;
  }
  auto ps = FindPeer(p.peer);
  if (!ps) {
    DropProducer(p, PeerGone("decode instance '" + p.peer + "' is no longer known"), false);
    return;
  }
  const int32_t count = upto - sent;
  xfer::TransferSpec spec;
  spec.op = xfer::Op::kWrite;
  spec.local = local_list_;
  spec.remote = ps->remote_list;
  spec.local_indices.reserve(static_cast<size_t>(count) * 2);
  spec.remote_indices.reserve(static_cast<size_t>(count) * 2);
  for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
    for (int32_t i = sent; i < upto; ++i) {
      spec.local_indices.push_back(EntryIndex(options_.layout.num_blocks, layer, kind,
                                              p.blocks[static_cast<size_t>(i)]));
      spec.remote_indices.push_back(EntryIndex(
          ps->info.layout.num_blocks, layer, kind,
          p.dst[static_cast<size_t>(i - static_cast<int32_t>(p.first_block))]));
    }
  }
  // Delivered once these chunks are visible on D, so D can checksum them while P computes on.
  PdMessage landed;
  landed.tag = MsgTag::kLayerReady;
  landed.transfer_id = p.tid;
  landed.layer = static_cast<uint32_t>(layer);
  landed.first_block = static_cast<uint32_t>(sent);
  landed.num_blocks = static_cast<uint32_t>(count);
  if (auto payload = EncodeMessage(landed); payload.ok()) spec.notification = std::move(*payload);
  const uint64_t bytes = static_cast<uint64_t>(count) * 2 * options_.layout.chunk_bytes();
  Status err;
  if (!PostTracked(spec, p.tid, XferKind::kWrite, bytes, &err)) {
    DropProducer(p, Status(err.code(), "posting the WRITE of layer " + std::to_string(layer) +
                                           ": " + err.message()),
                 true);
    return;
  }
  spdlog::debug("kv connector: {} layer {} WRITE of blocks [{}, {}) posted", p.tid, layer, sent,
                upto);
  // The chunks are final (this layer's K/V of these tokens are stored): hash them while the
  // WRITE is on the wire and the engine computes the next layer.
  const int64_t hash_start = NowNs();
  const size_t per_block = 2 * static_cast<size_t>(options_.layout.num_layers);
  for (int32_t i = sent; i < upto; ++i) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      p.chunk_sums[static_cast<size_t>(i) * per_block + static_cast<size_t>(layer) * 2 +
                   static_cast<size_t>(kind)] =
          KvChunkHash(options_.layout, arena_, layer, kind, p.blocks[static_cast<size_t>(i)]);
    }
  }
  sent = upto;
  ++p.outstanding;
  std::lock_guard lock(stats_mu_);
  ++stats_.writes_posted;
  stats_.checksum_ns_sum += NowNs() - hash_start;
}

void PdConnector::OnProducerTransferDone(const Outstanding& o, const xfer::TransferStatus& st) {
  auto it = producers_.find(o.tid);
  if (it == producers_.end()) return;
  Producer& p = it->second;
  if (o.kind == XferKind::kReady) {
    if (st.state != xfer::TransferState::kDone) {
      spdlog::warn("kv connector: KV_READY of transfer {} failed: {}", o.tid, st.error.ToString());
    }
    Tombstone(p.tid);
    producer_by_seq_.erase(p.seq_id);
    producers_.erase(it);
    return;
  }
  --p.outstanding;
  spdlog::debug("kv connector: {} WRITE ended ({}), {} outstanding", p.tid,
                xfer::TransferStateName(st.state), p.outstanding);
  if (st.state == xfer::TransferState::kDone) {
    std::lock_guard lock(stats_mu_);
    stats_.bytes_written += static_cast<int64_t>(o.bytes);
  } else if (!p.dropped) {
    DropProducer(p, Status(st.error.code(), "WRITE failed: " + st.error.message()), true);
    return;
  }
  AdvanceProducer(p);
}

void PdConnector::DropProducer(Producer& p, Status why, bool tell_peer) {
  if (!p.dropped) {
    p.dropped = true;
    p.failure = std::move(why);
    p.fail_due = tell_peer && p.has_target;
    if (tell_peer && !p.has_target && p.mode == Mode::kPush) {
      // D may still send its target: refuse it when it comes.
      Tombstone(p.tid);
    }
    // Cancel WRITEs not yet on the wire; AdvanceProducer waits for the rest to end.
    CancelOutstanding(p.tid, XferKind::kWrite);
  }
  AdvanceProducer(p);
}

void PdConnector::ReleaseProducer(Producer& p) {
  if (p.released || !p.finished) return;
  p.released = true;
  std::lock_guard lock(out_mu_);
  release_ids_.push_back(p.seq_id);
}

void PdConnector::AdvanceProducer(Producer& p) {
  if (p.dropped) {
    if (p.outstanding > 0) return;  // wait until no WRITE of ours can land any more
    if (p.fail_due) {
      p.fail_due = false;
      SendFailure(p.peer, p.tid, p.failure.code(), p.failure.message());
    }
    if (p.cancel_ack_due) {
      p.cancel_ack_due = false;
      SendSignal(p.peer, MsgTag::kCancelAck, p.tid);
    }
    if (!p.finished) return;  // the engine still owns the blocks; OnProducerDone comes back here
    ReleaseProducer(p);
    Tombstone(p.tid);
    producer_by_seq_.erase(p.seq_id);
    producers_.erase(p.tid);  // p is dangling after this line
    return;
  }
  if (p.mode == Mode::kPull || !p.finished || !p.finished_ok || !p.has_target) return;
  const int32_t bs = options_.layout.block_size;
  const int32_t nblocks = (p.n + bs - 1) / bs;
  for (int32_t s : p.layer_sent) {
    if (s < nblocks) return;
  }
  if (p.outstanding > 0 || p.ready_posted) return;
  // Every WRITE completed (remote visibility): P's blocks can go, and KV_READY follows the data.
  ReleaseProducer(p);
  PdMessage r;
  r.tag = MsgTag::kKvReady;
  r.transfer_id = p.tid;
  r.token_id = p.token.id;
  r.logprob = p.token.logprob;
  r.kv_digest = PushDigest(p);
  r.top_logprobs = p.token.top_logprobs;
  if (r.top_logprobs.size() > kMaxTopLogprobs) r.top_logprobs.resize(kMaxTopLogprobs);
  auto payload = EncodeMessage(r);
  Status err = payload.status();
  if (payload.ok()) {
    auto t = agent_->CreateNotification(p.peer, *payload);
    err = t.status();
    if (t.ok()) {
      err = agent_->Post(*t);
      if (err.ok()) {
        outstanding_[t->packed()] = Outstanding{p.tid, XferKind::kReady, 0};
        p.ready_posted = true;
        spdlog::debug("kv connector: KV_READY of {} posted", p.tid);
        std::lock_guard lock(stats_mu_);
        ++stats_.kv_ready_sent;
        stats_.push_tail_ns_sum += NowNs() - p.finished_ns;
        ++stats_.push_tail_count;
        return;
      }
      (void)agent_->ReleaseTransfer(*t);
    }
  }
  spdlog::warn("kv connector: cannot send KV_READY of {}: {}", p.tid, err.ToString());
  Tombstone(p.tid);
  producer_by_seq_.erase(p.seq_id);
  producers_.erase(p.tid);
}

}  // namespace kvpush::connector

namespace kvpush::connector {

uint64_t PdConnector::PushDigest(const Producer& p) const {
  const size_t per_block = 2 * static_cast<size_t>(options_.layout.num_layers);
  const std::span<const uint64_t> sent(p.chunk_sums);
  return KvDigestFromChunks(sent.subspan(p.first_block * per_block), options_.layout.num_layers);
}

void PdConnector::OnPin(const std::string& peer, const PdMessage& m) {
  auto refuse = [&](const std::string& why) {
    spdlog::warn("kv connector: refusing to pin transfer {} for '{}': {}", m.transfer_id, peer,
                 why);
    {
      std::lock_guard lock(stats_mu_);
      ++stats_.pins_refused;
    }
    SendFailure(peer, m.transfer_id, StatusCode::kFailedPrecondition, why);
  };
  auto it = producers_.find(m.transfer_id);
  if (it == producers_.end()) {
    return refuse(IsTombstoned(m.transfer_id)
                      ? "the transfer's lease expired or it was released"
                      : "unknown transfer (no prefill request with this id)");
  }
  Producer& p = it->second;
  if (p.mode != Mode::kPull) return refuse("the prefill request is not in pull mode");
  if (p.dropped) return refuse("the transfer was dropped (lease expired, aborted or failed)");
  if (!p.finished && !p.early_pin) {
    p.early_pin.emplace(peer, m);  // the engine's "finished" event is still on its way
    return;
  }
  if (!p.finished || !p.finished_ok) return refuse("the prefill did not finish");
  if (p.pinned && p.peer != peer) return refuse("already pinned by '" + p.peer + "'");
  if (static_cast<size_t>(m.first_block) + m.num_blocks > p.block_sums.size()) {
    return refuse("blocks [" + std::to_string(m.first_block) + ", +" +
                  std::to_string(m.num_blocks) + ") of a " +
                  std::to_string(p.block_sums.size()) + "-block prompt");
  }
  // Pinned: the lease cannot run out under the READ (D's watchdog is shorter than one lease,
  // which the handshake checks); RELEASE or this deadline frees the blocks.
  p.pinned = true;
  p.peer = peer;
  p.lease_deadline = SteadyClock::now() + options_.config.lease;
  PdMessage a;
  a.tag = MsgTag::kPinned;
  a.transfer_id = p.tid;
  a.num_prompt_tokens = static_cast<uint32_t>(p.n);
  a.prompt_hash = p.prompt_hash;
  a.token_id = p.token.id;
  a.logprob = p.token.logprob;
  a.top_logprobs = p.token.top_logprobs;
  if (a.top_logprobs.size() > kMaxTopLogprobs) a.top_logprobs.resize(kMaxTopLogprobs);
  a.first_block = m.first_block;
  const auto first = static_cast<ptrdiff_t>(m.first_block);
  const auto last = first + static_cast<ptrdiff_t>(m.num_blocks);
  a.block_ids.assign(p.blocks.begin() + first, p.blocks.begin() + last);
  a.kv_digest = KvDigest(std::span<const uint64_t>(p.block_sums.data() + first, m.num_blocks));
  SendMessage(peer, a);
}

}  // namespace kvpush::connector
