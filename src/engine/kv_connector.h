// KvConnector: the hook interface through which a P/D connector (DESIGN.md §2, §3) plugs into the
// engine, after vLLM's KV-connector hook points. Colocated mode (--role both) passes nullptr and
// the engine skips every hook. docs/engine.md describes where each hook is called.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sequence.h"
#include "model/executor.h"

namespace kvpush {

/// All methods are called on the engine thread and must not block (hand work to the connector's
/// own threads through queues). Sequences are passed by reference and must not be retained.
class KvConnector {
 public:
  virtual ~KvConnector() = default;

  /// match-tokens: a waiting request is being admitted; `num_local_computed` prompt tokens were
  /// found in the local prefix cache. Returns how many further tokens the connector provides
  /// (their K/V will be written into the blocks announced by OnBlocksAllocated before the
  /// request is scheduled again; today the engine treats them as computed at once, so a
  /// connector that returns > 0 must have filled them by the next step). 0 = compute locally.
  virtual int32_t GetNumMatchedTokens(const Sequence& seq, int32_t num_local_computed) = 0;

  /// after-alloc: blocks were allocated for `seq` at admission; `num_external_tokens` is what
  /// GetNumMatchedTokens returned. The push connector announces these block ids to P here.
  virtual void OnBlocksAllocated(const Sequence& seq, std::span<const BlockId> blocks,
                                 int32_t num_external_tokens) = 0;

  /// per-layer save: the observer handed to Executor::Execute for the step whose chunks are
  /// `batch` (null = no per-layer callbacks). Called once per step, right before Execute.
  virtual LayerObserver* BeginStep(std::span<const SequenceChunk> batch) = 0;

  /// finished: `seq` finished (any reason). Return true to keep its `blocks` alive (e.g. an
  /// outstanding WRITE or a lease); the engine then releases them only once GetFinished()
  /// reports seq.seq_id.
  virtual bool OnRequestFinished(const Sequence& seq, std::span<const BlockId> blocks) = 0;

  /// get-finished: ids of requests whose held blocks may now be released. Polled every step.
  virtual std::vector<int64_t> GetFinished() = 0;
};

}  // namespace kvpush
