#include "router/routing_policy.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvpush::router {

const char* RoutingPolicyName(RoutingPolicy p) {
  return p == RoutingPolicy::kCacheAware ? "cache-aware" : "least-outstanding";
}

Result<RoutingPolicy> ParseRoutingPolicy(std::string_view name) {
  if (name == "least-outstanding") return RoutingPolicy::kLeastOutstanding;
  if (name == "cache-aware") return RoutingPolicy::kCacheAware;
  return InvalidArgument("--routing must be least-outstanding or cache-aware, not '" +
                         std::string(name) + "'");
}

std::vector<uint64_t> PrefixBlockHashes(std::span<const int32_t> tokens, int32_t block_size) {
  std::vector<uint64_t> out;
  if (block_size < 1) return out;
  const size_t bs = static_cast<size_t>(block_size);
  out.reserve(tokens.size() / bs);
  uint64_t parent = 0;
  for (size_t i = 0; i + bs <= tokens.size(); i += bs) {
    // int32 in host order: little-endian on every supported target, as BlockPool::HashBlock.
    parent = XXH3_64bits_withSeed(tokens.data() + i, bs * sizeof(int32_t), parent);
    out.push_back(parent);
  }
  return out;
}

uint64_t RendezvousWeight(uint64_t key, std::string_view instance) {
  return XXH3_64bits_withSeed(instance.data(), instance.size(), key);
}

std::optional<size_t> ChooseLeastOutstanding(std::span<const DecodeCandidate> candidates,
                                             size_t start) {
  if (candidates.empty()) return std::nullopt;
  std::optional<size_t> best;
  int64_t best_out = std::numeric_limits<int64_t>::max();
  for (size_t k = 0; k < candidates.size(); ++k) {
    const size_t i = (start + k) % candidates.size();
    if (candidates[i].outstanding < best_out) {
      best_out = candidates[i].outstanding;
      best = i;
    }
  }
  return best;
}

std::optional<DecodeChoice> ChooseDecodeCacheAware(std::span<const DecodeCandidate> candidates,
                                                   std::span<const uint64_t> block_hashes,
                                                   const CacheAwareOptions& options, size_t start) {
  if (candidates.empty()) return std::nullopt;
  if (block_hashes.empty()) {
    DecodeChoice c;
    c.index = *ChooseLeastOutstanding(candidates, start);
    c.cached_blocks = candidates[c.index].cached_blocks;
    return c;
  }
  // The routing key: the hash of the prompt's shortest prefix that no candidate is known to hold
  // (the first block past the longest predicted hit; the last block when one holds them all).
  int64_t held = 0;
  for (const DecodeCandidate& d : candidates) held = std::max(held, d.cached_blocks);
  const uint64_t key =
      block_hashes[static_cast<size_t>(std::min<int64_t>(held, block_hashes.size() - 1))];
  std::vector<size_t> order(candidates.size());
  std::vector<uint64_t> weight(candidates.size());
  int64_t total = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    order[i] = i;
    weight[i] = RendezvousWeight(key, candidates[i].url);
    total += std::max<int64_t>(0, candidates[i].outstanding);
  }
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (candidates[a].cached_blocks != candidates[b].cached_blocks) {
      return candidates[a].cached_blocks > candidates[b].cached_blocks;
    }
    if (weight[a] != weight[b]) return weight[a] > weight[b];
    return candidates[a].url < candidates[b].url;
  });
  const double cap_factor = std::max(1.0, options.load_cap);
  const auto cap = static_cast<int64_t>(std::ceil(
      cap_factor * static_cast<double>(total + 1) / static_cast<double>(candidates.size())));
  for (size_t k = 0; k < order.size(); ++k) {
    const DecodeCandidate& d = candidates[order[k]];
    if (d.outstanding + 1 > cap) continue;
    DecodeChoice c;
    c.index = order[k];
    c.cached_blocks = d.cached_blocks;
    c.reason = d.cached_blocks > 0 ? DecodeReason::kPrefixHit : DecodeReason::kRendezvous;
    c.load_cap_override = k > 0;
    return c;
  }
  // Unreachable with cap_factor >= 1 (the least loaded D is always under the cap); kept total.
  DecodeChoice c;
  c.index = *ChooseLeastOutstanding(candidates, start);
  c.cached_blocks = candidates[c.index].cached_blocks;
  c.load_cap_override = true;
  return c;
}

std::optional<size_t> ChoosePrefillByTokens(std::span<const PrefillCandidate> candidates,
                                            size_t start) {
  if (candidates.empty()) return std::nullopt;
  std::optional<size_t> best;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const size_t i = (start + k) % candidates.size();
    if (!best) {
      best = i;
      continue;
    }
    const PrefillCandidate& a = candidates[i];
    const PrefillCandidate& b = candidates[*best];
    if (a.outstanding_tokens < b.outstanding_tokens ||
        (a.outstanding_tokens == b.outstanding_tokens && a.outstanding < b.outstanding)) {
      best = i;
    }
  }
  return best;
}

SkipReason ShouldSkipPrefill(int64_t prompt_tokens, int64_t cached_tokens, int64_t threshold) {
  if (threshold <= 0 || prompt_tokens <= 0) return SkipReason::kNone;
  if (prompt_tokens < threshold) return SkipReason::kThreshold;
  const int64_t cached = std::clamp<int64_t>(cached_tokens, 0, prompt_tokens - 1);
  return prompt_tokens - cached < threshold ? SkipReason::kCached : SkipReason::kNone;
}

}  // namespace kvpush::router
