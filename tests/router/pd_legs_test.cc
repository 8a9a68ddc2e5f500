// Pure parts of the router: instance URLs, the x-kvpush-mode header, leg bodies
// (docs/pd_protocol.md §1), SSE event splitting, minted ids.
#include "router/pd_legs.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "router/instance_pool.h"
#include "router/prompt_list.h"
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
  auto b = ParseInstanceUrl("http://decode-0:9000");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "decode-0");
}

TEST(InstanceUrl, RejectsBadUrlsWithAReason) {
  for (const char* bad :
       {"https://h:1", "127.0.0.1:8100", "http://:8100", "http://host", "http://host:0",
        "http://host:70000", "http://host:80/v1", "http://host:8x"}) {
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

TEST(LegBodies, PrefillLegCarriesOneTokenNoStreamAndTransferParams) {
  json client = {{"model", "m"},     {"prompt", "hi"},
                 {"max_tokens", 20}, {"max_completion_tokens", 20},
                 {"stream", true},   {"stream_options", {{"include_usage", true}}},
                 {"seed", 7},        {"min_tokens", 5}};
  json p = MakePrefillBody(client, TransferMode::kPull, "ab");
  EXPECT_EQ(p["max_tokens"], 1);
  EXPECT_EQ(p["min_tokens"], 5);  // P clamps it: no EOS or stop id as the first token
  EXPECT_FALSE(p.contains("max_completion_tokens"));
  EXPECT_EQ(p["stream"], false);
  EXPECT_FALSE(p.contains("stream_options"));
  EXPECT_EQ(p["seed"], 7);
  EXPECT_EQ(p["prompt"], "hi");
  EXPECT_EQ(p["kv_transfer_params"], json({{"do_remote_decode", true},
                                           {"do_remote_prefill", false},
                                           {"transfer_mode", "pull"},
                                           {"transfer_id", "ab"}}));
}

TEST(LegBodies, DecodePushLegNamesThePrefillInstance) {
  json client = {{"prompt", "hi"}, {"stream", true}, {"seed", 3}, {"max_tokens", 9}};
  json d = MakeDecodePushBody(client, "t1", *ParseInstanceUrl("http://10.0.0.2:8100"));
  EXPECT_EQ(d["stream"], true);
  EXPECT_EQ(d["max_tokens"], 9);
  EXPECT_EQ(d["kv_transfer_params"]["do_remote_prefill"], true);
  EXPECT_EQ(d["kv_transfer_params"]["do_remote_decode"], false);
  EXPECT_EQ(d["kv_transfer_params"]["transfer_mode"], "push");
  EXPECT_EQ(d["kv_transfer_params"]["transfer_id"], "t1");
  EXPECT_EQ(d["kv_transfer_params"]["remote_host"], "10.0.0.2");
  EXPECT_EQ(d["kv_transfer_params"]["remote_port"], 8100);
}

TEST(LegBodies, DecodePullLegCopiesPrefillParamsVerbatim) {
  json client = {{"prompt", "hi"}, {"seed", 3}};
  json kvp = {{"do_remote_prefill", true}, {"remote_block_ids", {3, 4}}, {"lease_ms", 30000}};
  auto d =
      MakeDecodePullBody(client, {{"choices", json::array()}, {"kv_transfer_params", kvp}}, "vllm");
  ASSERT_TRUE(d.ok());
  json want = kvp;
  want["pull_profile"] = "vllm";
  EXPECT_EQ((*d)["kv_transfer_params"], want);
  auto no_profile = MakeDecodePullBody(client, {{"kv_transfer_params", kvp}}, "");
  EXPECT_EQ((*no_profile)["kv_transfer_params"], kvp);
  auto missing = MakeDecodePullBody(client, {{"choices", json::array()}}, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "prefill instance returned no kv_transfer_params");
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
  // The instances' rule (completion_handler.cc): 1..256 visible ASCII characters.
  EXPECT_TRUE(IsValidRequestId("req-1.a:b_c"));
  EXPECT_TRUE(IsValidRequestId("my/id+a@b"));
  EXPECT_TRUE(IsValidRequestId(std::string(256, 'a')));
  EXPECT_FALSE(IsValidRequestId(""));
  EXPECT_FALSE(IsValidRequestId("a b"));
  EXPECT_FALSE(IsValidRequestId("a\tb"));
  EXPECT_FALSE(IsValidRequestId("caf\xc3\xa9"));
  EXPECT_FALSE(IsValidRequestId(std::string(257, 'a')));
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

}  // namespace
}  // namespace kvpush::router
