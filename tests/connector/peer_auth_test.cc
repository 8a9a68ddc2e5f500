// PeerAuth (--kv-auth-key-file, docs/pd_protocol.md §5): the key file checks, the two-step
// MAC'd handshake and its refusals, and every message type sealed, then forged (bad MAC, tampered
// body, no MAC, replayed, other key, reflected, other peer): each refused and counted by kind.
// Pure: no processes, sockets or sleeps.
#include "connector/peer_auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "connector/block_list.h"
#include "connector/messages.h"

namespace kvpush::connector {
namespace {

std::vector<uint8_t> Key(char c) {
  return std::vector<uint8_t>(32, static_cast<uint8_t>(c));
}

std::unique_ptr<PeerAuth> Auth(char key, const std::string& self) {
  auto a = PeerAuth::FromKey(Key(key));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  (*a)->set_self(self);
  return std::move(a).value();
}

int64_t Count(const PeerAuth& a, AuthFailure f) {
  return a.failures()[static_cast<size_t>(f)];
}

int64_t Total(const PeerAuth& a) {
  int64_t n = 0;
  for (int64_t v : a.failures()) n += v;
  return n;
}

/// Runs the whole authenticated handshake client -> server in memory; returns the server's
/// answer to the proof (or its error).
Result<nlohmann::json> Handshake(PeerAuth& client, const std::string& client_id, PeerAuth& server,
                                 const std::string& server_id) {
  std::string nc;
  const nlohmann::json hello = client.ClientHello(nc);
  KVP_ASSIGN_OR_RETURN(nlohmann::json challenge, server.AnswerHello(hello));
  KVP_ASSIGN_OR_RETURN(std::string ns, client.CheckChallenge(challenge, nc, "server"));
  const nlohmann::json proof = client.ClientProof({{"engine_id", client_id}}, nc, ns);
  KVP_ASSIGN_OR_RETURN(PeerAuth::Proof p, server.CheckProof(proof, "client"));
  server.AddSession(client_id, p.nc, p.ns);
  const nlohmann::json answer = server.SignServerDocument({{"engine_id", server_id}}, p.nc, p.ns);
  KVP_ASSIGN_OR_RETURN(nlohmann::json doc, client.CheckServerDocument(answer, nc, ns, "server"));
  client.AddSession(server_id, nc, ns);
  return doc;
}

class KeyFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("kvpush_auth_key_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& content, mode_t mode) {
    std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << content;
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(KeyFileTest, OwnerOnlyKeyOfAtLeast32BytesIsAcceptedAndItsTrailingNewlineIgnored) {
  const std::string key(32, 'k');
  auto a = PeerAuth::FromKeyFile(Write("ok", key + "\n", 0600));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  auto b = PeerAuth::FromKeyFile(Write("ok400", key, 0400));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  (*a)->set_self("a");
  (*b)->set_self("b");
  // The newline is not part of the key: both files hold the same key.
  EXPECT_TRUE(Handshake(**a, "a", **b, "b").ok());
}

TEST_F(KeyFileTest, ReadableByOthersShortOrMissingKeyFilesAreRefusedWithAClearError) {
  struct Case {
    const char* name;
    std::string content;
    mode_t mode;
    StatusCode code;
    const char* says;
  };
  const Case cases[] = {
      {"world_readable", std::string(32, 'k'), 0604, StatusCode::kFailedPrecondition, "chmod 600"},
      {"mode_644", std::string(32, 'k'), 0644, StatusCode::kFailedPrecondition, "mode 0644"},
      {"group_writable", std::string(32, 'k'), 0620, StatusCode::kFailedPrecondition, "chmod 600"},
      {"short", std::string(31, 'k'), 0600, StatusCode::kFailedPrecondition,
       "31 bytes, at least 32"},
      {"short_with_newline", std::string(31, 'k') + "\n", 0600, StatusCode::kFailedPrecondition,
       "at least 32"},
      {"empty", "", 0600, StatusCode::kFailedPrecondition, "at least 32"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = Write(c.name, c.content, c.mode);
    auto a = PeerAuth::FromKeyFile(path);
    ASSERT_FALSE(a.ok());
    EXPECT_EQ(a.status().code(), c.code);
    EXPECT_NE(a.status().message().find(c.says), std::string::npos) << a.status().message();
    EXPECT_NE(a.status().message().find(path), std::string::npos) << a.status().message();
  }
  auto missing = PeerAuth::FromKeyFile((dir_ / "absent").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kIoError);
  EXPECT_FALSE(PeerAuth::FromKey(std::vector<uint8_t>(31, 1)).ok());
}

TEST(PeerAuthHandshake, SameKeyCompletesAndYieldsTheServersDocument) {
  auto c = Auth('k', "d-0");
  auto s = Auth('k', "p-0");
  auto doc = Handshake(*c, "d-0", *s, "p-0");
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_EQ((*doc)["engine_id"], "p-0");
  EXPECT_EQ(Total(*c), 0);
  EXPECT_EQ(Total(*s), 0);
}

TEST(PeerAuthHandshake, HelloAndChallengeCarryNoDocument) {
  auto c = Auth('k', "d-0");
  auto s = Auth('k', "p-0");
  std::string nc;
  const nlohmann::json hello = c->ClientHello(nc);
  EXPECT_EQ(nc.size(), 32u);
  EXPECT_FALSE(hello.contains("document"));
  auto challenge = s->AnswerHello(hello);
  ASSERT_TRUE(challenge.ok());
  EXPECT_FALSE(challenge->contains("document"));
  EXPECT_EQ((*challenge)["kv_auth"]["client_nonce"], nc);
  // Fresh nonces: two hellos, two different client and server nonces.
  std::string nc2;
  auto challenge2 = s->AnswerHello(c->ClientHello(nc2));
  ASSERT_TRUE(challenge2.ok());
  EXPECT_NE(nc, nc2);
  EXPECT_NE((*challenge)["kv_auth"]["server_nonce"], (*challenge2)["kv_auth"]["server_nonce"]);
}

TEST(PeerAuthHandshake, ClientWithTheWrongKeyNeverSendsItsDocument) {
  auto c = Auth('x', "d-0");
  auto s = Auth('k', "p-0");
  std::string nc;
  auto challenge = s->AnswerHello(c->ClientHello(nc));
  ASSERT_TRUE(challenge.ok());
  auto ns = c->CheckChallenge(*challenge, nc, "127.0.0.1:1");
  ASSERT_FALSE(ns.ok());  // the server did not prove *our* key: stop before the document
  EXPECT_EQ(ns.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(Count(*c, AuthFailure::kHandshakeBadMac), 1);
}

TEST(PeerAuthHandshake, ProofsWithoutTheKeyReplayedOrTamperedAreRefusedAndCounted) {
  auto c = Auth('k', "d-0");
  auto s = Auth('k', "p-0");
  auto attacker = Auth('x', "d-0");
  std::string nc;
  auto challenge = s->AnswerHello(c->ClientHello(nc));
  ASSERT_TRUE(challenge.ok());
  const std::string ns = (*challenge)["kv_auth"]["server_nonce"];

  // A proof made with another key: bad MAC (and the nonce stays usable by the real client).
  auto forged = s->CheckProof(attacker->ClientProof({{"engine_id", "d-0"}}, nc, ns), "evil");
  ASSERT_FALSE(forged.ok());
  EXPECT_EQ(Count(*s, AuthFailure::kHandshakeBadMac), 1);

  // A genuine proof whose document was changed in transit.
  nlohmann::json proof = c->ClientProof({{"engine_id", "d-0"}}, nc, ns);
  nlohmann::json tampered = proof;
  tampered["document"] = nlohmann::json{{"engine_id", "evil"}}.dump();
  EXPECT_FALSE(s->CheckProof(tampered, "evil").ok());
  EXPECT_EQ(Count(*s, AuthFailure::kHandshakeBadMac), 2);
  nlohmann::json no_mac = proof;
  no_mac["kv_auth"].erase("mac");
  EXPECT_FALSE(s->CheckProof(no_mac, "evil").ok());

  // The genuine proof is accepted once; the same proof again (recorded) is a replay.
  auto ok = s->CheckProof(proof, "client");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->document["engine_id"], "d-0");
  EXPECT_FALSE(s->CheckProof(proof, "evil").ok());
  EXPECT_EQ(Count(*s, AuthFailure::kHandshakeReplay), 1);

  // Replayed into another instance with the same key: that one never issued the nonce.
  auto other = Auth('k', "p-1");
  EXPECT_FALSE(other->CheckProof(proof, "evil").ok());
  EXPECT_EQ(Count(*other, AuthFailure::kHandshakeReplay), 1);
}

TEST(PeerAuthHandshake, ServerDocumentIsCheckedAgainstTheClientsNonces) {
  auto c = Auth('k', "d-0");
  auto s = Auth('k', "p-0");
  auto attacker = Auth('x', "p-0");
  const std::string nc(32, 'a'), ns(32, 'b');
  EXPECT_FALSE(
      c->CheckServerDocument(attacker->SignServerDocument({{"e", 1}}, nc, ns), nc, ns, "s").ok());
  // A document signed for another handshake (recorded earlier) does not verify for this one.
  const std::string other(32, 'c');
  EXPECT_FALSE(
      c->CheckServerDocument(s->SignServerDocument({{"e", 1}}, other, ns), nc, ns, "s").ok());
  EXPECT_EQ(Count(*c, AuthFailure::kHandshakeBadMac), 2);
  // An unauthenticated answer (an unkeyed peer's plain document).
  EXPECT_FALSE(c->CheckServerDocument({{"engine_id", "p-0"}}, nc, ns, "s").ok());
  EXPECT_FALSE(c->CheckChallenge({{"engine_id", "p-0"}}, nc, "s").ok());
  EXPECT_EQ(Count(*c, AuthFailure::kHandshakeNoAuth), 2);
  EXPECT_TRUE(c->CheckServerDocument(s->SignServerDocument({{"e", 1}}, nc, ns), nc, ns, "s").ok());
}

// ---- messages ----

/// One valid message of every type (docs/pd_protocol.md §3).
std::vector<PdMessage> EveryMessageType() {
  const std::string tid(32, 'a');
  std::vector<PdMessage> out;
  for (uint8_t t = 1; t <= 10; ++t) {
    PdMessage m;
    m.tag = static_cast<MsgTag>(t);
    m.transfer_id = tid;
    m.token_id = 1;
    if (m.tag == MsgTag::kPushTarget || m.tag == MsgTag::kPinned) {
      m.block_ids = {4, 5, 6};
      m.num_blocks = 3;
    }
    if (m.tag == MsgTag::kPin || m.tag == MsgTag::kLayerReady) m.num_blocks = 2;
    if (m.tag == MsgTag::kTransferFailed) m.message = "no";
    out.push_back(m);
  }
  return out;
}

class MessageAuthTest : public ::testing::Test {
 protected:
  MessageAuthTest() : p_(Auth('k', "p-0")), d_(Auth('k', "d-0")), evil_(Auth('x', "p-0")) {
    EXPECT_TRUE(Handshake(*d_, "d-0", *p_, "p-0").ok());
    // The attacker has sessions of its own, under another key, claiming to be P.
    EXPECT_TRUE(Handshake(*evil_, "p-0", *Auth('x', "d-0"), "d-0").ok());
  }
  std::unique_ptr<PeerAuth> p_, d_, evil_;
};

TEST_F(MessageAuthTest, EveryTypeIsAcceptedOnceSealedAndRefusedForgedInEveryWay) {
  for (const PdMessage& m : EveryMessageType()) {
    SCOPED_TRACE("tag " + std::to_string(static_cast<int>(m.tag)));
    auto bytes = EncodeMessage(m);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto sealed = p_->Seal("d-0", *bytes);
    ASSERT_TRUE(sealed.ok());
    ASSERT_EQ(sealed->size(), bytes->size() + PeerAuth::kTrailerBytes);

    struct Forgery {
      const char* name;
      std::vector<uint8_t> payload;
      std::string claimed_sender;
      AuthFailure kind;
    };
    std::vector<uint8_t> bad_mac = *sealed;
    bad_mac.back() ^= 1;
    std::vector<uint8_t> tampered = *sealed;
    tampered[1] ^= 1;  // a transfer id character
    std::vector<uint8_t> truncated(sealed->begin(), sealed->end() - 1);
    auto other_key = evil_->Seal("d-0", *bytes);
    ASSERT_TRUE(other_key.ok());
    auto reflected = d_->Seal("p-0", *bytes);  // D's own message, sent back to D as P's
    ASSERT_TRUE(reflected.ok());
    const std::vector<Forgery> forgeries = {
        {"bad_mac", bad_mac, "p-0", AuthFailure::kMessageBadMac},
        {"tampered_body", tampered, "p-0", AuthFailure::kMessageBadMac},
        {"no_mac", *bytes, "p-0", AuthFailure::kMessageNoMac},
        {"truncated_trailer", truncated, "p-0", AuthFailure::kMessageNoMac},
        {"other_key", *other_key, "p-0", AuthFailure::kMessageUnknownSession},
        {"reflected", *reflected, "p-0", AuthFailure::kMessageBadMac},
        {"other_peer", *sealed, "p-1", AuthFailure::kMessageUnknownSession},
    };
    for (const Forgery& f : forgeries) {
      SCOPED_TRACE(f.name);
      const int64_t before = Count(*d_, f.kind);
      const int64_t total = Total(*d_);
      auto r = d_->Open(f.claimed_sender, f.payload);
      EXPECT_FALSE(r.ok());
      EXPECT_EQ(Count(*d_, f.kind), before + 1);
      EXPECT_EQ(Total(*d_), total + 1);
    }
    // The genuine one, after all the forgeries (they did not move the replay window): accepted,
    // and yields exactly the message.
    auto opened = d_->Open("p-0", *sealed);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    EXPECT_EQ(std::vector<uint8_t>(opened->begin(), opened->end()), *bytes);
    auto decoded = DecodeMessage(*opened);
    ASSERT_TRUE(decoded.ok());
    EXPECT_EQ(decoded->tag, m.tag);
    // Replayed: refused.
    const int64_t replays = Count(*d_, AuthFailure::kMessageReplay);
    EXPECT_FALSE(d_->Open("p-0", *sealed).ok());
    EXPECT_EQ(Count(*d_, AuthFailure::kMessageReplay), replays + 1);
  }
}

TEST_F(MessageAuthTest, LargestMessagesStillFitANotificationFrame) {
  PdMessage m;
  m.tag = MsgTag::kPinned;
  m.transfer_id = std::string(32, 'a');
  m.top_logprobs.assign(kMaxTopLogprobs, {0x7fffffff, -1.0f});
  // The largest part: ids so scattered that each is a run of its own, up to the byte budget.
  for (int32_t id = 0x7fff0000; BlockRunsBytes(m.block_ids) + 10 <= kMaxBlockListBytes; id += 2) {
    m.block_ids.push_back(id);
  }
  m.num_blocks = kMaxTransferBlocks;
  auto bytes = EncodeMessage(m);
  ASSERT_TRUE(bytes.ok());
  auto sealed = p_->Seal("d-0", *bytes);
  ASSERT_TRUE(sealed.ok());
  EXPECT_LE(sealed->size(), 4096u);  // xfer's notification frame limit
}

TEST_F(MessageAuthTest, ReorderingWithinTheWindowIsAcceptedOnceAndOlderIsRefused) {
  const std::vector<uint8_t> msg = {4, 'x'};
  std::vector<std::vector<uint8_t>> sealed;
  sealed.reserve(5);
  for (int i = 0; i < 5; ++i) sealed.push_back(*p_->Seal("d-0", msg));
  for (int i : {0, 3, 1, 4, 2}) EXPECT_TRUE(d_->Open("p-0", sealed[i]).ok()) << i;
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(d_->Open("p-0", sealed[i]).ok()) << i;
  EXPECT_EQ(Count(*d_, AuthFailure::kMessageReplay), 5);
  // One message held back past the window is refused as too old, even never seen.
  const auto late = *p_->Seal("d-0", msg);
  for (uint64_t i = 0; i < PeerAuth::kReplayWindow; ++i) {
    ASSERT_TRUE(d_->Open("p-0", *p_->Seal("d-0", msg)).ok());
  }
  EXPECT_FALSE(d_->Open("p-0", late).ok());
  EXPECT_EQ(Count(*d_, AuthFailure::kMessageReplay), 6);
}

TEST_F(MessageAuthTest, BothDirectionsAndOlderSessionsOfAPeerAreAccepted) {
  const std::vector<uint8_t> msg = {5, 'y'};
  EXPECT_TRUE(p_->Open("d-0", *d_->Seal("p-0", msg)).ok());
  const auto old = *p_->Seal("d-0", msg);
  // A second handshake the other way round: P now seals with the new session; D still opens a
  // message sealed under the first one (handshakes may cross).
  ASSERT_TRUE(Handshake(*p_, "p-0", *d_, "d-0").ok());
  EXPECT_TRUE(d_->Open("p-0", *p_->Seal("d-0", msg)).ok());
  EXPECT_TRUE(d_->Open("p-0", old).ok());
  EXPECT_EQ(Total(*d_), 0);
  EXPECT_EQ(Total(*p_), 0);
  // No session: Seal refuses.
  EXPECT_FALSE(p_->Seal("nobody", msg).ok());
  d_->DropSessions("p-0");
  EXPECT_FALSE(d_->Open("p-0", *p_->Seal("d-0", msg)).ok());
  EXPECT_EQ(Count(*d_, AuthFailure::kMessageUnknownSession), 1);
}

TEST(PeerAuthNames, EveryFailureKindHasAMetricLabel) {
  std::set<std::string_view> names;
  for (size_t k = 0; k < kNumAuthFailures; ++k) {
    names.insert(AuthFailureName(static_cast<AuthFailure>(k)));
  }
  EXPECT_EQ(names.size(), kNumAuthFailures);
  EXPECT_EQ(names.count("unknown"), 0u);
}

}  // namespace
}  // namespace kvpush::connector
