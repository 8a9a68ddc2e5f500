#include "engine/scheduler.h"

#include <algorithm>

#include "common/clock.h"

namespace kvpush {

namespace {

/// A push producer's blocks may be read by in-flight WRITEs at any time: never preempt it.
bool IsPinned(const Sequence& seq) {
  return seq.request.kv_transfer.role == pd::KvTransferParams::Role::kProducer &&
         seq.request.kv_transfer.mode == pd::KvTransferParams::Mode::kPush;
}

}  // namespace

Scheduler::Scheduler(const EngineConfig& config, BlockPool& pool, KvConnector* connector,
                     int32_t max_prompt_logit_rows)
    : config_(config),
      pool_(pool),
      connector_(connector),
      max_prompt_logit_rows_(std::max(1, max_prompt_logit_rows)) {}

void Scheduler::AddWaiting(Sequence* seq) {
  seq->state = SequenceState::kWaiting;
  waiting_.push_back(seq);
}

bool Scheduler::EnsureBlocks(Sequence& seq, int32_t num_tokens) {
  const int32_t bs = config_.block_size;
  const int32_t need = (num_tokens + bs - 1) / bs - static_cast<int32_t>(seq.blocks.size());
  if (need <= 0) return true;
  if (need > pool_.num_available()) return false;
  return pool_.AllocateAppend(need, seq.blocks).ok();
}

int32_t Scheduler::SpareBlocks() const {
  const int32_t bs = config_.block_size;
  int32_t headroom = 0;
  for (const Sequence* seq : running_) {
    const int32_t most = (seq->num_prompt_tokens + seq->max_output_tokens + bs - 1) / bs;
    headroom += std::max(0, most - static_cast<int32_t>(seq->blocks.size()));
  }
  return pool_.num_available() - headroom;
}

bool Scheduler::StartPartial(Sequence& seq, int32_t num_tokens) {
  if (partial_ != nullptr || connector_ == nullptr || !connector_->AcceptsPartialBlocks(seq)) {
    return false;
  }
  const int32_t spare = SpareBlocks();
  if (spare <= 0 || !pool_.AllocateAppend(spare, seq.blocks).ok()) return false;
  partial_ = &seq;
  partial_tokens_ = num_tokens;
  return true;
}

void Scheduler::GrowPartial() {
  if (partial_ == nullptr) return;
  Sequence& seq = *partial_;
  const int32_t bs = config_.block_size;
  const int32_t need = (partial_tokens_ + bs - 1) / bs - static_cast<int32_t>(seq.blocks.size());
  const int32_t take = std::min(need, SpareBlocks());
  if (take <= 0) return;
  const size_t before = seq.blocks.size();
  if (!pool_.AllocateAppend(take, seq.blocks).ok()) return;
  if (take == need) partial_ = nullptr;
  connector_->OnBlocksExtended(seq, std::span<const BlockId>(seq.blocks).subspan(before));
}

void Scheduler::ResetProgress(Sequence& seq) {
  pool_.Release(seq.blocks);
  seq.blocks.clear();
  seq.block_hashes.clear();
  seq.num_computed = 0;
}

void Scheduler::Preempt(Sequence* victim) {
  ResetProgress(*victim);
  victim->state = SequenceState::kWaiting;
  ++victim->num_preemptions;
  ++num_preemptions_;
  waiting_.push_front(victim);
}

std::vector<ScheduledChunk> Scheduler::Schedule() {
  std::vector<ScheduledChunk> out;
  int32_t budget = config_.max_num_batched_tokens;
  int32_t logit_rows = max_prompt_logit_rows_;  ///< left for prompt-logprobs tokens this step
  bool preempted = false;

  // 1. Running sequences: decodes first, then prefill chunks.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
      Sequence* seq = running_[i];
      const int32_t remaining = seq->num_tokens() - seq->num_computed;
      const bool is_decode = remaining == 1;
      if ((pass == 0) != is_decode || remaining <= 0) continue;
      if (std::any_of(out.begin(), out.end(), [&](const auto& c) { return c.seq == seq; })) {
        continue;
      }
      int32_t n = std::min(remaining, budget);
      if (seq->wants_prompt_logprobs()) n = std::min(n, logit_rows);
      if (n <= 0) continue;  // no logits rows left this step
      bool self_preempted = false;
      while (!EnsureBlocks(*seq, seq->num_computed + n)) {
        // The victim: the most recently admitted sequence that may be preempted. One whose KV a
        // connector may be reading (a push producer: WRITEs in flight) never is.
        auto vit = std::find_if(running_.rbegin(), running_.rend(),
                                [](const Sequence* s) { return !IsPinned(*s); });
        if (vit == running_.rend()) {
          self_preempted = true;  // nothing may be preempted: this one waits for blocks
          break;
        }
        Sequence* victim = *vit;
        running_.erase(std::next(vit).base());
        auto it =
            std::find_if(out.begin(), out.end(), [&](const auto& c) { return c.seq == victim; });
        if (it != out.end()) {
          budget += it->num_tokens;
          out.erase(it);
        }
        Preempt(victim);
        preempted = true;
        if (victim == seq) {
          self_preempted = true;
          break;
        }
      }
      if (self_preempted) break;
      out.push_back({seq, n});
      budget -= n;
      if (seq->wants_prompt_logprobs()) logit_rows -= n;
    }
  }

  // 2. A reservation in parts grows by what the running sequences left; no sequence is admitted
  // after it until it is whole (FIFO).
  if (!preempted) GrowPartial();

  // 3. Waiting sequences (FIFO), only when nothing had to be preempted.
  while (!preempted && partial_ == nullptr && !waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < config_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    const bool prompt_logprobs = seq->wants_prompt_logprobs();
    if (prompt_logprobs && logit_rows <= 0) break;  // FIFO: it waits for the next step
    KvMatch match;
    if (seq->num_computed == 0 && seq->blocks.empty()) {
      // Never match the whole sequence: at least its last token is computed, for the logits.
      // Prompt logprobs need the logits of every prompt position: no match at all (vLLM).
      const int32_t max_blocks = (seq->num_tokens() - 1) / config_.block_size;
      if (!prompt_logprobs) seq->blocks = pool_.MatchPrefix(seq->tokens, max_blocks);
      seq->num_computed = static_cast<int32_t>(seq->blocks.size()) * config_.block_size;
      if (connector_ != nullptr) {
        match = connector_->GetNumMatchedTokens(*seq, seq->num_computed);
        // An async load may bring every remaining prompt token (plus the first output token);
        // a synchronous one must leave at least one token to compute for the logits.
        const int32_t limit = seq->num_tokens() - seq->num_computed - (match.load_async ? 0 : 1);
        match.num_external_tokens = std::clamp(match.num_external_tokens, 0, limit);
        if (match.num_external_tokens == 0) match.load_async = false;
      }
    }
    const int32_t local_computed = seq->num_computed;
    const int32_t num_external = match.num_external_tokens;
    if (match.load_async) {
      if (!EnsureBlocks(*seq, local_computed + num_external) &&
          !StartPartial(*seq, local_computed + num_external)) {
        ResetProgress(*seq);  // give matched blocks back; retried next step
        break;
      }
      waiting_.pop_front();
      seq->state = SequenceState::kWaitingForRemoteKv;
      if (!seq->admitted_once) {
        seq->admitted_once = true;
        seq->num_cached_tokens = local_computed;
        seq->first_scheduled_ns = NowNs();
      }
      seq->num_external_tokens = num_external;
      CommitFullBlocks(*seq);
      connector_->OnBlocksAllocated(*seq, seq->blocks, num_external);
      waiting_for_kv_.push_back(seq);
      continue;  // no compute this step: uses no budget
    }
    int32_t n = std::min(seq->num_tokens() - local_computed - num_external, budget);
    if (prompt_logprobs) n = std::min(n, logit_rows);
    if (!EnsureBlocks(*seq, local_computed + num_external + n)) {
      ResetProgress(*seq);  // give matched blocks back; retried next step
      break;
    }
    waiting_.pop_front();
    seq->state = SequenceState::kRunning;
    if (!seq->admitted_once) {
      seq->admitted_once = true;
      seq->num_cached_tokens = local_computed;
      seq->first_scheduled_ns = NowNs();
    }
    if (connector_ != nullptr) connector_->OnBlocksAllocated(*seq, seq->blocks, num_external);
    seq->num_computed += num_external;
    CommitFullBlocks(*seq);  // records the matched blocks' hashes (no-op in the pool for them)
    running_.push_back(seq);
    out.push_back({seq, n});
    budget -= n;
    if (prompt_logprobs) logit_rows -= n;
  }
  return out;
}

void Scheduler::CommitFullBlocks(Sequence& seq) {
  const int32_t bs = config_.block_size;
  const size_t full = static_cast<size_t>(seq.num_computed / bs);
  while (seq.block_hashes.size() < full && seq.block_hashes.size() < seq.blocks.size()) {
    const size_t i = seq.block_hashes.size();
    const BlockHash parent = i == 0 ? pool_.root_hash() : seq.block_hashes[i - 1];
    std::span<const int32_t> toks(seq.tokens.data() + i * static_cast<size_t>(bs),
                                  static_cast<size_t>(bs));
    const BlockHash h = pool_.HashBlock(parent, toks);
    pool_.CommitFullBlock(seq.blocks[i], parent, h, toks);
    seq.block_hashes.push_back(h);
  }
}

void Scheduler::OnKvLoaded(Sequence& seq, int32_t num_computed) {
  auto it = std::find(waiting_for_kv_.begin(), waiting_for_kv_.end(), &seq);
  if (it == waiting_for_kv_.end()) return;
  waiting_for_kv_.erase(it);
  // A load that failed while reserved in parts: computed locally, its blocks as it goes.
  if (partial_ == &seq) partial_ = nullptr;
  seq.num_computed = std::clamp(num_computed, 0, seq.num_tokens());
  seq.state = SequenceState::kRunning;
  running_.push_back(&seq);
}

std::vector<BlockId> Scheduler::Remove(Sequence* seq) {
  if (partial_ == seq) partial_ = nullptr;
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  auto k = std::find(waiting_for_kv_.begin(), waiting_for_kv_.end(), seq);
  if (k != waiting_for_kv_.end()) waiting_for_kv_.erase(k);
  std::vector<BlockId> blocks;
  blocks.swap(seq->blocks);
  seq->block_hashes.clear();
  seq->num_computed = 0;
  return blocks;
}

int64_t Scheduler::outstanding_prefill_tokens() const {
  int64_t n = 0;
  auto add = [&n](const Sequence* seq) {
    n += std::max<int64_t>(0, int64_t{seq->num_prompt_tokens} - seq->num_computed);
  };
  for (const Sequence* seq : waiting_) add(seq);
  for (const Sequence* seq : running_) add(seq);
  return n;
}

}  // namespace kvpush
