// TLS from the router to its instances (docs/router.md, "TLS to instances"): HttpConn's TLS path
// against local httplib SSLServers with a test PKI (tls_test_certs.h) — keep-alive reuse, a
// streamed body read piece by piece, a refused certificate (untrusted, or naming another
// address), a plain-HTTP port never spoken to in plain HTTP, Shutdown() ending a pending TLS
// read — then the router itself in front of https fake instances: push and pull over TLS, the
// D leg told to reach P over https, and the 502 naming certificate verification.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "router/connection_pool.h"
#include "router/health_check.h"
#include "router/http_conn.h"
#include "router/leg.h"
#include "router/tls_client.h"
#include "router_test_util.h"
#include "tls_test_certs.h"

namespace kvpush::router::test {
namespace {

const ::kvpush::testing::TlsTestFiles& Pki() {
  static const ::kvpush::testing::TempTlsTestFiles pki;  // removed at exit
  return pki.files();
}

std::shared_ptr<const TlsClientContext> Trusting(const std::string& ca_file) {
  auto ctx = TlsClientContext::Create(ca_file);
  EXPECT_TRUE(ctx.ok()) << ctx.status().ToString();
  return ctx.ok() ? *ctx : nullptr;
}

InstanceAddress Https(int port, const std::string& host = "127.0.0.1") {
  auto a = ParseInstanceUrl("https://" + host + ":" + std::to_string(port));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return *a;
}

/// An HTTPS (or, with empty files, plain HTTP) server: POST /echo answers the body and the
/// client's port; POST /stream answers 4 chunks 30 ms apart; GET /slow answers after 3 s (or
/// when the server stops).
class TlsServer {
 public:
  TlsServer(const std::string& cert, const std::string& key)
      : svr_(cert.empty() ? std::make_unique<httplib::Server>()
                          : std::make_unique<httplib::SSLServer>(cert.c_str(), key.c_str())) {
    svr_->set_keep_alive_timeout(2);
    svr_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      ++requests;
      res.set_content(R"({"status":"ok"})", "application/json");
    });
    svr_->Post("/echo", [this](const httplib::Request& req, httplib::Response& res) {
      ++requests;
      res.set_content(nlohmann::json{{"body", req.body}, {"port", req.remote_port}}.dump(),
                      "application/json");
    });
    svr_->Post("/stream", [this](const httplib::Request&, httplib::Response& res) {
      ++requests;
      auto n = std::make_shared<int>(0);
      res.set_chunked_content_provider("text/event-stream", [n](size_t, httplib::DataSink& sink) {
        if (*n == 4) {
          sink.done();
          return true;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        const std::string ev = "data: " + std::to_string((*n)++) + "\n\n";
        return sink.write(ev.data(), ev.size());
      });
    });
    svr_->Get("/slow", [this](const httplib::Request&, httplib::Response& res) {
      ++requests;
      for (int i = 0; i < 300 && !stopping_.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      res.set_content("late", "text/plain");
    });
    port = svr_->bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { svr_->listen_after_bind(); });
    EXPECT_TRUE(WaitFor([this] { return svr_->is_running(); }));
  }
  ~TlsServer() {
    stopping_.store(true);
    svr_->stop();
    thread_.join();
  }
  int port = 0;
  std::atomic<int> requests{0};  ///< handler calls (requests that reached the HTTP layer)

 private:
  std::atomic<bool> stopping_{false};  ///< ends /slow's wait
  std::unique_ptr<httplib::Server> svr_;
  std::thread thread_;
};

class TlsConnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::signal(SIGPIPE, SIG_IGN);  // as Router::Start: a TLS write to a closed peer
    ASSERT_TRUE(Pki().ok) << "test PKI not written";
  }
};

TEST_F(TlsConnTest, KeepAliveTlsConnectionIsReusedByEveryLeg) {
  TlsServer server(Pki().server_cert, Pki().server_key);
  ConnectionPool pool(ConnectionPoolOptions{8, 2.0, Trusting(Pki().ca_cert)});
  std::vector<int> ports;
  for (int i = 0; i < 3; ++i) {
    Leg leg(Https(server.port), &pool, 2.0, 5.0);
    const LegResult r = leg.Post("/echo", "req-" + std::to_string(i), "hello " + std::to_string(i));
    ASSERT_TRUE(r.answered) << r.error;
    EXPECT_EQ(r.status, 200);
    const nlohmann::json j = nlohmann::json::parse(r.body);
    EXPECT_EQ(j["body"], "hello " + std::to_string(i));
    ports.push_back(j["port"].get<int>());
  }
  EXPECT_EQ(ports[0], ports[1]);  // one TLS connection carried all three
  EXPECT_EQ(ports[1], ports[2]);
  EXPECT_EQ(pool.counts().opened, 1);
  EXPECT_EQ(pool.counts().reused, 2);
  EXPECT_EQ(pool.idle(Https(server.port).url), 1u);
}

TEST_F(TlsConnTest, StreamedBodyArrivesPieceByPieceOverTls) {
  TlsServer server(Pki().server_cert, Pki().server_key);
  ConnectionPool pool(ConnectionPoolOptions{8, 2.0, Trusting(Pki().ca_cert)});
  Leg leg(Https(server.port), &pool, 2.0, 5.0);
  LegResult r;
  ASSERT_TRUE(leg.Send("POST", "/stream", "s1", "{}", /*sse=*/true, &r)) << r.error;
  ASSERT_TRUE(leg.ReadHead(&r)) << r.error;
  EXPECT_EQ(r.status, 200);
  std::string body;
  int pieces = 0;
  bool ended = false;
  while (!ended) {
    std::string piece;
    const BodyRead br = leg.ReadBody(2000, &piece, &ended, &r);
    ASSERT_NE(br, BodyRead::kFailed) << r.error;
    ASSERT_NE(br, BodyRead::kTimeout);
    if (!piece.empty()) ++pieces;
    body += piece;
  }
  EXPECT_EQ(body, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\n");
  EXPECT_GE(pieces, 2);  // 30 ms apart: read as they came, not at the end
  // Read to its end: the TLS connection went back to the pool and carries the next call.
  EXPECT_EQ(pool.idle(Https(server.port).url), 1u);
  Leg again(Https(server.port), &pool, 2.0, 5.0);
  EXPECT_EQ(again.Post("/echo", "s2", "x").status, 200);
  EXPECT_EQ(pool.counts().reused, 1);
}

TEST_F(TlsConnTest, UntrustedCertificateFailsTheConnectNamingVerification) {
  TlsServer server(Pki().server_cert, Pki().server_key);
  Leg leg(Https(server.port), nullptr, 2.0, 5.0, "", Trusting(Pki().other_ca_cert));
  const LegResult r = leg.Post("/echo", "u1", "secret");
  EXPECT_FALSE(r.answered);
  EXPECT_TRUE(r.connect_failed);
  EXPECT_NE(r.error.find("TLS certificate verification failed"), std::string::npos) << r.error;
  EXPECT_EQ(server.requests.load(), 0);  // nothing was sent, in TLS or in plain HTTP
  // The system's store does not trust the test CA either.
  Leg system(Https(server.port), nullptr, 2.0, 5.0, "", Trusting(""));
  const LegResult s = system.Post("/echo", "u2", "secret");
  EXPECT_NE(s.error.find("TLS certificate verification failed"), std::string::npos) << s.error;
  EXPECT_EQ(server.requests.load(), 0);
}

TEST_F(TlsConnTest, CertificateOfAnotherAddressIsRefused) {
  TlsServer server(Pki().wrong_name_cert, Pki().wrong_name_key);  // for 127.0.0.2
  Leg by_ip(Https(server.port), nullptr, 2.0, 5.0, "", Trusting(Pki().ca_cert));
  const LegResult r = by_ip.Post("/echo", "w1", "x");
  EXPECT_FALSE(r.answered);
  EXPECT_NE(r.error.find("TLS certificate verification failed"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("mismatch"), std::string::npos) << r.error;
  Leg by_name(Https(server.port, "localhost"), nullptr, 2.0, 5.0, "", Trusting(Pki().ca_cert));
  const LegResult n = by_name.Post("/echo", "w2", "x");
  EXPECT_NE(n.error.find("mismatch"), std::string::npos) << n.error;
  EXPECT_EQ(server.requests.load(), 0);
  // The right certificate by host name passes (SNI and DNS-name verification).
  TlsServer good(Pki().server_cert, Pki().server_key);
  Leg named(Https(good.port, "localhost"), nullptr, 2.0, 5.0, "", Trusting(Pki().ca_cert));
  EXPECT_EQ(named.Post("/echo", "w3", "x").status, 200);
}

TEST_F(TlsConnTest, PlainHttpPortIsNeverSpokenToInPlainHttp) {
  TlsServer plain("", "");
  Leg leg(Https(plain.port), nullptr, 2.0, 5.0, "", Trusting(Pki().ca_cert));
  const LegResult r = leg.Post("/echo", "p1", "x");
  EXPECT_FALSE(r.answered);
  EXPECT_TRUE(r.connect_failed);
  EXPECT_NE(r.error.find("TLS handshake failed"), std::string::npos) << r.error;
  EXPECT_EQ(plain.requests.load(), 0);
  const HealthAnswer h = CheckHealth(Https(plain.port), Trusting(Pki().ca_cert), 1000);
  EXPECT_FALSE(h.answered);
  EXPECT_TRUE(h.tls_failed);
  EXPECT_EQ(plain.requests.load(), 0);
}

TEST_F(TlsConnTest, StopEndsAPendingTlsReadPromptly) {
  TlsServer server(Pki().server_cert, Pki().server_key);
  Leg leg(Https(server.port), nullptr, 2.0, 10.0, "", Trusting(Pki().ca_cert));
  LegResult r;
  ASSERT_TRUE(leg.Send("GET", "/slow", "slow", "", false, &r)) << r.error;
  std::thread stopper([&leg] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    leg.Stop();
  });
  const auto t0 = std::chrono::steady_clock::now();
  const LegResult a = leg.ReadAnswer();
  const auto waited = std::chrono::steady_clock::now() - t0;
  stopper.join();
  EXPECT_FALSE(a.answered);
  EXPECT_TRUE(a.stopped);
  EXPECT_LT(waited, std::chrono::milliseconds(1500));  // not the server's 3 s
}

TEST_F(TlsConnTest, HealthCheckOverTlsReadsTheAnswer) {
  TlsServer server(Pki().server_cert, Pki().server_key);
  const HealthAnswer ok = CheckHealth(Https(server.port), Trusting(Pki().ca_cert), 1000);
  ASSERT_TRUE(ok.answered) << ok.error;
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, R"({"status":"ok"})");
  const HealthAnswer bad = CheckHealth(Https(server.port), Trusting(Pki().other_ca_cert), 1000);
  EXPECT_FALSE(bad.answered);
  EXPECT_TRUE(bad.tls_failed);
  EXPECT_NE(bad.error.find("TLS certificate verification failed"), std::string::npos) << bad.error;
  EXPECT_EQ(server.requests.load(), 1);
}

TEST_F(TlsConnTest, CaFileThatDoesNotLoadIsRefusedNamingIt) {
  auto missing = TlsClientContext::Create("/nonexistent/ca.pem");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("/nonexistent/ca.pem"), std::string::npos);
  auto empty = TlsClientContext::Create(Pki().not_pem);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find(Pki().not_pem), std::string::npos);
}

/// The router over https fake instances.
class RouterTlsTest : public RouterTest {
 protected:
  void SetUp() override {
    ASSERT_TRUE(Pki().ok) << "test PKI not written";
    fake_tls_cert_ = Pki().server_cert;
    fake_tls_key_ = Pki().server_key;
  }
  void TrustCa(const std::string& ca_file) {
    options_hook_ = [ca_file](RouterOptions& o) { o.tls_ca_file = ca_file; };
  }
};

TEST_F(RouterTlsTest, PushAndPullRunOverTlsAndDIsToldToReachPOverHttps) {
  TrustCa(Pki().ca_cert);
  StartRouter(1, 1, TransferMode::kPush);
  ASSERT_EQ(p_[0]->url().rfind("https://", 0), 0u);
  auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], "ABC");
  ASSERT_TRUE(WaitFor([&] { return p_[0]->count() == 1; }));
  const json kv = d_[0]->received().at(0).body["kv_transfer_params"];
  EXPECT_EQ(kv["remote_scheme"], "https");
  EXPECT_EQ(kv["remote_host"], "127.0.0.1");
  EXPECT_EQ(kv["remote_port"], p_[0]->port());
  // Pull: P's answer (its own address) is copied to D as is.
  auto pulled = Post({{"prompt", "hi"}, {"max_tokens", 4}}, {{"x-kvpush-mode", "pull"}});
  ASSERT_TRUE(pulled);
  EXPECT_EQ(pulled->status, 200) << pulled->body;
  // A streamed answer is relayed over the TLS leg event by event.
  const StreamSeen s = PostStream({{"prompt", "hi"}, {"max_tokens", 4}});
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("data: [DONE]"), std::string::npos) << s.body;
  EXPECT_GE(router_->connection_counts().reused, 1);  // keep-alive TLS connections reused
}

TEST_F(RouterTlsTest, UntrustedInstancesGet502NamingCertificateVerification) {
  TrustCa(Pki().other_ca_cert);
  StartRouter(1, 1, TransferMode::kPush);
  auto r = Post({{"prompt", "hi"}, {"max_tokens", 4}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 502) << r->body;
  const json e = json::parse(r->body)["error"];
  EXPECT_EQ(e["code"], "decode_tls_failed");
  EXPECT_NE(e["message"].get<std::string>().find("TLS certificate verification failed"),
            std::string::npos)
      << e.dump();
  EXPECT_NE(e["message"].get<std::string>().find(d_[0]->url()), std::string::npos) << e.dump();
  EXPECT_EQ(p_[0]->count(), 0u);  // no leg went out, in TLS or in plain HTTP
  EXPECT_EQ(d_[0]->count(), 0u);
  auto health = Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
}

TEST_F(RouterTlsTest, MissingCaFileFailsStart) {
  RouterOptions o;
  o.prefill_urls = {"https://127.0.0.1:1"};
  o.decode_urls = {"https://127.0.0.1:2"};
  o.port = 0;
  o.tls_ca_file = Pki().not_pem;
  Router r(o);
  const Status st = r.Start();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("--ssl-ca-certs"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace kvpush::router::test
