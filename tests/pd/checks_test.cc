// pd/checks.h: a leg checked against the instance that received it, and the tokens a consumer
// takes from the producer (docs/pd_protocol.md §1-§3).
#include "pd/checks.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "pd/ids.h"

namespace kvpush::pd {
namespace {

using Role = KvTransferParams::Role;
using Mode = KvTransferParams::Mode;

const std::string kTid = "0123456789abcdef0123456789abcdef";

KvTransferParams Leg(Role role, Mode mode) {
  KvTransferParams p;
  p.role = role;
  p.mode = mode;
  p.transfer_id = kTid;
  return p;
}

/// A pull consumer's params that match `prompt` (block size 16), P's blocks 0..n-1.
KvTransferParams PullFor(const std::vector<int32_t>& prompt) {
  KvTransferParams p = Leg(Role::kConsumer, Mode::kPull);
  p.remote_engine_id = "prefill-0";
  p.num_prompt_tokens = static_cast<int32_t>(prompt.size());
  p.prompt_hash = PromptHash(prompt);
  p.remote_block_ids.resize((prompt.size() + 15) / 16);
  std::iota(p.remote_block_ids.begin(), p.remote_block_ids.end(), 0);
  return p;
}

std::string Message(const Status& s) {
  return s.ok() ? "ok" : s.message();
}

TEST(CheckLeg, RolesTheInstanceDoesNotServeAreRefusedByName) {
  const InstanceFacts prefill_only{true, false, 16};
  const InstanceFacts decode_only{false, true, 16};
  const std::vector<int32_t> prompt(20, 7);
  EXPECT_EQ(Message(CheckLeg(Leg(Role::kConsumer, Mode::kPush), prefill_only, prompt, {})),
            "kv_transfer_params.do_remote_prefill: this is a prefill instance");
  EXPECT_EQ(Message(CheckLeg(Leg(Role::kProducer, Mode::kPush), decode_only, prompt, {})),
            "kv_transfer_params.do_remote_decode: this is a decode instance");
  EXPECT_TRUE(CheckLeg(Leg(Role::kProducer, Mode::kPull), prefill_only, prompt, {}).ok());
  EXPECT_TRUE(CheckLeg(KvTransferParams{}, prefill_only, prompt, {}).ok());  // colocated
  KvTransferParams bad_id = Leg(Role::kProducer, Mode::kPush);
  bad_id.transfer_id = "cmpl-1";
  EXPECT_EQ(Message(CheckLegRole(bad_id, prefill_only)),
            "kv_transfer_params.transfer_id must be 32 lowercase hex characters");
}

TEST(CheckLeg, APullConsumerMustMatchThePromptAndThePeersPool) {
  const InstanceFacts decode{false, true, 16};
  std::vector<int32_t> prompt(37);
  std::iota(prompt.begin(), prompt.end(), 1);
  const KvTransferParams ok = PullFor(prompt);
  EXPECT_TRUE(CheckLeg(ok, decode, prompt, 100).ok()) << Message(CheckLeg(ok, decode, prompt, 100));

  struct Case {
    const char* what;
    KvTransferParams p;
    std::optional<int32_t> peer_blocks;
    std::string error;
  };
  std::vector<Case> cases;
  KvTransferParams p = ok;
  p.num_prompt_tokens = 36;
  cases.push_back(
      {"count", p, 100, "kv_transfer_params.num_prompt_tokens is 36 but the prompt has 37 tokens"});
  p = ok;
  p.prompt_hash ^= 1;
  cases.push_back({"hash", p, 100, "kv_transfer_params.prompt_hash does not match the prompt"});
  p = ok;
  p.remote_block_ids.pop_back();
  cases.push_back(
      {"blocks", p, 100, "kv_transfer_params.remote_block_ids has 2 blocks; 3 expected"});
  cases.push_back({"no peer", ok, std::nullopt,
                   "kv_transfer_params.remote_engine_id 'prefill-0' is not the instance at "
                   "remote_host:remote_port"});
  cases.push_back({"outside", ok, 2,
                   "kv_transfer_params.remote_block_ids: block 2 is outside the peer's pool"});
  for (const Case& c : cases) {
    EXPECT_EQ(Message(CheckLeg(c.p, decode, prompt, c.peer_blocks)), c.error) << c.what;
  }
  // A push consumer carries none of those fields: nothing to match yet.
  EXPECT_TRUE(CheckLeg(Leg(Role::kConsumer, Mode::kPush), decode, prompt, std::nullopt).ok());
}

TEST(TokensFromProducer, PushTakesEveryUncachedTokenPullVllmAllButTheLast) {
  struct Case {
    Mode mode;
    PullProfile profile;
    int32_t first_token_id;
    int32_t n, local;
    int32_t want;
  };
  const Case cases[] = {
      // push: the whole uncached tail, unless every whole block before the last token is cached
      {Mode::kPush, PullProfile::kFast, -1, 40, 0, 40},
      {Mode::kPush, PullProfile::kFast, -1, 40, 16, 24},
      {Mode::kPush, PullProfile::kFast, -1, 40, 32, 0},  // (40 - 1) / 16 * 16 = 32: full hit
      // A prompt within one block is D's to compute in both modes (measured: under CPU
      // contention D's own 8-token prefill beats P's prefill plus one WRITE by ~1 ms)
      {Mode::kPush, PullProfile::kFast, -1, 16, 0, 0},  // (16 - 1) / 16 * 16 = 0: full hit
      {Mode::kPush, PullProfile::kFast, -1, 5, 0, 0},
      {Mode::kPush, PullProfile::kFast, -1, 17, 0, 17},
      {Mode::kPush, PullProfile::kFast, -1, 17, 16, 0},  // (17 - 1) / 16 * 16 = 16: full hit
      {Mode::kPush, PullProfile::kFast, -1, 32, 16, 0},  // 31 / 16 * 16 = 16: full hit
      {Mode::kPush, PullProfile::kFast, -1, 33, 16, 17},
      {Mode::kPull, PullProfile::kVllm, 5, 16, 0, 0},
      {Mode::kPull, PullProfile::kFast, 5, 16, 0, 0},
      // fast pull with P's first token: like push; without it, all but the last token
      {Mode::kPull, PullProfile::kFast, 5, 40, 0, 40},
      {Mode::kPull, PullProfile::kFast, -1, 40, 0, 39},
      {Mode::kPull, PullProfile::kFast, 5, 40, 32, 0},
      // vllm pull: D recomputes the last prompt token
      {Mode::kPull, PullProfile::kVllm, 5, 40, 0, 39},
      {Mode::kPull, PullProfile::kVllm, 5, 40, 16, 23},
      {Mode::kPull, PullProfile::kVllm, 5, 17, 0, 16},
  };
  for (const Case& c : cases) {
    KvTransferParams p = Leg(Role::kConsumer, c.mode);
    p.first_token_id = c.first_token_id;
    EXPECT_EQ(TokensFromProducer(p, c.profile, c.n, c.local, 16), c.want)
        << "mode " << static_cast<int>(c.mode) << " profile " << PullProfileName(c.profile)
        << " first " << c.first_token_id << " n " << c.n << " local " << c.local;
  }
  EXPECT_EQ(TokensFromProducer(Leg(Role::kProducer, Mode::kPush), PullProfile::kFast, 40, 0, 16),
            0);
  EXPECT_EQ(TokensFromProducer(KvTransferParams{}, PullProfile::kFast, 40, 0, 16), 0);
}

// P skips exactly the push legs whose KV no consumer would take, whatever its prefix cache.
TEST(PushPrefillNeeded, FalseExactlyWhenEveryConsumerComputesThePromptItself) {
  for (const int32_t bs : {1, 4, 16, 32}) {
    for (int32_t n = 1; n <= 3 * bs + 1; ++n) {
      bool taken_somewhere = false;
      KvTransferParams d = Leg(Role::kConsumer, Mode::kPush);
      for (int32_t local = 0; local < n; local += bs) {
        taken_somewhere =
            taken_somewhere || TokensFromProducer(d, PullProfile::kFast, n, local, bs) > 0;
      }
      EXPECT_EQ(PushPrefillNeeded(Leg(Role::kProducer, Mode::kPush), n, bs), taken_somewhere)
          << "n " << n << " block_size " << bs;
    }
  }
  EXPECT_FALSE(PushPrefillNeeded(Leg(Role::kProducer, Mode::kPush), 16, 16));
  EXPECT_TRUE(PushPrefillNeeded(Leg(Role::kProducer, Mode::kPush), 17, 16));
  // Pull's flow waits for P's answer (its first token and block ids): never skipped.
  EXPECT_TRUE(PushPrefillNeeded(Leg(Role::kProducer, Mode::kPull), 8, 16));
  EXPECT_TRUE(PushPrefillNeeded(Leg(Role::kConsumer, Mode::kPush), 8, 16));
  EXPECT_TRUE(PushPrefillNeeded(KvTransferParams{}, 8, 16));
}

}  // namespace
}  // namespace kvpush::pd
