// docs/pd_protocol.md §2: the handshake document, its JSON form and the compatibility check.
#include "connector/handshake.h"

#include <gtest/gtest.h>

#include <random>

#include "xfer/metadata.h"

namespace kvpush::connector {
namespace {

HandshakeInfo Info(const std::string& engine_id = "prefill-127.0.0.1:8100",
                   const std::string& role = "prefill") {
  HandshakeInfo h;
  h.engine_id = engine_id;
  h.incarnation = 0x0123456789abcdefull;
  h.role = role;
  h.connector_version = kConnectorVersion;
  h.transfer_backend = "ucx:tcp";
  h.model_fingerprint = 0xfedcba9876543210ull;
  h.layout.num_layers = 5;
  h.layout.num_kv_heads = 4;
  h.layout.head_dim = 8;
  h.layout.block_size = 16;
  h.layout.num_blocks = 4096;
  h.layout.dtype = KvDtype::kF32;
  h.kv_region_index = 3;
  h.kv_region_generation = 7;
  h.lease_ms = 30000;
  h.watchdog_ms = 10000;
  h.agent_metadata = {0, 1, 2, 0xfe, 0xff, 'k', 'v'};
  return h;
}

void ExpectEqual(const HandshakeInfo& a, const HandshakeInfo& b) {
  EXPECT_EQ(a.engine_id, b.engine_id);
  EXPECT_EQ(a.incarnation, b.incarnation);
  EXPECT_EQ(a.role, b.role);
  EXPECT_EQ(a.connector_version, b.connector_version);
  EXPECT_EQ(a.transfer_backend, b.transfer_backend);
  EXPECT_EQ(a.model_fingerprint, b.model_fingerprint);
  EXPECT_EQ(a.layout, b.layout);
  EXPECT_EQ(a.kv_region_index, b.kv_region_index);
  EXPECT_EQ(a.kv_region_generation, b.kv_region_generation);
  EXPECT_EQ(a.lease_ms, b.lease_ms);
  EXPECT_EQ(a.watchdog_ms, b.watchdog_ms);
  EXPECT_EQ(a.agent_metadata, b.agent_metadata);
  EXPECT_EQ(a.CompatHash(), b.CompatHash());
}

// Re-stamps compat_hash after the test edited fields it covers.
void Restamp(nlohmann::json& j) {
  HandshakeInfo x = Info();
  x.model_fingerprint = ParseHex64(j["model_fingerprint"].get<std::string>()).value();
  x.transfer_backend = j["transfer_backend"].get<std::string>();
  x.connector_version = j["connector_version"].get<int>();
  const auto& l = j["layout"];
  x.layout.num_layers = l["num_layers"].get<int>();
  x.layout.num_kv_heads = l["num_kv_heads"].get<int>();
  x.layout.head_dim = l["head_dim"].get<int>();
  x.layout.block_size = l["block_size"].get<int>();
  const std::string dt = l["dtype"].get<std::string>();
  x.layout.dtype = dt == "f16" ? KvDtype::kF16 : dt == "bf16" ? KvDtype::kBF16 : KvDtype::kF32;
  j["compat_hash"] = Hex64(x.CompatHash());
}

TEST(Handshake, JsonHasTheDocumentedShape) {
  const auto j = Info().ToJson();
  EXPECT_EQ(j["engine_id"], "prefill-127.0.0.1:8100");
  EXPECT_EQ(j["incarnation"], "0123456789abcdef");
  EXPECT_EQ(j["role"], "prefill");
  EXPECT_EQ(j["connector_version"], 3);  // 3: KV_READY and PINNED carry the first token's binding
  EXPECT_EQ(j["transfer_backend"], "ucx:tcp");
  EXPECT_EQ(j["model_fingerprint"], "fedcba9876543210");
  EXPECT_EQ(j["layout"]["num_layers"], 5);
  EXPECT_EQ(j["layout"]["num_kv_heads"], 4);
  EXPECT_EQ(j["layout"]["head_dim"], 8);
  EXPECT_EQ(j["layout"]["block_size"], 16);
  EXPECT_EQ(j["layout"]["num_blocks"], 4096);
  EXPECT_EQ(j["layout"]["dtype"], "f32");
  EXPECT_EQ(j["compat_hash"], Hex64(Info().CompatHash()));
  EXPECT_EQ(j["compat_hash"].get<std::string>().size(), 16u);
  EXPECT_EQ(j["lease_ms"], 30000);
  EXPECT_EQ(j["watchdog_ms"], 10000);
  EXPECT_EQ(j["agent_metadata"], "AAEC/v9rdg==");
  EXPECT_EQ(j["kv_region"]["index"], 3);
  EXPECT_EQ(j["kv_region"]["generation"], 7);
}

TEST(Handshake, JsonRoundTrip) {
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16, KvDtype::kBF16}) {
    HandshakeInfo h = Info("decode-0", "decode");
    h.layout.dtype = dt;
    h.agent_metadata.assign(1000, 0xab);
    auto back = HandshakeInfo::FromJson(h.ToJson());
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    ExpectEqual(h, *back);
  }
  // And through text.
  auto back = HandshakeInfo::FromJson(nlohmann::json::parse(Info().ToJson().dump()));
  ASSERT_TRUE(back.ok());
  ExpectEqual(Info(), *back);
}

TEST(Handshake, CompatHashCoversTheDocumentedFieldsOnly) {
  const uint64_t base = Info().CompatHash();
  auto changed = [&](auto edit) {
    HandshakeInfo h = Info();
    edit(h);
    return h.CompatHash() != base;
  };
  EXPECT_TRUE(changed([](HandshakeInfo& h) { h.model_fingerprint ^= 1; }));
  EXPECT_TRUE(changed([](HandshakeInfo& h) { h.layout.num_layers = 6; }));
  EXPECT_TRUE(changed([](HandshakeInfo& h) { h.layout.num_kv_heads = 2; }));
  EXPECT_TRUE(changed([](HandshakeInfo& h) { h.layout.head_dim = 16; }));
  EXPECT_TRUE(changed([](HandshakeInfo& h) { h.layout.block_size = 32; }));
  EXPECT_TRUE(changed([](HandshakeInfo& h) { h.layout.dtype = KvDtype::kF16; }));
  EXPECT_TRUE(changed([](HandshakeInfo& h) { h.connector_version = 1; }));
  EXPECT_TRUE(changed([](HandshakeInfo& h) { h.transfer_backend = "ucx:shm"; }));
  EXPECT_FALSE(changed([](HandshakeInfo& h) { h.layout.num_blocks = 17; }));
  EXPECT_FALSE(changed([](HandshakeInfo& h) { h.engine_id = "other"; }));
  EXPECT_FALSE(changed([](HandshakeInfo& h) { h.incarnation = 1; }));
  EXPECT_FALSE(changed([](HandshakeInfo& h) { h.role = "decode"; }));
  EXPECT_FALSE(changed([](HandshakeInfo& h) { h.lease_ms = 1; }));
  EXPECT_FALSE(changed([](HandshakeInfo& h) { h.agent_metadata.clear(); }));
}

TEST(Handshake, FromJsonRefusesNonObject) {
  for (const char* s : {"null", "[]", "1", "\"x\""}) {
    auto r = HandshakeInfo::FromJson(nlohmann::json::parse(s));
    ASSERT_FALSE(r.ok()) << s;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(Handshake, FromJsonRefusesMissingFields) {
  const auto good = Info().ToJson();
  for (const char* k : {"engine_id", "incarnation", "role", "connector_version", "transfer_backend",
                        "model_fingerprint", "layout", "compat_hash", "lease_ms", "watchdog_ms",
                        "agent_metadata", "kv_region"}) {
    auto j = good;
    j.erase(k);
    auto r = HandshakeInfo::FromJson(j);
    ASSERT_FALSE(r.ok()) << "missing " << k;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(k), std::string::npos)
        << "missing " << k << ": " << r.status().message();
  }
  for (const char* k :
       {"num_layers", "num_kv_heads", "head_dim", "block_size", "num_blocks", "dtype"}) {
    auto j = good;
    j["layout"].erase(k);
    auto r = HandshakeInfo::FromJson(j);
    ASSERT_FALSE(r.ok()) << "missing layout." << k;
    EXPECT_NE(r.status().message().find(k), std::string::npos) << r.status().message();
  }
  for (const char* k : {"index", "generation"}) {
    auto j = good;
    j["kv_region"].erase(k);
    auto r = HandshakeInfo::FromJson(j);
    ASSERT_FALSE(r.ok()) << "missing kv_region." << k;
    EXPECT_NE(r.status().message().find(k), std::string::npos) << r.status().message();
  }
}

TEST(Handshake, FromJsonRefusesWrongTypes) {
  const auto good = Info().ToJson();
  struct Case {
    const char* field;
    nlohmann::json value;
  };
  const std::vector<Case> cases = {
      {"engine_id", 5},
      {"incarnation", 12},
      {"role", true},
      {"connector_version", "1"},
      {"connector_version", 1.5},
      {"transfer_backend", nullptr},
      {"model_fingerprint", 1},
      {"compat_hash", 3},
      {"lease_ms", "30000"},
      {"lease_ms", 3.0e4},
      {"watchdog_ms", false},
      {"agent_metadata", {1, 2}},
      {"layout", "5"},
      {"kv_region", 0},
  };
  for (const auto& c : cases) {
    auto j = good;
    j[c.field] = c.value;
    auto r = HandshakeInfo::FromJson(j);
    ASSERT_FALSE(r.ok()) << c.field << " = " << c.value.dump();
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.field), std::string::npos)
        << c.field << ": " << r.status().message();
  }
  for (const char* k : {"num_layers", "num_kv_heads", "head_dim", "block_size", "num_blocks"}) {
    auto j = good;
    j["layout"][k] = "4";
    auto r = HandshakeInfo::FromJson(j);
    ASSERT_FALSE(r.ok()) << k;
    EXPECT_NE(r.status().message().find(k), std::string::npos) << r.status().message();
  }
  auto j = good;
  j["layout"]["dtype"] = 4;
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
  j["layout"]["dtype"] = "f64";
  auto r = HandshakeInfo::FromJson(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dtype"), std::string::npos);
}

TEST(Handshake, FromJsonRefusesOutOfRangeValues) {
  const auto good = Info().ToJson();
  auto j = good;
  j["engine_id"] = "";
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
  j["engine_id"] = std::string(256, 'e');
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
  j["engine_id"] = std::string(255, 'e');
  EXPECT_TRUE(HandshakeInfo::FromJson(j).ok());
  j = good;
  j["lease_ms"] = -1;
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
  j = good;
  j["watchdog_ms"] = -5;
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
  j = good;
  j["kv_region"]["generation"] = 0;  // generations start at 1
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
  j = good;
  j["kv_region"]["index"] = -1;
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
  j = good;
  j["layout"]["num_blocks"] = 0;
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
}

TEST(Handshake, FromJsonRefusesBadHexAndBase64) {
  const auto good = Info().ToJson();
  for (const char* k : {"incarnation", "model_fingerprint", "compat_hash"}) {
    for (const char* bad : {"", "xyz", "0123456789abcdef0", "12 4", "-1"}) {
      auto j = good;
      j[k] = bad;
      EXPECT_FALSE(HandshakeInfo::FromJson(j).ok()) << k << " = '" << bad << "'";
    }
  }
  for (const char* bad : {"A", "AB=", "A===", "AB=C", "AB*D", "====", "AAAA AAA"}) {
    auto j = good;
    j["agent_metadata"] = bad;
    auto r = HandshakeInfo::FromJson(j);
    ASSERT_FALSE(r.ok()) << "agent_metadata '" << bad << "'";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(Handshake, FromJsonRefusesZeroLayers) {
  auto j = Info().ToJson();
  j["layout"]["num_layers"] = 0;
  Restamp(j);
  auto r = HandshakeInfo::FromJson(j);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("num_layers"), std::string::npos) << r.status().message();
  for (const char* k : {"num_kv_heads", "head_dim", "block_size"}) {
    j = Info().ToJson();
    j["layout"][k] = 0;
    Restamp(j);
    r = HandshakeInfo::FromJson(j);
    ASSERT_FALSE(r.ok()) << k;
    EXPECT_NE(r.status().message().find(k), std::string::npos) << r.status().message();
  }
}

TEST(Handshake, FromJsonRefusesCompatHashMismatch) {
  auto j = Info().ToJson();
  j["compat_hash"] = Hex64(Info().CompatHash() ^ 1);
  auto r = HandshakeInfo::FromJson(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("compat_hash"), std::string::npos);

  // A field covered by the hash changed without re-stamping it.
  j = Info().ToJson();
  j["layout"]["block_size"] = 32;
  r = HandshakeInfo::FromJson(j);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("compat_hash"), std::string::npos);
  Restamp(j);
  r = HandshakeInfo::FromJson(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->layout.block_size, 32);

  j = Info().ToJson();
  j["transfer_backend"] = "ucx:shm";
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
  j = Info().ToJson();
  j["connector_version"] = 1;
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());
  j = Info().ToJson();
  j["model_fingerprint"] = "0000000000000001";
  EXPECT_FALSE(HandshakeInfo::FromJson(j).ok());

  // Fields outside the hash may change freely.
  j = Info().ToJson();
  j["layout"]["num_blocks"] = 12;
  j["lease_ms"] = 5;
  j["engine_id"] = "x";
  EXPECT_TRUE(HandshakeInfo::FromJson(j).ok());
}

TEST(Handshake, CheckCompatibleAcceptsSameShapeDifferentPool) {
  HandshakeInfo p = Info("prefill-0", "prefill");
  HandshakeInfo d = Info("decode-0", "decode");
  d.layout.num_blocks = 100;  // pool size is per instance
  d.incarnation = 99;
  d.kv_region_index = 0;
  EXPECT_TRUE(CheckCompatible(p, d).ok()) << CheckCompatible(p, d).ToString();
  EXPECT_TRUE(CheckCompatible(d, p).ok()) << CheckCompatible(d, p).ToString();
}

// A peer's num_blocks sizes the descriptor lists built for it: checked against a bound and its
// own exported region before anything per block is allocated (a forged 2^31 would be ~240 GiB).
TEST(Handshake, CheckPeerPoolBoundsTheDeclaredPoolByItsRegion) {
  auto with_region = [](HandshakeInfo h, uint64_t length, uint32_t index, uint32_t generation) {
    xfer::AgentMetadata md;
    md.name = h.engine_id;
    md.incarnation = 1;
    md.backend = "ucx:tcp";
    xfer::RegionInfo r;
    r.id.index = index;
    r.id.generation = generation;
    r.length = length;
    md.regions.push_back(r);
    h.agent_metadata = xfer::EncodeMetadata(md).value();
    return h;
  };
  HandshakeInfo p = Info();
  const uint64_t arena = p.layout.total_bytes();
  EXPECT_TRUE(CheckPeerPool(with_region(p, arena, 3, 7)).ok());
  EXPECT_TRUE(CheckPeerPool(with_region(p, arena + 4096, 3, 7)).ok());
  struct Case {
    const char* name;
    HandshakeInfo h;
    const char* field;
  };
  HandshakeInfo huge = p;
  huge.layout.num_blocks = 2147483647;
  HandshakeInfo zero = p;
  zero.layout.num_blocks = 0;
  const Case cases[] = {
      {"arena larger than its region", with_region(p, arena - 1, 3, 7), "num_blocks"},
      {"2^31 blocks", with_region(huge, UINT64_MAX, 3, 7), "num_blocks"},
      {"no blocks", with_region(zero, arena, 3, 7), "num_blocks"},
      {"no such region", with_region(p, arena, 4, 7), "kv_region"},
      {"stale generation", with_region(p, arena, 3, 6), "kv_region"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Status st = CheckPeerPool(c.h);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_EQ(st.message().rfind(c.field, 0), 0u) << st.message();
  }
  EXPECT_FALSE(CheckPeerPool(p).ok());  // metadata that does not decode
}

TEST(Handshake, CheckCompatibleNamesTheFirstDifference) {
  struct Case {
    const char* field;
    std::function<void(HandshakeInfo&)> edit;
    const char* here;
    const char* there;
  };
  const std::vector<Case> cases = {
      {"connector_version", [](HandshakeInfo& h) { h.connector_version = 1; }, "3", "1"},
      {"model_fingerprint", [](HandshakeInfo& h) { h.model_fingerprint = 1; }, "fedcba9876543210",
       "0000000000000001"},
      {"num_layers", [](HandshakeInfo& h) { h.layout.num_layers = 6; }, "5", "6"},
      {"num_kv_heads", [](HandshakeInfo& h) { h.layout.num_kv_heads = 2; }, "4", "2"},
      {"head_dim", [](HandshakeInfo& h) { h.layout.head_dim = 64; }, "8", "64"},
      {"block_size", [](HandshakeInfo& h) { h.layout.block_size = 32; }, "16", "32"},
      {"dtype", [](HandshakeInfo& h) { h.layout.dtype = KvDtype::kBF16; }, "f32", "bf16"},
      {"transfer_backend", [](HandshakeInfo& h) { h.transfer_backend = "libfabric:tcp"; },
       "ucx:tcp", "libfabric:tcp"},
  };
  const HandshakeInfo self = Info("decode-0", "decode");
  for (const auto& c : cases) {
    HandshakeInfo peer = Info("prefill-0", "prefill");
    c.edit(peer);
    const Status s = CheckCompatible(self, peer);
    ASSERT_FALSE(s.ok()) << c.field;
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.message(),
              std::string(c.field) + ": " + c.here + " here, " + c.there + " on peer 'prefill-0'");
  }
  // Several differences: the first in protocol order is named.
  HandshakeInfo peer = Info("prefill-0", "prefill");
  peer.transfer_backend = "ucx:shm";
  peer.layout.block_size = 32;
  peer.layout.num_kv_heads = 2;
  Status s = CheckCompatible(self, peer);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("num_kv_heads:", 0), 0u) << s.message();
  peer.connector_version = 9;
  s = CheckCompatible(self, peer);
  EXPECT_EQ(s.message().rfind("connector_version:", 0), 0u) << s.message();
}

TEST(Handshake, CheckCompatibleRefusesSameEngineId) {
  const HandshakeInfo self = Info("node-a", "decode");
  HandshakeInfo peer = Info("node-a", "prefill");
  peer.incarnation = 5;
  const Status s = CheckCompatible(self, peer);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("engine_id"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("node-a"), std::string::npos) << s.message();
}

TEST(Handshake, DecodeRefusesPrefillPeerWithShortLease) {
  HandshakeInfo self = Info("decode-0", "decode");
  self.watchdog_ms = 10000;
  HandshakeInfo peer = Info("prefill-0", "prefill");
  for (int64_t lease : {0, 5000, 10000, 11000}) {
    peer.lease_ms = lease;
    const Status s = CheckCompatible(self, peer);
    ASSERT_FALSE(s.ok()) << "lease " << lease;
    EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ(s.message().rfind("lease_ms:", 0), 0u) << s.message();
    EXPECT_NE(s.message().find("11000"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("prefill-0"), std::string::npos) << s.message();
  }
  peer.lease_ms = 11001;
  EXPECT_TRUE(CheckCompatible(self, peer).ok());
  peer.lease_ms = 30000;
  EXPECT_TRUE(CheckCompatible(self, peer).ok());

  // "both" decodes and prefills: the rule applies to it too.
  HandshakeInfo both_self = Info("both-0", "both");
  HandshakeInfo both_peer = Info("both-1", "both");
  both_peer.lease_ms = both_self.watchdog_ms + 1000;
  EXPECT_FALSE(CheckCompatible(both_self, both_peer).ok());
  both_peer.lease_ms += 1;
  EXPECT_TRUE(CheckCompatible(both_self, both_peer).ok());

  // A prefill self, or a decode peer, is not subject to it.
  HandshakeInfo p_self = Info("prefill-0", "prefill");
  HandshakeInfo d_peer = Info("decode-0", "decode");
  d_peer.lease_ms = 0;
  p_self.lease_ms = 0;
  EXPECT_TRUE(CheckCompatible(p_self, d_peer).ok());
  HandshakeInfo d_self = Info("decode-0", "decode");
  HandshakeInfo d_peer2 = Info("decode-1", "decode");
  d_peer2.lease_ms = 0;
  EXPECT_TRUE(CheckCompatible(d_self, d_peer2).ok());
}

TEST(Handshake, Base64RoundTripsEveryLength) {
  std::mt19937 rng(7);
  for (size_t n = 0; n <= 64; ++n) {
    std::vector<uint8_t> in(n);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    const std::string enc = Base64Encode(in);
    EXPECT_EQ(enc.size(), (n + 2) / 3 * 4) << n;
    auto dec = Base64Decode(enc);
    ASSERT_TRUE(dec.ok()) << n << ": " << dec.status().ToString();
    EXPECT_EQ(*dec, in) << n;
  }
  // RFC 4648 test vectors.
  auto bytes = [](std::string s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  EXPECT_EQ(Base64Encode(bytes("")), "");
  EXPECT_EQ(Base64Encode(bytes("f")), "Zg==");
  EXPECT_EQ(Base64Encode(bytes("fo")), "Zm8=");
  EXPECT_EQ(Base64Encode(bytes("foo")), "Zm9v");
  EXPECT_EQ(Base64Encode(bytes("foob")), "Zm9vYg==");
  EXPECT_EQ(Base64Encode(bytes("fooba")), "Zm9vYmE=");
  EXPECT_EQ(Base64Encode(bytes("foobar")), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode({0xfb, 0xff, 0xbf}), "+/+/");
  EXPECT_EQ(Base64Decode("Zm9vYmE=").value(), bytes("fooba"));
  EXPECT_EQ(Base64Decode("+/+/").value(), (std::vector<uint8_t>{0xfb, 0xff, 0xbf}));
}

TEST(Handshake, Base64RefusesBadInput) {
  for (const char* bad : {"A", "AB", "ABC", "ABCDE", "AB=", "A===", "====", "=AAA", "AB=C", "A=BC",
                          "AB*D", "AB-_", "AB\nC", "Zg==Zg==", "Zm9v Zm9v"}) {
    auto r = Base64Decode(bad);
    EXPECT_FALSE(r.ok()) << "'" << bad << "'";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(Handshake, Hex64) {
  EXPECT_EQ(Hex64(0), "0000000000000000");
  EXPECT_EQ(Hex64(0xdeadbeefull), "00000000deadbeef");
  EXPECT_EQ(Hex64(~0ull), "ffffffffffffffff");
  EXPECT_EQ(ParseHex64("ffffffffffffffff").value(), ~0ull);
  EXPECT_EQ(ParseHex64("00000000deadbeef").value(), 0xdeadbeefull);
  EXPECT_EQ(ParseHex64("DEADBEEF").value(), 0xdeadbeefull);
  for (uint64_t v : {0ull, 1ull, 0x8000000000000000ull, 0x0123456789abcdefull}) {
    EXPECT_EQ(ParseHex64(Hex64(v)).value(), v);
  }
  EXPECT_FALSE(ParseHex64("").ok());
  EXPECT_FALSE(ParseHex64("10000000000000000").ok());
  EXPECT_FALSE(ParseHex64("0x10").ok());
  EXPECT_FALSE(ParseHex64("g").ok());
  EXPECT_FALSE(ParseHex64(" 1").ok());
}

}  // namespace
}  // namespace kvpush::connector
