// Sampling from logits: greedy, temperature, top-k, top-p, per-request seed, logprobs.
//
// Randomness is counter-based: the uniform draw for output token i of a request is a pure function
// of (seed, i) (SplitMix64 of seed ^ golden-ratio * (i + 1); Steele et al., "Fast splittable
// pseudorandom number generators", OOPSLA 2014). So the same seed gives the same output whether
// the tokens are sampled on one instance or the first on P and the rest on D.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/status.h"

namespace kvpush {

/// Per-request sampling parameters (OpenAI/vLLM semantics).
struct SamplingParams {
  float temperature = 1.0f;  ///< 0 = greedy (argmax)
  int32_t top_k = 0;         ///< 0 or -1 = disabled
  float top_p = 1.0f;        ///< (0, 1]; 1 = disabled
  uint64_t seed = 0;         ///< the engine picks a random one when the request gives none
  int32_t logprobs = -1;     ///< -1 = none; n >= 0: logprob of the sampled token + top n

  /// Errors: kInvalidArgument naming the field (temperature < 0, top_p outside (0, 1], ...).
  Status Validate() const;
};

/// One sampled token with its log-probability (natural log, of the full softmax at temperature
/// 1, as OpenAI/vLLM report) and, if asked, the top alternatives.
struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top_logprobs;  ///< (token, logprob), descending
};

/// Samples token number `output_index` (0-based among the request's generated tokens) from
/// `logits` [vocab_size]. Pure function: thread-safe, deterministic for equal inputs.
/// Ties in argmax resolve to the lowest id.
SampleResult Sample(std::span<const float> logits, const SamplingParams& params,
                    int64_t output_index);

}  // namespace kvpush
