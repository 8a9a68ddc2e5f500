// PdConnector, the engine-thread hooks (engine/kv_connector.h): what the engine tells the
// connector (a request got its blocks, a step and its layers, a request finished or was refused)
// becomes an event queued for the connector thread; what the connector thread decided (blocks to
// release, loads finished, READs to post) is taken back here. Nothing here decides protocol: the
// events go to TransferCore, the pd/ vocabulary answers the token arithmetic.
#include <spdlog/spdlog.h>

#include <chrono>

#include "connector/pd_connector.h"
#include "engine/first_token_binding.h"
#include "pd/checks.h"
#include "pd/ids.h"

namespace kvpush::connector {
namespace {

/// The tokens whose KV a leg moves (the protocol's num_prompt_tokens): the prompt, plus the
/// output a continuation resumes (a migration's legs: the source computes prompt + resumed
/// output from its prefix cache and pushes all of it; docs/reliability.md, *Migration*).
int32_t TransferTokens(const Sequence& seq) { return seq.num_prefill_tokens(); }

/// XXH3 of those tokens (the protocol's prompt_hash).
uint64_t PromptHashOf(const Sequence& seq) {
  return pd::PromptHash(
      std::span<const int32_t>(seq.tokens.data(), static_cast<size_t>(TransferTokens(seq))));
}

/// The fields a leg's start event has on either side (ProducerStartEvent, ConsumerStartEvent).
template <typename Event>
Event LegStart(const Sequence& seq, std::span<const BlockId> blocks) {
  Event ev;
  ev.seq_id = seq.seq_id;
  ev.request_id = seq.request.request_id;
  ev.params = seq.request.kv_transfer;
  ev.num_prompt_tokens = TransferTokens(seq);
  ev.prompt_hash = PromptHashOf(seq);
  ev.first_token_binding = FirstTokenBinding(seq.request);
  ev.blocks.assign(blocks.begin(), blocks.end());
  return ev;
}

/// D: a request admitted again after a preemption. Its transfer was asked for (or declined) at its
/// first admission and has ended since (P released or tombstoned it): asking again would only be
/// refused, so it computes what its prefix cache no longer holds, like any preempted request.
bool ReadmittedConsumer(const Sequence& seq) {
  return seq.request.kv_transfer.role == pd::KvTransferParams::Role::kConsumer &&
         seq.num_preemptions > 0;
}

}  // namespace

void PdConnector::BindEngine(std::function<void()> wake, std::function<void(int64_t)> abort) {
  wake_engine_ = std::move(wake);
  abort_request_ = std::move(abort);
}

void PdConnector::Push(EngineEvent ev, bool wake) {
  {
    MutexLock lock(mu_);
    inbox_.push_back(std::move(ev));
  }
  if (wake) cv_.NotifyOne();
}

KvMatch PdConnector::GetNumMatchedTokens(const Sequence& seq, int32_t local) {
  const pd::KvTransferParams& p = seq.request.kv_transfer;
  if (ReadmittedConsumer(seq)) return {};
  const int32_t external =
      pd::TokensFromProducer(p, p.pull_profile.value_or(options_.config.pull_profile),
                             TransferTokens(seq), local, options_.layout.block_size);
  if (external == 0) return {};
  return KvMatch{external, true};
}

void PdConnector::OnBlocksAllocated(const Sequence& seq, std::span<const BlockId> blocks,
                                    int32_t num_external) {
  const pd::KvTransferParams& p = seq.request.kv_transfer;
  using Role = pd::KvTransferParams::Role;
  if (p.role == Role::kProducer) {
    auto ev = LegStart<ProducerStartEvent>(seq, blocks);
    ev.answer_needed = seq.request.prompt_logprobs >= 0;
    if (p.mode == pd::KvTransferParams::Mode::kPush)
      push_producers_[seq.seq_id] = TransferTokens(seq);
    Push(std::move(ev));
    return;
  }
  if (p.role != Role::kConsumer || ReadmittedConsumer(seq)) return;
  const int32_t local = seq.num_computed;
  if (num_external == 0) {
    // Full prefix hit (or nothing to load): tell P it need not compute or send anything.
    Push(ConsumerNotNeededEvent{p});
    return;
  }
  ++engine_waiting_;
  consumers_engine_[seq.seq_id] = 1;
  auto ev = LegStart<ConsumerStartEvent>(seq, blocks);
  ev.local_tokens = local;
  ev.external_tokens = num_external;
  ev.arrival_ns = seq.arrival_ns;
  Push(std::move(ev));
}

bool PdConnector::AcceptsPartialBlocks(const Sequence& seq) const {
  // Push only: P writes what the target covers as it comes. A pull READ is posted once, after
  // P's prefill, into blocks that must all exist then.
  const pd::KvTransferParams& p = seq.request.kv_transfer;
  return options_.config.partial_targets && p.role == pd::KvTransferParams::Role::kConsumer &&
         p.mode == pd::KvTransferParams::Mode::kPush;
}

void PdConnector::OnBlocksExtended(const Sequence& seq, std::span<const BlockId> added) {
  if (consumers_engine_.count(seq.seq_id) == 0) return;  // its load did not start here
  ConsumerBlocksEvent ev;
  ev.seq_id = seq.seq_id;
  ev.transfer_id = seq.request.kv_transfer.transfer_id;
  ev.blocks.assign(added.begin(), added.end());
  Push(std::move(ev));
}

LayerObserver* PdConnector::BeginStep(std::span<const SequenceChunk> batch) {
  // vLLM's NixlConnector posts the READ from the engine (worker) thread in start_load_kv, right
  // before the next forward pass; the vllm profile does the same once P pinned the lease.
  std::vector<PendingRead> reads;
  {
    MutexLock lock(out_mu_);
    reads.swap(reads_to_post_);
  }
  for (PendingRead& r : reads) PostHandedRead(r);
  if (push_producers_.empty() || !options_.config.layerwise) return nullptr;
  StepEvent ev;
  for (const SequenceChunk& c : batch) {
    if (push_producers_.count(c.seq_id) == 0) continue;
    ev.chunks.push_back(
        StepChunk{c.seq_id, c.start_pos + static_cast<int32_t>(c.tokens.size()),
                  std::vector<BlockId>(c.block_table.begin(), c.block_table.end())});
  }
  if (ev.chunks.empty()) return nullptr;
  Push(std::move(ev), layer_events_wanted_.load(std::memory_order_relaxed));
  return this;
}

void PdConnector::PostHandedRead(PendingRead& r) {
  // Finished (aborted) since the connector handed it over: its blocks are held until the
  // connector thread sees the abort, which it handles as "never posted".
  if (consumers_engine_.count(r.seq_id) == 0) return;
  ReadPostedEvent ev;
  ev.transfer_id = r.tid;
  auto peer = peers_->Find(r.peer);
  auto order =
      peer ? MakeReadOrder(options_.layout, r.peer, peer->num_blocks, r.local, r.remote)
           : Result<TransferOrder>(NotFound("no handshake with prefill instance '" + r.peer + "'"));
  auto t = order.ok() ? CreateTransfer(*order) : Result<xfer::TransferHandle>(order.status());
  if (!t.ok()) {
    ev.error = t.status();
  } else {
    ev.transfer = t->packed();
    const auto ops = agent_->TransferOpCount(*t);
    const auto post_start = std::chrono::steady_clock::now();
    ev.error = agent_->Post(*t);
    ev.post_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - post_start)
                     .count();
    ev.descriptors = static_cast<int64_t>(order->local_indices.size());
    if (ev.error.ok()) {
      MutexLock lock(stats_mu_);
      engine_descriptors_ += static_cast<int64_t>(order->local_indices.size());
      transfer_ops_ += ops.ok() ? static_cast<int64_t>(*ops) : 0;
    }
  }
  Push(std::move(ev));
}

void PdConnector::OnLayerDone(int32_t layer) {
  // No wake-up while no target can use it: a prefill with no target yet posts nothing per
  // layer; PostRest sends it all in one WRITE when the target comes.
  Push(LayerEvent{layer}, layer_events_wanted_.load(std::memory_order_relaxed));
}

bool PdConnector::OnRequestFinished(const Sequence& seq, std::span<const BlockId> blocks,
                                    RequestOutput& out) {
  const pd::KvTransferParams& p = seq.request.kv_transfer;
  using Role = pd::KvTransferParams::Role;
  if (p.role == Role::kProducer) {
    push_producers_.erase(seq.seq_id);
    const bool ok =
        out.finish_reason == FinishReason::kStop || out.finish_reason == FinishReason::kLength;
    if (!seq.admitted_once) return false;  // never admitted: no blocks, nothing announced
    ProducerDoneEvent ev;
    ev.seq_id = seq.seq_id;
    ev.ok = ok;
    ev.token = seq.last_token;
    ev.error = out.error;
    ev.blocks.assign(blocks.begin(), blocks.end());
    if (ok && p.mode == pd::KvTransferParams::Mode::kPull) {
      out.pull_answer = PullAnswerFor(seq, blocks);
    }
    ++engine_holds_;
    Push(std::move(ev));
    return true;
  }
  if (p.role == Role::kConsumer) {
    auto it = consumers_engine_.find(seq.seq_id);
    if (it == consumers_engine_.end()) return false;
    consumers_engine_.erase(it);
    if (seq.state != SequenceState::kWaitingForRemoteKv) return false;
    // Finished (aborted) while its K/V may still be landing: hold the blocks until the connector
    // thread knows no WRITE can land any more.
    --engine_waiting_;
    ++engine_holds_;
    Push(ConsumerAbortEvent{seq.seq_id, p.transfer_id});
    return true;
  }
  return false;
}

void PdConnector::OnRequestRejected(const GenerationRequest& request) {
  const pd::KvTransferParams& p = request.kv_transfer;
  if (!pd::IsValidTransferId(p.transfer_id)) return;
  if (p.role == pd::KvTransferParams::Role::kProducer) {
    // P refused its leg: a PUSH_TARGET that came (or comes) for it is refused at once, so D
    // does not wait out its watchdog.
    AbortTransfer(p.transfer_id);
    return;
  }
  if (p.role != pd::KvTransferParams::Role::kConsumer) return;
  Push(ConsumerRejectedEvent{p});
}

std::vector<int64_t> PdConnector::GetFinished() {
  std::vector<int64_t> out;
  {
    MutexLock lock(out_mu_);
    out.swap(release_ids_);
  }
  engine_holds_ -= static_cast<int64_t>(out.size());
  return out;
}

std::vector<KvLoadResult> PdConnector::GetFinishedLoading() {
  std::vector<KvLoadResult> out;
  {
    MutexLock lock(out_mu_);
    out.swap(loads_done_);
  }
  for (const auto& r : out) {
    if (consumers_engine_.erase(r.seq_id) == 0) continue;  // finished meanwhile: held already
    --engine_waiting_;
    if (r.quarantined) ++engine_holds_;  // the engine keeps the blocks until GetFinished
  }
  return out;
}

bool PdConnector::HasPendingWork() const {
  return engine_holds_ > 0 || engine_waiting_ > 0;
}

pd::PullAnswer PdConnector::PullAnswerFor(const Sequence& seq,
                                          std::span<const BlockId> blocks) const {
  pd::PullAnswer a;
  pd::KvTransferParams& p = a.params;
  p.role = pd::KvTransferParams::Role::kConsumer;
  p.mode = pd::KvTransferParams::Mode::kPull;
  p.transfer_id = seq.request.kv_transfer.transfer_id;
  p.remote_engine_id = agent_->name();
  p.remote_host = options_.advertise_host;
  p.remote_port = advertise_port_.load();
  p.remote_https = options_.advertise_https;
  p.remote_block_ids.assign(blocks.begin(), blocks.end());
  p.num_prompt_tokens = TransferTokens(seq);
  p.prompt_hash = PromptHashOf(seq);
  p.first_token_id = seq.last_token.id;
  p.first_token_logprob = seq.last_token.logprob;
  a.lease_ms = options_.config.lease.count();
  return a;
}

}  // namespace kvpush::connector
