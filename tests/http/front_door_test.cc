#include "http/front_door.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <future>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace kvpush::http {
namespace {

using nlohmann::json;

/// The OpenAI error object of a response body.
json ErrorOf(const httplib::Result& r) {
  EXPECT_TRUE(r);
  const json j = json::parse(r->body, nullptr, false);
  EXPECT_TRUE(j.is_object() && j.contains("error")) << r->body;
  return j.is_object() && j.contains("error") ? j["error"] : json();
}

class FrontDoorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FrontDoorOptions o;
    o.max_body_bytes = 64;
    door_ = std::make_unique<FrontDoor>(o);
    door_->Get("/a", [](const Request&, Response& res) { res.set_content("A", "text/plain"); });
    door_->Post("/b", [](const Request& req, Response& res) {
      res.set_content("got " + req.body, "text/plain");
    });
    door_->Get("/throws", [](const Request&, Response&) -> void {
      throw std::runtime_error("handler broke");
    });
    door_->Get("/own_error", [](const Request&, Response& res) {
      res.status = 418;
      res.set_content("{\"mine\":true}", "application/json");
    });
    door_->OnResponse([this](const Request& req, const Response& res) {
      if (req.path == "/a" && res.status == 200) ++hook_a_200_;
      ++hook_calls_;
    });
    ASSERT_TRUE(door_->Start().ok());
    client_ = std::make_unique<httplib::Client>("127.0.0.1", door_->port());
  }

  std::unique_ptr<FrontDoor> door_;
  std::unique_ptr<httplib::Client> client_;
  std::atomic<int> hook_a_200_{0};
  std::atomic<int> hook_calls_{0};
};

TEST_F(FrontDoorTest, RoutesAnswer) {
  auto a = client_->Get("/a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, 200);
  EXPECT_EQ(a->body, "A");
  auto b = client_->Post("/b", "xy", "text/plain");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->body, "got xy");
  EXPECT_TRUE(door_->IsRoute("/a"));
  EXPECT_FALSE(door_->IsRoute("/nope"));
}

TEST_F(FrontDoorTest, WrongMethodOnAKnownPathIs405WithAllow) {
  auto r = client_->Post("/a", "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 405);
  EXPECT_EQ(r->get_header_value("Allow"), "GET");
  const json e = ErrorOf(r);
  EXPECT_EQ(e["code"], "method_not_allowed");
  EXPECT_EQ(e["message"], "method POST is not allowed on /a (use GET)");
  auto d = client_->Delete("/b");
  ASSERT_TRUE(d);
  EXPECT_EQ(d->status, 405);
  EXPECT_EQ(d->get_header_value("Allow"), "POST");
}

TEST_F(FrontDoorTest, UnknownPathIs404NotFound) {
  auto r = client_->Get("/nope");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  const json e = ErrorOf(r);
  EXPECT_EQ(e["code"], "not_found");
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["message"], "no route for GET /nope");
}

TEST_F(FrontDoorTest, BodyOverTheLimitIs413) {
  auto r = client_->Post("/b", std::string(65, 'x'), "text/plain");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  EXPECT_EQ(ErrorOf(r)["message"], "request body too large");
}

TEST_F(FrontDoorTest, AHandlersExceptionIs500WithItsMessage) {
  auto r = client_->Get("/throws");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  const json e = ErrorOf(r);
  EXPECT_EQ(e["type"], "server_error");
  EXPECT_EQ(e["message"], "handler broke");
}

TEST_F(FrontDoorTest, AHandlersOwnErrorBodyIsKept) {
  auto r = client_->Get("/own_error");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 418);
  EXPECT_EQ(r->body, "{\"mine\":true}");
}

TEST_F(FrontDoorTest, TheHookSeesEveryResponse) {
  ASSERT_TRUE(client_->Get("/a"));
  ASSERT_TRUE(client_->Get("/nope"));
  ASSERT_TRUE(client_->Get("/a"));
  client_.reset();  // closes its keep-alive connection
  door_->Stop();    // joins the connection threads: every hook call has returned
  EXPECT_EQ(hook_a_200_.load(), 2);
  EXPECT_EQ(hook_calls_.load(), 3);
}

TEST_F(FrontDoorTest, APortInUseFailsStartAndAStartedDoorRefusesASecondStart) {
  FrontDoorOptions o;
  o.port = door_->port();
  FrontDoor second(o);
  const Status st = second.Start();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_EQ(door_->Start().code(), StatusCode::kFailedPrecondition);
}

// A connection that finds every worker busy runs on an extra thread: with one worker held by a
// handler that waits, another request is still answered (it would wait forever in a fixed pool).
TEST(FrontDoor, ExtraThreadsServeWhileEveryWorkerIsBusy) {
  FrontDoorOptions o;
  o.worker_threads = 1;
  o.max_extra_threads = 4;
  FrontDoor door(o);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> entered;
  door.Get("/hold", [&](const Request&, Response& res) {
    entered.set_value();
    released.wait();
    res.set_content("held", "text/plain");
  });
  door.Get("/a", [](const Request&, Response& res) { res.set_content("A", "text/plain"); });
  ASSERT_TRUE(door.Start().ok());
  auto held = std::async(std::launch::async, [&] {
    httplib::Client c("127.0.0.1", door.port());
    return c.Get("/hold");
  });
  entered.get_future().wait();
  httplib::Client c("127.0.0.1", door.port());
  c.set_read_timeout(60, 0);
  auto a = c.Get("/a");
  release.set_value();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->body, "A");
  auto h = held.get();
  ASSERT_TRUE(h);
  EXPECT_EQ(h->body, "held");
}

// GET /version on every front door: its BuildInfo as JSON; kvpush_build_info renders it.
TEST(FrontDoor, AnswersVersionWithItsBuild) {
  FrontDoorOptions o;
  o.build = BuildInfo{"1.2.3", std::string(40, 'a'), true};
  FrontDoor door(o);
  ASSERT_TRUE(door.Start().ok());
  httplib::Client c("127.0.0.1", door.port());
  auto r = c.Get("/version");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  const json j = json::parse(r->body);
  EXPECT_EQ(j["version"], "1.2.3");
  EXPECT_EQ(j["git_commit"], std::string(40, 'a'));
  EXPECT_EQ(j["git_dirty"], true);
  EXPECT_EQ(o.build.ToString(), "1.2.3 (git aaaaaaaaaaaa, modified)");
  PrometheusWriter w;
  WriteBuildInfo(w, o.build);
  EXPECT_NE(w.str().find("kvpush_build_info{version=\"1.2.3\",git_commit=\"" +
                         std::string(40, 'a') + "\",git_dirty=\"true\"} 1\n"),
            std::string::npos)
      << w.str();
}

TEST(FrontDoor, TlsNeedsALoadableCertificateAndKey) {
  FrontDoorOptions only_cert;
  only_cert.tls_cert_file = "/nonexistent/cert.pem";
  EXPECT_EQ(FrontDoor(only_cert).Start().code(), StatusCode::kInvalidArgument);
  FrontDoorOptions missing;
  missing.tls_cert_file = "/nonexistent/cert.pem";
  missing.tls_key_file = "/nonexistent/key.pem";
  const Status st = FrontDoor(missing).Start();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("/nonexistent/cert.pem"), std::string::npos) << st.ToString();
}

TEST(FrontDoor, BearerMatchesOnlyTheExactKey) {
  EXPECT_TRUE(BearerMatches("Bearer sk-1", "sk-1"));
  EXPECT_TRUE(BearerMatches("bearer sk-1", "sk-1"));  // the scheme is case-insensitive
  EXPECT_FALSE(BearerMatches("Bearer sk-12", "sk-1"));
  EXPECT_FALSE(BearerMatches("Bearer sk-2", "sk-1"));
  EXPECT_FALSE(BearerMatches("Bearer SK-1", "sk-1"));  // the token is not
  EXPECT_FALSE(BearerMatches("Basic sk-1", "sk-1"));
  EXPECT_FALSE(BearerMatches("sk-1", "sk-1"));
  EXPECT_FALSE(BearerMatches("", "sk-1"));
}

// vLLM's --api-key: 401 invalid_api_key without the key or with a wrong one, on every path but
// the open ones (unknown paths included: nothing is revealed to a caller without the key).
TEST(FrontDoor, AnApiKeyGuardsEveryPathButHealthVersionAndMetrics) {
  FrontDoorOptions o;
  o.api_key = "sk-test";
  FrontDoor door(o);
  for (const char* path : {"/v1/x", "/kv/abort", "/health", "/metrics"}) {
    door.Get(path, [](const Request&, Response& res) { res.set_content("ok", "text/plain"); });
  }
  ASSERT_TRUE(door.Start().ok());
  httplib::Client c("127.0.0.1", door.port());
  for (const char* path : {"/v1/x", "/kv/abort", "/nowhere"}) {
    SCOPED_TRACE(path);
    auto none = c.Get(path);
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 401);
    EXPECT_EQ(none->get_header_value("WWW-Authenticate"), "Bearer");
    EXPECT_EQ(ErrorOf(none)["code"], "invalid_api_key");
    auto wrong = c.Get(path, httplib::Headers{{"Authorization", "Bearer sk-wrong"}});
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 401);
    EXPECT_EQ(ErrorOf(wrong)["message"], "incorrect API key");
  }
  auto ok = c.Get("/v1/x", httplib::Headers{{"Authorization", "Bearer sk-test"}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  auto missing = c.Get("/nowhere", httplib::Headers{{"Authorization", "Bearer sk-test"}});
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  for (const char* path : {"/health", "/metrics", "/version"}) {
    auto open = c.Get(path);
    ASSERT_TRUE(open);
    EXPECT_EQ(open->status, 200) << path;
  }
}

// The access note a handler fills is the one of its own request, fresh for each request on a
// kept-alive connection, and is timed from the request's routing.
TEST(FrontDoor, EachRequestHasItsOwnAccessNote) {
  FrontDoor door(FrontDoorOptions{});
  std::atomic<int> stale{0};
  door.Get("/n", [&](const Request& req, Response& res) {
    AccessNote& n = CurrentAccessNote();
    if (!n.request_id.empty() || n.prompt_tokens >= 0) ++stale;
    if (CurrentRequestStart() == std::chrono::steady_clock::time_point{}) ++stale;
    n.request_id = req.get_param_value("id");
    n.prompt_tokens = 3;
    res.set_content(n.request_id, "text/plain");
  });
  ASSERT_TRUE(door.Start().ok());
  httplib::Client c("127.0.0.1", door.port());
  c.set_keep_alive(true);
  for (int i = 0; i < 3; ++i) {
    auto r = c.Get("/n?id=r" + std::to_string(i));
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, "r" + std::to_string(i));
  }
  EXPECT_EQ(stale.load(), 0);
}

}  // namespace
}  // namespace kvpush::http
