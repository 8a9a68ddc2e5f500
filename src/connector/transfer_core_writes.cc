// TransferCore, prefill (P) side, push: the KV WRITEs into D's target blocks (layer by layer
// during the prefill, the rest in one WRITE after it, KV_READY as its notification or alone), the
// chunk hashes they carry and KV_READY (docs/pd_protocol.md §3, *The push path*); checks of a
// target's parts (*A target in parts*).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "connector/transfer_core.h"
#include "kv/block_checksum.h"

namespace kvpush::connector {

std::string TransferCore::PartMismatch(const PdMessage& first, const PdMessage& m) {
  if (m.num_prompt_tokens != first.num_prompt_tokens || m.prompt_hash != first.prompt_hash ||
      m.first_block != first.first_block || m.num_blocks != first.num_blocks) {
    return "the parts of the target disagree on its prompt or block range";
  }
  return "";
}

std::string TransferCore::NameTargetBlocks(Producer& p, const PeerView& peer, uint32_t from,
                                           uint32_t count) {
  // Only received slots hold ids: check those (a fresh assembly's others are 0 and unset).
  const std::span<const int32_t> ids = p.target.ids();
  for (uint32_t i = from; i < from + count; ++i) {
    if (!p.target.Has(i)) continue;
    const int32_t b = ids[i];
    if (b < 0 || b >= peer.num_blocks) {
      return "target block " + std::to_string(b) + " is outside the decode pool";
    }
    if (p.target_named[static_cast<size_t>(b)]) return "the target names a decode block twice";
    p.target_named[static_cast<size_t>(b)] = true;
  }
  return "";
}

bool TransferCore::PostCovered(Producer& p) {
  // A target that arrives after the prefill ended gets one WRITE of every layer, whose
  // notification is KV_READY; during the prefill, the layers computed so far go out.
  const bool posted = p.engine_done ? PostRest(p) : TryPostAll(p);
  if (posted) AdvanceProducer(p);  // else dropped: p may be gone
  return posted;
}

bool TransferCore::TryPostAll(Producer& p) {
  for (int32_t layer = 0; layer < static_cast<int32_t>(p.layer_done.size()); ++layer) {
    if (!TryPostLayer(p, layer)) return false;
  }
  return true;
}

bool TransferCore::TryPostLayer(Producer& p, int32_t layer) {
  if (!p.targeted() || p.state == ProducerState::kDropping) return true;
  if (!config_.layerwise && !p.engine_done) return true;
  const int32_t bs = layout_.block_size;
  const int32_t nblocks = (p.n + bs - 1) / bs;
  const int32_t done = p.layer_done[static_cast<size_t>(layer)];
  // A partial block goes at the end; only what D's target covers so far can go.
  const int32_t upto = std::min(done >= p.n ? nblocks : done / bs, p.covered());
  int32_t& sent = p.layer_sent[static_cast<size_t>(layer)];
  if (upto <= sent) return true;
  // The last layer's WRITE that completes the prompt waits for the engine's end (the first
  // token is sampled right after it): PostRest then sends it with KV_READY as its notification.
  if (!p.engine_done && layer + 1 == layout_.num_layers && upto == nblocks) return true;
  const int32_t count = upto - sent;
  const uint64_t bytes = static_cast<uint64_t>(count) * 2 * layout_.chunk_bytes();
  if (bytes < config_.layerwise_min_bytes &&
      !(done >= p.n && DeferredBytes(p, layer, bytes) >= config_.layerwise_min_bytes)) {
    return true;  // goes with the rest (PostRest)
  }
  const std::optional<PeerView> ps = WriteTarget(p, upto);
  if (!ps) return false;
  TransferOrder order = NewWriteOrder(p, static_cast<size_t>(count));
  AppendLayerChunks(order, p, ps->num_blocks, layer, sent, upto);
  // Delivered once these chunks are visible on D, so D can checksum them while P computes on.
  PdMessage landed;
  landed.tag = MsgTag::kLayerReady;
  landed.transfer_id = p.tid;
  landed.layer = static_cast<uint32_t>(layer);
  landed.first_block = static_cast<uint32_t>(sent);
  landed.num_blocks = static_cast<uint32_t>(count);
  if (auto payload = EncodeMessage(landed); payload.ok()) order.notification = std::move(*payload);
  if (!PostWrite(p, order, bytes, "layer " + std::to_string(layer))) return false;
  spdlog::debug("kv connector: {} layer {} WRITE of blocks [{}, {}) posted", p.tid, layer, sent,
                upto);
  HashSentChunks(p, layer, sent, upto);
  sent = upto;
  return true;
}

size_t TransferCore::UnsentBlocks(const Producer& p, int32_t layers, int32_t upto) const {
  size_t blocks = 0;
  for (int32_t l = 0; l < layers; ++l) {
    blocks += static_cast<size_t>(std::max(0, upto - p.layer_sent[static_cast<size_t>(l)]));
  }
  return blocks;
}

uint64_t TransferCore::DeferredBytes(const Producer& p, int32_t layer, uint64_t bytes) const {
  // Layers are computed in order and see the same chunks, so each later layer will hold what
  // this one holds now; the earlier ones hold what they left unsent.
  const int32_t nblocks = (p.n + layout_.block_size - 1) / layout_.block_size;
  return bytes * static_cast<uint64_t>(layout_.num_layers - layer) +
         static_cast<uint64_t>(UnsentBlocks(p, layer, nblocks)) * 2 * layout_.chunk_bytes();
}

TransferOrder TransferCore::NewWriteOrder(const Producer& p, size_t blocks) const {
  TransferOrder order;
  order.op = xfer::Op::kWrite;
  order.peer = p.peer;
  order.local_indices.reserve(blocks * 2);
  order.remote_indices.reserve(blocks * 2);
  return order;
}

void TransferCore::AppendLayerChunks(TransferOrder& order, const Producer& p,
                                     int32_t peer_num_blocks, int32_t layer, int32_t from,
                                     int32_t upto) const {
  for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
    for (int32_t i = from; i < upto; ++i) {
      order.local_indices.push_back(
          EntryIndex(layout_.num_blocks, layer, kind, p.blocks[static_cast<size_t>(i)]));
      order.remote_indices.push_back(
          EntryIndex(peer_num_blocks, layer, kind,
                     p.target.ids()[static_cast<size_t>(i - static_cast<int32_t>(p.first_block))]));
    }
  }
}

std::optional<int64_t> TransferCore::PostWrite(Producer& p, const TransferOrder& order,
                                               uint64_t bytes, const std::string& what) {
  Status err;
  const int64_t post_ns = clock_.NowNanos();  // before the post: D may see it before it returns
  if (!PostTracked(order, p.tid, XferKind::kWrite, bytes, &err)) {
    DropProducer(p, Status(err.code(), "posting the WRITE of " + what + ": " + err.message()),
                 true);
    return std::nullopt;
  }
  ++p.outstanding;
  ++stats_.writes_posted;
  HandoffRecord& r = p.timeline;
  r.Mark(HandoffPhase::kFirstWritePosted, post_ns);
  r.t_ns[static_cast<size_t>(HandoffPhase::kLastWritePosted)] = post_ns;
  ++r.writes;
  if (!order.notification.empty()) ++r.write_notifications;
  return post_ns;
}

void TransferCore::NoteKvReadyPosted(Producer& p, int64_t post_ns) {
  p.state = ProducerState::kReadyPosted;
  p.timeline.Mark(HandoffPhase::kKvReadyPosted, post_ns);
  ++stats_.kv_ready_sent;
  stats_.push_tail_ns_sum += clock_.NowNanos() - p.finished_ns;
  ++stats_.push_tail_count;
}

std::optional<PeerView> TransferCore::WriteTarget(Producer& p, int32_t upto) {
  if (static_cast<int32_t>(p.blocks.size()) < upto) {
    DropProducer(p, Internal("block table shorter than the computed tokens"), true);
    return std::nullopt;
  }
  auto ps = peers_.Find(p.peer);
  if (!ps) {
    DropProducer(p, PeerGone("decode instance '" + p.peer + "' is no longer known"), false);
    return std::nullopt;
  }
  if (ps->connection != p.target_connection) {
    // D dropped (fenced) the connection its target came over and connected again: it may have
    // reused those blocks since. Never WRITE a target over another connection than its own.
    DropProducer(p,
                 PeerGone("the connection to decode instance '" + p.peer +
                          "' changed since its target arrived (it reconnected)"),
                 true);
    return std::nullopt;
  }
  return ps;
}

void TransferCore::HashSentChunks(Producer& p, int32_t layer, int32_t from, int32_t upto) {
  // The chunks are final (this layer's K/V of these tokens are stored): hash them while the
  // WRITE is on the wire and the engine computes the next layer.
  const int64_t hash_start = clock_.NowNanos();
  for (int32_t i = from; i < upto; ++i) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      p.sent_sums.Add(static_cast<size_t>(i), layer, kind,
                      KvChunkHash(layout_, arena_, layer, kind, p.blocks[static_cast<size_t>(i)]));
    }
  }
  stats_.checksum_ns_sum += clock_.NowNanos() - hash_start;
}

PdMessage TransferCore::KvReadyMessage(const Producer& p) const {
  PdMessage r;
  r.tag = MsgTag::kKvReady;
  r.transfer_id = p.tid;
  r.token_id = p.token.id;
  r.first_token_binding = p.first_token_binding;
  r.logprob = p.token.logprob;
  r.kv_digest = PushDigest(p);
  r.top_logprobs = p.token.top_logprobs;
  if (r.top_logprobs.size() > kMaxTopLogprobs) r.top_logprobs.resize(kMaxTopLogprobs);
  return r;
}

bool TransferCore::PostRest(Producer& p) {
  if (!p.targeted() || p.state == ProducerState::kDropping) return true;
  const int32_t bs = layout_.block_size;
  const int32_t nblocks = (p.n + bs - 1) / bs;
  const int32_t upto = std::min(nblocks, p.covered());  // the rest waits for D's next parts
  const size_t chunks = UnsentBlocks(p, layout_.num_layers, upto);
  if (chunks == 0) return true;  // everything went out layer by layer: KV_READY follows the ends
  const std::optional<PeerView> ps = WriteTarget(p, upto);
  if (!ps) return false;
  TransferOrder order = NewWriteOrder(p, chunks);
  for (int32_t layer = 0; layer < layout_.num_layers; ++layer) {
    const int32_t from = p.layer_sent[static_cast<size_t>(layer)];
    AppendLayerChunks(order, p, ps->num_blocks, layer, from, upto);
    // Final (the request finished): hashed now, as the KV_READY below carries their digest.
    if (from < upto) HashSentChunks(p, layer, from, upto);
  }
  // KV_READY rides on this WRITE (the notification is delivered only after its data) when it
  // completes the target and no other WRITE of the transfer is in flight; else it follows once
  // they all ended.
  const bool with_ready = p.outstanding == 0 && upto == nblocks;
  if (with_ready) {
    auto payload = EncodeMessage(KvReadyMessage(p));
    if (payload.ok()) order.notification = std::move(*payload);
  }
  const uint64_t bytes = static_cast<uint64_t>(chunks) * 2 * layout_.chunk_bytes();
  const std::optional<int64_t> post_ns = PostWrite(p, order, bytes, "the prompt's KV");
  if (!post_ns) return false;
  spdlog::debug("kv connector: {} WRITE of the rest ({} chunks{}) posted", p.tid, chunks * 2,
                with_ready ? ", KV_READY as its notification" : "");
  for (int32_t& s : p.layer_sent) s = std::max(s, upto);
  if (with_ready && !order.notification.empty()) {
    p.ready_on_write = true;
    ++stats_.kv_ready_on_write;
    NoteKvReadyPosted(p, *post_ns);
  }
  return true;
}

void TransferCore::PostKvReady(Producer& p) {
  const PdMessage r = KvReadyMessage(p);
  const int64_t post_ns = clock_.NowNanos();  // before the send: D may see it before it returns
  auto t = actions_.SendMessage(p.peer, r);
  if (!t.ok()) {
    spdlog::warn("kv connector: cannot send KV_READY of {}: {}", p.tid, t.status().ToString());
    EraseProducer(p);
    return;
  }
  outstanding_[*t] = Outstanding{p.tid, XferKind::kReady, 0};
  NoteKvReadyPosted(p, post_ns);
  ++p.timeline.messages_sent;
  p.timeline.ok = true;
  spdlog::debug("kv connector: KV_READY of {} posted", p.tid);
}

uint64_t TransferCore::PushDigest(const Producer& p) const {
  // Every chunk of the target is hashed before KV_READY is built (HashSentChunks, PostRest). A
  // missing one would be a bug here; 0 then makes D's check fail (DataLoss), never pass.
  const std::optional<uint64_t> d = p.sent_sums.Digest(p.first_block);
  if (!d) spdlog::error("kv connector: {}: KV_READY digest over chunks not all hashed", p.tid);
  return d.value_or(0);
}

}  // namespace kvpush::connector
