// TransferCore, prefill (P) side: layer-wise push WRITEs, KV_READY, pull leases and PINs.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/log.h"
#include "connector/transfer_core.h"
#include "kv/block_checksum.h"
#include "pd/ids.h"

namespace kvpush::connector {

using Mode = pd::KvTransferParams::Mode;

void TransferCore::OnProducerStart(ProducerStartEvent& ev) {
  const std::string& tid = ev.params.transfer_id;
  if (auto same = producers_.find(tid);
      same != producers_.end() && same->second.seq_id == ev.seq_id) {
    // The engine admitted the same request again: it was preempted (a pull prefill may be; a
    // push one never is) and computes its prompt anew into these blocks. Taken for a duplicate
    // id, it used to abort the request and leave this producer without its engine's end: never
    // released, never expired (chaos with 64-block pools).
    spdlog::debug("kv connector: producer {} admitted again (seq {})", tid, ev.seq_id);
    Producer& p = same->second;
    p.blocks = std::move(ev.blocks);
    std::fill(p.layer_done.begin(), p.layer_done.end(), 0);
    return;
  }
  if (IsTombstoned(tid) || producers_.count(tid) != 0) {
    // D already said it needs nothing (or a duplicate id): drop the prefill if it has not run,
    // unless its own answer is needed (prompt logprobs): then it runs, sending nothing.
    spdlog::info("kv connector: prefill of transfer {} is not needed; {}", tid,
                 ev.answer_needed ? "computing it for its answer only" : "aborting it");
    if (!ev.answer_needed) actions_.AbortRequest(ev.seq_id);
    Producer p;  // tracked only so that its blocks are released when the engine finishes it
    p.seq_id = ev.seq_id;
    p.tid = tid + "#dropped" + std::to_string(ev.seq_id);
    p.state = ProducerState::kDropping;
    producer_by_seq_[ev.seq_id] = p.tid;
    producers_.emplace(p.tid, std::move(p));
    return;
  }
  spdlog::debug("kv connector: producer {} started (seq {}, {} tokens, {})", tid, ev.seq_id,
                ev.num_prompt_tokens, ev.params.mode == Mode::kPush ? "push" : "pull");
  Producer p;
  p.seq_id = ev.seq_id;
  p.tid = tid;
  p.request_id = std::move(ev.request_id);
  p.mode = ev.params.mode;
  p.n = ev.num_prompt_tokens;
  p.prompt_hash = ev.prompt_hash;
  p.answer_needed = ev.answer_needed;
  p.first_token_binding = ev.first_token_binding;
  p.blocks = std::move(ev.blocks);
  p.timeline.transfer_id = tid;
  p.timeline.producer = true;
  p.timeline.push = p.mode == Mode::kPush;
  Mark(p.timeline, HandoffPhase::kProducerStart);
  p.layer_done.assign(static_cast<size_t>(layout_.num_layers), 0);
  p.layer_sent.assign(static_cast<size_t>(layout_.num_layers), 0);
  if (p.mode == Mode::kPush) {
    const int32_t bs = layout_.block_size;
    p.sent_sums = KvDigestBuilder(static_cast<size_t>((p.n + bs - 1) / bs), layout_.num_layers);
  }
  producer_by_seq_[ev.seq_id] = tid;
  auto [it, inserted] = producers_.emplace(tid, std::move(p));
  (void)inserted;
  auto pending = pending_targets_.find(tid);
  if (pending != pending_targets_.end()) {
    // Whole or in part: what the parts cover is written as it is computed.
    PendingTarget t = std::move(pending->second);
    pending_targets_.erase(pending);
    AttachTarget(it->second, t.peer, t.msg, std::move(t.parts), t.connection);
  }
}

void TransferCore::OnStep(StepEvent& ev) {
  step_chunks_ = std::move(ev.chunks);
  for (const StepChunk& c : step_chunks_) {
    auto s = producer_by_seq_.find(c.seq_id);
    if (s == producer_by_seq_.end()) continue;
    auto p = producers_.find(s->second);
    if (p != producers_.end()) p->second.blocks = c.blocks;
  }
}

void TransferCore::OnLayer(int32_t layer) {
  for (const StepChunk& c : step_chunks_) {
    auto s = producer_by_seq_.find(c.seq_id);
    if (s == producer_by_seq_.end()) continue;
    auto it = producers_.find(s->second);
    if (it == producers_.end()) continue;
    Producer& p = it->second;
    if (layer < 0 || layer >= static_cast<int32_t>(p.layer_done.size())) continue;
    LogRequestScope scope(p.request_id);
    p.layer_done[static_cast<size_t>(layer)] = c.end_pos;
    TryPostLayer(p, layer);
  }
}

void TransferCore::OnProducerDone(ProducerDoneEvent& ev) {
  auto s = producer_by_seq_.find(ev.seq_id);
  if (s == producer_by_seq_.end()) {
    // Never announced (events are ordered, so it never started here): release at once.
    actions_.ReleaseBlocks(ev.seq_id);
    return;
  }
  const std::string tid = s->second;
  auto early_pin = std::exchange(producers_.at(tid).early_pin, std::nullopt);
  FinishProducer(producers_.at(tid), ev);
  // Answered (or refused) now that the prefill's outcome is known; p may be gone.
  if (early_pin) OnPin(early_pin->first, early_pin->second);
}

void TransferCore::FinishProducer(Producer& p, ProducerDoneEvent& ev) {
  spdlog::debug("kv connector: producer {} finished (ok={}, target={}, state={})", p.tid, ev.ok,
                p.targeted(), ProducerStateName(p.state));
  p.engine_done = true;
  p.token = ev.token;
  p.blocks = std::move(ev.blocks);
  if (p.state == ProducerState::kDropping) {
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
  p.state = ProducerState::kHeld;
  // Every layer of every prompt token is computed now (the request finished after its prefill).
  std::fill(p.layer_done.begin(), p.layer_done.end(), p.n);
  p.finished_ns = clock_.NowNanos();
  p.timeline.Mark(HandoffPhase::kPrefillDone, p.finished_ns);
  p.lease_deadline = clock_.Now() + config_.lease;
  if (p.mode == Mode::kPull) {
    // The blocks are final and held: checksum them now, off the PIN round trip.
    const int32_t bs = layout_.block_size;
    const int32_t nblocks =
        std::min<int32_t>((p.n + bs - 1) / bs, static_cast<int32_t>(p.blocks.size()));
    p.block_sums.resize(static_cast<size_t>(nblocks));
    for (int32_t i = 0; i < nblocks; ++i) {
      p.block_sums[static_cast<size_t>(i)] =
          KvBlockChecksum(layout_, arena_, p.blocks[static_cast<size_t>(i)]);
    }
    stats_.checksum_ns_sum += clock_.NowNanos() - p.finished_ns;
  }
  if (p.targeted() && !PostRest(p)) return;  // dropped: p may be gone
  AdvanceProducer(p);
}

void TransferCore::OnProducerMessage(const std::string& peer, PdMessage& m) {
  switch (m.tag) {
    case MsgTag::kPushTarget:
      OnPushTarget(peer, m);
      return;
    case MsgTag::kPin:
      OnPin(peer, m);
      return;
    case MsgTag::kNotNeeded: {
      ++stats_.not_needed_received;
      auto it = producers_.find(m.transfer_id);
      Tombstone(m.transfer_id);
      pending_targets_.erase(m.transfer_id);
      if (it == producers_.end()) return;  // the P leg has not arrived yet: it will be dropped
      Producer& p = it->second;
      // A prefill whose answer is needed (prompt logprobs) runs on; nothing is sent to D.
      if (!p.engine_done && !p.answer_needed) actions_.AbortRequest(p.seq_id);
      DropProducer(p, Cancelled("decode instance has the whole prefix cached"), false);
      return;
    }
    case MsgTag::kCancel:
      OnProducerCancel(peer, m);
      return;
    case MsgTag::kRelease: {
      auto it = producers_.find(m.transfer_id);
      Tombstone(m.transfer_id);
      if (it == producers_.end()) return;
      Producer& p = it->second;
      if (p.mode != Mode::kPull || (!p.peer.empty() && p.peer != peer)) {
        ++stats_.bad_messages;  // not the D that pinned it
        return;
      }
      p.state = ProducerState::kDropping;
      AdvanceProducer(p);
      return;
    }
    case MsgTag::kTransferFailed: {
      auto it = producers_.find(m.transfer_id);
      Tombstone(m.transfer_id);
      if (it == producers_.end()) return;
      Producer& p = it->second;
      if (!p.peer.empty() && p.peer != peer) {  // not the D of this transfer
        ++stats_.bad_messages;
        return;
      }
      if (!p.engine_done) actions_.AbortRequest(p.seq_id);
      DropProducer(p, Cancelled("decode instance gave up: " + m.message), false);
      return;
    }
    default:
      return;
  }
}

void TransferCore::OnProducerCancel(const std::string& peer, const PdMessage& m) {
  Tombstone(m.transfer_id);
  pending_targets_.erase(m.transfer_id);
  auto it = producers_.find(m.transfer_id);
  if (it == producers_.end()) {
    SendSignal(peer, MsgTag::kCancelAck, m.transfer_id);
    return;
  }
  Producer& p = it->second;
  if (!p.engine_done) actions_.AbortRequest(p.seq_id);
  // The target's D gets its CANCEL_ACK once no WRITE can land; anyone else at once.
  p.cancel_ack_due = p.targeted() && p.peer == peer;
  if (!p.cancel_ack_due) SendSignal(peer, MsgTag::kCancelAck, m.transfer_id);
  DropProducer(p, Cancelled("cancelled by the decode instance"), false);
}

TransferStatusAnswer TransferCore::AnswerTransferStatus(const TransferStatusQuery& query) {
  TransferStatusAnswer a;
  for (const std::string& tid : query.transfer_ids) {
    PdMessage cancel;
    cancel.tag = MsgTag::kCancel;
    cancel.transfer_id = tid;
    OnProducerCancel(query.engine_id, cancel);  // tombstoned: nothing of it is written later
    a.settled[tid] = !WriteOutstanding(tid);
  }
  return a;
}

void TransferCore::OnAbortTransfer(const std::string& tid) {
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
    if (!p.engine_done) actions_.AbortRequest(p.seq_id);
    DropProducer(p, Cancelled("transfer aborted"), true);
  }
  if (found) {
    spdlog::info("kv connector: transfer {} aborted on request; its blocks are freed", tid);
    ++stats_.transfers_aborted;
  }
}

void TransferCore::OnPushTarget(const std::string& peer, PdMessage& m) {
  // Logged when attached (AttachTarget): a target that arrives before its prefill request is
  // held, and only the request names it (its log lines carry the request id).
  if (IsTombstoned(m.transfer_id)) {
    const char* why = "unknown or expired transfer (its lease ran out or it already ended)";
    spdlog::warn("kv connector: refusing push target {} from '{}': {}", m.transfer_id, peer, why);
    SendFailure(peer, m.transfer_id, StatusCode::kFailedPrecondition, why);
    return;
  }
  if (m.num_blocks > static_cast<uint32_t>(layout_.num_blocks)) {
    // No prompt computed here can need more blocks than this instance's pool holds.
    ++stats_.bad_messages;
    SendFailure(peer, m.transfer_id, StatusCode::kInvalidArgument,
                "a target of " + std::to_string(m.num_blocks) + " blocks is longer than " +
                    "any prompt of this instance (" + std::to_string(layout_.num_blocks) +
                    " blocks)");
    return;
  }
  if (m.part_offset == 0) ++stats_.push_targets_received;
  auto it = producers_.find(m.transfer_id);
  if (it == producers_.end()) {
    // Target first, prefill request later: keep it until the request arrives (bounded by the
    // lease).
    AddPendingPart(peer, m, arrived_on_);
    return;
  }
  Producer& p = it->second;
  if (p.targeted()) {
    ExtendTarget(p, peer, m, arrived_on_);
    return;
  }
  BlockListAssembly parts(m.num_blocks);
  if (Status s = parts.Add(m.part_offset, m.block_ids); !s.ok()) {
    ++stats_.bad_messages;
    SendFailure(peer, p.tid, StatusCode::kInvalidArgument, s.message());
    return;
  }
  AttachTarget(p, peer, m, std::move(parts), arrived_on_);
}

void TransferCore::AddPendingPart(const std::string& peer, PdMessage& m, uint64_t connection) {
  const std::string& tid = m.transfer_id;
  auto refuse = [&](const std::string& why) {
    spdlog::warn("kv connector: refusing a push target part of {} from '{}': {}", tid, peer, why);
    ++stats_.bad_messages;
    SendFailure(peer, tid, StatusCode::kInvalidArgument, why);
  };
  auto it = pending_targets_.find(tid);
  if (it == pending_targets_.end()) {
    PendingTarget t{peer, m, clock_.Now() + config_.lease, BlockListAssembly(m.num_blocks)};
    t.msg.block_ids.clear();
    t.connection = connection;
    it = pending_targets_.emplace(tid, std::move(t)).first;
  }
  PendingTarget& t = it->second;
  if (t.peer != peer) return refuse("the first part of this target came from '" + t.peer + "'");
  // Parts over different connections: no connection of ours vouches for the whole target.
  if (t.connection != connection) t.connection = kMixedConnections;
  std::string why = PartMismatch(t.msg, m);
  if (why.empty()) {
    if (Status s = t.parts.Add(m.part_offset, m.block_ids); !s.ok()) why = s.message();
  }
  if (!why.empty()) {
    pending_targets_.erase(it);
    refuse(why);
  }
}

void TransferCore::AttachTarget(Producer& p, const std::string& peer, const PdMessage& header,
                                BlockListAssembly parts, uint64_t connection) {
  spdlog::debug("kv connector: push target {} from '{}' ({} blocks from {}, {} received)", p.tid,
                peer, header.num_blocks, header.first_block, parts.received());
  auto fail = [&](const std::string& why) {
    spdlog::warn("kv connector: refusing push target {} from '{}': {}", p.tid, peer, why);
    SendFailure(peer, p.tid, StatusCode::kInvalidArgument, why);
  };
  if (p.state == ProducerState::kDropping) return fail("transfer dropped");
  if (p.mode != Mode::kPush) return fail("the prefill request is not in push mode");
  auto ps = peers_.Find(peer);
  if (!ps) return fail("no handshake with '" + peer + "'");
  const int32_t bs = layout_.block_size;
  const int32_t nblocks = (p.n + bs - 1) / bs;
  if (static_cast<int32_t>(header.num_prompt_tokens) != p.n ||
      header.prompt_hash != p.prompt_hash) {
    return fail("the target's prompt (" + std::to_string(header.num_prompt_tokens) +
                " tokens) is not the prompt computed here (" + std::to_string(p.n) + " tokens)");
  }
  if (static_cast<int32_t>(header.first_block) >= nblocks ||
      static_cast<int32_t>(header.num_blocks) !=
          nblocks - static_cast<int32_t>(header.first_block)) {
    return fail("target covers blocks [" + std::to_string(header.first_block) + ", +" +
                std::to_string(header.num_blocks) + ") of a " + std::to_string(nblocks) +
                "-block prompt");
  }
  p.target = std::move(parts);
  p.target_named.assign(static_cast<size_t>(ps->num_blocks), false);
  if (std::string why = NameTargetBlocks(p, *ps, 0, p.target.total()); !why.empty()) {
    p.target = BlockListAssembly();
    return fail(why);
  }
  p.peer = peer;
  p.target_connection = connection;
  p.first_block = header.first_block;
  Mark(p.timeline, HandoffPhase::kTargetAttached);
  p.timeline.blocks = static_cast<int32_t>(p.target.total());
  for (auto& s : p.layer_sent) s = std::max(s, static_cast<int32_t>(p.first_block));
  PostCovered(p);
}

void TransferCore::ExtendTarget(Producer& p, const std::string& peer, const PdMessage& m,
                                uint64_t connection) {
  if (peer != p.peer) {
    ++stats_.bad_messages;
    SendFailure(peer, p.tid, StatusCode::kInvalidArgument,
                "the first part of this target came from '" + p.peer + "'");
    return;
  }
  if (p.state == ProducerState::kDropping) return;  // TRANSFER_FAILED or CANCEL_ACK follows
  if (p.target.complete()) {
    // A repeated part: the WRITEs into the whole target go on (a TRANSFER_FAILED would make D
    // release blocks they may still land in).
    spdlog::warn("kv connector: push target {} from '{}': a part after the whole target; ignored",
                 p.tid, peer);
    ++stats_.bad_messages;
    return;
  }
  PdMessage header;  // the attached target's, as PartMismatch compares it
  header.num_prompt_tokens = static_cast<uint32_t>(p.n);
  header.prompt_hash = p.prompt_hash;
  header.first_block = p.first_block;
  header.num_blocks = p.target.total();
  std::string why = PartMismatch(header, m);
  if (why.empty() && connection != p.target_connection) {
    // D reconnected between the parts: the blocks named before may have been reused.
    why = "a part of the target came over another connection than its first";
  }
  auto ps = peers_.Find(peer);
  if (why.empty() && !ps) why = "no handshake with '" + peer + "'";
  if (why.empty()) {
    if (Status s = p.target.Add(m.part_offset, m.block_ids); !s.ok()) why = s.message();
  }
  if (why.empty()) {
    why = NameTargetBlocks(p, *ps, m.part_offset, static_cast<uint32_t>(m.block_ids.size()));
  }
  if (!why.empty()) {
    spdlog::warn("kv connector: push target {} from '{}': {}; the transfer is dropped", p.tid, peer,
                 why);
    ++stats_.bad_messages;
    DropProducer(p, InvalidArgument(why), true);
    return;
  }
  spdlog::debug("kv connector: push target {}: part [{}, +{}) ({} of {} blocks covered)", p.tid,
                m.part_offset, m.block_ids.size(), p.target.prefix(), p.target.total());
  // D is alive and its pool progresses: the lease counts from its last part.
  if (p.engine_done) p.lease_deadline = clock_.Now() + config_.lease;
  PostCovered(p);
}

void TransferCore::OnProducerTransferDone(const Outstanding& o, const xfer::TransferStatus& st) {
  auto it = producers_.find(o.tid);
  if (it == producers_.end()) return;
  Producer& p = it->second;
  if (o.kind == XferKind::kReady) {
    if (st.state != xfer::TransferState::kDone) {
      spdlog::warn("kv connector: KV_READY of transfer {} failed: {}", o.tid, st.error.ToString());
    }
    EraseProducer(p);
    return;
  }
  --p.outstanding;
  spdlog::debug("kv connector: {} WRITE ended ({}), {} outstanding", p.tid,
                xfer::TransferStateName(st.state), p.outstanding);
  if (st.state == xfer::TransferState::kDone) {
    stats_.bytes_written += static_cast<int64_t>(o.bytes);
  } else if (p.state != ProducerState::kDropping) {
    DropProducer(p, Status(st.error.code(), "WRITE failed: " + st.error.message()), true);
    return;
  }
  AdvanceProducer(p);
}

void TransferCore::DropProducer(Producer& p, Status why, bool tell_peer) {
  if (p.state != ProducerState::kDropping) {
    p.state = ProducerState::kDropping;
    p.failure = std::move(why);
    p.fail_due = tell_peer && p.targeted();
    if (tell_peer && !p.targeted() && p.mode == Mode::kPush) {
      // D may still send its target: refuse it when it comes.
      Tombstone(p.tid);
    }
    // Cancel WRITEs not yet on the wire; AdvanceProducer waits for the rest to end.
    CancelOutstanding(p.tid, XferKind::kWrite);
  }
  AdvanceProducer(p);
}

void TransferCore::ReleaseProducer(Producer& p) {
  if (p.released || !p.engine_done) return;
  p.released = true;
  actions_.ReleaseBlocks(p.seq_id);
}

void TransferCore::EraseProducer(Producer& p) {
  spdlog::debug("kv connector: producer {} ended (state={}, released={})", p.tid,
                ProducerStateName(p.state), p.released);
  if (pd::IsValidTransferId(p.tid)) {  // not a locally dropped duplicate
    Mark(p.timeline, HandoffPhase::kProducerEnd);
    finished_records_.push_back(std::move(p.timeline));
  }
  Tombstone(p.tid);
  producer_by_seq_.erase(p.seq_id);
  const std::string tid = p.tid;
  producers_.erase(tid);  // p is dangling after this line
}

void TransferCore::AdvanceProducer(Producer& p) {
  if (p.state == ProducerState::kDropping) {
    if (p.outstanding > 0) return;  // wait until no WRITE of ours can land any more
    if (p.fail_due) {
      p.fail_due = false;
      SendFailure(p.peer, p.tid, p.failure.code(), p.failure.message());
    }
    if (p.cancel_ack_due) {
      p.cancel_ack_due = false;
      SendSignal(p.peer, MsgTag::kCancelAck, p.tid);
    }
    if (!p.engine_done) return;  // the engine still owns the blocks; OnProducerDone comes back
    ReleaseProducer(p);
    EraseProducer(p);
    return;
  }
  if (p.mode == Mode::kPull) return;
  if (p.state == ProducerState::kReadyPosted && p.ready_on_write) {
    // KV_READY rode on the last WRITE: once it ended (remote completion) the blocks can go.
    if (p.outstanding > 0) return;
    Mark(p.timeline, HandoffPhase::kWritesDone);
    p.timeline.ok = true;
    ReleaseProducer(p);
    EraseProducer(p);
    return;
  }
  if (p.state != ProducerState::kHeld || !p.targeted()) return;
  const int32_t bs = layout_.block_size;
  const int32_t nblocks = (p.n + bs - 1) / bs;
  for (int32_t s : p.layer_sent) {
    if (s < nblocks) return;
  }
  if (p.outstanding > 0) return;
  // Every WRITE completed (remote visibility): P's blocks can go, and KV_READY follows the data.
  Mark(p.timeline, HandoffPhase::kWritesDone);
  ReleaseProducer(p);
  PostKvReady(p);
}

void TransferCore::OnPin(const std::string& peer, const PdMessage& m) {
  auto refuse = [&](const std::string& why) {
    spdlog::warn("kv connector: refusing to pin transfer {} for '{}': {}", m.transfer_id, peer,
                 why);
    ++stats_.pins_refused;
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
  if (p.state == ProducerState::kDropping) {
    return refuse("the transfer was dropped (lease expired, aborted or failed)");
  }
  if (p.state == ProducerState::kPrefilling && !p.early_pin) {
    p.early_pin.emplace(peer, m);  // the engine's "finished" event is still on its way
    ++stats_.pins_held;
    return;
  }
  if (p.state == ProducerState::kPrefilling) return refuse("the prefill did not finish");
  if (!p.peer.empty() && p.peer != peer) return refuse("already pinned by '" + p.peer + "'");
  if (static_cast<size_t>(m.first_block) + m.num_blocks > p.block_sums.size()) {
    return refuse("blocks [" + std::to_string(m.first_block) + ", +" +
                  std::to_string(m.num_blocks) + ") of a " + std::to_string(p.block_sums.size()) +
                  "-block prompt");
  }
  // Pinned: the lease cannot run out under the READ (D's watchdog is shorter than one lease,
  // which the handshake checks); RELEASE or this deadline frees the blocks.
  p.state = ProducerState::kPinned;
  p.peer = peer;
  p.lease_deadline = clock_.Now() + config_.lease;
  PdMessage a;
  a.tag = MsgTag::kPinned;
  a.transfer_id = p.tid;
  a.num_prompt_tokens = static_cast<uint32_t>(p.n);
  a.prompt_hash = p.prompt_hash;
  a.token_id = p.token.id;
  a.first_token_binding = p.first_token_binding;
  a.logprob = p.token.logprob;
  a.top_logprobs = p.token.top_logprobs;
  if (a.top_logprobs.size() > kMaxTopLogprobs) a.top_logprobs.resize(kMaxTopLogprobs);
  a.first_block = m.first_block;
  a.num_blocks = m.num_blocks;
  const std::span<const BlockId> pinned(p.blocks.data() + m.first_block, m.num_blocks);
  a.kv_digest = KvDigest(std::span<const uint64_t>(p.block_sums.data() + m.first_block,
                                                   m.num_blocks));
  Mark(p.timeline, HandoffPhase::kPinAnswered);  // before the send: D may see it first
  // A list longer than one notification goes in parts, each a whole PINNED (block_list.h).
  for (const auto& [offset, count] : SplitBlockList(pinned, config_.block_list_part_bytes,
                                                         kMaxPartBlocks)) {
    a.part_offset = offset;
    a.block_ids.assign(pinned.begin() + offset, pinned.begin() + offset + count);
    SendMessage(peer, a);
  }
  p.timeline.blocks = static_cast<int32_t>(m.num_blocks);
  p.timeline.ok = true;
}

}  // namespace kvpush::connector
