// TransferCore, decode (D) side: push targets, KV_READY, pull PINs and READs, checksums,
// watchdog outcomes.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "connector/transfer_core.h"
#include "kv/block_checksum.h"

namespace kvpush::connector {

using Mode = pd::KvTransferParams::Mode;

Result<TransferOrder> MakeReadOrder(const KvLayout& layout, const std::string& peer,
                                    int32_t peer_num_blocks, std::span<const BlockId> local,
                                    std::span<const int32_t> remote) {
  if (local.size() != remote.size() || local.empty()) {
    return InvalidArgument("READ: local and remote block counts differ");
  }
  TransferOrder order;
  order.op = xfer::Op::kRead;
  order.peer = peer;
  const size_t n = local.size() * 2 * static_cast<size_t>(layout.num_layers);
  order.local_indices.reserve(n);
  order.remote_indices.reserve(n);
  for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      for (size_t i = 0; i < local.size(); ++i) {
        if (remote[i] < 0 || remote[i] >= peer_num_blocks) {
          return InvalidArgument("READ: remote block " + std::to_string(remote[i]) +
                                 " is outside the prefill pool");
        }
        order.local_indices.push_back(
            TransferCore::EntryIndex(layout.num_blocks, layer, kind, local[i]));
        order.remote_indices.push_back(
            TransferCore::EntryIndex(peer_num_blocks, layer, kind, remote[i]));
      }
    }
  }
  return order;
}

Result<TransferOrder> TransferCore::BuildRead(const std::string& peer,
                                              std::span<const BlockId> local,
                                              std::span<const int32_t> remote) const {
  auto ps = peers_.Find(peer);
  if (!ps) return NotFound("no handshake with prefill instance '" + peer + "'");
  return MakeReadOrder(layout_, peer, ps->num_blocks, local, remote);
}

void TransferCore::OnReadPosted(ReadPostedEvent& ev) {
  // vllm profile: the engine thread posted (or failed to post) the READ.
  const std::string& tid = ev.transfer_id;
  auto it = consumers_.find(tid);
  if (it == consumers_.end()) {
    if (ev.error.ok()) actions_.Cancel(ev.transfer);
    return;
  }
  Consumer& c = it->second;
  if (!ev.error.ok()) {
    CompleteConsumer(c, Status(ev.error.code(), "posting the READ: " + ev.error.message()),
                     std::nullopt);
    return;
  }
  c.read_posted_ns = clock_.NowNanos();
  c.timeline.Mark(HandoffPhase::kReadPosted, c.read_posted_ns);
  ++c.timeline.reads;
  c.timeline.descriptors += ev.descriptors;
  c.timeline.bytes += ev.descriptors * static_cast<int64_t>(layout_.chunk_bytes());
  c.timeline.post_ns += ev.post_ns;
  outstanding_[ev.transfer] = Outstanding{tid, XferKind::kRead, 0};
  if (c.state == ConsumerState::kCancelling || c.state == ConsumerState::kQuarantined) {
    // The watchdog fired while the READ waited for the engine thread: end it at once (the
    // consumer completes when it has ended, so nothing lands in reused blocks).
    actions_.Cancel(ev.transfer);
  } else {
    c.state = ConsumerState::kReading;
  }
}

void TransferCore::OnConsumerStart(ConsumerStartEvent& ev) {
  const std::string& tid = ev.params.transfer_id;
  if (consumers_.count(tid) != 0) {
    // A duplicate transfer id (router bug or replay): never let two requests share targets.
    actions_.FinishLoad(KvLoadResult{
        ev.seq_id, AlreadyExists("transfer id " + tid + " is already in use on this instance"),
        config_.failure_policy == FailurePolicy::kRecompute, std::nullopt});
    return;
  }
  Consumer c;
  c.seq_id = ev.seq_id;
  c.request_id = std::move(ev.request_id);
  c.tid = tid;
  c.mode = ev.params.mode;
  c.state = c.mode == Mode::kPush ? ConsumerState::kAwaitingKv : ConsumerState::kPinSent;
  c.blocks = std::move(ev.blocks);
  c.local_tokens = ev.local_tokens;
  c.external_tokens = ev.external_tokens;
  c.n = ev.num_prompt_tokens;
  c.prompt_hash = ev.prompt_hash;
  c.first_token_binding = ev.first_token_binding;
  // The watchdog counts from the request's arrival: time spent in this instance's queue is
  // time P's lease was running too.
  c.deadline = TimePoint(std::chrono::nanoseconds(ev.arrival_ns)) + config_.watchdog;
  const int32_t bs = layout_.block_size;
  c.first_block = static_cast<uint32_t>(c.local_tokens / bs);
  c.num_blocks =
      static_cast<uint32_t>((c.local_tokens + c.external_tokens + bs - 1) / bs) - c.first_block;
  c.profile = ev.params.pull_profile.value_or(config_.pull_profile);
  c.take_first_token = c.mode == Mode::kPull && c.profile == pd::PullProfile::kFast &&
                       c.local_tokens + c.external_tokens == c.n;
  c.peer = PeerOf(ev.params);
  c.peer_host = ev.params.remote_host;
  c.peer_port = ev.params.remote_port;
  if (auto view = peers_.Find(c.peer)) c.peer_incarnation = view->incarnation;
  c.timeline.transfer_id = tid;
  c.timeline.push = c.mode == Mode::kPush;
  c.timeline.blocks = static_cast<int32_t>(c.num_blocks);
  Mark(c.timeline, HandoffPhase::kConsumerStart);
  auto [it, inserted] = consumers_.emplace(tid, std::move(c));
  (void)inserted;
  Consumer& con = it->second;
  if (con.peer.empty()) {
    CompleteConsumer(con, FailedPrecondition("no handshake with the prefill instance"),
                     std::nullopt);
    return;
  }
  if (clock_.Now() >= con.deadline) {
    // Waited out the whole watchdog in the queue. Nothing was announced, so nothing can land;
    // tell P to drop the transfer (push) or free its lease (pull: CompleteConsumer's RELEASE).
    if (con.mode == Mode::kPush) {
      SendFailure(con.peer, tid, StatusCode::kDeadlineExceeded, "decode gave up before admission");
    }
    ++stats_.watchdog_expired;
    CompleteConsumer(con,
                     DeadlineExceeded("the request waited longer than the KV watchdog (" +
                                      std::to_string(config_.watchdog.count()) +
                                      " ms) before its KV could be requested"),
                     std::nullopt);
    return;
  }
  SendConsumerRequest(con);
}

void TransferCore::SendConsumerRequest(Consumer& con) {
  if (con.num_blocks > kMaxTransferBlocks) {
    CompleteConsumer(con,
                     InvalidArgument("prompt needs " + std::to_string(con.num_blocks) +
                                     " blocks moved; one transfer names at most " +
                                     std::to_string(kMaxTransferBlocks)),
                     std::nullopt);
    return;
  }
  PdMessage m;
  m.transfer_id = con.tid;
  m.first_block = con.first_block;
  m.num_blocks = con.num_blocks;
  Mark(con.timeline, HandoffPhase::kRequestSent);  // before the send: P may see it first
  // The connection the request goes over, when it is the same before and after the sends (ids
  // are never reused): a fence of it then covers every WRITE P may make into these blocks.
  const uint64_t connection = ConnectionTo(con.peer);
  SendRequestMessages(con, m);
  con.peer_connection = ConnectionTo(con.peer) == connection ? connection : 0;
}

void TransferCore::SendRequestMessages(Consumer& con, PdMessage& m) {
  if (con.mode == Mode::kPush) {
    AnnounceTargetBlocks(con);
    ++stats_.push_targets_sent;
    if (con.announced < con.num_blocks) ++stats_.push_targets_partial;
    return;
  }
  // Pull: read only what P confirms it still holds (DESIGN.md §3 pull step 3).
  m.tag = MsgTag::kPin;
  spdlog::debug("kv connector: PIN of transfer {} sent to '{}' ({} blocks from {})", con.tid,
                con.peer, con.num_blocks, m.first_block);
  SendMessage(con.peer, m);
  ++stats_.pins_sent;
}

void TransferCore::AnnounceTargetBlocks(Consumer& c) {
  const size_t have = c.blocks.size() > c.first_block ? c.blocks.size() - c.first_block : 0;
  const auto upto = static_cast<uint32_t>(std::min<size_t>(have, c.num_blocks));
  if (upto <= c.announced) return;
  PdMessage m;  // every part carries the whole target's header
  m.tag = MsgTag::kPushTarget;
  m.transfer_id = c.tid;
  m.num_prompt_tokens = static_cast<uint32_t>(c.n);
  // The prompt hash is recomputed here from the engine's tokens: they are the prompt.
  m.prompt_hash = c.prompt_hash;
  m.first_block = c.first_block;
  m.num_blocks = c.num_blocks;
  const std::span<const BlockId> fresh(c.blocks.data() + c.first_block + c.announced,
                                       upto - c.announced);
  // A list longer than one notification goes in parts, each a whole PUSH_TARGET
  // (block_list.h); P writes the entries its parts cover, in order, and KV_READY once it has
  // every part.
  const auto parts = SplitBlockList(fresh, config_.block_list_part_bytes, kMaxPartBlocks);
  spdlog::debug("kv connector: push target {} to '{}': blocks [{}, {}) of {} from {}, {} parts",
                c.tid, c.peer, c.announced, upto, c.num_blocks, m.first_block, parts.size());
  for (const auto& [offset, count] : parts) {
    m.part_offset = c.announced + offset;
    m.block_ids.assign(fresh.begin() + offset, fresh.begin() + offset + count);
    SendMessage(c.peer, m);
  }
  c.announced = upto;
}

void TransferCore::OnConsumerBlocks(ConsumerBlocksEvent& ev) {
  auto it = consumers_.find(ev.transfer_id);
  // Its load ended meanwhile (failed, cancelled): the blocks are the engine's again.
  if (it == consumers_.end() || it->second.seq_id != ev.seq_id) return;
  Consumer& c = it->second;
  if (c.mode != Mode::kPush || c.state != ConsumerState::kAwaitingKv) return;
  c.blocks.insert(c.blocks.end(), ev.blocks.begin(), ev.blocks.end());
  const uint64_t connection = ConnectionTo(c.peer);
  AnnounceTargetBlocks(c);
  // The parts of one target must go over one connection (P refuses the others): a reconnect
  // since the first part leaves no connection whose fence covers every WRITE into the blocks.
  if (connection != c.peer_connection || ConnectionTo(c.peer) != connection) {
    c.peer_connection = 0;
  }
  // The wait was this instance's own pool: the watchdog counts from the blocks' announcement.
  c.deadline = std::max(c.deadline, clock_.Now() + config_.watchdog);
}

void TransferCore::OnPinned(Consumer& c, PdMessage& m) {
  if (c.mode != Mode::kPull || c.state != ConsumerState::kPinSent) {
    ++stats_.bad_messages;
    return;
  }
  if (m.first_block != c.first_block || m.num_blocks != c.num_blocks ||
      static_cast<int32_t>(m.num_prompt_tokens) != c.n || m.prompt_hash != c.prompt_hash) {
    ++stats_.bad_messages;
    CompleteConsumer(c, DataLoss("the prefill instance pinned a different prompt or block range"),
                     std::nullopt);
    return;
  }
  if (!AddPinnedPart(c, m)) return;  // parts still missing, or refused
  Mark(c.timeline, HandoffPhase::kPinnedReceived);
  c.expected_digest = m.kv_digest;
  if (c.take_first_token && TokenIsBound(c, m)) {
    c.first_token = TokenOutput{m.token_id, m.logprob, std::move(m.top_logprobs)};
  }
  std::vector<BlockId> local(c.blocks.begin() + c.first_block,
                             c.blocks.begin() + c.first_block + c.num_blocks);
  if (c.profile == pd::PullProfile::kVllm) {
    c.state = ConsumerState::kReadHanded;
    actions_.HandRead(
        PendingRead{c.seq_id, c.tid, c.peer, std::move(local), std::move(m.block_ids)});
    return;
  }
  auto order = BuildRead(c.peer, local, m.block_ids);
  Status err = order.status();
  c.read_posted_ns = clock_.NowNanos();
  if (order.ok() && PostTracked(*order, c.tid, XferKind::kRead, 0, &err)) {
    c.timeline.Mark(HandoffPhase::kReadPosted, c.read_posted_ns);
    ++c.timeline.reads;
    c.state = ConsumerState::kReading;
    return;
  }
  CompleteConsumer(c, Status(err.code(), "posting the READ: " + err.message()), std::nullopt);
}

bool TransferCore::AddPinnedPart(Consumer& c, PdMessage& m) {
  if (IsWholeList(m) && c.pinned_parts.total() == 0) return CheckPinnedList(c, m);
  if (c.pinned_parts.total() == 0) {
    c.pinned_parts = BlockListAssembly(c.num_blocks);
    c.expected_digest = m.kv_digest;
  }
  // Every part repeats the header: they must agree, or the answer is not one lease.
  Status s = m.kv_digest == c.expected_digest
                 ? c.pinned_parts.Add(m.part_offset, m.block_ids)
                 : InvalidArgument("the parts disagree on the KV digest");
  if (!s.ok()) {
    ++stats_.bad_messages;
    CompleteConsumer(c, DataLoss("malformed pinned answer: " + s.message()), std::nullopt);
    return false;
  }
  if (!c.pinned_parts.complete()) return false;
  m.block_ids = c.pinned_parts.Take();
  return CheckPinnedList(c, m);
}

bool TransferCore::CheckPinnedList(Consumer& c, const PdMessage& m) {
  if (!HasDuplicateBlocks(m.block_ids)) return true;
  ++stats_.bad_messages;
  CompleteConsumer(c, DataLoss("the prefill instance pinned a block twice"), std::nullopt);
  return false;
}

KvDigestBuilder& TransferCore::ReceivedSums(Consumer& c) const {
  if (c.received_sums.num_blocks() != c.num_blocks) {
    c.received_sums = KvDigestBuilder(c.num_blocks, layout_.num_layers);
  }
  return c.received_sums;
}

bool TransferCore::HashReceivedChunk(Consumer& c, size_t i, int32_t layer, KvKind kind) {
  KvDigestBuilder& sums = ReceivedSums(c);
  if (sums.Has(i, layer, kind)) return false;
  return sums.Add(i, layer, kind,
                  KvChunkHash(layout_, arena_, layer, kind, c.blocks[c.first_block + i]));
}

void TransferCore::OnLayerReady(Consumer& c, const PdMessage& m) {
  // Only blocks announced to P can have been written.
  const bool in_range = c.mode == Mode::kPush &&
                        m.layer < static_cast<uint32_t>(layout_.num_layers) &&
                        m.first_block >= c.first_block &&
                        static_cast<uint64_t>(m.first_block) + m.num_blocks <=
                            static_cast<uint64_t>(c.first_block) + c.announced;
  if (!in_range) {
    ++stats_.bad_messages;
    return;
  }
  if (!config_.verify_checksums || c.state == ConsumerState::kCancelling ||
      c.state == ConsumerState::kQuarantined) {
    return;
  }
  const int64_t start = clock_.NowNanos();
  bool progress = false;
  for (uint32_t b = m.first_block; b < m.first_block + m.num_blocks; ++b) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      progress |= HashReceivedChunk(c, b - c.first_block, static_cast<int32_t>(m.layer), kind);
    }
  }
  stats_.verify_early_ns_sum += clock_.NowNanos() - start;
  // KV that had not landed before did: the transfer progresses, so the watchdog counts from
  // now. A long prefill pushed layer by layer is not given up while it streams in; each chunk
  // counts once, so a peer cannot keep a transfer alive by repeating itself.
  if (progress && c.state == ConsumerState::kAwaitingKv) {
    c.deadline = std::max(c.deadline, clock_.Now() + config_.watchdog);
  }
}

Status TransferCore::VerifyReceived(Consumer& c) {
  if (!config_.verify_checksums) return Status::Ok();
  const int64_t start = clock_.NowNanos();
  const auto L = layout_.num_layers;
  // What no LAYER_READY announced (the WRITE that carried KV_READY, or all of a transfer
  // without them) is hashed now; blocks whose chunks all came early cost one check each.
  const KvDigestBuilder& sums = ReceivedSums(c);
  for (size_t i = 0; i < c.num_blocks; ++i) {
    if (sums.BlockComplete(i)) continue;
    for (int32_t layer = 0; layer < L; ++layer) {
      HashReceivedChunk(c, i, layer, KvKind::kKey);
      HashReceivedChunk(c, i, layer, KvKind::kValue);
    }
  }
  const uint64_t got = *sums.Digest();  // complete: every chunk was hashed above
  const bool ok = got == c.expected_digest;
  stats_.blocks_verified += c.num_blocks;
  stats_.verify_ns_sum += clock_.NowNanos() - start;
  if (ok) return Status::Ok();
  ++stats_.checksum_mismatches;
  spdlog::error(
      "kv connector: transfer {}: checksum mismatch over {} received blocks "
      "(digest {:016x}, prefill sent {:016x}); the KV is discarded",
      c.tid, c.num_blocks, got, c.expected_digest);
  return DataLoss("received KV failed its checksum");
}

void TransferCore::OnConsumerAbort(const ConsumerAbortEvent& ev) {
  auto it = consumers_.find(ev.transfer_id);
  if (it == consumers_.end() || it->second.seq_id != ev.seq_id) {
    // Its load already ended (the result crossed the abort): nothing can land any more.
    actions_.ReleaseBlocks(ev.seq_id);
    return;
  }
  Consumer& c = it->second;
  c.aborted = true;
  if (c.state == ConsumerState::kCancelling || c.state == ConsumerState::kQuarantined) return;
  if (c.mode == Mode::kPush) {
    BeginPushCancel(c, clock_.Now());
    return;
  }
  const bool reading = c.state == ConsumerState::kReading;
  c.state = ConsumerState::kCancelling;
  c.cancel_deadline = clock_.Now() + config_.cancel_ack;
  if (!reading) {
    CompleteConsumer(c, Aborted("aborted"), std::nullopt);
    return;
  }
  CancelOutstanding(c.tid, XferKind::kRead);
}

void TransferCore::OnConsumerMessage(const std::string& peer, PdMessage& m) {
  auto it = consumers_.find(m.transfer_id);
  if (it == consumers_.end() || it->second.peer != peer) {
    if (m.tag != MsgTag::kCancelAck) {
      spdlog::debug("kv connector: message {} for unknown transfer {} from '{}'",
                    static_cast<int>(m.tag), m.transfer_id, peer);
    }
    return;
  }
  Consumer& c = it->second;
  switch (m.tag) {
    case MsgTag::kKvReady:
      OnKvReady(c, m);
      return;
    case MsgTag::kPinned:
      OnPinned(c, m);
      return;
    case MsgTag::kLayerReady:
      OnLayerReady(c, m);
      return;
    case MsgTag::kCancelAck:
      CompleteConsumer(c, CancelledLoadStatus(c), std::nullopt);
      return;
    case MsgTag::kTransferFailed:
      // P sends it only once none of its WRITEs can land any more.
      CompleteConsumer(c, Unavailable("prefill instance failed the transfer: " + m.message),
                       std::nullopt);
      return;
    default:
      return;
  }
}

Status TransferCore::CancelledLoadStatus(const Consumer& c) const {
  if (!c.cancel_reason.ok()) return c.cancel_reason;
  return DeadlineExceeded("KV did not arrive within " + std::to_string(config_.watchdog.count()) +
                          " ms");
}

void TransferCore::OnConsumerMessageFailed(Consumer& c, const Status& error) {
  switch (c.state) {
    case ConsumerState::kAwaitingKv:
      // A failed completion does not say the PUSH_TARGET was not delivered: P may hold the
      // targets and WRITE into them. Releasing the blocks now let a late WRITE land in another
      // request's KV (chaos_test: HTTP 200 with wrong tokens). Cancel as the watchdog does; the
      // blocks come back only once nothing of P can land.
      c.cancel_reason = PeerGone("could not reach the prefill instance: " + error.ToString());
      BeginPushCancel(c, clock_.Now());
      return;
    case ConsumerState::kPinSent:
      // Pull, no READ posted: D's blocks are written only by its own READ, so nothing can land.
      CompleteConsumer(c, PeerGone("could not reach the prefill instance: " + error.ToString()),
                       std::nullopt);
      return;
    case ConsumerState::kReadHanded:
    case ConsumerState::kReading:
    case ConsumerState::kCancelling:
    case ConsumerState::kQuarantined:
      // A lost CANCEL or a message beside a READ in flight: the cancel deadline, the CANCEL
      // re-sends of the quarantine and the READ's own end decide; releasing here would not wait
      // for P's WRITEs (the same hole).
      return;
  }
}

void TransferCore::OnKvReady(Consumer& c, PdMessage& m) {
  if (c.mode != Mode::kPush) return;
  ++stats_.kv_ready_received;
  if (c.state == ConsumerState::kQuarantined) {
    // Late: every WRITE of P settled before it was sent, so the blocks can be reused; the
    // request went on without them.
    CompleteConsumer(c, Aborted("KV arrived after the load was given up"), std::nullopt);
    return;
  }
  if (c.announced < c.num_blocks) {
    // P writes nothing more after KV_READY, but it cannot have written blocks it was never told.
    ++stats_.bad_messages;
    CompleteConsumer(c, DataLoss("KV_READY before the whole push target was announced"),
                     std::nullopt);
    return;
  }
  // KV_READY is ordered after every WRITE of the transfer: the blocks hold the prompt's K/V,
  // unless something corrupted them on the way, which the digest tells.
  Mark(c.timeline, HandoffPhase::kKvArrived);
  c.expected_digest = m.kv_digest;
  Status verified = VerifyReceived(c);
  if (!verified.ok()) {
    CompleteConsumer(c, std::move(verified), std::nullopt);
    return;
  }
  Mark(c.timeline, HandoffPhase::kVerified);
  std::optional<TokenOutput> token;
  if (TokenIsBound(c, m)) token = TokenOutput{m.token_id, m.logprob, std::move(m.top_logprobs)};
  CompleteConsumer(c, Status::Ok(), std::move(token));
}

bool TransferCore::TokenIsBound(const Consumer& c, const PdMessage& m) {
  if (m.first_token_binding == c.first_token_binding) return true;
  // P sampled its first token under other settings than this request's (a client that sent
  // the legs itself): the KV is the prompt's all the same, but the token is not this request's
  // to emit. The load ends without it and the engine computes the last prompt token here.
  ++stats_.first_tokens_unbound;
  spdlog::info("kv connector: transfer {}: the prefill instance sampled its first token under "
               "other sampling settings; the last prompt token is computed here",
               c.tid);
  return false;
}

void TransferCore::OnConsumerTransferDone(const Outstanding& o, const xfer::TransferStatus& st) {
  auto it = consumers_.find(o.tid);
  if (it == consumers_.end()) return;
  Consumer& c = it->second;
  if (st.state != xfer::TransferState::kDone) {
    CompleteConsumer(c, Status(st.error.code(), "READ failed: " + st.error.message()),
                     std::nullopt);
    return;
  }
  ++stats_.reads_completed;
  stats_.read_ns_sum += clock_.NowNanos() - c.read_posted_ns;
  ++stats_.read_count;
  Mark(c.timeline, HandoffPhase::kKvArrived);
  Status verified = VerifyReceived(c);
  if (verified.ok()) Mark(c.timeline, HandoffPhase::kVerified);
  CompleteConsumer(c, verified, verified.ok() ? c.first_token : std::nullopt);
}

void TransferCore::CompleteConsumer(Consumer& c, Status status, std::optional<TokenOutput> token) {
  if (c.state == ConsumerState::kQuarantined) {
    ++stats_.quarantines_released;
    spdlog::info("kv connector: transfer {}: quarantine of {} blocks ends ({})", c.tid,
                 c.num_blocks, status.ok() ? "ok" : status.ToString());
  }
  // Pull: P may free its leased blocks whatever happened here (READ done, failed, abandoned).
  if (c.mode == Mode::kPull && !c.peer.empty()) SendSignal(c.peer, MsgTag::kRelease, c.tid);
  if (c.aborted) {
    actions_.ReleaseBlocks(c.seq_id);
  } else {
    KvLoadResult r;
    r.seq_id = c.seq_id;
    r.recompute = config_.failure_policy == FailurePolicy::kRecompute;
    if (!status.ok()) {
      spdlog::warn("kv connector: transfer {} failed: {} (policy {})", c.tid, status.ToString(),
                   r.recompute ? "recompute" : "fail");
    } else {
      spdlog::debug("kv connector: transfer {} loaded ({} blocks from '{}', verified)", c.tid,
                    c.num_blocks, c.peer);
    }
    r.status = std::move(status);
    r.first_token = std::move(token);
    actions_.FinishLoad(std::move(r));
  }
  Mark(c.timeline, HandoffPhase::kLoadFinished);
  c.timeline.ok = c.timeline.at(HandoffPhase::kVerified) != 0;
  finished_records_.push_back(std::move(c.timeline));
  const std::string tid = c.tid;
  consumers_.erase(tid);  // c is dangling after this line
}

}  // namespace kvpush::connector
