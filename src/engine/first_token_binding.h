// The first token's binding: a digest of every setting that decides which token a request samples
// first and what logprobs it reports for it. A P/D decode instance uses the prefill instance's
// first token only when P's binding equals its own request's (docs/pd_protocol.md §3).
#pragma once

#include <cstdint>

#include "engine/request.h"

namespace kvpush {

/// XXH3-64 of a canonical encoding ("ftb1", then little-endian fields) of what decides the first
/// sampled token of `r` and its logprobs:
///  - greedy (temperature 0) or not; when not: temperature, top_k (<= 0 as 0), top_p, min_p,
///    and the seed when the client gave one (`seed_given`; an engine-chosen seed is a random
///    draw, and a token drawn under another random seed is as valid a sample);
///  - logit_bias, presence/frequency/repetition penalties, `sampling.logprobs`;
///  - whether EOS and the stop token ids are suppressed for the first token (min_tokens > k,
///    k = the continuation's resumed output tokens, 0 for a new request), and then the stop ids
///    (sorted, unique);
///  - for a continuation (k > 0, a migration's legs): k and the resumed token ids, which the
///    penalties count and after which the token is sampled.
/// Floats enter as IEEE-754 bit patterns (-0 as +0): both legs parse the same JSON text the same
/// way. Not covered: `seed + choice index` for n > 1 (only choice 0 takes P's token). Pure;
/// thread-safe.
uint64_t FirstTokenBinding(const GenerationRequest& r);

}  // namespace kvpush
