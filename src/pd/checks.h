// The P/D protocol's checks of a leg against the instance that received it, and which prompt
// tokens a consumer takes from the producer (docs/pd_protocol.md §1-§3). Pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "common/status.h"
#include "pd/kv_transfer_params.h"

namespace kvpush::pd {

/// What the checks need to know of the receiving instance.
struct InstanceFacts {
  bool serves_prefill = true;  ///< accepts producer legs (kv_producer or kv_both)
  bool serves_decode = true;   ///< accepts consumer legs (kv_consumer or kv_both)
  int32_t block_size = 16;     ///< tokens per KV block, >= 1
};

/// Checks `p` (already parsed) against the instance and, for a pull consumer, against the
/// prompt: the role is one the instance serves, the transfer id is valid, num_prompt_tokens and
/// prompt_hash (PromptHash) are the prompt's, remote_block_ids has ceil(n / block_size) entries,
/// and each is inside the producer's pool of `peer_num_blocks` blocks. `peer_num_blocks` is
/// nullopt when remote_engine_id is not a handshaken peer (refused for a pull consumer; not
/// looked at otherwise). Role kNone is always accepted.
/// Errors: kInvalidArgument whose message starts with "kv_transfer_params.<field>".
Status CheckLeg(const KvTransferParams& p, const InstanceFacts& instance,
                std::span<const int32_t> prompt, std::optional<int32_t> peer_num_blocks);

/// As CheckLeg, the role and the transfer id only (what is known before the producer was
/// reached: a D leg sent to a prefill-only instance is a 400, not a failed handshake).
Status CheckLegRole(const KvTransferParams& p, const InstanceFacts& instance);

/// How many prompt tokens a consumer takes from the producer, after its own prefix cache served
/// `num_local_computed` of the `num_prompt_tokens`: every uncached token in push and in the fast
/// pull profile when P's first token is given; all but the last in the vllm profile (D computes
/// the last token to sample the first output, as vLLM does). 0 (compute locally, take nothing)
/// when the prefix cache holds every whole block before the last token, or for a role other than
/// kConsumer. `profile` is the request's pull profile resolved against the instance default.
int32_t TokensFromProducer(const KvTransferParams& p, PullProfile profile,
                           int32_t num_prompt_tokens, int32_t num_local_computed,
                           int32_t block_size);

/// False for a push producer leg whose prompt the consumer computes itself whatever its prefix
/// cache holds: a prompt of `num_prompt_tokens` within one block of `block_size` tokens has no
/// whole block before its last token, so TokensFromProducer is 0 for it on every consumer (a
/// full prefix hit with nothing cached). P need not prefill such a leg: its KV would never be
/// sent (D answers NOT_NEEDED). True otherwise, and for every other role or mode (a pull leg's
/// answer carries P's first token and block ids, which pull's flow waits for).
bool PushPrefillNeeded(const KvTransferParams& p, int32_t num_prompt_tokens, int32_t block_size);

}  // namespace kvpush::pd
