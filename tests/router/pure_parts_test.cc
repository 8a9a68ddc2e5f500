// Pure parts of the router: instance URLs, the x-kvpush-mode header, SSE event splitting,
// minted ids. (The legs' bodies: tests/pd/leg_bodies_test.cc.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "router/flow_mode.h"
#include "router/instance_pool.h"
#include "router/prompt_list.h"
#include "router/resume_ledger.h"
#include "router/stream_registry.h"
#include "router/sse_splitter.h"

namespace kvpush::router {
namespace {

using nlohmann::json;

TEST(InstanceUrl, ParsesHostAndPort) {
  auto a = ParseInstanceUrl("http://127.0.0.1:8100/");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8100);
  EXPECT_EQ(a->url, "http://127.0.0.1:8100");
  EXPECT_FALSE(a->https);
  auto b = ParseInstanceUrl("http://decode-0:9000");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "decode-0");
  auto c = ParseInstanceUrl("https://p0.example:8443/");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->https);
  EXPECT_EQ(c->host, "p0.example");
  EXPECT_EQ(c->port, 8443);
  EXPECT_EQ(c->url, "https://p0.example:8443");
}

TEST(InstanceUrl, RejectsBadUrlsWithAReason) {
  for (const char* bad :
       {"ftp://h:1", "127.0.0.1:8100", "http://:8100", "http://host", "http://host:0",
        "http://host:70000", "http://host:80/v1", "http://host:8x", "https://host",
        "https://host:1/v1", "HTTPS://host:1"}) {
    auto a = ParseInstanceUrl(bad);
    ASSERT_FALSE(a.ok()) << bad;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find(bad), std::string::npos) << a.status().message();
  }
}

TEST(ModeHeader, AcceptsTheFourValues) {
  EXPECT_EQ(ParseModeHeader("push", "fast")->mode, TransferMode::kPush);
  auto pull = ParseModeHeader("pull", "fast");
  EXPECT_EQ(pull->mode, TransferMode::kPull);
  EXPECT_EQ(pull->pull_profile, "fast");
  EXPECT_EQ(ParseModeHeader("pull-vllm", "fast")->pull_profile, "vllm");
  EXPECT_EQ(ParseModeHeader("pull-fast", "")->pull_profile, "fast");
  EXPECT_FALSE(ParseModeHeader("PUSH", "").ok());
  EXPECT_FALSE(ParseModeHeader("pull-slow", "").ok());
}

TEST(Ids, TransferIdsAre32LowercaseHexAndSeedsBelow2To53) {
  IdMinter ids;
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    const std::string t = ids.TransferId();
    ASSERT_EQ(t.size(), 32u);
    EXPECT_EQ(t.find_first_not_of("0123456789abcdef"), std::string::npos);
    seen.insert(t);
    EXPECT_LT(ids.Seed(), uint64_t{1} << 53);
  }
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(ids.RequestId("cmpl-").rfind("cmpl-", 0), 0u);
}

TEST(SseSplitter, CutsWholeEventsAcrossPieces) {
  SseSplitter s;
  auto feed = [&s](const std::string& piece) { return s.Feed(piece.data(), piece.size()); };
  EXPECT_TRUE(feed("data: {\"a\"").empty());
  auto ev = feed(":1}\n\ndata: [DO");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0], "data: {\"a\":1}\n\n");
  EXPECT_EQ(ClassifySseEvent(ev[0]), SseEventKind::kData);
  ev = feed("NE]\r\n\r\n");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ClassifySseEvent(ev[0]), SseEventKind::kDone);
  EXPECT_EQ(ClassifySseEvent("data: {\"error\": {\"message\": \"x\"}}\n\n"), SseEventKind::kError);
  EXPECT_EQ(ClassifySseEvent("data: {\"text\": \"\\\"error\\\"\"}\n\n"), SseEventKind::kData);
  feed("data: x");
  EXPECT_EQ(s.TakeRest(), "data: x");
}

// An event's data is its `data:` lines joined with "\n" (the SSE spec), for the kind and the JSON
// alike: a multi-line event is one value, not one per line (sse_fuzz found them disagreeing).
TEST(SseSplitterTest, AnEventsDataIsItsDataLinesJoined) {
  EXPECT_EQ(SseEventData("data: a\ndata:b\r\n: comment\nid: 3\rdata:  c\n\n"), "a\nb\n c");
  EXPECT_EQ(SseEventData(": only a comment\n\n"), std::nullopt);
  EXPECT_EQ(SseEventData("data\n\n"), std::nullopt);  // a field named "data" needs its colon here
  EXPECT_EQ(SseEventData("data:\n\n"), "");
  // Two lines that are JSON only together: one object, classified by it.
  const std::string split = "data: {\"error\":\ndata: {\"message\":\"x\"}}\n\n";
  EXPECT_EQ(ClassifySseEvent(split), SseEventKind::kError);
  EXPECT_EQ(ParseSseData(split), nlohmann::json::parse(R"({"error":{"message":"x"}})"));
  // [DONE] followed by another line is not [DONE]; its JSON is not an object either.
  EXPECT_EQ(ClassifySseEvent("data: [DONE]\ndata: 1\n\n"), SseEventKind::kData);
  EXPECT_TRUE(ParseSseData("data: [DONE]\ndata: 1\n\n").is_discarded());
  // A comment before the data does not hide it.
  EXPECT_EQ(ParseSseData(": keep-alive\ndata: {\"a\":1}\n\n"), nlohmann::json::parse(R"({"a":1})"));
  // Whatever is read back, written out by SseEvent reads the same, with the same kind.
  for (const std::string& e : {split, std::string("data: {\"a\":\r\ndata: [1,2]}\r\n\r\n")}) {
    const nlohmann::json j = ParseSseData(e);
    ASSERT_FALSE(j.is_discarded()) << e;
    EXPECT_EQ(ParseSseData(SseEvent(j)), j);
    EXPECT_EQ(ClassifySseEvent(SseEvent(j)), ClassifySseEvent(e));
  }
}

TEST(ResumeLedger, TakesTheCommentOutOfAnEventAndKeepsTheRest) {
  std::string ev = "data: {\"x\":1}\n: kvpush-resume {\"index\":0}\n\n";
  EXPECT_EQ(TakeResumeInfo(&ev), std::optional<std::string>("{\"index\":0}"));
  EXPECT_EQ(ev, "data: {\"x\":1}\n\n");
  std::string alone = ": kvpush-resume {\"index\":1}\r\n\r\n";
  EXPECT_EQ(TakeResumeInfo(&alone), std::optional<std::string>("{\"index\":1}"));
  EXPECT_EQ(alone, "");  // nothing left for the client
  std::string plain = "data: [DONE]\n\n";
  EXPECT_EQ(TakeResumeInfo(&plain), std::nullopt);
  EXPECT_EQ(plain, "data: [DONE]\n\n");
  std::string other = ": keep-alive\n\n";  // another comment is the client's
  EXPECT_EQ(TakeResumeInfo(&other), std::nullopt);
}

TEST(ResumeLedger, AccumulatesEachChoiceInIndexOrder) {
  ResumeLedger l;
  EXPECT_TRUE(l.Note(R"({"index":1,"token_ids":[7],"text_bytes":3,"finished":false})"));
  EXPECT_TRUE(l.Note(R"({"index":0,"token_ids":[],"text_bytes":0,"finished":false})"));
  EXPECT_EQ(l.seed(), std::nullopt);
  EXPECT_TRUE(
      l.Note(R"({"index":1,"token_ids":[8,9],"text_bytes":5,"finished":true,"seed":-5})"));
  EXPECT_EQ(l.seed(), std::optional<int64_t>(-5));
  EXPECT_EQ(l.tokens(), 3);
  EXPECT_FALSE(l.broken());
  EXPECT_EQ(l.ToJson(), json::parse(R"({"choices":[
      {"index":0,"token_ids":[],"text_bytes":0,"finished":false},
      {"index":1,"token_ids":[7,8,9],"text_bytes":5,"finished":true}]})"));
  l.NoteUsageRelayed();  // the usage chunk went out: a continuation must not send it again
  EXPECT_EQ(l.ToJson()["usage_sent"], true);
  l.MarkBroken();  // an event with choice data but no comment: never continued
  EXPECT_TRUE(l.broken());
}

TEST(ResumeLedger, AMalformedCommentBreaksIt) {
  for (const char* bad : {"not json", "[]", R"({"index":-1,"token_ids":[],"text_bytes":0,"finished":false})",
                          R"({"index":0,"token_ids":[-3],"text_bytes":0,"finished":false})",
                          R"({"index":0,"token_ids":[1],"finished":false})",
                          R"({"index":0,"token_ids":[],"text_bytes":0,"finished":false,"seed":"7"})"}) {
    ResumeLedger l;
    EXPECT_FALSE(l.Note(bad)) << bad;
    EXPECT_TRUE(l.broken()) << bad;
  }
}

TEST(StreamRegistry, AMoveIsAskedAnsweredOrEndedWithTheStream) {
  StreamRegistry reg;
  auto slot = std::make_shared<MoveSlot>();
  reg.Add("r1", slot);
  EXPECT_EQ(reg.Find("r1"), slot);
  EXPECT_EQ(reg.Find("r2"), nullptr);
  EXPECT_FALSE(slot->Asked());
  EXPECT_EQ(slot->Ask(std::chrono::milliseconds(20)), std::nullopt);  // nobody answered
  std::thread relay([&] {
    while (!slot->Asked()) std::this_thread::yield();
    slot->Answer(MoveOutcome{true, "http://a:1", "http://b:2", ""});
  });
  const std::optional<MoveOutcome> o = slot->Ask(std::chrono::seconds(10));
  relay.join();
  ASSERT_TRUE(o.has_value());
  EXPECT_TRUE(o->moved);
  EXPECT_EQ(o->to, "http://b:2");
  std::thread end([&] {
    while (!slot->Asked()) std::this_thread::yield();
    slot->Close("the stream ended");
  });
  const std::optional<MoveOutcome> closed = slot->Ask(std::chrono::seconds(10));
  end.join();
  ASSERT_TRUE(closed.has_value());
  EXPECT_FALSE(closed->moved);
  EXPECT_EQ(closed->error, "the stream ended");
  auto other = std::make_shared<MoveSlot>();
  reg.Remove("r1", other.get());  // not the registered one: kept
  EXPECT_EQ(reg.Find("r1"), slot);
  reg.Remove("r1", slot.get());
  EXPECT_EQ(reg.Find("r1"), nullptr);
}

}  // namespace
}  // namespace kvpush::router
