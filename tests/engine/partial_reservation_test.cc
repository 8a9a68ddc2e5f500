// The scheduler's reservation in parts (scheduler.h, policy 4): a request whose asynchronous load
// needs more blocks than the pool has free starts with what is free (one block per running
// sequence kept back) when its connector accepts that, grows as running sequences free blocks,
// holds back later admissions until whole, and ends like any load. Over the fake model, whose
// tokens depend on the K/V read through the block table: a table assembled wrongly shows up as a
// wrong token.
#include <gtest/gtest.h>

#include <set>

#include "common/clock.h"
#include "engine_test_util.h"

namespace kvpush::testing {
namespace {

/// Loads the requests in `async_ids` asynchronously (every prompt token, as push does) and
/// records the block table it was told of, allocation and extensions together.
class PartialConnector : public KvConnector, public LayerObserver {
 public:
  void BindEngine(std::function<void()>, std::function<void(int64_t)>) override {}
  KvMatch GetNumMatchedTokens(const Sequence& seq, int32_t local) override {
    // A preempted request computes its prompt here (PdConnector's ReadmittedConsumer).
    if (async_ids.count(seq.seq_id) == 0 || seq.num_preemptions > 0) return {};
    return KvMatch{seq.num_tokens() - local, true};
  }
  bool AcceptsPartialBlocks(const Sequence&) const override { return accept_partial; }
  void OnBlocksAllocated(const Sequence& seq, std::span<const BlockId> table, int32_t) override {
    if (async_ids.count(seq.seq_id) == 0) return;
    first_part = table.size();
    blocks.assign(table.begin(), table.end());
  }
  void OnBlocksExtended(const Sequence&, std::span<const BlockId> added) override {
    ++extensions;
    blocks.insert(blocks.end(), added.begin(), added.end());
  }
  LayerObserver* BeginStep(std::span<const SequenceChunk>) override { return this; }
  void OnLayerDone(int32_t) override {}
  bool OnRequestFinished(const Sequence&, std::span<const BlockId>, RequestOutput&) override {
    return false;
  }
  std::vector<int64_t> GetFinished() override { return {}; }
  std::vector<KvLoadResult> GetFinishedLoading() override { return std::exchange(loads, {}); }
  bool HasPendingWork() const override { return false; }

  std::set<int64_t> async_ids;
  bool accept_partial = true;
  size_t first_part = 0;
  int extensions = 0;
  std::vector<BlockId> blocks;
  std::vector<KvLoadResult> loads;
};

/// Writes `prompt`'s K/V into `table` the way P's WRITEs would (the fake model's K/V: token id,
/// position + 1).
void FillKv(EngineCore& core, const std::vector<int32_t>& prompt,
            const std::vector<BlockId>& table) {
  KvCache& kv = core.kv_cache();
  const int32_t bs = kv.layout().block_size;
  for (int32_t pos = 0; pos < static_cast<int32_t>(prompt.size()); ++pos) {
    const BlockId b = table[static_cast<size_t>(pos / bs)];
    for (int32_t layer = 0; layer < kv.layout().num_layers; ++layer) {
      for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
        float* slot = kv.chunk_f32(layer, kind, b) + (pos % bs) * 2;
        slot[0] = static_cast<float>(prompt[static_cast<size_t>(pos)]);
        slot[1] = static_cast<float>(pos + 1);
      }
    }
  }
}

struct Instance {
  std::unique_ptr<EngineCore> core;
  std::shared_ptr<OutputChannel> a = std::make_shared<OutputChannel>();
  std::shared_ptr<OutputChannel> b = std::make_shared<OutputChannel>();
  std::shared_ptr<OutputChannel> c = std::make_shared<OutputChannel>();
};

// 16 blocks of 4 tokens. A (computed here: 26 prompt tokens, 14 output) holds 7 blocks, then up to
// 10; B (loaded: 40 prompt tokens, 10 blocks) cannot be held whole until A finishes; C (computed,
// 8 tokens) arrives after B.
const std::vector<int32_t> kPromptA = MakePrompt(26, 1);
const std::vector<int32_t> kPromptB = MakePrompt(40, 2);
const std::vector<int32_t> kPromptC = MakePrompt(8, 3);

Instance Start(FakeTokenizer& tok, PartialConnector& conn) {
  Instance r;
  auto made = EngineCore::Create(FakeConfig(16, 4, 64), std::make_unique<FakeExecutor>(nullptr),
                                 tok, &conn);
  EXPECT_TRUE(made.ok()) << made.status().ToString();
  r.core = std::move(made).value();
  conn.async_ids = {2};
  r.core->AddRequest(1, MakeRequest(kPromptA, 14), r.a, NowNs());
  r.core->Step();  // A's prefill: 7 blocks
  r.core->AddRequest(2, MakeRequest(kPromptB, 4), r.b, NowNs());
  r.core->AddRequest(3, MakeRequest(kPromptC, 3), r.c, NowNs());
  return r;
}

TEST(PartialReservationTest, GrowsAsBlocksFreeAndLoadsIntoTheWholeTable) {
  FakeTokenizer tok;
  PartialConnector conn;
  Instance r = Start(tok, conn);
  r.core->Step();
  // 9 free, 3 kept for A (up to 40 tokens: 10 blocks): B starts with 6 of its 10 blocks; C
  // waits behind it.
  EXPECT_EQ(conn.first_part, 6u);
  EXPECT_EQ(r.core->stats().num_waiting_for_kv, 1);
  EXPECT_EQ(r.core->stats().num_waiting, 1);
  int steps = 0;
  while (conn.blocks.size() < 10 && steps++ < 100) {
    r.core->Step();
    EXPECT_EQ(r.core->stats().num_waiting, conn.blocks.size() < 10 ? 1 : 0);
  }
  ASSERT_EQ(conn.blocks.size(), 10u);
  EXPECT_GE(conn.extensions, 1);
  EXPECT_EQ(std::set<BlockId>(conn.blocks.begin(), conn.blocks.end()).size(), 10u);
  EXPECT_TRUE(r.a->closed());  // the blocks came from A's end
  EXPECT_EQ(r.core->stats().num_preemptions, 0);
  // The load ends into the table as announced, with P's first token.
  const std::vector<int32_t> expected = FakeGreedy(kPromptB, 4, 64);
  FillKv(*r.core, kPromptB, conn.blocks);
  conn.loads.push_back(KvLoadResult{2, Status::Ok(), false, TokenOutput{expected[0], 0.0f, {}}});
  for (int i = 0; i < 50 && r.core->HasWork(); ++i) r.core->Step();
  Collected a, b, c;
  for (const auto& o : r.a->TakeAll()) Accumulate(a, o);
  for (const auto& o : r.b->TakeAll()) Accumulate(b, o);
  for (const auto& o : r.c->TakeAll()) Accumulate(c, o);
  EXPECT_EQ(a.tokens, FakeGreedy(kPromptA, 14, 64));
  EXPECT_EQ(b.tokens, expected);
  EXPECT_EQ(c.tokens, FakeGreedy(kPromptC, 3, 64));
  EXPECT_EQ(r.core->stats().prompt_tokens_computed, 26 + 8);  // B's prompt was not computed
  ExpectNoLeak(*r.core);
}

TEST(PartialReservationTest, WithoutItTheRequestWaitsForItsWholeTable) {
  FakeTokenizer tok;
  PartialConnector conn;
  conn.accept_partial = false;
  Instance r = Start(tok, conn);
  r.core->Step();
  EXPECT_EQ(conn.first_part, 0u);  // nothing allocated
  EXPECT_EQ(r.core->stats().num_waiting, 2);
  for (int i = 0; i < 100 && conn.first_part == 0; ++i) r.core->Step();
  EXPECT_EQ(conn.first_part, 10u);
  EXPECT_EQ(conn.extensions, 0);
  EXPECT_TRUE(r.a->closed());
}

TEST(PartialReservationTest, ALoadThatFailsOrAnAbortMidReservationLeavesNothingBehind) {
  for (bool abort : {false, true}) {
    SCOPED_TRACE(abort ? "aborted" : "load failed, recomputed");
    FakeTokenizer tok;
    PartialConnector conn;
    Instance r = Start(tok, conn);
    r.core->Step();
    ASSERT_EQ(conn.first_part, 6u);
    if (abort) {
      r.core->Abort(2);
    } else {
      KvLoadResult failed;
      failed.seq_id = 2;
      failed.status = Unavailable("prefill instance failed the transfer");
      failed.recompute = true;
      conn.loads.push_back(failed);
    }
    for (int i = 0; i < 200 && r.core->HasWork(); ++i) r.core->Step();
    Collected b, c;
    for (const auto& o : r.b->TakeAll()) Accumulate(b, o);
    for (const auto& o : r.c->TakeAll()) Accumulate(c, o);
    if (!abort) {
      EXPECT_EQ(b.tokens, FakeGreedy(kPromptB, 4, 64));
    }
    EXPECT_EQ(c.tokens, FakeGreedy(kPromptC, 3, 64));  // admitted once B left the reservation
    ExpectNoLeak(*r.core);
  }
}

}  // namespace
}  // namespace kvpush::testing
