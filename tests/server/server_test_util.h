// An in-process server over an engine (fake or real model) on an ephemeral loopback port, plus
// small HTTP/SSE helpers.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "server/http_server.h"
#include "test_util.h"

namespace kvpush::testing {

using nlohmann::json;

/// Engine + HttpServer on 127.0.0.1:<ephemeral>. The tokenizer must outlive it.
struct TestServer {
  std::unique_ptr<Engine> engine;
  std::unique_ptr<server::HttpServer> http;
  int port = 0;

  /// `prompt_tokens_details`: ServerOptions::enable_prompt_tokens_details.
  TestServer(std::unique_ptr<Executor> executor, const Tokenizer& tok, EngineConfig config,
             std::string model_name = "test-model", bool prompt_tokens_details = false) {
    auto e = Engine::Create(config, std::move(executor), tok);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    engine = std::move(e).value();
    server::ServerOptions so;
    so.host = "127.0.0.1";
    so.port = 0;
    so.served_model_name = std::move(model_name);
    so.enable_prompt_tokens_details = prompt_tokens_details;
    http = std::make_unique<server::HttpServer>(*engine, so);
    Status st = http->Start();
    EXPECT_TRUE(st.ok()) << st.ToString();
    port = http->port();
  }
  ~TestServer() {
    http->Stop();
    engine->Stop();
  }

  std::unique_ptr<httplib::Client> Client() const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_connection_timeout(5, 0);
    c->set_read_timeout(30, 0);
    c->set_write_timeout(5, 0);
    return c;
  }

  /// POSTs JSON; returns (status, body). Fails the test on a transport error.
  std::pair<int, std::string> Post(const std::string& path, const std::string& body,
                                   const httplib::Headers& headers = {}) const {
    auto c = Client();
    auto r = c->Post(path.c_str(), headers, body, "application/json");
    EXPECT_TRUE(r) << "transport error " << static_cast<int>(r.error());
    if (!r) return {0, ""};
    return {r->status, r->body};
  }

  /// Waits (10 s deadline) until no request is running or waiting and no KV block is used.
  void WaitIdle() const {
    const bool idle = ::kvpush::testing::WaitUntil(
        [&] {
          auto s = engine->stats();
          return s.kv.num_used == 0 && s.num_running == 0 && s.num_waiting == 0;
        },
        std::chrono::seconds(10), std::chrono::milliseconds(5));
    if (idle) return;
    auto s = engine->stats();
    EXPECT_EQ(s.kv.num_used, 0);
    EXPECT_EQ(s.num_running, 0);
    EXPECT_EQ(s.num_waiting, 0);
  }
};

/// The JSON payloads of an SSE body's "data: " events (the literal "[DONE]" kept as a string).
inline std::vector<std::string> SseEvents(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      ADD_FAILURE() << "SSE body does not end with a blank line: " << body.substr(pos);
      break;
    }
    std::string ev = body.substr(pos, end - pos);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << "not a data line: " << ev;
    out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

/// Token ids of a completion response with logprobs is not available; this collects the
/// streamed/returned text and the usage of a non-streaming response.
inline json ParseJson(const std::string& s) {
  json j = json::parse(s, nullptr, false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << s;
  return j;
}

/// The value of a Prometheus sample line starting with `prefix` (name + labels), or -1.
inline double MetricValue(const std::string& text, const std::string& prefix) {
  size_t pos = 0;
  while ((pos = text.find(prefix, pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') {
      size_t sp = text.find(' ', pos + prefix.size());
      size_t nl = text.find('\n', pos);
      if (sp != std::string::npos && sp < nl) return std::stod(text.substr(sp + 1, nl - sp - 1));
    }
    pos += prefix.size();
  }
  return -1;
}

}  // namespace kvpush::testing
