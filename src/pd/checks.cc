#include "pd/checks.h"

#include <string>

#include "pd/ids.h"

namespace kvpush::pd {
namespace {

using Role = KvTransferParams::Role;
using Mode = KvTransferParams::Mode;

/// The pull consumer's fields against the prompt and the producer's pool.
Status CheckPullPrompt(const KvTransferParams& p, int32_t block_size,
                       std::span<const int32_t> prompt, std::optional<int32_t> peer_num_blocks) {
  const auto n = static_cast<int32_t>(prompt.size());
  if (p.num_prompt_tokens != n) {
    return InvalidArgument("kv_transfer_params.num_prompt_tokens is " +
                           std::to_string(p.num_prompt_tokens) + " but the prompt has " +
                           std::to_string(n) + " tokens");
  }
  if (p.prompt_hash != PromptHash(prompt)) {
    return InvalidArgument("kv_transfer_params.prompt_hash does not match the prompt");
  }
  const int32_t expected = (n + block_size - 1) / block_size;
  if (static_cast<int32_t>(p.remote_block_ids.size()) != expected) {
    return InvalidArgument("kv_transfer_params.remote_block_ids has " +
                           std::to_string(p.remote_block_ids.size()) + " blocks; " +
                           std::to_string(expected) + " expected");
  }
  if (!peer_num_blocks) {
    return InvalidArgument("kv_transfer_params.remote_engine_id '" + p.remote_engine_id +
                           "' is not the instance at remote_host:remote_port");
  }
  for (int32_t b : p.remote_block_ids) {
    if (b < 0 || b >= *peer_num_blocks) {
      return InvalidArgument("kv_transfer_params.remote_block_ids: block " + std::to_string(b) +
                             " is outside the peer's pool");
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckLegRole(const KvTransferParams& p, const InstanceFacts& instance) {
  if (p.role == Role::kNone) return Status::Ok();
  if (p.role == Role::kProducer && !instance.serves_prefill) {
    return InvalidArgument("kv_transfer_params.do_remote_decode: this is a decode instance");
  }
  if (p.role == Role::kConsumer && !instance.serves_decode) {
    return InvalidArgument("kv_transfer_params.do_remote_prefill: this is a prefill instance");
  }
  if (!IsValidTransferId(p.transfer_id)) {
    return InvalidArgument("kv_transfer_params.transfer_id must be 32 lowercase hex characters");
  }
  return Status::Ok();
}

Status CheckLeg(const KvTransferParams& p, const InstanceFacts& instance,
                std::span<const int32_t> prompt, std::optional<int32_t> peer_num_blocks) {
  if (Status s = CheckLegRole(p, instance); !s.ok()) return s;
  if (p.role == Role::kConsumer && p.mode == Mode::kPull) {
    return CheckPullPrompt(p, instance.block_size, prompt, peer_num_blocks);
  }
  return Status::Ok();
}

int32_t TokensFromProducer(const KvTransferParams& p, PullProfile profile,
                           int32_t num_prompt_tokens, int32_t num_local_computed,
                           int32_t block_size) {
  if (p.role != Role::kConsumer) return 0;
  const int32_t n = num_prompt_tokens;
  const int32_t local = num_local_computed;
  // Every whole block before the last token is cached: computing the short tail here is cheaper
  // than a transfer (push: the connector tells P it need not send anything). A prompt within one
  // block is such a hit in push too: with both cores busy, D computing 8-16 tokens itself beat
  // P's prefill plus one WRITE by ~1 ms of median TTFT, and on a quiet machine they were even
  // (docs/benchmarks/pd.md, "Push never loses").
  const bool full_hit = local >= (n - 1) / block_size * block_size;
  if (full_hit) return 0;
  if (p.mode == Mode::kPush) return n - local;
  const bool take_first = profile == PullProfile::kFast && p.first_token_id >= 0;
  const int32_t external = take_first ? n - local : n - 1 - local;
  return external > 0 ? external : 0;
}

bool PushPrefillNeeded(const KvTransferParams& p, int32_t num_prompt_tokens, int32_t block_size) {
  if (p.role != Role::kProducer || p.mode != Mode::kPush || block_size < 1) return true;
  if (num_prompt_tokens < 1) return true;
  // The consumer's own rule, with nothing cached (a cache only lowers what it takes).
  KvTransferParams consumer = p;
  consumer.role = Role::kConsumer;
  return TokensFromProducer(consumer, PullProfile::kFast, num_prompt_tokens, 0, block_size) > 0;
}

}  // namespace kvpush::pd
