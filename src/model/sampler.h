// Sampling from logits: logits processors (logit_bias, suppressed ids, repetition / frequency /
// presence penalties), greedy, temperature, min-p, top-k, top-p, per-request seed, logprobs.
//
// Randomness is counter-based: the uniform draw for output token i of a request is a pure function
// of (seed, i) (SplitMix64 of seed ^ golden-ratio * (i + 1); Steele et al., "Fast splittable
// pseudorandom number generators", OOPSLA 2014). So the same seed gives the same output whether
// the tokens are sampled on one instance or the first on P and the rest on D.
//
// Order of processing follows vLLM's V1 sampler (vllm/v1/sample/sampler.py): logit_bias and the
// suppressed ids (vLLM's MinTokensLogitsProcessor) first, then penalties
// (vllm/model_executor/layers/utils.py apply_penalties), then greedy argmax or temperature,
// min-p (MinPLogitsProcessor), top-k and top-p. Logprobs are always those of the raw logits
// (vLLM's default `raw_logprobs`), whatever the processing.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvpush {

/// Per-request sampling parameters (OpenAI/vLLM semantics).
struct SamplingParams {
  float temperature = 1.0f;  ///< 0 = greedy (argmax)
  int32_t top_k = 0;         ///< 0 or -1 = disabled
  float top_p = 1.0f;        ///< (0, 1]; 1 = disabled
  /// [0, 1]; 0 = disabled. Keeps tokens whose probability (at the temperature) is at least
  /// min_p times the most likely token's. Ignored by greedy sampling (as in vLLM).
  float min_p = 0.0f;
  /// [-2, 2]; subtracted once from the logit of every token that occurs in the output so far.
  float presence_penalty = 0.0f;
  /// [-2, 2]; subtracted from a token's logit once per occurrence in the output so far.
  float frequency_penalty = 0.0f;
  /// (0, 10]; 1 = off. A token seen in the prompt or the output so far has a positive logit
  /// divided by it, a non-positive one multiplied by it (CTRL, Keskar et al. 2019, as vLLM).
  float repetition_penalty = 1.0f;
  /// (token id, bias in [-100, 100]) added to the logit before anything else; ids ascending,
  /// unique, inside the vocabulary (the engine checks the vocabulary).
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;      ///< the engine picks a random one when the request gives none
  int32_t logprobs = -1;  ///< -1 = none; n >= 0: logprob of the sampled token + top n

  /// True when any logits processor (bias, penalties) is active.
  bool has_processors() const {
    return !logit_bias.empty() || presence_penalty != 0.0f || frequency_penalty != 0.0f ||
           repetition_penalty != 1.0f;
  }

  /// Errors: kInvalidArgument naming the field (temperature < 0, top_p outside (0, 1], min_p
  /// outside [0, 1], a penalty out of range, a bias outside [-100, 100] or unsorted ids, ...).
  Status Validate() const;
};

/// What the logits processors need of the request's history. The spans must stay valid during
/// the Sample() call only.
struct SamplingHistory {
  std::span<const int32_t> prompt;  ///< prompt token ids (repetition penalty)
  std::span<const int32_t> output;  ///< tokens generated so far (all penalties)
  /// Ids that must not be sampled (logit set to -inf): vLLM's min_tokens processor passes EOS
  /// and the stop token ids while fewer than min_tokens tokens were generated. Ids outside the
  /// vocabulary are ignored.
  std::span<const int32_t> suppressed;
};

/// One sampled token with its log-probability (natural log, of the full softmax at temperature
/// 1 of the raw logits, as OpenAI/vLLM report) and, if asked, the top alternatives.
struct SampleResult {
  int32_t token = -1;
  float logprob = 0.0f;  ///< of the sampled token; 0 when params.logprobs < 0 (not computed)
  std::vector<std::pair<int32_t, float>> top_logprobs;  ///< (token, logprob), descending
};

/// Samples token number `output_index` (0-based among the request's generated tokens; normally
/// history.output.size()) from `logits` [vocab_size]. Pure function: thread-safe, deterministic
/// for equal inputs. Ties in argmax resolve to the lowest id. If every token is suppressed the
/// suppression is ignored (there must be a token).
SampleResult Sample(std::span<const float> logits, const SamplingParams& params,
                    int64_t output_index, const SamplingHistory& history = {});

/// Log-probability of `token` under the full softmax at temperature 1 of the raw `logits`
/// [vocab_size] (natural log, computed in double), and the `k` most likely tokens with theirs,
/// descending (ties: lower id first); k <= 0: none. What Sample() reports for a sampled token, and
/// what the engine reports for a prompt token (echo with logprobs: `logits` = the row of the
/// position before it). A token outside [0, vocab_size) gives logprob 0 and no top list. Pure:
/// thread-safe.
SampleResult TokenLogprobs(std::span<const float> logits, int32_t token, int32_t k);

/// Applies logit_bias, suppression and penalties (in vLLM's order) to `logits` in place.
/// Exposed for tests; Sample() calls it. Pure apart from `logits`.
void ApplyLogitsProcessors(std::span<float> logits, const SamplingParams& params,
                           const SamplingHistory& history);

}  // namespace kvpush
