// TransferCore with authenticated peers (set_auth, --kv-auth-key-file): every message type a
// peer can send, forged (bad MAC, no MAC, replayed, another key, reflected), is refused and
// counted and changes nothing in the core (states, actions, counters); the genuine sealed one
// reaches it. No processes, threads or sleeps.
#include <gtest/gtest.h>

#include <sstream>

#include "connector/peer_auth.h"
#include "connector/transfer_core.h"
#include "core_fakes.h"

namespace kvpush::connector::test {
namespace {

using Mode = pd::KvTransferParams::Mode;

constexpr const char* kSelf = "self-0";

std::unique_ptr<PeerAuth> MakeAuth(char key, const std::string& self) {
  auto a = PeerAuth::FromKey(std::vector<uint8_t>(32, static_cast<uint8_t>(key)));
  EXPECT_TRUE(a.ok());
  (*a)->set_self(self);
  return std::move(a).value();
}

/// The authenticated handshake client -> server, in memory; both add the session.
void Handshake(PeerAuth& client, const std::string& client_id, PeerAuth& server,
               const std::string& server_id) {
  std::string nc;
  auto challenge = server.AnswerHello(client.ClientHello(nc));
  ASSERT_TRUE(challenge.ok());
  auto ns = client.CheckChallenge(*challenge, nc, server_id);
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  auto proof = server.CheckProof(client.ClientProof({{"engine_id", client_id}}, nc, *ns), "c");
  ASSERT_TRUE(proof.ok()) << proof.status().ToString();
  server.AddSession(client_id, nc, *ns);
  client.AddSession(server_id, nc, *ns);
}

/// Every message type, from the peer that would send it, aimed at the transfer it would affect.
struct Case {
  const char* name;
  const char* from;
  PdMessage msg;
};

class AuthCoreTest : public CoreTest {
 protected:
  static std::vector<Case> Cases();
  AuthCoreTest()
      : self_(MakeAuth('k', kSelf)),
        p_(MakeAuth('k', kP)),
        d_(MakeAuth('k', kD)),
        evil_(MakeAuth('x', kD)) {
    Handshake(*d_, kD, *self_, kSelf);  // this instance as P: D handshook with it
    Handshake(*self_, kSelf, *p_, kP);  // this instance as D: it handshook with P
    auto other = MakeAuth('x', kSelf);
    Handshake(*evil_, kD, *other, kSelf);
    evil_p_ = MakeAuth('x', kP);
    Handshake(*evil_p_, kP, *other, kSelf);
    Reset();
  }
  /// A fresh core (authenticated by self_) with a held pull lease (transfer 1, from P's view)
  /// and a push consumer awaiting KV (transfer 2, from D's view).
  void Reset() {
    Rebuild();
    core_->set_auth(self_.get());
    StartProducer(1, Tid(1), Mode::kPull);
    FinishProducer(1);
    StartConsumer(2, Tid(2), Mode::kPush);
    rec_.Clear();
  }
  /// Everything a message could change: both transfers' states, the actions, the counters.
  std::string Snapshot() const {
    std::ostringstream s;
    auto ps = core_->producer_state(Tid(1));
    auto cs = core_->consumer_state(Tid(2));
    const ConnectorStats st = core_->stats();
    s << (ps ? ProducerStateName(*ps) : "none") << "/" << (cs ? ConsumerStateName(*cs) : "none")
      << " actions=" << rec_.log.size() << " bad=" << st.bad_messages
      << " pins_refused=" << st.pins_refused << " not_needed=" << st.not_needed
      << " targets=" << st.push_targets_received << " ready=" << st.kv_ready_received
      << " failed=" << st.transfers_failed << " tomb=" << core_->IsTombstoned(Tid(1));
    return s.str();
  }
  int64_t Failures(AuthFailure f) const { return self_->failures()[static_cast<size_t>(f)]; }

  std::unique_ptr<PeerAuth> self_, p_, d_, evil_, evil_p_;
};

std::vector<Case> AuthCoreTest::Cases() {
  auto sig = [](MsgTag tag, int tid) {
    PdMessage m;
    m.tag = tag;
    m.transfer_id = Tid(tid);
    return m;
  };
  PdMessage target = CoreTest::Target(Tid(1));
  target.num_blocks = 3;
  PdMessage pin = CoreTest::Pin(Tid(1));
  PdMessage failed_p = sig(MsgTag::kTransferFailed, 1);
  failed_p.message = "forged";
  PdMessage failed_d = sig(MsgTag::kTransferFailed, 2);
  failed_d.message = "forged";
  PdMessage ready = sig(MsgTag::kKvReady, 2);
  ready.token_id = 42;
  PdMessage pinned = sig(MsgTag::kPinned, 2);
  pinned.block_ids = {1, 2, 3};
  pinned.num_blocks = 3;
  pinned.num_prompt_tokens = 10;
  pinned.token_id = 42;
  PdMessage layer = sig(MsgTag::kLayerReady, 2);
  layer.layer = 9;  // out of range: the genuine one is counted as a bad message (observable)
  layer.num_blocks = 1;
  return {
      {"push_target", kD, target},
      {"not_needed", kD, sig(MsgTag::kNotNeeded, 1)},
      {"cancel", kD, sig(MsgTag::kCancel, 1)},
      {"release", kD, sig(MsgTag::kRelease, 1)},
      {"pin", kD, pin},
      {"transfer_failed_to_p", kD, failed_p},
      {"kv_ready", kP, ready},
      {"cancel_ack", kP, sig(MsgTag::kCancelAck, 2)},
      {"pinned", kP, pinned},
      {"layer_ready", kP, layer},
      {"transfer_failed_to_d", kP, failed_d},
  };
}

TEST_F(AuthCoreTest, EveryForgedMessageTypeIsRefusedCountedAndChangesNothing) {
  const auto cases = Cases();
  ASSERT_EQ(cases.size(), 11u);  // 10 tags, TRANSFER_FAILED both ways
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Reset();
    const bool from_d = std::string(c.from) == kD;
    PeerAuth& genuine = from_d ? *d_ : *p_;
    PeerAuth& attacker = from_d ? *evil_ : *evil_p_;
    auto bytes = EncodeMessage(c.msg);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto sealed = genuine.Seal(kSelf, *bytes);
    ASSERT_TRUE(sealed.ok());
    std::vector<uint8_t> bad_mac = *sealed;
    bad_mac[bad_mac.size() - 5] ^= 0x40;
    auto other_key = attacker.Seal(kSelf, *bytes);
    ASSERT_TRUE(other_key.ok());
    auto reflected = self_->Seal(c.from, *bytes);  // our own message to that peer, sent back
    ASSERT_TRUE(reflected.ok());
    struct Forgery {
      const char* name;
      std::vector<uint8_t> payload;
      AuthFailure kind;
    };
    const std::vector<Forgery> forgeries = {
        {"bad_mac", bad_mac, AuthFailure::kMessageBadMac},
        {"no_mac", *bytes, AuthFailure::kMessageNoMac},
        {"other_key", *other_key, AuthFailure::kMessageUnknownSession},
        {"reflected", *reflected, AuthFailure::kMessageBadMac},
    };
    const std::string before = Snapshot();
    for (const Forgery& f : forgeries) {
      SCOPED_TRACE(f.name);
      const int64_t n = Failures(f.kind);
      core_->HandleMessage(c.from, f.payload);
      EXPECT_EQ(Failures(f.kind), n + 1);
      EXPECT_EQ(Snapshot(), before);
    }
    // The genuine message reaches the core (the test can fail) ...
    core_->HandleMessage(c.from, *sealed);
    const std::string after = Snapshot();
    EXPECT_NE(after, before);
    // ... once: replayed, it is refused and changes nothing more.
    const int64_t replays = Failures(AuthFailure::kMessageReplay);
    core_->HandleMessage(c.from, *sealed);
    EXPECT_EQ(Failures(AuthFailure::kMessageReplay), replays + 1);
    EXPECT_EQ(Snapshot(), after);
  }
}

TEST_F(AuthCoreTest, WithoutAuthThePlainMessageIsHandledAsBefore) {
  Rebuild();  // no set_auth
  StartProducer(1, Tid(1), Mode::kPull);
  FinishProducer(1);
  Deliver(kD, Pin(Tid(1)));
  EXPECT_EQ(core_->producer_state(Tid(1)), ProducerState::kPinned);
}

}  // namespace
}  // namespace kvpush::connector::test
