// Test helper: serves POST /kv/handshake for one in-process PdConnector on 127.0.0.1 (any free
// port), so another connector's EnsurePeer does a real HTTP round trip.
#pragma once

#include <httplib.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "connector/pd_connector.h"
#include "test_util.h"

namespace kvpush::connector {

/// Serves POST /kv/handshake for one connector, remembering the last request and answer. With
/// `tls_cert` and `tls_key` (PEM files) it serves HTTPS only.
class HandshakeServer {
 public:
  explicit HandshakeServer(PdConnector& c, const std::string& tls_cert = {},
                           const std::string& tls_key = {})
      : c_(c),
        srv_(tls_cert.empty()
                 ? std::make_unique<httplib::Server>()
                 : std::make_unique<httplib::SSLServer>(tls_cert.c_str(), tls_key.c_str())) {
    srv_->Post("/kv/handshake", [this](const httplib::Request& req, httplib::Response& res) {
      auto body = nlohmann::json::parse(req.body, nullptr, false);
      auto r = c_.HandleHandshake(body);
      last_request = body;
      requests.push_back(body);
      if (r.ok()) {
        last_answer = *r;
        answers.push_back(*r);
        res.set_content(r->dump(), "application/json");
      } else {
        res.status = r.status().code() == StatusCode::kFailedPrecondition ? 409 : 400;
        res.set_content(nlohmann::json{{"error", {{"message", r.status().message()}}}}.dump(),
                        "application/json");
      }
    });
    port = srv_->bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_->listen_after_bind(); });
    EXPECT_TRUE(::kvpush::testing::WaitUntil([this] { return srv_->is_running(); },
                                             std::chrono::seconds(5), std::chrono::milliseconds(1)))
        << "the handshake server did not start";
  }
  ~HandshakeServer() {
    srv_->stop();
    thread_.join();
  }
  int port = 0;
  nlohmann::json last_request, last_answer;
  std::vector<nlohmann::json> requests, answers;  ///< every request; every 200 answer

 private:
  PdConnector& c_;
  std::unique_ptr<httplib::Server> srv_;
  std::thread thread_;
};

}  // namespace kvpush::connector
