// Routing policies of the router (docs/router.md, "Routing policies"): which decode (D) and
// prefill (P) instance a P/D request goes to, and whether it needs a P leg at all. Pure functions
// over candidate snapshots and the prompt's prefix-block hashes; InstancePool holds the state
// (outstanding counts, reported load, the per-D PrefixIndex) and calls these under its lock.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvpush::router {

/// `--routing`: least-outstanding (D and P by fewest legs in flight, ties round robin) or
/// cache-aware (D by prefix-block hashes with a load cap, P by outstanding prefill tokens).
enum class RoutingPolicy { kLeastOutstanding, kCacheAware };

/// "least-outstanding" / "cache-aware".
const char* RoutingPolicyName(RoutingPolicy p);

/// Parses a `--routing` value. Errors: kInvalidArgument naming the accepted values.
Result<RoutingPolicy> ParseRoutingPolicy(std::string_view name);

/// Chained hashes of the full blocks of `tokens` (a trailing partial block has none):
///   h_0 = XXH3_64bits_withSeed(block 0 as int32 LE, seed 0),
///   h_i = XXH3_64bits_withSeed(block i as int32 LE, seed h_{i-1}),
/// the chain D's prefix cache uses (kv/block_pool.h) with salt 0. The router only compares its own
/// hashes, so the salt need not be D's. `block_size` must be >= 1. Pure.
std::vector<uint64_t> PrefixBlockHashes(std::span<const int32_t> tokens, int32_t block_size);

/// Rendezvous (highest-random-weight) weight of `instance` (its URL) for routing key `key`:
/// XXH3_64bits_withSeed(instance, key). The instance with the highest weight owns the key; when
/// one instance leaves, only its keys move. Pure.
uint64_t RendezvousWeight(uint64_t key, std::string_view instance);

/// One healthy D as the decode choice sees it. Value type.
struct DecodeCandidate {
  std::string url;             ///< rendezvous identity
  int64_t outstanding = 0;     ///< legs in flight to it
  int64_t cached_blocks = 0;   ///< leading prompt blocks the router's index says it holds
};

/// Cache-aware knobs. Value type.
struct CacheAwareOptions {
  /// Load cap c (>= 1): a D is eligible when outstanding + 1 <= ceil(c * (total + 1) / n), total
  /// being the outstanding legs of all n healthy Ds (consistent hashing with bounded loads,
  /// Mirrokni et al. 2018). The least loaded D is always eligible.
  double load_cap = 1.25;
};

/// Why a D was chosen (counted in the router's /metrics).
enum class DecodeReason {
  kPrefixHit,         ///< the chosen D holds >= 1 leading block of the prompt (router's index)
  kRendezvous,        ///< the chosen D holds no block: the rendezvous owner of the routing key
  kLeastOutstanding,  ///< policy least-outstanding, or a prompt shorter than one block
};

/// The decode choice. Value type.
struct DecodeChoice {
  size_t index = 0;           ///< into the candidates
  int64_t cached_blocks = 0;  ///< the chosen D's cached_blocks
  DecodeReason reason = DecodeReason::kLeastOutstanding;
  /// The preferred D (most cached blocks, then rendezvous order) was over the load cap and a
  /// later one in that order was taken.
  bool load_cap_override = false;
};

/// Least outstanding legs; ties go to the first such candidate at or after `start` (round robin).
/// nullopt when `candidates` is empty. Pure.
std::optional<size_t> ChooseLeastOutstanding(std::span<const DecodeCandidate> candidates,
                                             size_t start);

/// Cache-aware D choice. Candidates are ordered by cached_blocks (more first), then by rendezvous
/// weight for the key h_k, k = min(max cached_blocks over the candidates, blocks - 1): the hash of
/// the prompt's shortest prefix no candidate is known to hold (h_0 when none holds a block), so
/// prompts that share only a common head (a system prompt every D has) still spread; the first
/// eligible one under the load cap wins. With no full block (`block_hashes` empty) it is ChooseLeastOutstanding(start).
/// nullopt when `candidates` is empty. Pure.
std::optional<DecodeChoice> ChooseDecodeCacheAware(std::span<const DecodeCandidate> candidates,
                                                   std::span<const uint64_t> block_hashes,
                                                   const CacheAwareOptions& options, size_t start);

/// One healthy P as the prefill choice sees it. Value type.
struct PrefillCandidate {
  int64_t outstanding_tokens = 0;  ///< estimated prompt tokens queued or being prefilled there
  int64_t outstanding = 0;         ///< legs in flight to it
};

/// Fewest outstanding prefill tokens, then fewest legs; remaining ties: the first at or after
/// `start`. nullopt when empty. Pure.
std::optional<size_t> ChoosePrefillByTokens(std::span<const PrefillCandidate> candidates,
                                            size_t start);

/// Why a request got no P leg.
enum class SkipReason { kNone, kThreshold, kCached };

/// Conditional disaggregation (`--local-prefill-threshold N`, N > 0): the request skips its P
/// leg when the uncached part of the prompt, prompt_tokens - cached_tokens, is below N. Reason
/// kThreshold when the prompt alone is below N, kCached when the predicted prefix hit brought it
/// there. `cached_tokens` is clamped to [0, prompt_tokens - 1] (D computes at least the last
/// token). threshold <= 0 or prompt_tokens <= 0: kNone. Pure.
SkipReason ShouldSkipPrefill(int64_t prompt_tokens, int64_t cached_tokens, int64_t threshold);

}  // namespace kvpush::router
