// Two in-process PdConnectors (loopback backend) with --kv-auth-key-file: the same key
// handshakes over HTTP in two steps and neither document leaves before the peer proved the key;
// a wrong key, a missing key (either way round) and forged handshake steps are refused, counted by
// kind, and adopt nothing. Bad key files fail PdConnector::Create with a clear error.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "connector/handshake_server.h"
#include "connector/pd_connector.h"

namespace kvpush::connector {
namespace {

class PdConnectorAuth : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("kvpush_pd_auth_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    key_ = WriteKey("key", std::string(40, 'k'), 0600);
    other_key_ = WriteKey("other", std::string(40, 'o'), 0600);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteKey(const std::string& name, const std::string& content, mode_t mode) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }

  static ConnectorOptions Options(const std::string& role, const std::string& id,
                                  const std::string& key_file) {
    ConnectorOptions o;
    auto cfg = KvTransferConfig::Parse(
        R"({"kv_connector_extra_config": {"backend": "loopback", "engine_id": ")" + id + "\"}}",
        role);
    EXPECT_TRUE(cfg.ok()) << cfg.status().ToString();
    o.config = cfg.value();
    o.layout = KvLayout{2, 2, 4, 4, 64, KvDtype::kF32};
    o.model_fingerprint = 0xa11;
    o.role_name = role;
    o.auth_key_file = key_file;
    return o;
  }
  static std::unique_ptr<PdConnector> Make(const std::string& role, const std::string& id,
                                           const std::string& key_file) {
    auto c = PdConnector::Create(Options(role, id, key_file));
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }
  static int64_t Failures(const PdConnector& c, AuthFailure f) {
    return c.stats().auth_failures[static_cast<size_t>(f)];
  }

  std::filesystem::path dir_;
  std::string key_, other_key_;
};

TEST_F(PdConnectorAuth, SameKeyHandshakesInTwoStepsAndNoDocumentLeavesBeforeTheProof) {
  auto p = Make("prefill", "p-auth", key_);
  auto d = Make("decode", "d-auth", key_);
  ASSERT_TRUE(p && d);
  HandshakeServer server(*p);
  auto peer = d->EnsurePeer("127.0.0.1", server.port);
  ASSERT_TRUE(peer.ok()) << peer.status().ToString();
  EXPECT_EQ(*peer, "p-auth");
  EXPECT_EQ(p->stats().handshakes, 1);
  EXPECT_EQ(d->stats().handshakes, 1);
  EXPECT_TRUE(p->stats().auth_enabled);
  ASSERT_EQ(server.requests.size(), 2u);
  // Step 1 (hello) and its answer (challenge) carry no document, no agent metadata.
  EXPECT_EQ(server.requests[0]["kv_auth"]["step"], "hello");
  EXPECT_FALSE(server.requests[0].contains("document"));
  EXPECT_EQ(server.requests[0].dump().find("agent_metadata"), std::string::npos);
  EXPECT_EQ(server.answers[0].dump().find("agent_metadata"), std::string::npos);
  // Step 2: D's document with its proof, answered by P's document with P's MAC.
  EXPECT_EQ(server.requests[1]["kv_auth"]["step"], "proof");
  auto ddoc = HandshakeInfo::FromJson(
      nlohmann::json::parse(server.requests[1]["document"].get<std::string>()));
  ASSERT_TRUE(ddoc.ok()) << ddoc.status().ToString();
  EXPECT_EQ(ddoc->engine_id, "d-auth");
  auto pdoc = HandshakeInfo::FromJson(
      nlohmann::json::parse(server.answers[1]["document"].get<std::string>()));
  ASSERT_TRUE(pdoc.ok()) << pdoc.status().ToString();
  EXPECT_EQ(pdoc->engine_id, "p-auth");
  for (size_t k = 0; k < kNumAuthFailures; ++k) {
    EXPECT_EQ(p->stats().auth_failures[k], 0);
    EXPECT_EQ(d->stats().auth_failures[k], 0);
  }

  // Replaying the recorded proof is refused (the server nonce was used) and adopts nothing.
  auto replay = p->HandleHandshake(server.requests[1], "10.0.0.9:4444");
  ASSERT_FALSE(replay.ok());
  EXPECT_EQ(replay.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Failures(*p, AuthFailure::kHandshakeReplay), 1);
  EXPECT_EQ(p->stats().handshakes, 1);
}

TEST_F(PdConnectorAuth, WrongKeyIsRefusedBeforeEitherDocumentIsSent) {
  auto p = Make("prefill", "p-auth", key_);
  auto d = Make("decode", "d-auth", other_key_);
  ASSERT_TRUE(p && d);
  HandshakeServer server(*p);
  auto peer = d->EnsurePeer("127.0.0.1", server.port);
  ASSERT_FALSE(peer.ok());
  EXPECT_EQ(peer.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(peer.status().message().find("different key"), std::string::npos)
      << peer.status().message();
  ASSERT_EQ(server.requests.size(), 1u);  // the hello only: D stopped at P's challenge
  EXPECT_EQ(Failures(*d, AuthFailure::kHandshakeBadMac), 1);
  EXPECT_EQ(p->stats().handshakes, 0);
  EXPECT_EQ(d->stats().handshakes, 0);

  // A proof made with the wrong key for a nonce P really issued: refused by P, counted.
  auto challenge = p->HandleHandshake(
      {{"kv_auth", {{"step", "hello"}, {"client_nonce", std::string(32, 'a')}}}});
  ASSERT_TRUE(challenge.ok());
  auto forged = PeerAuth::FromKey(std::vector<uint8_t>(40, 'o'));
  ASSERT_TRUE(forged.ok());
  const nlohmann::json proof = (*forged)->ClientProof({{"engine_id", "evil"}}, std::string(32, 'a'),
                                                      (*challenge)["kv_auth"]["server_nonce"]);
  auto r = p->HandleHandshake(proof, "10.0.0.9:4444");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Failures(*p, AuthFailure::kHandshakeBadMac), 1);
  EXPECT_EQ(p->stats().handshakes, 0);
}

TEST_F(PdConnectorAuth, KeyedAndUnkeyedInstancesRefuseEachOtherWithAClearError) {
  auto keyed_p = Make("prefill", "p-keyed", key_);
  auto plain_p = Make("prefill", "p-plain", "");
  auto keyed_d = Make("decode", "d-keyed", key_);
  auto plain_d = Make("decode", "d-plain", "");
  ASSERT_TRUE(keyed_p && plain_p && keyed_d && plain_d);
  EXPECT_FALSE(plain_p->stats().auth_enabled);
  HandshakeServer keyed_server(*keyed_p), plain_server(*plain_p);

  // An unkeyed D's plain document: the keyed P refuses it without reading it.
  auto e = plain_d->EnsurePeer("127.0.0.1", keyed_server.port);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("requires authenticated peers"), std::string::npos)
      << e.status().message();
  EXPECT_EQ(Failures(*keyed_p, AuthFailure::kHandshakeNoAuth), 1);
  EXPECT_EQ(keyed_p->stats().handshakes, 0);

  // A keyed D's hello: the unkeyed P says it has no key.
  e = keyed_d->EnsurePeer("127.0.0.1", plain_server.port);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(e.status().message().find("no --kv-auth-key-file"), std::string::npos)
      << e.status().message();
  EXPECT_EQ(plain_p->stats().handshakes, 0);
  EXPECT_EQ(keyed_d->stats().handshakes, 0);
}

TEST_F(PdConnectorAuth, BadKeyFilesFailCreateNamingTheProblem) {
  struct Case {
    const char* name;
    std::string path;
    const char* says;
  };
  const Case cases[] = {
      {"world_readable", WriteKey("wr", std::string(40, 'k'), 0644), "chmod 600"},
      {"short", WriteKey("short", std::string(31, 'k'), 0600), "at least 32"},
      {"missing", (dir_ / "absent").string(), "absent"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto conn = PdConnector::Create(Options("prefill", "p-bad", c.path));
    ASSERT_FALSE(conn.ok());
    EXPECT_NE(conn.status().message().find("--kv-auth-key-file"), std::string::npos)
        << conn.status().message();
    EXPECT_NE(conn.status().message().find(c.says), std::string::npos) << conn.status().message();
  }
}

}  // namespace
}  // namespace kvpush::connector
