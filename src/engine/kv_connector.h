// KvConnector: the hook interface through which a P/D connector (DESIGN.md §2, §3) plugs into the
// engine, after vLLM's KV-connector hook points (get_num_new_matched_tokens, update_state_after_
// alloc, save_kv_layer, request_finished, get_finished). Colocated mode (--role both) passes
// nullptr and the engine skips every hook. docs/engine.md describes where each hook is called.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "engine/request.h"
#include "engine/sequence.h"
#include "model/executor.h"

namespace kvpush {

/// What the connector provides for a request being admitted.
struct KvMatch {
  /// Tokens after the local prefix-cache hit whose K/V the connector provides. With
  /// `load_async` this may cover every remaining prompt token (the first output token then comes
  /// with the KV, KvLoadResult::first_token); without it at most num_tokens - 1 - local.
  int32_t num_external_tokens = 0;
  /// true: the K/V arrive later (remote WRITE or READ). The request waits, blocks allocated and
  /// not scheduled, until GetFinishedLoading() reports it.
  bool load_async = false;
};

/// The end of an asynchronous KV load (DESIGN.md §3 push step 5, pull step 3, §6 watchdog).
struct KvLoadResult {
  int64_t seq_id = 0;
  /// ok: the external tokens' K/V are in the blocks. Otherwise the load failed, and (unless
  /// `quarantined`) it is guaranteed that no remote WRITE can land in the blocks any more;
  /// `recompute` says whether the engine computes the prompt locally (policy `recompute`) or fails
  /// the request with `status` (policy `fail`).
  Status status;
  bool recompute = false;
  /// The first output token sampled by P (push, pull "fast" profile), appended without
  /// recomputation. Absent: the engine computes whatever is left of the prompt, and at least
  /// its last token (a load of every prompt token without P's token: the last one is computed
  /// again over its loaded K/V, for this request's own logits).
  std::optional<TokenOutput> first_token;
  /// Only with a failed status: the load was given up while a remote WRITE or READ may still
  /// land in the request's blocks after its local prefix-cache hit (P never acknowledged the
  /// cancel). The engine then takes those blocks out of the request and keeps them, untouched and
  /// never cached, until GetFinished() reports seq_id; the request recomputes into fresh blocks
  /// (or fails) at once. The guarantee above does not hold for them until then.
  bool quarantined = false;
};

/// All methods are called on the engine thread and must not block (hand work to the connector's
/// own threads through queues). Sequences are passed by reference and must not be retained.
class KvConnector {
 public:
  virtual ~KvConnector() = default;

  /// Called once when the engine starts: `wake` makes the engine thread run a step soon (call it
  /// when GetFinished/GetFinishedLoading has news); `abort` asks the engine to abort a request
  /// by seq_id (P drops a prefill D no longer needs). Both are thread-safe and non-blocking.
  virtual void BindEngine(std::function<void()> wake, std::function<void(int64_t)> abort) = 0;

  /// match-tokens: a waiting request is being admitted; `num_local_computed` prompt tokens were
  /// found in the local prefix cache (a multiple of the block size).
  virtual KvMatch GetNumMatchedTokens(const Sequence& seq, int32_t num_local_computed) = 0;

  /// after-alloc: blocks were allocated for `seq` at admission (covering the local hit plus
  /// `num_external_tokens`, or, after AcceptsPartialBlocks, at least one block past the local
  /// hit); the push connector announces the uncached ones to P here.
  virtual void OnBlocksAllocated(const Sequence& seq, std::span<const BlockId> blocks,
                                 int32_t num_external_tokens) = 0;

  /// A request about to load asynchronously whose blocks the pool cannot hold at once: true when
  /// its load may start with part of them (a decode-side push target announced in parts, the
  /// rest by OnBlocksExtended as the pool frees blocks). Default: false (it waits in the queue).
  virtual bool AcceptsPartialBlocks(const Sequence& seq) const {
    (void)seq;
    return false;
  }

  /// The scheduler appended `added` to the block table of `seq`, whose asynchronous load started
  /// with part of its blocks (AcceptsPartialBlocks). Called in table order until the table holds
  /// every block OnBlocksAllocated's `num_external_tokens` need. Default: nothing.
  virtual void OnBlocksExtended(const Sequence& seq, std::span<const BlockId> added) {
    (void)seq;
    (void)added;
  }

  /// per-layer save: the observer handed to Executor::Execute for the step whose chunks are
  /// `batch` (null = no per-layer callbacks). Called once per step, right before Execute.
  virtual LayerObserver* BeginStep(std::span<const SequenceChunk> batch) = 0;

  /// finished: `seq` finished (any reason; `out` is its final output, which the connector may
  /// annotate, e.g. out.kv_transfer_params). Return true to keep its `blocks` alive (an
  /// outstanding WRITE or a lease); the engine then releases them only once GetFinished()
  /// reports seq.seq_id.
  virtual bool OnRequestFinished(const Sequence& seq, std::span<const BlockId> blocks,
                                 RequestOutput& out) = 0;

  /// A request carrying kv_transfer_params was refused at admission (invalid, never fits): it
  /// never reaches the other hooks. A decode-side connector tells its prefill peer at once, so P
  /// frees what it holds for the transfer instead of waiting out the lease; a prefill-side one
  /// refuses the transfer's push target at once, so D does not wait out its watchdog.
  /// Default: nothing.
  /// Exception to the class contract: also called from Engine::Submit's caller (an HTTP thread),
  /// so an override must be thread-safe.
  virtual void OnRequestRejected(const GenerationRequest& request) { (void)request; }

  /// get-finished: ids of requests whose held blocks may now be released. Polled every step.
  virtual std::vector<int64_t> GetFinished() = 0;

  /// Asynchronous loads that ended since the last call. Polled every step.
  virtual std::vector<KvLoadResult> GetFinishedLoading() = 0;

  /// True while the connector holds work that needs the engine to keep polling (loads pending,
  /// blocks held).
  virtual bool HasPendingWork() const = 0;
};

}  // namespace kvpush
