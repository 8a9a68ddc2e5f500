// OpenAiClient against a scripted in-process SSE server on loopback.
#include "client/openai_client.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <thread>

#include "test_util.h"

namespace kvpush {
namespace {

class ScriptedServer {
 public:
  explicit ScriptedServer(std::vector<std::string> chunks, int status = 200)
      : chunks_(std::move(chunks)), status_(status) {
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      last_body_ = req.body;
      if (status_ != 200) {
        res.status = status_;
        res.set_content(R"({"error":{"message":"bad max_tokens","type":"invalid_request_error"}})",
                        "application/json");
        return;
      }
      res.set_chunked_content_provider("text/event-stream",
                                       [this](size_t, httplib::DataSink& sink) {
                                         for (const auto& c : chunks_)
                                           sink.write(c.data(), c.size());
                                         sink.done();
                                         return true;
                                       });
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    EXPECT_TRUE(::kvpush::testing::WaitUntil([this] { return server_.is_running(); },
                                             std::chrono::seconds(5), std::chrono::milliseconds(1)))
        << "the scripted server did not start";
  }
  ~ScriptedServer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::string last_body_;

 private:
  std::vector<std::string> chunks_;
  int status_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

TEST(OpenAiClientTest, ParsesSseChunksUsageAndDone) {
  ScriptedServer srv({
      "data: {\"choices\":[{\"index\":0,\"text\":\"Hel\",\"finish_reason\":null}]}\n\n",
      // An event split across writes, with CRLF line ends.
      "data: {\"choices\":[{\"index\":0,\"te",
      "xt\":\"lo\",\"finish_reason\":\"length\"}]}\r\n\r\n",
      "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
      "data: [DONE]\n\n",
  });
  OpenAiClient client("127.0.0.1", srv.port(), 10.0);
  auto r = client.Stream("/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->http_status, 200);
  EXPECT_EQ(r->error, "");
  EXPECT_EQ(r->text, "Hello");
  EXPECT_EQ(r->finish_reason, "length");
  EXPECT_EQ(r->prompt_tokens, 3);
  EXPECT_EQ(r->completion_tokens, 2);
  EXPECT_EQ(r->chunk_ns.size(), 2u);
  EXPECT_GE(r->TtftMs(), 0.0);
  EXPECT_GE(r->TpotMs(), 0.0);
  auto sent = nlohmann::json::parse(srv.last_body_);
  EXPECT_EQ(sent["stream"], true);
  EXPECT_EQ(sent["stream_options"]["include_usage"], true);
}

TEST(OpenAiClientTest, ReportsSseErrorEventAndMissingDone) {
  ScriptedServer srv({"data: {\"error\":{\"message\":\"peer gone\",\"code\":502}}\n\n"});
  OpenAiClient client("127.0.0.1", srv.port(), 10.0);
  auto r = client.Stream("/v1/completions", {{"prompt", "x"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->error, "peer gone");
}

TEST(OpenAiClientTest, ReportsHttpErrorBody) {
  ScriptedServer srv({}, 400);
  OpenAiClient client("127.0.0.1", srv.port(), 10.0);
  auto r = client.Stream("/v1/completions", {{"prompt", "x"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->http_status, 400);
  EXPECT_EQ(r->error, "bad max_tokens");
}

TEST(OpenAiClientTest, ConnectionRefusedIsUnavailable) {
  int port;
  {
    ScriptedServer srv({});
    port = srv.port();
  }
  OpenAiClient client("127.0.0.1", port, 2.0);
  auto r = client.Stream("/v1/completions", {{"prompt", "x"}});
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace kvpush
