// Sequence: the engine thread's state of one request (tokens, KV blocks, progress, timestamps).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/output_channel.h"
#include "engine/output_processor.h"
#include "engine/request.h"
#include "kv/block_pool.h"

namespace kvpush {

/// Lifecycle: kWaiting -> [kWaitingForRemoteKv ->] kRunning -> (kWaiting again on preemption)
/// -> finished (destroyed). kWaitingForRemoteKv: blocks allocated, K/V arriving from a peer
/// (never preempted, never scheduled).
enum class SequenceState : uint8_t { kWaiting, kWaitingForRemoteKv, kRunning };

/// Owned by EngineCore; the scheduler and the connector hooks see it by reference.
/// Not thread-safe: only the engine thread touches it.
struct Sequence {
  int64_t seq_id = 0;  ///< engine-assigned, unique
  GenerationRequest request;
  std::shared_ptr<OutputChannel> channel;

  std::vector<int32_t> tokens;  ///< prompt followed by generated tokens
  int32_t num_prompt_tokens = 0;
  int32_t max_output_tokens = 0;        ///< max_tokens clamped to max_model_len - prompt
  int32_t num_computed = 0;             ///< tokens whose K/V are in `blocks` (prefix of `tokens`)
  std::vector<BlockId> blocks;          ///< block table: covers positions [0, blocks.size() * bs)
  std::vector<BlockHash> block_hashes;  ///< chain hashes of the leading full, committed blocks

  SequenceState state = SequenceState::kWaiting;
  bool admitted_once = false;      ///< first admission done (num_cached_tokens set)
  bool admission_counted = false;  ///< EngineCore counted its cached prompt tokens
  int32_t num_cached_tokens = 0;   ///< prefix-cache hit tokens at first admission
  int32_t num_preemptions = 0;
  int32_t num_external_tokens = 0;  ///< tokens whose K/V a connector loads (KvMatch)
  int32_t num_transferred_tokens = 0;  ///< of those, the tokens of a load that succeeded
  TokenOutput last_token;           ///< the latest generated token with its logprobs
  /// request.prompt_logprobs >= 0: entry p scores prompt token p + 1 (filled as prefill chunks
  /// are computed; handed to the first output, RequestOutput::prompt_logprobs).
  std::vector<TokenOutput> prompt_logprobs;

  int64_t arrival_ns = 0;  ///< steady clock (NowNs)
  int64_t first_scheduled_ns = 0;
  int64_t first_token_ns = 0;
  int64_t last_token_ns = 0;

  std::unique_ptr<OutputTextProcessor> text;

  int32_t num_tokens() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  /// The tokens its first admission computes, looks up or loads: the prompt, plus the output a
  /// continuation resumes (GenerationRequest::resume_output_tokens).
  int32_t num_prefill_tokens() const {
    return num_prompt_tokens + static_cast<int32_t>(request.resume_output_tokens.size());
  }
  /// Its prompt is computed for prompt logprobs: logits at every position, no prefix-cache read
  /// (until the first token is sampled; a later recomputation may use the cache).
  bool wants_prompt_logprobs() const {
    return request.prompt_logprobs >= 0 && num_output_tokens() == 0;
  }
};

}  // namespace kvpush
