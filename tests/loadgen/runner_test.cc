// The pure parts of the runner: URL parsing, request bodies, and how a streamed completion
// becomes a RequestOutcome (success rules, TTFT/ITL/E2EL from chunk times).
#include "loadgen/runner.h"

#include <gtest/gtest.h>

namespace kvpush::loadgen {
namespace {

TEST(LoadgenRunner, ParsesBaseUrls) {
  auto t = ParseBaseUrl("http://127.0.0.1:8100", "/v1/completions");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->host, "127.0.0.1");
  EXPECT_EQ(t->port, 8100);
  EXPECT_EQ(t->path, "/v1/completions");
  t = ParseBaseUrl("http://example.org/prefix/", "v1/chat/completions");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->port, 80);
  EXPECT_EQ(t->path, "/prefix/v1/chat/completions");
  t = ParseBaseUrl("http://[::1]:9000", "/v1/completions");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->host, "::1");
  EXPECT_EQ(t->port, 9000);
  EXPECT_FALSE(ParseBaseUrl("https://x:1", "/v1/completions").ok());
  EXPECT_FALSE(ParseBaseUrl("http://x:99999", "/v1/completions").ok());
  EXPECT_FALSE(ParseBaseUrl("http://:80", "/v1/completions").ok());
}

TEST(LoadgenRunner, BuildsCompletionAndChatBodies) {
  SampleRequest ids{nlohmann::json::array({5, 6, 7}), 3, 16};
  BodyOptions o;
  o.model = "m";
  o.ignore_eos = true;
  o.temperature = 0.0;
  o.extra_body = {{"seed", 1}};
  auto b = BuildRequestBody(ids, o);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, nlohmann::json({{"model", "m"},
                                {"prompt", {5, 6, 7}},
                                {"max_tokens", 16},
                                {"ignore_eos", true},
                                {"temperature", 0.0},
                                {"seed", 1}}));
  o = BodyOptions{};
  o.kind = ApiKindOf("/v1/chat/completions");
  ASSERT_EQ(o.kind, ApiKind::kChat);
  EXPECT_FALSE(BuildRequestBody(ids, o).ok());  // token ids cannot go through chat
  b = BuildRequestBody({"hello", 1, 8}, o);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)["messages"][0]["content"], "hello");
  EXPECT_EQ((*b)["max_completion_tokens"], 8);
  EXPECT_FALSE(b->contains("model"));
  EXPECT_FALSE(b->contains("temperature"));  // server default unless given
}

TEST(LoadgenRunner, OutcomeTimesComeFromContentChunks) {
  StreamedCompletion s;
  s.http_status = 200;
  s.start_ns = 1'000'000'000;
  s.chunk_ns = {1'050'000'000, 1'060'000'000, 1'080'000'000};
  s.end_ns = 1'090'000'000;  // usage chunk / [DONE]: not part of E2EL
  s.prompt_tokens = 12;
  s.completion_tokens = 3;
  s.text = "xyz";
  auto o = OutcomeFromStream(Result<StreamedCompletion>(s), 99, 900'000'000, 990'000'000);
  EXPECT_TRUE(o.success);
  EXPECT_EQ(o.prompt_len, 12);  // usage wins over the dataset's count
  EXPECT_EQ(o.output_tokens, 3);
  EXPECT_NEAR(o.ttft_s, 0.05, 1e-12);
  ASSERT_EQ(o.itl_s.size(), 2u);
  EXPECT_NEAR(o.itl_s[0], 0.01, 1e-12);
  EXPECT_NEAR(o.itl_s[1], 0.02, 1e-12);
  EXPECT_NEAR(o.latency_s, 0.08, 1e-12);
  EXPECT_NEAR(o.start_s, 0.1, 1e-12);
  EXPECT_NEAR(o.queue_s, 0.01, 1e-12);
}

TEST(LoadgenRunner, FailuresKeepTheirError) {
  StreamedCompletion s;
  s.http_status = 400;
  s.error = "prompt too long";
  auto o = OutcomeFromStream(Result<StreamedCompletion>(s), 5, 0, 0);
  EXPECT_FALSE(o.success);
  EXPECT_EQ(o.error, "HTTP 400: prompt too long");
  EXPECT_EQ(o.prompt_len, 5);
  s.http_status = 200;
  s.error = "engine aborted";
  s.chunk_ns = {1, 2};
  EXPECT_EQ(OutcomeFromStream(Result<StreamedCompletion>(s), 5, 0, 0).error, "engine aborted");
  s.error.clear();
  s.chunk_ns.clear();
  EXPECT_FALSE(OutcomeFromStream(Result<StreamedCompletion>(s), 5, 0, 0).success);
  auto down =
      OutcomeFromStream(Result<StreamedCompletion>(Unavailable("connection refused")), 5, 0, 0);
  EXPECT_FALSE(down.success);
  EXPECT_EQ(down.error, "connection refused");
}

}  // namespace
}  // namespace kvpush::loadgen
