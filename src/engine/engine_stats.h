// EngineStats: counters, gauges and latency histograms of one engine, for /metrics.
#pragma once

#include <array>
#include <cstdint>

#include "common/histogram.h"
#include "engine/request.h"
#include "kv/block_pool.h"

namespace kvpush {

/// A snapshot published by the engine thread after every step (Engine::stats() copies it).
/// Counters are monotonic; gauges describe the moment of the snapshot.
struct EngineStats {
  // Gauges.
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  int32_t num_waiting_for_kv = 0;  ///< requests whose K/V are being loaded from a peer
  /// Prompt tokens of waiting and running requests not computed yet (a router's load signal).
  int64_t outstanding_prefill_tokens = 0;
  int32_t num_kv_blocks_total = 0;
  int32_t block_size = 0;               ///< tokens per KV block (vllm:cache_config_info)
  bool prefix_caching_enabled = false;  ///< --enable-prefix-caching (vllm:cache_config_info)
  BlockPool::Stats kv;  ///< used/free/cached blocks and prefix-cache counters (blocks)

  // Counters.
  std::array<int64_t, 5> finished_by_reason{};  ///< indexed by FinishReason
  int64_t requests_received = 0;
  int64_t prompt_tokens = 0;         ///< prompt tokens of admitted requests (first admission)
  int64_t generation_tokens = 0;     ///< tokens sampled
  int64_t cached_prompt_tokens = 0;  ///< prompt tokens served by the prefix cache (first admission)
  int64_t computed_tokens = 0;  ///< tokens executed (prefill chunks + decodes, incl. recompute)
  /// Prompt positions executed here (prefill chunks, incl. recompute after a failed load or a
  /// preemption); never tokens whose K/V came from a peer.
  int64_t prompt_tokens_computed = 0;
  /// P/D decode side: prompt tokens whose K/V arrived over the KV connector (successful loads).
  int64_t prompt_tokens_transferred = 0;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t kv_loads = 0;            ///< asynchronous KV loads that succeeded (P/D decode side)
  int64_t kv_load_recomputes = 0;  ///< failed loads recomputed locally (policy recompute)
  /// failed loads whose blocks were quarantined (a WRITE could still land): the request went on
  /// in fresh blocks
  int64_t kv_load_quarantines = 0;
  /// vLLM's prefix-cache counters, in tokens: prompt tokens looked up in the local prefix cache
  /// at first admission (not for prompt-logprobs requests, which skip the cache) and of those the
  /// tokens found. `cached_prompt_tokens` equals the hits.
  int64_t prefix_cache_queried_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  /// vLLM's external_prefix_cache_queries: with a KV connector, the prompt tokens of every
  /// admitted request (the hits are `prompt_tokens_transferred`).
  int64_t external_queried_tokens = 0;

  // Latencies in seconds (recorded when a request finishes, or per token for ITL).
  Histogram ttft{Histogram::LatencyBounds()};        ///< arrival -> first token
  Histogram tpot{Histogram::LatencyBounds()};        ///< (last - first token) / (n - 1)
  Histogram itl{Histogram::LatencyBounds()};         ///< between consecutive tokens
  Histogram e2e{Histogram::LatencyBounds()};         ///< arrival -> finish
  Histogram queue_time{Histogram::LatencyBounds()};  ///< arrival -> first scheduled
  /// vLLM's request phases (v1 RequestStateStats), recorded at finish for requests that
  /// produced a token: first scheduled -> first token (prefill), first -> last token (decode),
  /// first scheduled -> last token (inference).
  Histogram prefill_time{Histogram::LatencyBounds()};
  Histogram decode_time{Histogram::LatencyBounds()};
  Histogram inference_time{Histogram::LatencyBounds()};

  // Sizes (tokens). The per-request ones are recorded at finish; their bounds are set from
  // max_model_len by the engine (Histogram::OneTwoFiveBounds).
  Histogram request_prompt_tokens;
  Histogram request_generation_tokens;
  /// Prompt tokens computed here for the request: neither prefix-cache hits nor transferred.
  Histogram request_prefill_kv_computed_tokens;
  /// Tokens executed per engine step (prefill chunks + decodes).
  Histogram iteration_tokens{Histogram::IterationTokenBounds()};
};

}  // namespace kvpush
