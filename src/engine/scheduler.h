// Scheduler: continuous batching with a per-step token budget, chunked prefill, prefix-cache
// reuse and recompute-style preemption (after vLLM v1's scheduler).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/engine_config.h"
#include "engine/kv_connector.h"
#include "engine/sequence.h"
#include "kv/block_pool.h"

namespace kvpush {

/// `num_tokens` tokens of `seq` starting at seq->num_computed are computed in this step.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t num_tokens = 0;
};

/// Decides, step by step, which sequences run and how many tokens each computes.
///
/// Policy per step (budget = max_num_batched_tokens, at most max_num_seqs running):
///  1. running sequences in decode (one token left to compute) get one token each, in admission
///     order; then running sequences still in prefill get min(remaining, budget) tokens (chunked
///     prefill);
///  2. when a running sequence needs a block and none is available, the most recently admitted
///     running sequence is preempted (blocks released, progress reset, put back at the head of
///     the waiting queue; it is recomputed later, prompt and generated tokens alike);
///     a sequence that wants prompt logprobs gets at most what is left of the step's
///     max_prompt_logit_rows;
///  3. if nothing was preempted, waiting sequences are admitted in FIFO order while budget and
///     blocks last: the prefix cache is matched first (never the whole sequence: at least one
///     token is computed so there are logits; not at all for prompt logprobs), then blocks for the
///     chunk are allocated. A request whose connector loads its K/V asynchronously gets blocks for
///     its whole prompt and waits (kWaitingForRemoteKv) without using the step's token budget,
///     until OnKvLoaded;
///  4. a reservation in parts: when the pool cannot hold such a request's blocks and its
///     connector accepts part of them (KvConnector::AcceptsPartialBlocks: a decode-side push
///     target), it gets what is free beyond what the running sequences may still need (each up
///     to its prompt + max_output_tokens: the reservation never makes a running sequence
///     preempt), and at every later step what has freed since, until it holds them all
///     (OnBlocksExtended). At most one request is reserved in parts at a time, and none is
///     admitted after it until it is whole (FIFO), so reservations cannot deadlock each other; a
///     request reserved in parts is never preempted (remote WRITEs may be landing in its
///     blocks), and its whole prompt fits the pool (admission refuses it otherwise), so the
///     running sequences finishing completes it.
/// Not thread-safe: owned by the engine thread. Does not own the sequences.
class Scheduler {
 public:
  /// `config` resolved; `pool` and `connector` (may be null) outlive the scheduler.
  /// `max_prompt_logit_rows` (>= 1): per step, at most this many tokens of sequences that want
  /// prompt logprobs (Sequence::wants_prompt_logprobs: one row of logits each) are scheduled, so
  /// the step's logits stay bounded; such a sequence that gets no row waits for the next step.
  Scheduler(const EngineConfig& config, BlockPool& pool, KvConnector* connector,
            int32_t max_prompt_logit_rows = 1 << 20);

  /// Queues a validated sequence (state kWaiting, no blocks) at the tail of the waiting queue.
  void AddWaiting(Sequence* seq);

  /// Plans one step. Every returned chunk has blocks allocated for its tokens. Sequences admitted
  /// for the first time get admitted_once/num_cached_tokens/first_scheduled_ns set.
  std::vector<ScheduledChunk> Schedule();

  /// Records the prefix-cache hashes of every full block of `seq` whose tokens are all computed
  /// (chained hashes, BlockPool::CommitFullBlock). Call after num_computed advanced.
  void CommitFullBlocks(Sequence& seq);

  /// An asynchronous KV load of `seq` (state kWaitingForRemoteKv) ended: its first
  /// `num_computed` tokens now have K/V in its blocks. Makes it running (lowest priority). Its
  /// full blocks are not committed to the prefix cache here: the caller does (CommitFullBlocks)
  /// once the first token is out, as hashing them is O(prompt).
  void OnKvLoaded(Sequence& seq, int32_t num_computed);

  /// Takes `seq` out of the running/waiting queues and returns its block table (the caller
  /// releases it or hands it to the connector).
  std::vector<BlockId> Remove(Sequence* seq);

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_waiting_for_kv() const { return static_cast<int32_t>(waiting_for_kv_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  /// Prompt tokens of the waiting and running sequences whose K/V are not computed yet (those
  /// waiting for remote K/V are not counted: a peer sends them). O(waiting + running).
  int64_t outstanding_prefill_tokens() const;

 private:
  bool EnsureBlocks(Sequence& seq, int32_t num_tokens);
  /// Blocks a reservation in parts may take now: those available beyond what the running
  /// sequences may still allocate, each up to num_prompt_tokens + max_output_tokens (may be
  /// negative). O(running).
  int32_t SpareBlocks() const;
  /// Policy 4: reserves what is free for `seq`, whose load needs blocks for `num_tokens`
  /// tokens the pool cannot hold now. False when it may not (another reservation in parts, the
  /// connector refuses, nothing free): nothing is allocated then.
  bool StartPartial(Sequence& seq, int32_t num_tokens);
  /// Policy 4: grows the reservation in parts by what is free now.
  void GrowPartial();
  void Preempt(Sequence* victim);
  void ResetProgress(Sequence& seq);

  EngineConfig config_;
  BlockPool& pool_;
  KvConnector* connector_;
  int32_t max_prompt_logit_rows_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;         ///< admission order; back = lowest priority
  std::vector<Sequence*> waiting_for_kv_;  ///< kWaitingForRemoteKv, admission order
  int64_t num_preemptions_ = 0;
  Sequence* partial_ = nullptr;  ///< reserved in parts (policy 4), in waiting_for_kv_
  int32_t partial_tokens_ = 0;   ///< the tokens partial_'s blocks must hold when whole
};

}  // namespace kvpush
