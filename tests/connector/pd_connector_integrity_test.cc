// Pull's pinned lease and the end-to-end block checksums, on two in-process PdConnectors
// (loopback backend) driven through the engine hooks by hand: D reads only the blocks P confirms
// for the transfer id (whatever kv_transfer_params claim), takes P's first token, refuses KV whose
// checksum does not match, and is refused a lease that expired (DESIGN.md §3 pull, §6).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "common/clock.h"
#include "connector/handshake_server.h"
#include "connector/pd_connector.h"
#include "kv/block_checksum.h"
#include "pd/ids.h"
#include "test_util.h"

namespace kvpush::connector {
namespace {

using namespace std::chrono_literals;
using Role = pd::KvTransferParams::Role;
using Mode = pd::KvTransferParams::Mode;

const std::string kTid = "00112233445566778899aabbccddeeff";

ConnectorOptions Options(const std::string& role, const std::string& id, const std::string& extra) {
  ConnectorOptions o;
  auto cfg = KvTransferConfig::Parse(R"({"kv_connector_extra_config": {"backend": "loopback", )"
                                     R"("engine_id": ")" + id + "\"" + extra + "}}",
                                     role);
  EXPECT_TRUE(cfg.ok()) << cfg.status().ToString();
  o.config = cfg.value();
  o.layout = KvLayout{2, 2, 4, 4, 64, KvDtype::kF32};  // 2 layers, 2 kv heads, dim 4, bs 4
  o.model_fingerprint = 0x5eed;
  o.role_name = role;
  return o;
}

/// Fills every chunk of `block` with bytes derived from (salt, layer, kind, byte index).
void Fill(PdConnector& c, const KvLayout& L, BlockId block, uint8_t salt) {
  for (int32_t layer = 0; layer < L.num_layers; ++layer) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      std::byte* chunk = c.kv_memory().data() + L.offset(layer, kind, block);
      for (size_t i = 0; i < L.chunk_bytes(); ++i) {
        chunk[i] = static_cast<std::byte>(salt + layer * 31 + static_cast<int>(kind) * 7 + i);
      }
    }
  }
}

bool SameBlock(PdConnector& a, BlockId ba, PdConnector& b, BlockId bb, const KvLayout& L) {
  for (int32_t layer = 0; layer < L.num_layers; ++layer) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      if (std::memcmp(a.kv_memory().data() + L.offset(layer, kind, ba),
                      b.kv_memory().data() + L.offset(layer, kind, bb), L.chunk_bytes()) != 0) {
        return false;
      }
    }
  }
  return true;
}

template <typename F>
bool WaitFor(F done, std::chrono::milliseconds limit = 5000ms) {
  return ::kvpush::testing::WaitUntil(done, limit, 1ms);
}

class PullIntegrity : public ::testing::Test {
 protected:
  /// `key_file`: both connectors authenticate peers with it (--kv-auth-key-file).
  void Start(const std::string& p_extra, const std::string& d_extra,
             const std::string& key_file = "") {
    auto popts = Options("prefill", "p-int", p_extra);
    popts.auth_key_file = key_file;
    auto p = PdConnector::Create(popts);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    p_ = std::move(*p);
    auto dopts = Options("decode", "d-int", d_extra);
    dopts.auth_key_file = key_file;
    auto d = PdConnector::Create(dopts);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    d_ = std::move(*d);
    p_->BindEngine([] {}, [](int64_t) {});
    d_->BindEngine([] {}, [](int64_t) {});
    server_ = std::make_unique<HandshakeServer>(*p_);
    auto peer = d_->EnsurePeer("127.0.0.1", server_->port);
    ASSERT_TRUE(peer.ok()) << peer.status().ToString();
    layout_ = Options("prefill", "x", "").layout;
  }

  /// P computes a 10-token prompt into blocks {5, 6, 7} and finishes it with first token 7;
  /// returns once P's connector holds the lease (its checksums computed).
  void RunProducer() {
    StartProducer();
    FinishProducer();
  }

  void StartProducer() {
    ps_.seq_id = 1;
    ps_.request.kv_transfer.role = Role::kProducer;
    ps_.request.kv_transfer.mode = Mode::kPull;
    ps_.request.kv_transfer.transfer_id = kTid;
    ps_.tokens = prompt_;
    ps_.num_prompt_tokens = static_cast<int32_t>(prompt_.size());
    ps_.admitted_once = true;
    ps_.last_token = TokenOutput{7, -0.5f, {{7, -0.5f}, {12, -1.25f}}};
    for (size_t i = 0; i < p_blocks_.size(); ++i) {
      Fill(*p_, layout_, p_blocks_[i], static_cast<uint8_t>(i + 1));
    }
    p_->OnBlocksAllocated(ps_, p_blocks_, 0);
  }

  void FinishProducer() {
    RequestOutput out;
    out.finish_reason = FinishReason::kLength;
    ASSERT_TRUE(p_->OnRequestFinished(ps_, p_blocks_, out));
    ASSERT_TRUE(out.pull_answer.has_value());
    ASSERT_TRUE(WaitFor([&] { return p_->stats().checksum_ns_sum > 0; }));
  }

  /// D admits the request with `params` (pull) into blocks {20, 21, 22} and waits for the load.
  KvLoadResult RunConsumer(pd::KvTransferParams params,
                           const std::function<void()>& meanwhile = {}) {
    ds_.seq_id = 11;
    params.role = Role::kConsumer;
    params.mode = Mode::kPull;
    params.transfer_id = kTid;
    params.remote_engine_id = "p-int";
    ds_.request.kv_transfer = params;
    ds_.tokens = prompt_;
    ds_.num_prompt_tokens = static_cast<int32_t>(prompt_.size());
    ds_.arrival_ns = NowNs();
    KvMatch m = d_->GetNumMatchedTokens(ds_, 0);
    EXPECT_TRUE(m.load_async);
    d_->OnBlocksAllocated(ds_, d_blocks_, m.num_external_tokens);
    if (meanwhile) meanwhile();
    std::vector<KvLoadResult> got;
    EXPECT_TRUE(WaitFor([&] {
      (void)d_->BeginStep({});  // the vllm profile posts its READ from here
      got = d_->GetFinishedLoading();
      return !got.empty();
    }));
    return got.empty() ? KvLoadResult{} : got.front();
  }

  /// The pull params P's answer carries for the 10-token prompt (what an honest router relays).
  pd::KvTransferParams HonestParams() const {
    pd::KvTransferParams params;
    params.remote_block_ids = p_blocks_;
    params.num_prompt_tokens = 10;
    params.prompt_hash = pd::PromptHash(prompt_);
    params.first_token_id = 7;
    return params;
  }

  /// True once P reported seq 1's blocks free (RELEASE, expiry or refusal).
  bool ProducerReleased() {
    return WaitFor([&] {
      for (int64_t id : p_->GetFinished()) {
        if (id == 1) return true;
      }
      return false;
    });
  }

  std::unique_ptr<PdConnector> p_, d_;
  std::unique_ptr<HandshakeServer> server_;
  KvLayout layout_;
  std::vector<int32_t> prompt_{1, 17, 33, 49, 65, 81, 97, 113, 129, 145};
  std::vector<BlockId> p_blocks_{5, 6, 7};
  std::vector<BlockId> d_blocks_{20, 21, 22};
  Sequence ps_, ds_;
};

TEST_F(PullIntegrity, ReadsThePinnedBlocksAndTakesPsFirstTokenWhateverTheParamsSay) {
  for (const char* profile : {"fast", "vllm"}) {
    SCOPED_TRACE(profile);
    Start("", std::string(R"(, "pull_profile": ")") + profile + "\"");
    RunProducer();
    pd::KvTransferParams forged;
    forged.remote_block_ids = {7, 6, 5};  // reversed: in range, wrong
    forged.num_prompt_tokens = 10;
    forged.prompt_hash = pd::PromptHash(prompt_);
    forged.first_token_id = 2;  // EOS, not what P sampled
    KvLoadResult r = RunConsumer(forged);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    const bool fast = std::string(profile) == "fast";
    ASSERT_EQ(r.first_token.has_value(), fast);
    if (fast) {
      EXPECT_EQ(r.first_token->id, 7);  // P's token, from PINNED
      EXPECT_EQ(r.first_token->logprob, -0.5f);
      EXPECT_EQ(r.first_token->top_logprobs, ps_.last_token.top_logprobs);
    }
    // vllm: the last prompt token is recomputed, so its block is read only up to token 9 (the
    // 10-token prompt's blocks 0..2 all hold earlier tokens: all three are read).
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_TRUE(SameBlock(*p_, p_blocks_[i], *d_, d_blocks_[i], layout_)) << "block " << i;
    }
    const ConnectorStats ds = d_->stats();
    EXPECT_EQ(ds.pins_sent, 1);
    EXPECT_EQ(ds.blocks_verified, 3);
    EXPECT_EQ(ds.checksum_mismatches, 0);
    EXPECT_TRUE(ProducerReleased());  // RELEASE after the READ
    server_.reset();
    d_.reset();
    p_.reset();
  }
}

// A D request preempted after its load (churn on a small pool) is admitted again without asking
// P again: its transfer ended, so P would refuse it and the request would recompute after a
// round trip and a warning pair (issue 26, "also seen").
TEST_F(PullIntegrity, APreemptedRequestDoesNotAskForItsEndedTransferAgain) {
  Start("", R"(, "pull_profile": "vllm")");
  RunProducer();
  KvLoadResult r = RunConsumer(HonestParams());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_TRUE(ProducerReleased());
  const ConnectorStats before = d_->stats();
  ds_.num_preemptions = 1;
  ds_.num_computed = 0;
  const KvMatch m = d_->GetNumMatchedTokens(ds_, 0);
  EXPECT_EQ(m.num_external_tokens, 0);
  EXPECT_FALSE(m.load_async);
  d_->OnBlocksAllocated(ds_, d_blocks_, 0);  // no NOT_NEEDED / RELEASE for the ended transfer
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const ConnectorStats after = d_->stats();
  EXPECT_EQ(after.pins_sent, before.pins_sent);
  EXPECT_EQ(after.control_messages_sent, before.control_messages_sent);
  EXPECT_EQ(p_->stats().pins_refused, 0);
}

// The same pinned READ with authenticated peers: PIN, PINNED and RELEASE travel sealed (the
// shell seals, the core opens) and none is refused.
TEST_F(PullIntegrity, WithAuthenticatedPeersThePinnedReadWorksAndNoMessageIsRefused) {
  const std::string key =
      ::testing::TempDir() + "kvpush_integrity_key_" + std::to_string(::getpid());
  {
    std::ofstream f(key, std::ios::binary);
    f << std::string(48, 'z');
  }
  ASSERT_EQ(::chmod(key.c_str(), 0600), 0);
  Start("", R"(, "pull_profile": "fast")", key);
  RunProducer();
  KvLoadResult r = RunConsumer(HonestParams());
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  ASSERT_TRUE(r.first_token.has_value());
  EXPECT_EQ(r.first_token->id, 7);  // from the sealed PINNED
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(SameBlock(*p_, p_blocks_[i], *d_, d_blocks_[i], layout_)) << "block " << i;
  }
  EXPECT_TRUE(ProducerReleased());  // the sealed RELEASE was accepted
  for (const ConnectorStats& s : {p_->stats(), d_->stats()}) {
    EXPECT_TRUE(s.auth_enabled);
    EXPECT_EQ(s.bad_messages, 0);
    for (int64_t n : s.auth_failures) EXPECT_EQ(n, 0);
  }
  std::remove(key.c_str());
}

// D's PIN can overtake the engine's "prefill finished" event on P (P's HTTP answer leaves first):
// P holds the PIN and answers it once the prefill's outcome is known.
TEST_F(PullIntegrity, APinThatOvertakesThePrefillsEndIsAnsweredWhenItEnds) {
  Start("", R"(, "pull_profile": "fast")");
  StartProducer();
  const pd::KvTransferParams params = HonestParams();
  KvLoadResult r = RunConsumer(params, [&] {
    // The PIN reached P before the prefill ended (P holds it).
    ASSERT_TRUE(WaitFor([&] { return p_->stats().pins_held == 1; }));
    FinishProducer();
  });
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.first_token->id, 7);
  EXPECT_EQ(p_->stats().pins_refused, 0);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(SameBlock(*p_, p_blocks_[i], *d_, d_blocks_[i], layout_)) << "block " << i;
  }
}

TEST_F(PullIntegrity, CorruptedBlocksAreRefusedAndNeverUsed) {
  Start("", R"(, "pull_profile": "fast", "failure_policy": "recompute")");
  RunProducer();
  // Flip one byte of P's middle block after P checksummed it (a bit flip, a stray write).
  p_->kv_memory()[layout_.offset(1, KvKind::kValue, p_blocks_[1]) + 5] ^= std::byte{0x40};
  const pd::KvTransferParams params = HonestParams();
  KvLoadResult r = RunConsumer(params);
  EXPECT_EQ(r.status.code(), StatusCode::kDataLoss) << r.status.ToString();
  EXPECT_TRUE(r.recompute);
  EXPECT_FALSE(r.first_token.has_value());  // nothing of the failed transfer is used
  const ConnectorStats ds = d_->stats();
  EXPECT_EQ(ds.checksum_mismatches, 1);
  EXPECT_EQ(ds.blocks_verified, 3);
  EXPECT_TRUE(ProducerReleased());
}

TEST_F(PullIntegrity, AnExpiredLeaseIsRefusedNotRead) {
  // P's lease 1.2 s (the handshake needs it above D's watchdog + 1 s).
  Start(R"(, "lease_ms": 1200)", R"(, "watchdog_ms": 150, "pull_profile": "fast")");
  RunProducer();
  EXPECT_TRUE(ProducerReleased());  // the lease ran out: P freed (and may reuse) the blocks
  EXPECT_EQ(p_->stats().leases_expired, 1);
  for (BlockId b : p_blocks_) Fill(*p_, layout_, b, 0x77);  // another request's KV
  const pd::KvTransferParams params = HonestParams();
  KvLoadResult r = RunConsumer(params);
  EXPECT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("lease expired"), std::string::npos) << r.status.ToString();
  EXPECT_TRUE(r.recompute);
  EXPECT_EQ(p_->stats().pins_refused, 1);
  EXPECT_EQ(d_->stats().reads_completed, 0);
  EXPECT_FALSE(SameBlock(*p_, p_blocks_[0], *d_, d_blocks_[0], layout_));  // nothing was read
}

TEST(KvBlockChecksum, DefinitionsAgree) {
  const KvLayout L{3, 2, 4, 4, 8, KvDtype::kF32};
  std::vector<std::byte> arena(L.total_bytes());
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (std::byte& b : arena) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64: no two blocks alike
    b = static_cast<std::byte>(x);
  }
  // c(b) from the arena equals c(b) combined from chunk hashes taken in any order.
  std::vector<uint64_t> h(static_cast<size_t>(L.num_layers) * 2);
  for (int32_t layer = L.num_layers - 1; layer >= 0; --layer) {
    for (KvKind kind : {KvKind::kValue, KvKind::kKey}) {
      h[static_cast<size_t>(layer) * 2 + static_cast<size_t>(kind)] =
          KvChunkHash(L, arena, layer, kind, 3);
    }
  }
  EXPECT_EQ(KvBlockChecksumFromChunks(h), KvBlockChecksum(L, arena, 3));
  const std::vector<BlockId> blocks{3, 1};
  const std::vector<uint64_t> sums{KvBlockChecksum(L, arena, 3), KvBlockChecksum(L, arena, 1)};
  EXPECT_EQ(KvBlocksDigest(L, arena, blocks), KvDigest(sums));
  std::vector<uint64_t> chunks;  // block 3's chunk hashes, then block 1's
  for (BlockId blk : blocks) {
    for (int32_t layer = 0; layer < L.num_layers; ++layer) {
      for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
        chunks.push_back(KvChunkHash(L, arena, layer, kind, blk));
      }
    }
  }
  EXPECT_EQ(KvDigestFromChunks(chunks, L.num_layers), KvDigest(sums));
  // Order matters, and so does every byte of every chunk of every block.
  EXPECT_NE(KvBlocksDigest(L, arena, std::vector<BlockId>{1, 3}), KvDigest(sums));
  const uint64_t before = KvBlocksDigest(L, arena, blocks);
  for (int32_t layer = 0; layer < L.num_layers; ++layer) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      const size_t at = L.offset(layer, kind, 1) + L.chunk_bytes() - 1;
      arena[at] ^= std::byte{1};
      EXPECT_NE(KvBlocksDigest(L, arena, blocks), before) << layer;
      arena[at] ^= std::byte{1};
    }
  }
  EXPECT_EQ(KvBlocksDigest(L, arena, blocks), before);
}

}  // namespace
}  // namespace kvpush::connector
