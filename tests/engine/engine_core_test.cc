// EngineCore over the fake model: scheduling, chunked prefill, prefix cache, preemption, stop
// conditions, aborts and block accounting. The fake's tokens depend on the KV read back through
// the block table, so a scheduling bug shows up as a wrong token.
#include <gtest/gtest.h>

#include "common/clock.h"
#include "engine/first_token_binding.h"
#include "engine_test_util.h"

namespace kvpush::testing {
namespace {

std::unique_ptr<EngineCore> MakeCore(const EngineConfig& c, FakeTokenizer& tok,
                                     std::shared_ptr<FakeProbe> probe = nullptr,
                                     KvConnector* connector = nullptr) {
  auto r = EngineCore::Create(c, std::make_unique<FakeExecutor>(probe), tok, connector);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

/// A load of `seq_id` given up while P's WRITEs may still land: failed (no CANCEL_ACK), to be
/// recomputed, its blocks quarantined (KvLoadResult::quarantined).
KvLoadResult QuarantinedRecomputeLoad(int64_t seq_id) {
  KvLoadResult r;
  r.seq_id = seq_id;
  r.status = DeadlineExceeded("no CANCEL_ACK");
  r.recompute = true;
  r.quarantined = true;
  return r;
}

TEST(EngineCoreTest, GreedyMatchesReferenceModel) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(64, 4, 512), tok);
  auto prompt = MakePrompt(10, 1);
  auto res = RunAll(*core, {MakeRequest(prompt, 30)});
  EXPECT_EQ(res[0].tokens, FakeGreedy(prompt, 30, 64));
  EXPECT_EQ(res[0].finish, FinishReason::kLength);
  EXPECT_EQ(res[0].num_outputs, 30);  // one output per token, the last one final
  ExpectNoLeak(*core);
}

// Batched with a small budget (chunked prefill) == each request alone, greedy and seeded.
void CheckBatchedEqualsSequential(float temperature) {
  FakeTokenizer tok;
  auto probe = std::make_shared<FakeProbe>();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 16; ++i) {
    reqs.push_back(MakeRequest(MakePrompt(3 + i * 7, static_cast<uint32_t>(i)), 5 + i * 2,
                               temperature, 1000 + static_cast<uint64_t>(i)));
  }
  auto batched_core = MakeCore(FakeConfig(512, 4, 24), tok, probe);
  auto batched = RunAll(*batched_core, reqs);
  EXPECT_GT(probe->chunked_prefills.load(), 0) << "budget 24 must split the long prompts";
  EXPECT_LE(probe->max_step_tokens.load(), 24);
  EXPECT_GT(probe->max_batch_seqs.load(), 1);
  ExpectNoLeak(*batched_core);
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto solo_core = MakeCore(FakeConfig(512, 4, 4096), tok);
    auto solo = RunAll(*solo_core, {reqs[i]});
    EXPECT_EQ(batched[i].tokens, solo[0].tokens) << "request " << i;
    EXPECT_EQ(batched[i].text, solo[0].text) << "request " << i;
    EXPECT_EQ(static_cast<int32_t>(batched[i].tokens.size()), reqs[i].max_tokens);
    if (temperature == 0.0f) {
      EXPECT_EQ(batched[i].tokens, FakeGreedy(reqs[i].prompt_tokens, reqs[i].max_tokens, 64));
    }
  }
}

TEST(EngineCoreTest, BatchedEqualsSequentialGreedy) {
  CheckBatchedEqualsSequential(0.0f);
}
TEST(EngineCoreTest, BatchedEqualsSequentialSeeded) {
  CheckBatchedEqualsSequential(0.9f);
}

TEST(EngineCoreTest, MaxNumSeqsLimitsTheBatch) {
  FakeTokenizer tok;
  auto probe = std::make_shared<FakeProbe>();
  auto core = MakeCore(FakeConfig(512, 4, 512, /*max_seqs=*/3), tok, probe);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) reqs.push_back(MakeRequest(MakePrompt(5, i), 4));
  auto res = RunAll(*core, reqs);
  EXPECT_EQ(probe->max_batch_seqs.load(), 3);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(res[i].tokens, FakeGreedy(MakePrompt(5, i), 4, 64));
  ExpectNoLeak(*core);
}

TEST(EngineCoreTest, PrefixCacheHitsOnRepeatedPrompt) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(128, 4, 512), tok);
  auto prompt = MakePrompt(23, 7);  // 5 full blocks + 3 tokens
  auto first = RunAll(*core, {MakeRequest(prompt, 6)}, 1);
  auto s1 = core->stats();
  EXPECT_EQ(first[0].num_cached_tokens, 0);
  EXPECT_EQ(s1.kv.prefix_hit_blocks, 0);
  auto second = RunAll(*core, {MakeRequest(prompt, 6)}, 2);
  auto s2 = core->stats();
  EXPECT_EQ(second[0].tokens, first[0].tokens);
  EXPECT_EQ(second[0].num_cached_tokens, 20);
  EXPECT_EQ(s2.kv.prefix_hit_blocks - s1.kv.prefix_hit_blocks, 5);
  EXPECT_EQ(s2.kv.prefix_query_blocks - s1.kv.prefix_query_blocks, 5);
  EXPECT_EQ(s2.cached_prompt_tokens, 20);
  // Generated tokens' full blocks are committed too: prompt + first output as a new prompt
  // (29 tokens = 7 full blocks) finds 7 blocks.
  auto longer = prompt;
  longer.insert(longer.end(), first[0].tokens.begin(), first[0].tokens.end());
  auto third = RunAll(*core, {MakeRequest(longer, 3)}, 3);
  EXPECT_EQ(third[0].num_cached_tokens, 28);
  EXPECT_EQ(third[0].tokens, FakeGreedy(longer, 3, 64));
  ExpectNoLeak(*core);
}

// vLLM's reset_prefix_cache: refused while a request holds blocks (nothing changes), then every
// cached block is freed and the same prompt no longer hits.
TEST(EngineCoreTest, ResetPrefixCacheFreesCachedBlocksOnlyWhenNoneIsInUse) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(128, 4, 512), tok);
  auto prompt = MakePrompt(23, 7);  // 5 full blocks + 3 tokens
  auto first = RunAll(*core, {MakeRequest(prompt, 6)}, 1);
  const int32_t cached = core->stats().kv.num_cached;
  EXPECT_GT(cached, 0);
  auto ch = std::make_shared<OutputChannel>();
  core->AddRequest(50, MakeRequest(MakePrompt(9, 2), 4), ch, 0);
  core->Step();  // it holds blocks now
  auto busy = core->ResetPrefixCache();
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.status().message().find("in use"), std::string::npos);
  core->Abort(50);
  core->Step();
  const int32_t before = core->stats().kv.num_cached;
  EXPECT_GE(before, cached);
  auto freed = core->ResetPrefixCache();
  ASSERT_TRUE(freed.ok()) << freed.status().ToString();
  EXPECT_EQ(*freed, before);
  EXPECT_EQ(core->stats().kv.num_cached, 0);
  auto again = RunAll(*core, {MakeRequest(prompt, 6)}, 2);
  EXPECT_EQ(again[0].num_cached_tokens, 0);
  EXPECT_EQ(again[0].tokens, first[0].tokens);
  ExpectNoLeak(*core);
}

TEST(EngineCoreTest, PrefixCacheNeverMatchesTheWholePrompt) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(128, 4, 512), tok);
  auto prompt = MakePrompt(16, 3);  // exactly 4 full blocks
  auto a = RunAll(*core, {MakeRequest(prompt, 2)}, 1);
  auto b = RunAll(*core, {MakeRequest(prompt, 2)}, 2);
  EXPECT_EQ(b[0].num_cached_tokens, 12);  // the last block is recomputed for the logits
  EXPECT_EQ(a[0].tokens, b[0].tokens);
  ExpectNoLeak(*core);
}

TEST(EngineCoreTest, DisabledPrefixCacheNeverHits) {
  FakeTokenizer tok;
  auto c = FakeConfig(128, 4, 512);
  c.enable_prefix_caching = false;
  auto core = MakeCore(c, tok);
  auto prompt = MakePrompt(23, 7);
  RunAll(*core, {MakeRequest(prompt, 3)}, 1);
  auto b = RunAll(*core, {MakeRequest(prompt, 3)}, 2);
  EXPECT_EQ(b[0].num_cached_tokens, 0);
  EXPECT_EQ(core->stats().kv.prefix_hit_blocks, 0);
  EXPECT_EQ(core->stats().kv.num_cached, 0);
}

TEST(EngineCoreTest, PreemptionUnderTinyPoolGivesSameTokens) {
  FakeTokenizer tok;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 8; ++i) {
    reqs.push_back(MakeRequest(MakePrompt(10 + i, 50 + i), 30, i % 2 ? 0.8f : 0.0f, 77 + i));
  }
  // Each request needs ceil((17 + 30) / 4) = 12 blocks at most; 20 blocks hold one or two.
  auto tiny = MakeCore(FakeConfig(20, 4, 64), tok);
  auto small = RunAll(*tiny, reqs);
  EXPECT_GT(tiny->stats().num_preemptions, 0);
  ExpectNoLeak(*tiny);
  auto big = MakeCore(FakeConfig(1024, 4, 64), tok);
  auto ref = RunAll(*big, reqs);
  EXPECT_EQ(big->stats().num_preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(small[i].tokens, ref[i].tokens) << "request " << i;
    EXPECT_EQ(small[i].finish, FinishReason::kLength);
  }
}

TEST(EngineCoreTest, RequestThatCanNeverFitIsRefused) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(8, 4, 64), tok);
  auto res = RunAll(*core, {MakeRequest(MakePrompt(20, 1), 20), MakeRequest(MakePrompt(5, 2), 3)});
  EXPECT_EQ(res[0].finish, FinishReason::kError);
  EXPECT_EQ(res[0].error.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(res[0].tokens.empty());
  EXPECT_EQ(res[1].finish, FinishReason::kLength);  // the other request is unaffected
  EXPECT_EQ(res[1].tokens, FakeGreedy(MakePrompt(5, 2), 3, 64));
  ExpectNoLeak(*core);
  EXPECT_EQ(core->block_pool().stats().num_free + core->block_pool().stats().num_cached, 8);
}

TEST(EngineCoreTest, InvalidRequestsAreRefused) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(64, 4, 64), tok);
  auto empty = MakeRequest({}, 3);
  auto bad_id = MakeRequest({1, 64}, 3);
  auto zero = MakeRequest({1, 5}, 0);
  auto too_long = MakeRequest(MakePrompt(4096, 1), 1);
  auto res = RunAll(*core, {empty, bad_id, zero, too_long});
  for (const auto& r : res) {
    EXPECT_EQ(r.finish, FinishReason::kError);
    EXPECT_EQ(r.error.code(), StatusCode::kInvalidArgument) << r.error.ToString();
  }
  ExpectNoLeak(*core);
}

TEST(EngineCoreTest, StopConditions) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(256, 4, 64), tok);
  auto prompt = MakePrompt(6, 11);
  auto ref = RunAll(*core, {MakeRequest(prompt, 40)}, 1)[0];
  ASSERT_EQ(ref.tokens.size(), 40u);
  ASSERT_GT(ref.text.size(), 12u);

  // EOS stops unless ignore_eos; the stop token itself is counted but adds no text.
  auto eos_req = MakeRequest(prompt, 40);
  eos_req.ignore_eos = false;
  eos_req.stop_token_ids = {ref.tokens[9]};
  auto by_id = RunAll(*core, {eos_req}, 2)[0];
  auto first = std::find(ref.tokens.begin(), ref.tokens.end(), ref.tokens[9]) - ref.tokens.begin();
  EXPECT_EQ(by_id.finish, FinishReason::kStop);
  EXPECT_EQ(by_id.tokens.size(), static_cast<size_t>(first + 1));
  // Its text is what the tokens before it produce on their own (flushed, no stop token text).
  std::string before_text;
  if (first > 0)
    before_text = RunAll(*core, {MakeRequest(prompt, static_cast<int32_t>(first))}, 20)[0].text;
  EXPECT_EQ(by_id.text, before_text);

  // A stop string spanning several tokens, taken from the middle of the reference text.
  std::string stop = ref.text.substr(5, 6);
  auto s_req = MakeRequest(prompt, 40);
  s_req.stop = {"never-there", stop};
  auto by_str = RunAll(*core, {s_req}, 3)[0];
  EXPECT_EQ(by_str.finish, FinishReason::kStop);
  EXPECT_EQ(by_str.stop_reason, stop);
  EXPECT_EQ(by_str.text, ref.text.substr(0, ref.text.find(stop)));
  EXPECT_LT(by_str.tokens.size(), ref.tokens.size());

  // max_tokens -> length.
  auto l = RunAll(*core, {MakeRequest(prompt, 3)}, 4)[0];
  EXPECT_EQ(l.finish, FinishReason::kLength);
  EXPECT_EQ(l.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + 3));
  ExpectNoLeak(*core);
}

TEST(EngineCoreTest, StopTokenIdIsReportedAndMinTokensHoldsOffStops) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(256, 4, 64), tok);
  auto prompt = MakePrompt(6, 11);
  auto ref = RunAll(*core, {MakeRequest(prompt, 40)}, 1)[0];
  const int32_t stop_id = ref.tokens[2];
  const auto first = std::find(ref.tokens.begin(), ref.tokens.end(), stop_id) - ref.tokens.begin();

  auto req = MakeRequest(prompt, 40);
  req.stop_token_ids = {stop_id};
  auto by_id = RunAll(*core, {req}, 2)[0];
  EXPECT_EQ(by_id.finish, FinishReason::kStop);
  EXPECT_EQ(by_id.tokens.size(), static_cast<size_t>(first + 1));
  EXPECT_EQ(by_id.stop_token_id, stop_id);  // vLLM: stop_reason = the token id
  EXPECT_EQ(by_id.stop_reason, "");

  // min_tokens = 10: neither the stop id nor EOS is sampled among the first 10 tokens (their
  // logits are -inf), so the request runs at least 10 tokens.
  req.ignore_eos = false;
  req.min_tokens = 10;
  auto held = RunAll(*core, {req}, 3)[0];
  ASSERT_GE(held.tokens.size(), 10u);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_NE(held.tokens[i], stop_id) << i;
    EXPECT_NE(held.tokens[i], 2) << i;
  }
  if (held.finish == FinishReason::kStop && held.tokens.back() == stop_id) {
    EXPECT_EQ(held.stop_token_id, stop_id);
  } else if (held.finish == FinishReason::kStop) {
    EXPECT_EQ(held.tokens.back(), 2);  // EOS: stop_reason null
    EXPECT_EQ(held.stop_token_id, -1);
  } else {
    EXPECT_EQ(held.tokens.size(), 40u);
  }

  // Stop strings: min_tokens = max_tokens holds every one off; the tokens are those of the same
  // request without stop strings (the stop strings never change sampling).
  auto s_req = MakeRequest(prompt, 40);
  s_req.min_tokens = 40;
  auto plain = RunAll(*core, {s_req}, 4)[0];
  s_req.stop = {ref.text.substr(0, 2), ref.text.substr(5, 6)};
  auto no_stop = RunAll(*core, {s_req}, 5)[0];
  EXPECT_EQ(no_stop.finish, FinishReason::kLength);
  EXPECT_EQ(no_stop.tokens, plain.tokens);
  EXPECT_EQ(no_stop.text, plain.text);

  // min_tokens above max_tokens is refused.
  auto bad = MakeRequest(prompt, 4);
  bad.min_tokens = 5;
  EXPECT_EQ(RunAll(*core, {bad}, 6)[0].finish, FinishReason::kError);
  ExpectNoLeak(*core);
}

TEST(EngineCoreTest, PenaltiesCountTheOutputSoFar) {
  // Greedy with a strong presence penalty never repeats a generated token while others remain.
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(256, 4, 64), tok);
  auto req = MakeRequest(MakePrompt(6, 3), 20);
  req.sampling.presence_penalty = 2.0f;
  req.sampling.logit_bias = {{2, -100.0f}};
  auto r = RunAll(*core, {req}, 1)[0];
  ASSERT_EQ(r.tokens.size(), 20u);
  std::vector<int32_t> sorted = r.tokens;
  std::sort(sorted.begin(), sorted.end());
  // The fake model's logits span a few units, so a 2.0 penalty need not forbid every repeat;
  // but it must change the greedy text and never pick the -100 biased EOS.
  EXPECT_EQ(std::count(r.tokens.begin(), r.tokens.end(), 2), 0);
  auto plain = RunAll(*core, {MakeRequest(MakePrompt(6, 3), 20)}, 2)[0];
  EXPECT_NE(r.tokens, plain.tokens);
  // Out-of-vocabulary logit_bias ids are refused at admission.
  auto bad = MakeRequest(MakePrompt(6, 3), 4);
  bad.sampling.logit_bias = {{1 << 20, 1.0f}};
  auto refused = RunAll(*core, {bad}, 3)[0];
  EXPECT_EQ(refused.finish, FinishReason::kError);
  EXPECT_NE(refused.error.message().find("logit_bias"), std::string::npos);
  ExpectNoLeak(*core);
}

TEST(EngineCoreTest, EosEndsGenerationUnlessIgnored) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(1024, 4, 512), tok);
  // Find a prompt whose greedy continuation contains EOS (id 2) within 200 tokens.
  for (uint32_t salt = 0; salt < 200; ++salt) {
    auto prompt = MakePrompt(4, salt);
    auto ref = FakeGreedy(prompt, 200, 64);
    auto it = std::find(ref.begin(), ref.end(), 2);
    if (it == ref.end()) continue;
    auto req = MakeRequest(prompt, 200);
    req.ignore_eos = false;
    auto r = RunAll(*core, {req, MakeRequest(prompt, 200)}, 10);
    EXPECT_EQ(r[0].finish, FinishReason::kStop);
    EXPECT_EQ(r[0].tokens, std::vector<int32_t>(ref.begin(), it + 1));
    EXPECT_EQ(r[1].finish, FinishReason::kLength);
    EXPECT_EQ(r[1].tokens, ref);
    ExpectNoLeak(*core);
    return;
  }
  GTEST_SKIP() << "no prompt with EOS found";
}

TEST(EngineCoreTest, MaxModelLenEndsWithLength) {
  FakeTokenizer tok;
  EngineConfig c;
  c.block_size = 4;
  c.num_kv_blocks = 64;
  c.max_model_len = 20;
  auto resolved = c.Resolve(FakeModelConfig());
  ASSERT_TRUE(resolved.ok());
  auto core = MakeCore(*resolved, tok);
  auto r = RunAll(*core, {MakeRequest(MakePrompt(15, 2), 100)})[0];
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.tokens.size(), 5u);
}

TEST(EngineCoreTest, AbortReleasesBlocks) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(64, 4, 8), tok);
  auto ch1 = std::make_shared<OutputChannel>();
  auto ch2 = std::make_shared<OutputChannel>();
  core->AddRequest(1, MakeRequest(MakePrompt(30, 1), 20), ch1, 0);
  core->AddRequest(2, MakeRequest(MakePrompt(30, 2), 20), ch2, 0);
  for (int i = 0; i < 5; ++i) core->Step();  // 1 is mid-prefill or decoding, 2 waiting/partial
  EXPECT_GT(core->block_pool().stats().num_used, 0);
  core->Abort(1);
  core->Abort(2);
  core->Abort(99);  // unknown: ignored
  EXPECT_FALSE(core->HasWork());
  for (auto* ch : {ch1.get(), ch2.get()}) {
    auto outs = ch->TakeAll();
    ASSERT_FALSE(outs.empty());
    EXPECT_EQ(outs.back().finish_reason, FinishReason::kAbort);
    EXPECT_TRUE(ch->closed());
  }
  ExpectNoLeak(*core);
  EXPECT_EQ(core->stats().finished_by_reason[static_cast<size_t>(FinishReason::kAbort)], 2);
}

TEST(EngineCoreTest, StatsCountTokensAndLatencies) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(64, 4, 64), tok);
  RunAll(*core, {MakeRequest(MakePrompt(9, 1), 5), MakeRequest(MakePrompt(7, 2), 4)});
  const auto& s = core->stats();
  EXPECT_EQ(s.prompt_tokens, 16);
  EXPECT_EQ(s.generation_tokens, 9);
  EXPECT_EQ(s.finished_by_reason[static_cast<size_t>(FinishReason::kLength)], 2);
  EXPECT_EQ(s.ttft.count(), 2u);
  EXPECT_EQ(s.e2e.count(), 2u);
  EXPECT_EQ(s.tpot.count(), 2u);
  EXPECT_EQ(s.itl.count(), 7u);
  EXPECT_EQ(s.queue_time.count(), 2u);
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.num_waiting, 0);
}

TEST(EngineCoreTest, LogprobsAreReported) {
  FakeTokenizer tok;
  auto core = MakeCore(FakeConfig(64, 4, 64), tok);
  auto req = MakeRequest(MakePrompt(5, 1), 3);
  req.sampling.logprobs = 2;
  auto ch = std::make_shared<OutputChannel>();
  core->AddRequest(1, req, ch, 0);
  while (core->HasWork()) core->Step();
  auto outs = ch->TakeAll();
  ASSERT_EQ(outs.size(), 3u);
  for (const auto& o : outs) {
    ASSERT_EQ(o.tokens.size(), 1u);
    ASSERT_EQ(o.tokens[0].top_logprobs.size(), 2u);
    EXPECT_EQ(o.tokens[0].top_logprobs[0].first, o.tokens[0].id);  // greedy = top-1
    EXPECT_LE(o.tokens[0].logprob, 0.0f);
    EXPECT_FLOAT_EQ(o.tokens[0].logprob, o.tokens[0].top_logprobs[0].second);
  }
}

// A connector that records the hook calls and keeps finished requests' blocks until released.
class RecordingConnector : public KvConnector, public LayerObserver {
 public:
  void BindEngine(std::function<void()>, std::function<void(int64_t)>) override {}
  KvMatch GetNumMatchedTokens(const Sequence& seq, int32_t local) override {
    ++matched;
    if (!async_load) return {};
    return KvMatch{seq.num_tokens() - local, true};
  }
  void OnBlocksAllocated(const Sequence&, std::span<const BlockId> table, int32_t) override {
    ++allocated;
    EXPECT_FALSE(table.empty());
    blocks.assign(table.begin(), table.end());
  }
  LayerObserver* BeginStep(std::span<const SequenceChunk>) override {
    ++steps;
    return this;
  }
  void OnLayerDone(int32_t) override { ++layers; }
  bool OnRequestFinished(const Sequence& seq, std::span<const BlockId>, RequestOutput&) override {
    finished_ids.push_back(seq.seq_id);
    return hold;
  }
  std::vector<int64_t> GetFinished() override { return std::exchange(release, {}); }
  std::vector<KvLoadResult> GetFinishedLoading() override { return std::exchange(loads, {}); }
  bool HasPendingWork() const override { return false; }

  bool async_load = false;
  bool hold = true;
  int matched = 0, allocated = 0, steps = 0, layers = 0;
  std::vector<int64_t> finished_ids, release;
  std::vector<KvLoadResult> loads;
  std::vector<BlockId> blocks;
};

TEST(EngineCoreTest, ConnectorHooksAreCalledAndHeldBlocksReleased) {
  FakeTokenizer tok;
  RecordingConnector conn;
  auto core = MakeCore(FakeConfig(64, 4, 64), tok, nullptr, &conn);
  auto res = RunAll(*core, {MakeRequest(MakePrompt(9, 1), 3)}, 5);
  // RunAll stops when HasWork() is false; held blocks keep it busy, so release them.
  EXPECT_EQ(res[0].tokens, FakeGreedy(MakePrompt(9, 1), 3, 64));
  EXPECT_EQ(conn.matched, 1);
  EXPECT_EQ(conn.allocated, 1);
  EXPECT_EQ(conn.steps, 3);
  EXPECT_EQ(conn.layers, 6);
  ASSERT_EQ(conn.finished_ids, std::vector<int64_t>{5});
  EXPECT_GT(core->block_pool().stats().num_used, 0);  // held for the connector
  conn.release = {5};
  core->Step();
  ExpectNoLeak(*core);
  EXPECT_FALSE(core->HasWork());
}

// An asynchronous load: the request waits without compute, then resumes with the first token
// from the connector (push); a load of every prompt token that brings no first token (P sampled
// it under other settings, FirstTokenBinding) has the last prompt token computed here, over the
// loaded K/V, for its own logits.
TEST(EngineCoreTest, AsyncKvLoadResumesWithTheConnectorsFirstTokenOrComputesTheLastToken) {
  FakeTokenizer tok;
  for (bool with_token : {true, false}) {
    SCOPED_TRACE(with_token ? "P's first token" : "no first token");
    RecordingConnector conn;
    conn.async_load = true;
    conn.hold = false;
    auto core = MakeCore(FakeConfig(64, 4, 64), tok, nullptr, &conn);
    const auto prompt = MakePrompt(9, 1);
    const auto expected = FakeGreedy(prompt, 3, 64);
    auto ch = std::make_shared<OutputChannel>();
    core->AddRequest(7, MakeRequest(prompt, 3), ch, NowNs());
    EXPECT_EQ(core->Step(), 0);  // admitted, waiting for the K/V: nothing computed
    EXPECT_EQ(core->stats().num_waiting_for_kv, 1);
    EXPECT_EQ(conn.allocated, 1);
    EXPECT_TRUE(ch->TakeAll().empty());
    // Fill the blocks the way P's WRITEs would (the fake model's K/V: token id, position + 1),
    // then end the load with P's first token (the one P samples) or without.
    KvCache& kv = core->kv_cache();
    const int32_t bs = kv.layout().block_size;
    for (int32_t pos = 0; pos < static_cast<int32_t>(prompt.size()); ++pos) {
      const BlockId b = conn.blocks[static_cast<size_t>(pos / bs)];
      for (int32_t layer = 0; layer < kv.layout().num_layers; ++layer) {
        for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
          float* slot = kv.chunk_f32(layer, kind, b) + (pos % bs) * 2;
          slot[0] = static_cast<float>(prompt[static_cast<size_t>(pos)]);
          slot[1] = static_cast<float>(pos + 1);
        }
      }
    }
    // Built in place: GCC 12's -Wmaybe-uninitialized (under -fsanitize=address) misreads a copy
    // of a KvLoadResult whose optional was assigned after construction.
    if (with_token) {
      conn.loads.push_back(
          KvLoadResult{7, Status::Ok(), false, TokenOutput{expected[0], 0.0f, {}}});
    } else {
      conn.loads.push_back(KvLoadResult{7, Status::Ok(), false, std::nullopt});
    }
    const int64_t computed_before = core->stats().prompt_tokens_computed;
    Collected got;
    for (int i = 0; i < 10 && core->HasWork(); ++i) {
      core->Step();
      for (const auto& o : ch->TakeAll()) Accumulate(got, o);
    }
    EXPECT_EQ(got.tokens, expected);
    EXPECT_EQ(core->stats().kv_loads, 1);
    EXPECT_EQ(core->stats().prompt_tokens_computed - computed_before, with_token ? 0 : 1);
    ExpectNoLeak(*core);
  }
}

TEST(EngineCoreTest, FailedAsyncKvLoadIsRecomputedOrFailed) {
  FakeTokenizer tok;
  for (bool recompute : {true, false}) {
    RecordingConnector conn;
    conn.async_load = true;
    conn.hold = false;
    auto core = MakeCore(FakeConfig(64, 4, 64), tok, nullptr, &conn);
    const auto prompt = MakePrompt(21, 3);
    auto ch = std::make_shared<OutputChannel>();
    core->AddRequest(1, MakeRequest(prompt, 4), ch, NowNs());
    core->Step();
    KvLoadResult r;
    r.seq_id = 1;
    r.status = PeerGone("prefill instance went away");
    r.recompute = recompute;
    conn.loads.push_back(r);
    Collected got;
    for (int i = 0; i < 20 && core->HasWork(); ++i) {
      core->Step();
      for (const auto& o : ch->TakeAll()) Accumulate(got, o);
    }
    if (recompute) {
      EXPECT_EQ(got.tokens, FakeGreedy(prompt, 4, 64));
      EXPECT_EQ(core->stats().kv_load_recomputes, 1);
    } else {
      EXPECT_TRUE(got.tokens.empty());
      EXPECT_EQ(got.finish, FinishReason::kError);
      EXPECT_EQ(got.error.code(), StatusCode::kPeerGone);
    }
    ExpectNoLeak(*core);
  }
}

// A load given up while P's WRITEs may still land (KvLoadResult::quarantined): the blocks after
// the local prefix hit leave the request and stay allocated, uncached, until the connector
// releases them; the request recomputes into fresh blocks, so writes that land in the old ones
// meanwhile (scribbled here every step) cannot change its tokens.
TEST(EngineCoreTest, QuarantinedLoadRecomputesInFreshBlocksAndHoldsTheOldOnes) {
  FakeTokenizer tok;
  for (bool prefix_hit : {false, true}) {
    SCOPED_TRACE(prefix_hit ? "after a local prefix hit" : "no local hit");
    RecordingConnector conn;
    conn.hold = false;
    auto core = MakeCore(FakeConfig(64, 4, 64), tok, nullptr, &conn);
    const auto prompt = MakePrompt(21, 3);
    if (prefix_hit) {  // the same prompt once, locally: its full blocks go to the prefix cache
      RunAll(*core, {MakeRequest(prompt, 1)}, 1);
    }
    conn.async_load = true;
    auto ch = std::make_shared<OutputChannel>();
    core->AddRequest(2, MakeRequest(prompt, 4), ch, NowNs());
    core->Step();
    ASSERT_EQ(core->stats().num_waiting_for_kv, 1);
    const int32_t bs = core->kv_cache().layout().block_size;
    const size_t local_blocks = prefix_hit ? (prompt.size() - 1) / static_cast<size_t>(bs) : 0;
    const std::vector<BlockId> announced(conn.blocks.begin() + static_cast<long>(local_blocks),
                                         conn.blocks.end());
    ASSERT_FALSE(announced.empty());
    conn.loads.push_back(QuarantinedRecomputeLoad(2));
    Collected got;
    for (int i = 0; i < 20 && got.tokens.size() < 4; ++i) {
      KvCache& kv = core->kv_cache();
      for (BlockId b : announced) {  // late WRITEs landing in the quarantined blocks
        for (int32_t layer = 0; layer < kv.layout().num_layers; ++layer) {
          for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
            float* chunk = kv.chunk_f32(layer, kind, b);
            for (int32_t k = 0; k < bs * 2; ++k) chunk[k] = 1e6f + static_cast<float>(i);
          }
        }
      }
      core->Step();
      for (const auto& o : ch->TakeAll()) Accumulate(got, o);
    }
    EXPECT_EQ(got.tokens, FakeGreedy(prompt, 4, 64));
    EXPECT_EQ(core->stats().kv_load_quarantines, 1);
    EXPECT_EQ(core->stats().kv_load_recomputes, 1);
    // The request is done; its quarantined blocks are still held (used, not cached).
    for (BlockId b : announced) EXPECT_EQ(core->block_pool().ref_count(b), 1) << b;
    EXPECT_EQ(core->block_pool().stats().num_used, static_cast<int32_t>(announced.size()));
    conn.release = {2};
    core->Step();
    ExpectNoLeak(*core);
  }
}

// A quarantined load and its quarantine's end reported between two polls, while another
// request's blocks are held: the end must still release the quarantined blocks. (Released before
// the load was applied, it found nothing held, and the blocks leaked: chaos_stopped_prefill_push.)
TEST(EngineCoreTest, QuarantineEndReportedWithItsLoadInOnePollReleasesTheBlocks) {
  FakeTokenizer tok;
  RecordingConnector conn;
  auto core = MakeCore(FakeConfig(64, 4, 64), tok, nullptr, &conn);
  conn.hold = true;  // request 1's blocks stay held until released: held_blocks_ is not empty
  RunAll(*core, {MakeRequest(MakePrompt(5, 3), 1)}, 1);
  ASSERT_GT(core->block_pool().stats().num_used, 0);
  const int32_t held_by_1 = core->block_pool().stats().num_used;
  conn.hold = false;
  conn.async_load = true;
  const auto prompt = MakePrompt(21, 3);
  auto ch = std::make_shared<OutputChannel>();
  core->AddRequest(2, MakeRequest(prompt, 4), ch, NowNs());
  core->Step();
  ASSERT_EQ(core->stats().num_waiting_for_kv, 1);
  conn.loads.push_back(QuarantinedRecomputeLoad(2));
  conn.release = {2};  // the quarantine already ended by the next poll
  Collected got;
  for (int i = 0; i < 20 && got.tokens.size() < 4; ++i) {
    core->Step();
    for (const auto& o : ch->TakeAll()) Accumulate(got, o);
  }
  EXPECT_EQ(got.tokens, FakeGreedy(prompt, 4, 64));
  EXPECT_EQ(core->stats().kv_load_quarantines, 1);
  EXPECT_EQ(core->block_pool().stats().num_used, held_by_1);  // only request 1's, still held
  conn.release = {1};
  core->Step();
  ExpectNoLeak(*core);
}

}  // namespace
}  // namespace kvpush::testing

namespace kvpush::testing {
namespace {

/// The text bytes a run emits for its first `k` output tokens (what the instance that generated
/// them streamed, CompletionState::text_bytes).
int64_t EmittedBytes(const Tokenizer& tok, const GenerationRequest& r,
                     const std::vector<int32_t>& out, size_t k) {
  OutputTextProcessor text(tok, r.stop, r.prompt_tokens);
  int64_t n = 0;
  for (size_t i = 0; i < k; ++i) n += static_cast<int64_t>(text.Append(out[i]).text.size());
  return n;
}

// Continuation (issue 24): prompt + the first k output tokens of a run, resumed, samples exactly
// the run's remaining tokens — greedy and seeded, at the first token, mid-way and one before
// the end — and finishes with the run's reason and output count.
TEST(EngineCoreContinuation, SamplesWhatTheUninterruptedRunWould) {
  FakeTokenizer tok;
  for (float temperature : {0.0f, 0.9f}) {
    GenerationRequest base = MakeRequest(MakePrompt(9, 3), 20, temperature, 1234);
    base.sampling.frequency_penalty = 0.4f;  // the penalties count the resumed tokens
    auto ref_core = MakeCore(FakeConfig(256, 4, 64), tok);
    const Collected ref = RunAll(*ref_core, {base})[0];
    ASSERT_EQ(ref.tokens.size(), 20u);
    for (size_t k : {size_t{1}, size_t{10}, size_t{19}}) {
      GenerationRequest r = base;
      r.resume_output_tokens.assign(ref.tokens.begin(), ref.tokens.begin() + k);
      r.resume_text_bytes = EmittedBytes(tok, base, ref.tokens, k);
      auto core = MakeCore(FakeConfig(256, 4, 64), tok);
      const Collected got = RunAll(*core, {r})[0];
      EXPECT_EQ(got.tokens, std::vector<int32_t>(ref.tokens.begin() + k, ref.tokens.end()))
          << "temperature " << temperature << ", resumed after " << k;
      EXPECT_EQ(got.finish, FinishReason::kLength);
      ExpectNoLeak(*core);
    }
  }
}

TEST(EngineCoreContinuation, RefusesWhatNoRunStillGoingCouldHaveStreamed) {
  FakeTokenizer tok;
  const GenerationRequest base = MakeRequest(MakePrompt(9, 3), 20);
  auto ref_core = MakeCore(FakeConfig(256, 4, 64), tok);
  const Collected ref = RunAll(*ref_core, {base})[0];
  struct Case {
    const char* what;
    std::vector<int32_t> tokens;
    int64_t bytes_delta;
    bool consumer;
  };
  const int32_t eos = FakeModelConfig().eos_id;
  const std::vector<int32_t> three(ref.tokens.begin(), ref.tokens.begin() + 3);
  const Case cases[] = {
      {"text_bytes off by one", three, 1, false},
      {"EOS among them", {ref.tokens[0], eos, ref.tokens[1]}, 0, false},
      {"already max_tokens", std::vector<int32_t>(20, ref.tokens[0]), 0, false},
      {"a P/D pull leg (a migration's legs are push legs)", three, 0, true},
  };
  for (const Case& c : cases) {
    GenerationRequest r = base;
    r.resume_output_tokens = c.tokens;
    r.resume_text_bytes = EmittedBytes(tok, base, c.tokens, std::min<size_t>(c.tokens.size(), 2));
    if (c.tokens == three) r.resume_text_bytes = EmittedBytes(tok, base, three, 3) + c.bytes_delta;
    if (c.consumer) {
      r.kv_transfer.role = pd::KvTransferParams::Role::kConsumer;
      r.kv_transfer.mode = pd::KvTransferParams::Mode::kPull;
    }
    auto core = MakeCore(FakeConfig(256, 4, 64), tok);
    const Collected got = RunAll(*core, {r})[0];
    EXPECT_EQ(got.finish, FinishReason::kError) << c.what;
    EXPECT_EQ(got.error.code(), StatusCode::kInvalidArgument) << c.what;
    EXPECT_NE(got.error.message().find("kvpush_resume"), std::string::npos)
        << c.what << ": " << got.error.message();
    EXPECT_TRUE(got.tokens.empty()) << c.what;
    ExpectNoLeak(*core);
  }
}

// A migration (docs/reliability.md, *Migration*): the source's P leg is the continuation with
// max_tokens = k + 1 (and min_tokens clamped to it, as every P leg's); it samples exactly the
// run's token k + 1, and its first-token binding equals the new D's leg's (the same
// continuation with the client's max_tokens), so D takes that token. Another resumed output, or
// a min_tokens that suppresses EOS at k + 1 on one side only, binds differently.
TEST(EngineCoreContinuation, AMigrationsPrefillLegSamplesTheNextTokenUnderTheDecodeLegsBinding) {
  FakeTokenizer tok;
  for (float temperature : {0.0f, 0.9f}) {
    GenerationRequest base = MakeRequest(MakePrompt(9, 3), 20, temperature, 1234);
    base.seed_given = true;
    base.sampling.presence_penalty = 0.5f;
    auto ref_core = MakeCore(FakeConfig(256, 4, 64), tok);
    const Collected ref = RunAll(*ref_core, {base})[0];
    ASSERT_EQ(ref.tokens.size(), 20u);
    for (size_t k : {size_t{1}, size_t{10}, size_t{19}}) {
      for (int32_t min_tokens : {0, 5, 11, 12}) {
        GenerationRequest d = base;
        d.min_tokens = min_tokens;
        d.resume_output_tokens.assign(ref.tokens.begin(), ref.tokens.begin() + k);
        d.resume_text_bytes = EmittedBytes(tok, base, ref.tokens, k);
        GenerationRequest p = d;
        p.max_tokens = static_cast<int32_t>(k) + 1;
        p.min_tokens = std::min(d.min_tokens, p.max_tokens);
        EXPECT_EQ(FirstTokenBinding(p), FirstTokenBinding(d)) << k << " " << min_tokens;
        GenerationRequest other = d;
        other.resume_output_tokens[0] ^= 1;
        EXPECT_NE(FirstTokenBinding(other), FirstTokenBinding(d));
        GenerationRequest fresh = d;
        fresh.resume_output_tokens.clear();
        EXPECT_NE(FirstTokenBinding(fresh), FirstTokenBinding(d));
        if (min_tokens != 0) continue;
        auto core = MakeCore(FakeConfig(256, 4, 64), tok);
        const Collected got = RunAll(*core, {p})[0];
        EXPECT_EQ(got.tokens, std::vector<int32_t>{ref.tokens[k]})
            << "temperature " << temperature << ", resumed after " << k;
        ExpectNoLeak(*core);
      }
    }
  }
  // min_tokens suppresses output token k + 1 while k < min_tokens: a bound above k binds as
  // any other above it, one at k as none at all.
  GenerationRequest a = MakeRequest(MakePrompt(9, 3), 20);
  a.resume_output_tokens = {5, 6, 7};
  GenerationRequest b = a;
  a.min_tokens = 4;
  b.min_tokens = 9;
  EXPECT_EQ(FirstTokenBinding(a), FirstTokenBinding(b));
  b.min_tokens = 3;
  EXPECT_NE(FirstTokenBinding(a), FirstTokenBinding(b));
  a.min_tokens = 0;
  EXPECT_EQ(FirstTokenBinding(a), FirstTokenBinding(b));
}

}  // namespace
}  // namespace kvpush::testing
