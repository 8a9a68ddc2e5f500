// EngineCore: the single-threaded heart of the engine: request admission, one step at a time
// (schedule -> execute -> sample -> stream outputs), finish/abort and block accounting.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine_config.h"
#include "engine/engine_stats.h"
#include "engine/kv_connector.h"
#include "engine/output_channel.h"
#include "engine/output_processor.h"
#include "engine/scheduler.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"
#include "model/executor.h"
#include "model/tokenizer.h"

namespace kvpush {

/// Checks a request against a resolved config and model: non-empty prompt, ids in
/// [0, vocab_size), prompt + 1 <= max_model_len, max_tokens >= 1, sampling params valid, and
/// that the request can ever fit in the KV pool (blocks for min(prompt + max_tokens,
/// max_model_len) tokens <= num_kv_blocks). Errors: kInvalidArgument, kResourceExhausted (never
/// fits). Thread-safe (pure).
Status ValidateRequest(const EngineConfig& config, const ModelConfig& model,
                       const GenerationRequest& request);

/// Not thread-safe: exactly one thread (the engine thread, or a test) calls every method.
/// Engine wraps it with a thread and queues.
class EngineCore {
 public:
  /// `config` must be resolved (EngineConfig::Resolve). Allocates the KV arena.
  /// `tokenizer` and `connector` (null in colocated mode) must outlive the core.
  /// `kv_memory`: when not empty, the KV arena lives there (e.g. memory the transfer agent
  /// allocated and registered); it must hold KvLayout::total_bytes() and outlive the core.
  /// Errors: kInvalidArgument (config, kv_memory too small), kResourceExhausted (allocation).
  static Result<std::unique_ptr<EngineCore>> Create(const EngineConfig& config,
                                                    std::unique_ptr<Executor> executor,
                                                    const Tokenizer& tokenizer,
                                                    KvConnector* connector = nullptr,
                                                    std::span<std::byte> kv_memory = {});

  /// The KV layout an engine with a resolved `config` and `model` uses (what the connector
  /// registers and announces). Pure.
  static KvLayout LayoutFor(const EngineConfig& config, const ModelConfig& model);

  /// Admits a request under engine id `seq_id` (unique). An invalid request is answered at once
  /// on `channel` with FinishReason::kError. `arrival_ns` is the NowNs() of its arrival.
  void AddRequest(int64_t seq_id, GenerationRequest request, std::shared_ptr<OutputChannel> channel,
                  int64_t arrival_ns);

  /// Finishes a waiting or running request with FinishReason::kAbort and releases its blocks.
  /// Unknown ids (already finished) are ignored.
  void Abort(int64_t seq_id);

  /// Aborts every request (shutdown); `reason` goes into their outputs' error message.
  void AbortAll(const std::string& reason);

  /// Runs one step: schedule, execute, sample, emit outputs, finish requests. Returns the number
  /// of tokens computed (0 when there was nothing to do). A chunk that fails CheckChunk, or whose
  /// sequence fails when executed alone after a failed batch, finishes its own request with
  /// FinishReason::kError; the other requests of the step go on.
  int32_t Step();

  /// Applies the connector's news (held blocks to release, finished KV loads: a loaded request
  /// may emit its first token here). Step() calls it first; Engine calls it before Step() too so
  /// that such a token is published before the step's forward pass, not after it.
  void PollConnector();

  /// True while any request is waiting or running (or the connector holds blocks).
  bool HasWork() const;

  /// vLLM's reset_prefix_cache: when no block is in use (no request running or waiting, no KV
  /// held for a peer), every cached block is dropped from the prefix cache and becomes free;
  /// returns how many. Errors: kFailedPrecondition naming the blocks in use (nothing changes:
  /// a block a request holds keeps its hash, as vLLM refuses then too).
  Result<int32_t> ResetPrefixCache();

  /// Counters and gauges, refreshed.
  const EngineStats& stats();

  /// With deferral on, outputs produced by AddRequest/Abort/Step are kept until FlushOutputs()
  /// instead of being pushed at once. Engine uses it to publish the stats snapshot first, so a
  /// client that has seen a request's final output also sees it counted in /metrics.
  void set_defer_outputs(bool defer) { defer_outputs_ = defer; }
  void FlushOutputs();
  bool has_pending_outputs() const { return !pending_outputs_.empty(); }

  const EngineConfig& config() const { return config_; }
  const ModelConfig& model_config() const { return executor_->config(); }
  const BlockPool& block_pool() const { return pool_; }
  /// The KV arena (tests fill it the way a remote WRITE would).
  KvCache& kv_cache() { return *kv_; }

 private:
  EngineCore(const EngineConfig& config, std::unique_ptr<Executor> executor,
             std::unique_ptr<KvCache> kv, const Tokenizer& tokenizer, KvConnector* connector);

  /// Samples the next token of `seq` from `logits`, appends it, streams the delta and finishes
  /// the request when a stop condition holds.
  void ProcessLogits(Sequence& seq, std::span<const float> logits);
  /// Appends an already sampled token (from logits or from a connector) and streams it.
  void ProcessSampled(Sequence& seq, TokenOutput token);
  /// A request refused at admission: the connector forgets it, and its one output is a kError
  /// with `error`.
  void Refuse(const GenerationRequest& request, const std::shared_ptr<OutputChannel>& channel,
              Status error);
  /// A continuation's admission: appends request.resume_output_tokens to seq.tokens and feeds
  /// them through seq.text as the earlier run did (their text is not emitted). Errors
  /// (kInvalidArgument): one of them would have ended the run, or the text they emitted is not
  /// request.resume_text_bytes long.
  Status ReplayResumed(Sequence& seq, const GenerationRequest& request) const;
  /// Prompt logprobs from a chunk computed with all_logits: `logits` holds one row per token of
  /// `chunk` (vocab floats each); the row of position p scores prompt token p + 1.
  void RecordPromptLogprobs(Sequence& seq, const SequenceChunk& chunk,
                            std::span<const float> logits);
  /// Applies the connector's finished asynchronous KV loads (a first token that is not a token
  /// of this model fails the load: recompute or fail per the connector's policy).
  void ApplyKvLoads();
  /// Checks what a chunk hands the executor: token ids in [0, vocab), positions within
  /// max_model_len, a block table covering them with ids inside the pool. Errors:
  /// kInvalidArgument naming the field.
  Status CheckChunk(const SequenceChunk& chunk) const;
  /// After a failed batched Execute: executes each chunk of batch_ alone (into its own logits
  /// row) and returns one status per chunk, so one sequence's failure fails only it.
  std::vector<Status> ExecuteEach();
  /// Sends the final output (`partial` carries this step's token, if any), releases or hands
  /// over the blocks, records latencies and destroys `seq`.
  void Finish(Sequence& seq, FinishReason reason, Status error, std::string text,
              std::string stop_reason, RequestOutput* partial = nullptr);
  /// Releases the held blocks of every finished id (the connector's GetFinished, taken by
  /// PollConnector before it applies the KV loads); ids with nothing held are ignored.
  void ReleaseHeldBlocks(const std::vector<int64_t>& finished);
  /// A load given up while remote writes may still land (KvLoadResult::quarantined): moves the
  /// request's blocks after its local prefix hit to held_blocks_ until the connector releases
  /// them.
  void QuarantineLoadBlocks(Sequence& seq);
  /// Commits the full blocks of the requests whose KV loads ApplyKvLoads applied (loaded_) to
  /// the prefix cache; called at the start of Step(), after Engine published their first tokens.
  void CommitLoadedBlocks();
  void Emit(const std::shared_ptr<OutputChannel>& channel, RequestOutput out);
  /// Counts `seq`'s first admission once: cached tokens, queue time, prefix-cache queries.
  void CountAdmission(Sequence& seq);
  /// The per-request size and phase histograms of a finishing `seq`.
  void RecordFinishedSizes(const Sequence& seq);

  EngineConfig config_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<KvCache> kv_;
  const Tokenizer& tokenizer_;
  KvConnector* connector_;
  BlockPool pool_;
  Scheduler scheduler_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::unordered_map<int64_t, std::vector<BlockId>> held_blocks_;  ///< kept for the connector
  std::vector<int64_t> loaded_;  ///< seq ids loaded since the last Step(), blocks not committed
  EngineStats stats_;
  std::vector<SequenceChunk> batch_;   ///< reused per step
  std::vector<Sequence*> batch_seqs_;  ///< the sequence of each batch_ entry
  std::vector<float> logits_;          ///< reused per step
  std::vector<int32_t> suppressed_;    ///< ids suppressed for one sample (min_tokens), reused
  bool defer_outputs_ = false;
  std::vector<std::pair<std::shared_ptr<OutputChannel>, RequestOutput>> pending_outputs_;
};

}  // namespace kvpush
