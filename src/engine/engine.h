// Engine: one engine thread that owns an EngineCore (scheduler, block pool, KV cache, executor).
// Other threads (HTTP handlers, the generate command) submit requests through a queue and read
// outputs from a per-request OutputChannel (Seastar style: no shared mutable state under locks
// except the two queues and a published stats snapshot).
#pragma once

#include <atomic>
#include <chrono>
#include <future>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <thread>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine/engine_core.h"

namespace kvpush {

class Engine {
 public:
  /// Resolves and validates `config` against the executor's model, allocates the KV arena and
  /// starts the engine thread. `tokenizer` (and `connector`, null in colocated mode) must outlive
  /// the engine. `kv_memory` (optional) holds the KV arena (EngineCore::Create). A connector gets
  /// BindEngine() before the engine thread starts. Errors: those of EngineConfig::Resolve and
  /// EngineCore::Create.
  static Result<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                std::unique_ptr<Executor> executor,
                                                const Tokenizer& tokenizer,
                                                KvConnector* connector = nullptr,
                                                std::span<std::byte> kv_memory = {});

  /// Stops the engine thread; unfinished requests end with FinishReason::kAbort.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// A submitted request: the engine id (for Abort) and its output channel.
  struct Handle {
    int64_t id = 0;
    std::shared_ptr<OutputChannel> channel;
  };

  /// Validates `request` (ValidateRequest) and queues it for the engine thread. A refused P/D
  /// request is reported to the connector (KvConnector::OnRequestRejected) before returning.
  /// Errors: kInvalidArgument / kResourceExhausted (never fits) from validation;
  /// kUnavailable when max_pending_requests are already waiting (overload) or the engine stopped.
  /// Thread-safe.
  Result<Handle> Submit(GenerationRequest request);

  /// Asks the engine thread to abort request `id` (its channel then gets a kAbort output and its
  /// blocks are released). Unknown or finished ids are ignored. Thread-safe, non-blocking.
  void Abort(int64_t id);

  /// Makes the engine thread run a step soon (a connector has news). Thread-safe, non-blocking.
  void Wake();

  /// EngineCore::ResetPrefixCache on the engine thread, between two steps; waits for it at most
  /// `timeout`. Returns the blocks freed. Errors: those of EngineCore::ResetPrefixCache,
  /// kUnavailable (stopping), kDeadlineExceeded (the engine thread did not get to it in time; it
  /// still runs it). Thread-safe, blocking.
  Result<int32_t> ResetPrefixCache(std::chrono::milliseconds timeout);

  /// Stops the engine thread (idempotent). Thread-safe.
  void Stop();

  /// The latest snapshot published by the engine thread (after each step). Thread-safe.
  EngineStats stats() const;

  /// A load summary for routers (an instance's /health): read from atomics the engine thread
  /// publishes after each step, never from the engine's state or locks. Value type.
  struct Load {
    int64_t outstanding_prefill_tokens = 0;  ///< EngineStats::outstanding_prefill_tokens
    int32_t running = 0;
    int32_t waiting = 0;  ///< in the scheduler's waiting queue
  };
  /// The latest published Load. Thread-safe, lock-free.
  Load load() const {
    return Load{outstanding_prefill_tokens_.load(std::memory_order_relaxed),
                num_running_.load(std::memory_order_relaxed),
                num_waiting_.load(std::memory_order_relaxed)};
  }

  /// Resolved configuration and the model's; immutable after Create. Thread-safe.
  const EngineConfig& config() const { return config_; }
  const ModelConfig& model_config() const { return model_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }

 private:
  Engine(const EngineConfig& config, std::unique_ptr<EngineCore> core, const Tokenizer& tokenizer,
         KvConnector* connector);
  void Loop();
  /// Publishes the engine thread's stats snapshot, then the deferred outputs (so a client that
  /// saw a request's final output also sees it counted). Engine thread only.
  void PublishAndFlush();

  struct Command {
    bool abort = false;
    /// A prefix-cache reset (ResetPrefixCache): its answer goes here.
    std::shared_ptr<std::promise<Result<int32_t>>> reset;
    int64_t id = 0;
    GenerationRequest request;
    std::shared_ptr<OutputChannel> channel;
    int64_t arrival_ns = 0;
  };

  const EngineConfig config_;
  const ModelConfig model_;
  const Tokenizer& tokenizer_;
  KvConnector* const connector_;      ///< null in colocated mode; Submit tells it of refusals
  std::unique_ptr<EngineCore> core_;  ///< touched only by the engine thread after Create

  Mutex mu_;  ///< guards queue_, stopping_
  CondVar cv_;
  std::deque<Command> queue_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  bool woken_ GUARDED_BY(mu_) = false;

  mutable Mutex stats_mu_;
  EngineStats stats_ GUARDED_BY(stats_mu_);  ///< guarded by stats_mu_

  std::atomic<int64_t> next_id_{1};
  std::atomic<int32_t> num_waiting_{0};  ///< published with stats, for overload checks
  std::atomic<int32_t> num_running_{0};  ///< published with stats (load())
  std::atomic<int64_t> outstanding_prefill_tokens_{0};  ///< published with stats (load())
  std::thread thread_;
};

}  // namespace kvpush
