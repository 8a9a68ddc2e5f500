// Two in-process PdConnectors on the "loopback" backend handshake with each other: one over a
// real HTTP round trip (EnsurePeer -> a test server that forwards to HandleHandshake), then
// HandleHandshake's refusals. No engine, no KV movement.
#include <gtest/gtest.h>
#include <httplib.h>

#include <thread>

#include "connector/pd_connector.h"
#include "connector/handshake_server.h"
#include "tls_test_certs.h"

namespace kvpush::connector {
namespace {

ConnectorOptions Options(const std::string& role, const std::string& engine_id) {
  ConnectorOptions o;
  auto cfg = KvTransferConfig::Parse(
      R"({"kv_connector_extra_config": {"backend": "loopback", "engine_id": ")" + engine_id +
          "\"}}",
      role);
  EXPECT_TRUE(cfg.ok()) << cfg.status().ToString();
  o.config = cfg.value();
  o.layout.num_layers = 2;
  o.layout.num_kv_heads = 2;
  o.layout.head_dim = 4;
  o.layout.block_size = 4;
  o.layout.num_blocks = 64;
  o.layout.dtype = KvDtype::kF32;
  o.model_fingerprint = 0xabcdef0123456789ull;
  o.role_name = role;
  return o;
}

TEST(PdConnectorHandshake, LoopbackPairHandshakesOverHttp) {
  auto p = PdConnector::Create(Options("prefill", "p-test"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto d = PdConnector::Create(Options("decode", "d-test"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*p)->engine_id(), "p-test");
  EXPECT_EQ((*d)->engine_id(), "d-test");
  EXPECT_EQ((*p)->kv_memory().size(), Options("prefill", "x").layout.total_bytes());
  EXPECT_EQ((*p)->stats().handshakes, 0);

  HandshakeServer server(**p);
  ASSERT_GT(server.port, 0);
  auto peer = (*d)->EnsurePeer("127.0.0.1", server.port);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  EXPECT_EQ(*peer, "p-test");
  EXPECT_EQ((*p)->stats().handshakes, 1);
  EXPECT_EQ((*d)->stats().handshakes, 1);

  // What each side told the other: the documented fields, self-consistent.
  auto dinfo = HandshakeInfo::FromJson(server.last_request);
  ASSERT_TRUE(dinfo.ok()) << dinfo.status().ToString();
  EXPECT_EQ(dinfo->engine_id, "d-test");
  EXPECT_EQ(dinfo->role, "decode");
  EXPECT_EQ(dinfo->transfer_backend, "loopback");
  EXPECT_EQ(dinfo->connector_version, kConnectorVersion);
  EXPECT_EQ(dinfo->model_fingerprint, 0xabcdef0123456789ull);
  EXPECT_EQ(dinfo->layout, Options("decode", "x").layout);
  EXPECT_EQ(dinfo->lease_ms, 30000);
  EXPECT_EQ(dinfo->watchdog_ms, 10000);
  EXPECT_FALSE(dinfo->agent_metadata.empty());
  auto pinfo = HandshakeInfo::FromJson(server.last_answer);
  ASSERT_TRUE(pinfo.ok()) << pinfo.status().ToString();
  EXPECT_EQ(pinfo->engine_id, "p-test");
  EXPECT_EQ(pinfo->role, "prefill");
  EXPECT_EQ(pinfo->CompatHash(), dinfo->CompatHash());
  EXPECT_NE(pinfo->incarnation, 0u);

  // Cached: a second EnsurePeer does not handshake again.
  peer = (*d)->EnsurePeer("127.0.0.1", server.port);
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ((*p)->stats().handshakes, 1);
  EXPECT_EQ((*d)->stats().handshakes, 1);

  // Idempotent: the same document again is answered (and not counted again).
  auto again = (*p)->HandleHandshake(server.last_request);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ((*again)["engine_id"], "p-test");
  EXPECT_EQ((*p)->stats().handshakes, 1);
}

TEST(PdConnectorHandshake, HandleHandshakeRefusals) {
  auto p = PdConnector::Create(Options("prefill", "p-ref"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  auto d = PdConnector::Create(Options("decode", "d-ref"));
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  HandshakeServer server(**p);
  ASSERT_TRUE((*d)->EnsurePeer("127.0.0.1", server.port).ok());
  const nlohmann::json ddoc = server.last_request;  // d's own document
  const nlohmann::json pdoc = server.last_answer;   // p's own document

  // Malformed: kInvalidArgument.
  auto r = (*p)->HandleHandshake(nlohmann::json::array());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  auto bad = ddoc;
  bad.erase("layout");
  r = (*p)->HandleHandshake(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);

  // Incompatible: kFailedPrecondition naming the field (a differently shaped decode peer).
  HandshakeInfo other = HandshakeInfo::FromJson(ddoc).value();
  other.engine_id = "d-other";
  other.layout.block_size = 8;
  r = (*p)->HandleHandshake(other.ToJson());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "block_size: 4 here, 8 on peer 'd-other'");

  // Its own document (same engine_id) is refused.
  r = (*p)->HandleHandshake(pdoc);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);

  // Decode refuses a prefill whose lease does not outlast its watchdog + 1 s.
  HandshakeInfo short_lease = HandshakeInfo::FromJson(pdoc).value();
  short_lease.engine_id = "p-short";
  short_lease.lease_ms = 11000;
  r = (*d)->HandleHandshake(short_lease.ToJson());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message().rfind("lease_ms:", 0), 0u) << r.status().message();

  // Undecodable agent metadata: kUnavailable.
  HandshakeInfo junk = HandshakeInfo::FromJson(ddoc).value();
  junk.engine_id = "d-junk";
  junk.agent_metadata = {1, 2, 3};
  r = (*p)->HandleHandshake(junk.ToJson());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().ToString();

  // An incompatible peer reached over HTTP: EnsurePeer maps the 409 to kFailedPrecondition.
  auto p2opts = Options("prefill", "p-wide");
  p2opts.layout.head_dim = 8;
  auto p2 = PdConnector::Create(p2opts);
  ASSERT_TRUE(p2.ok());
  HandshakeServer server2(**p2);
  auto e = (*d)->EnsurePeer("127.0.0.1", server2.port);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("head_dim"), std::string::npos) << e.status().message();
  // Unreachable: kUnavailable.
  e = (*d)->EnsurePeer("127.0.0.1", 1);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnavailable);
}

// An https prefill instance (serve --ssl-certfile): the decode side's handshake goes over TLS
// when the leg says "remote_scheme": "https", verified against its --ssl-ca-certs; an untrusted
// certificate is refused naming the verification, and nothing is sent in plain HTTP instead.
TEST(PdConnectorHandshake, HandshakesWithAnHttpsPeerOverVerifiedTls) {
  const ::kvpush::testing::TempTlsTestFiles tmp;
  const ::kvpush::testing::TlsTestFiles& pki = tmp.files();
  ASSERT_TRUE(pki.ok);
  auto p = PdConnector::Create(Options("prefill", "p-tls"));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HandshakeServer server(**p, pki.server_cert, pki.server_key);
  ASSERT_GT(server.port, 0);

  auto untrusting = Options("decode", "d-other-ca");
  untrusting.tls_ca_file = pki.other_ca_cert;
  auto d1 = PdConnector::Create(untrusting);
  ASSERT_TRUE(d1.ok()) << d1.status().ToString();
  auto refused = (*d1)->EnsurePeer("127.0.0.1", server.port, {}, /*https=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("TLS certificate verification failed"),
            std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("https://127.0.0.1:"), std::string::npos)
      << refused.status().message();
  EXPECT_TRUE(server.requests.empty());

  auto trusting = Options("decode", "d-tls");
  trusting.tls_ca_file = pki.ca_cert;
  auto d = PdConnector::Create(trusting);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  // Plain HTTP to the TLS port gets no handshake (the leg must say https).
  auto plain = (*d)->EnsurePeer("127.0.0.1", server.port);
  EXPECT_FALSE(plain.ok());
  EXPECT_TRUE(server.requests.empty());
  auto peer = (*d)->EnsurePeer("127.0.0.1", server.port, {}, /*https=*/true);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  EXPECT_EQ(*peer, "p-tls");
  EXPECT_EQ(server.requests.size(), 1u);
  EXPECT_EQ((*d)->stats().handshakes, 1);
}

}  // namespace
}  // namespace kvpush::connector
