// Engine (threaded): submission from several threads, output channels, abort, overload, stop.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include <thread>

#include "engine_test_util.h"
#include "test_util.h"

namespace kvpush::testing {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<Engine> MakeEngine(EngineConfig c, FakeTokenizer& tok,
                                   std::shared_ptr<FakeProbe> probe = nullptr) {
  auto r = Engine::Create(c, std::make_unique<FakeExecutor>(probe), tok);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

EngineConfig Config(int32_t blocks, int32_t bs, int32_t budget) {
  EngineConfig c;
  c.block_size = bs;
  c.num_kv_blocks = blocks;
  c.max_num_batched_tokens = budget;
  return c;
}

/// Reads a channel to its final output (10 s deadline).
Collected Drain(OutputChannel& ch) {
  Collected c;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (c.finish == FinishReason::kNone && std::chrono::steady_clock::now() < deadline) {
    if (auto o = ch.Next(milliseconds(100))) Accumulate(c, *o);
  }
  EXPECT_NE(c.finish, FinishReason::kNone) << "request did not finish in time";
  return c;
}

/// Waits until the published stats show every block back (10 s deadline).
void WaitNoBlocksUsed(const Engine& e) {
  ::kvpush::testing::WaitUntil(
      [&] {
        auto s = e.stats();
        return s.kv.num_used == 0 && s.num_running == 0 && s.num_waiting == 0;
      },
      std::chrono::seconds(10), milliseconds(5));
  auto s = e.stats();
  EXPECT_EQ(s.kv.num_used, 0);
  EXPECT_EQ(s.kv.num_free + s.kv.num_cached, s.num_kv_blocks_total);
}

TEST(EngineTest, ConcurrentSubmittersGetTheirOwnTokens) {
  FakeTokenizer tok;
  auto probe = std::make_shared<FakeProbe>();
  auto engine = MakeEngine(Config(512, 4, 16), tok, probe);
  constexpr int kN = 16;
  std::vector<Collected> got(kN);
  std::vector<std::thread> threads;
  for (int i = 0; i < kN; ++i) {
    threads.emplace_back([&, i] {
      auto req = MakeRequest(MakePrompt(2 + 5 * i, 100 + i), 10 + i, i % 2 ? 0.7f : 0.0f, 5 + i);
      auto h = engine->Submit(req);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      got[i] = Drain(*h->channel);
    });
  }
  for (auto& t : threads) t.join();
  FakeTokenizer tok2;
  for (int i = 0; i < kN; ++i) {
    auto req = MakeRequest(MakePrompt(2 + 5 * i, 100 + i), 10 + i, i % 2 ? 0.7f : 0.0f, 5 + i);
    auto solo =
        RunAll(*EngineCore::Create(FakeConfig(512, 4, 4096), std::make_unique<FakeExecutor>(), tok2)
                    .value(),
               {req});
    EXPECT_EQ(got[i].tokens, solo[0].tokens) << i;
    EXPECT_EQ(got[i].text, solo[0].text) << i;
  }
  WaitNoBlocksUsed(*engine);
  auto s = engine->stats();
  EXPECT_EQ(s.finished_by_reason[static_cast<size_t>(FinishReason::kLength)], kN);
}

TEST(EngineTest, SubmitValidatesSynchronously) {
  FakeTokenizer tok;
  auto engine = MakeEngine(Config(8, 4, 16), tok);
  EXPECT_EQ(engine->Submit(MakeRequest({}, 3)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Submit(MakeRequest({1, 99}, 3)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->Submit(MakeRequest(MakePrompt(20, 1), 20)).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(EngineTest, AbortMidGenerationReleasesBlocks) {
  FakeTokenizer tok;
  auto probe = std::make_shared<FakeProbe>();
  probe->step_delay_us = 1000;
  auto engine = MakeEngine(Config(256, 4, 16), tok, probe);
  auto h = engine->Submit(MakeRequest(MakePrompt(10, 3), 500));
  ASSERT_TRUE(h.ok());
  auto first = h->channel->Next(milliseconds(5000));
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(first->finished());
  engine->Abort(h->id);
  auto c = Drain(*h->channel);
  EXPECT_EQ(c.finish, FinishReason::kAbort);
  EXPECT_LT(c.tokens.size(), 499u);
  WaitNoBlocksUsed(*engine);
}

TEST(EngineTest, OverloadIsRefusedWithUnavailable) {
  FakeTokenizer tok;
  auto probe = std::make_shared<FakeProbe>();
  probe->step_delay_us = 2000;
  EngineConfig c = Config(64, 4, 16);
  c.max_num_seqs = 1;
  c.max_pending_requests = 2;
  auto engine = MakeEngine(c, tok, probe);
  std::vector<Engine::Handle> hs;
  int refused = 0;
  for (int i = 0; i < 10; ++i) {
    auto h = engine->Submit(MakeRequest(MakePrompt(4, i), 50));
    if (h.ok()) {
      hs.push_back(*h);
    } else {
      EXPECT_EQ(h.status().code(), StatusCode::kUnavailable);
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  for (auto& h : hs) engine->Abort(h.id);
  for (auto& h : hs) EXPECT_NE(Drain(*h.channel).finish, FinishReason::kNone);
  WaitNoBlocksUsed(*engine);
}

TEST(EngineTest, StopAbortsInFlightRequests) {
  FakeTokenizer tok;
  auto probe = std::make_shared<FakeProbe>();
  probe->step_delay_us = 1000;
  auto engine = MakeEngine(Config(256, 4, 16), tok, probe);
  auto h = engine->Submit(MakeRequest(MakePrompt(10, 3), 1000));
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(h->channel->Next(milliseconds(5000)).has_value());
  engine->Stop();
  EXPECT_EQ(Drain(*h->channel).finish, FinishReason::kAbort);
  EXPECT_EQ(engine->Submit(MakeRequest({1, 5}, 2)).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(engine->stats().kv.num_used, 0);
}

}  // namespace
}  // namespace kvpush::testing
