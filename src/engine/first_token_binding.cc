#include "engine/first_token_binding.h"

#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <vector>

namespace kvpush {
namespace {

void PutU64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutI32(std::vector<uint8_t>& b, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(u >> (8 * i)));
}
void PutF32(std::vector<uint8_t>& b, float v) {
  PutI32(b, std::bit_cast<int32_t>(v == 0.0f ? 0.0f : v));
}

}  // namespace

uint64_t FirstTokenBinding(const GenerationRequest& r) {
  const SamplingParams& s = r.sampling;
  std::vector<uint8_t> b = {'f', 't', 'b', '1'};
  const bool greedy = s.temperature == 0.0f;
  b.push_back(greedy ? 1 : 0);
  if (!greedy) {
    PutF32(b, s.temperature);
    PutI32(b, std::max(s.top_k, 0));
    PutF32(b, s.top_p);
    PutF32(b, s.min_p);
    b.push_back(r.seed_given ? 1 : 0);
    if (r.seed_given) PutU64(b, s.seed);
  }
  PutF32(b, s.presence_penalty);
  PutF32(b, s.frequency_penalty);
  PutF32(b, s.repetition_penalty);
  PutI32(b, static_cast<int32_t>(s.logit_bias.size()));
  for (const auto& [id, bias] : s.logit_bias) {
    PutI32(b, id);
    PutF32(b, bias);
  }
  PutI32(b, s.logprobs);
  // A continuation's next token is output token k + 1 (k resumed): min_tokens suppresses it
  // while k < min_tokens, and the penalties count the resumed tokens.
  const auto k = static_cast<int32_t>(r.resume_output_tokens.size());
  const bool suppressed = r.min_tokens > k;
  b.push_back(suppressed ? 1 : 0);
  if (suppressed) {
    std::vector<int32_t> ids = r.stop_token_ids;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    PutI32(b, static_cast<int32_t>(ids.size()));
    for (int32_t id : ids) PutI32(b, id);
  }
  if (k > 0) {
    PutI32(b, k);
    for (int32_t id : r.resume_output_tokens) PutI32(b, id);
  }
  return XXH3_64bits(b.data(), b.size());
}

}  // namespace kvpush
