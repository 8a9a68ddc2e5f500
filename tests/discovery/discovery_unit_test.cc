// The pure parts of etcd discovery: endpoint and prefix parsing, keys, the value document, the
// gateway's answers (range, watch lines) and MembershipCore's admission rule. No processes.
#include <gtest/gtest.h>

#include "common/encoding.h"
#include "discovery/etcd_client.h"
#include "discovery/instance_record.h"
#include "discovery/membership.h"

namespace kvpush::discovery {
namespace {

InstanceRecord Rec(const std::string& role, const std::string& url, uint64_t compat, uint64_t inc,
                   const std::string& model = "m") {
  InstanceRecord r;
  r.role = role;
  r.model = model;
  r.url = url;
  r.compat_hash = compat;
  r.incarnation = inc;
  r.started_at = 1700000000;
  r.pid = 42;
  return r;
}

KeyValue Kv(const InstanceRecord& r, const std::string& prefix = "/kvpush/") {
  return KeyValue{r.Key(prefix), r.ToJson().dump(), 1, 7};
}

TEST(DiscoveryUrl, ParsesOneOrMoreEndpoints) {
  auto one = ParseDiscoveryUrl("etcd://10.0.0.1:2379");
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].host, "10.0.0.1");
  EXPECT_EQ((*one)[0].port, 2379);
  auto two = ParseDiscoveryUrl("etcd://a:1,b:2/");
  ASSERT_TRUE(two.ok());
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].host, "b");
  for (const char* bad : {"http://a:1", "etcd://", "etcd://a", "etcd://a:0", "etcd://a:70000",
                          "etcd://a:1/x", "etcd://a:1,,b:2", "etcd://:1", "etcd://a:x"}) {
    EXPECT_FALSE(ParseDiscoveryUrl(bad).ok()) << bad;
  }
}

TEST(DiscoveryPrefix, MustBeSlashDelimited) {
  EXPECT_TRUE(ValidatePrefix("/kvpush/").ok());
  EXPECT_TRUE(ValidatePrefix("/a/b/").ok());
  for (const char* bad : {"", "/", "kvpush/", "/kvpush", "/kv push/"}) {
    EXPECT_FALSE(ValidatePrefix(bad).ok()) << bad;
  }
  EXPECT_EQ(PrefixRangeEnd("/kvpush/"), "/kvpush0");
  EXPECT_EQ(PrefixRangeEnd(std::string("a\xff", 2)), "b");
}

TEST(InstanceRecord, KeyEscapesTheModelName) {
  const InstanceRecord r = Rec("decode", "http://h:1", 1, 0xabc, "org/model%1");
  EXPECT_EQ(r.Key("/kvpush/"), "/kvpush/org%2Fmodel%251/decode/0000000000000abc");
}

TEST(InstanceRecord, RoundTripsAndValidates) {
  const InstanceRecord r = Rec("prefill", "http://10.0.0.2:8100", 0x1234, 99);
  auto back = InstanceRecord::FromJson(r.ToJson());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, r);
  auto parsed = InstanceRecord::Parse("/kvpush/", r.Key("/kvpush/"), r.ToJson().dump());
  ASSERT_TRUE(parsed.ok());
  // A value copied under another key is refused.
  EXPECT_FALSE(InstanceRecord::Parse("/kvpush/", "/kvpush/m/decode/x", r.ToJson().dump()).ok());
  EXPECT_FALSE(InstanceRecord::Parse("/kvpush/", r.Key("/kvpush/"), "not json").ok());
  // Every field is checked.
  const std::vector<std::pair<std::string, nlohmann::json>> bad = {
      {"version", 2},         {"version", "1"},     {"role", "router"},
      {"model", ""},          {"url", "ftp://h:1"}, {"url", "http://h"},
      {"compat_hash", "xyz"}, {"compat_hash", 5},   {"incarnation", ""},
      {"started_at", -1},     {"pid", "7"},         {"url", "http://h:1/path"}};
  for (const auto& [field, value] : bad) {
    nlohmann::json j = r.ToJson();
    j[field] = value;
    EXPECT_FALSE(InstanceRecord::FromJson(j).ok()) << field << "=" << value.dump();
    j.erase(field);
    EXPECT_FALSE(InstanceRecord::FromJson(j).ok()) << "without " << field;
  }
  EXPECT_FALSE(InstanceRecord::FromJson(nlohmann::json::array()).ok());
  // An instance serving HTTPS registers an https URL.
  nlohmann::json tls = r.ToJson();
  tls["url"] = "https://10.0.0.2:8100";
  auto https = InstanceRecord::FromJson(tls);
  ASSERT_TRUE(https.ok()) << https.status().ToString();
  EXPECT_EQ(https->url, "https://10.0.0.2:8100");
}

TEST(EtcdGateway, ReadsInt64AsStringOrNumber) {
  const nlohmann::json j = {{"a", "123"}, {"b", 5}, {"c", "x"}, {"d", "1 "}, {"e", ""}, {"f", 1.5}};
  EXPECT_EQ(*ReadInt64(j, "a"), 123);
  EXPECT_EQ(*ReadInt64(j, "b"), 5);
  EXPECT_EQ(*ReadInt64(j, "absent"), 0);
  for (const char* k : {"c", "d", "e", "f"}) EXPECT_FALSE(ReadInt64(j, k).ok()) << k;
  EXPECT_FALSE(ReadInt64(nlohmann::json::array(), "a").ok());
}

TEST(EtcdGateway, ParsesRangeAnswers) {
  const nlohmann::json j = nlohmann::json::parse(
      R"({"header":{"revision":"9"},"kvs":[{"key":"L2EvYg==","value":"eA==",
      "mod_revision":"3","lease":"77"}],"count":"1"})");
  auto r = ParseRangeResponse(j);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->revision, 9);
  ASSERT_EQ(r->kvs.size(), 1u);
  EXPECT_EQ(r->kvs[0].key, "/a/b");
  EXPECT_EQ(r->kvs[0].value, "x");
  EXPECT_EQ(r->kvs[0].lease, 77);
  auto empty = ParseRangeResponse(nlohmann::json::parse(R"({"header":{"revision":"2"}})"));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->kvs.empty());
  for (const char* bad : {R"({})", R"({"header":{}})", R"({"header":{"revision":"2"},"kvs":{}})",
                          R"({"header":{"revision":"2"},"kvs":[{"key":"!!"}]})",
                          R"({"header":{"revision":"2"},"kvs":[{"value":"eA=="}]})",
                          R"({"header":{"revision":"2"},"kvs":[{"key":5}]})"}) {
    EXPECT_FALSE(ParseRangeResponse(nlohmann::json::parse(bad)).ok()) << bad;
  }
}

TEST(EtcdGateway, ParsesWatchLines) {
  auto created = ParseWatchLine(R"({"result":{"header":{"revision":"2"},"created":true}})");
  ASSERT_TRUE(created.ok());
  EXPECT_TRUE(created->created);
  auto ev = ParseWatchLine(
      R"({"result":{"header":{"revision":"4"},"events":[{"kv":{"key":"L2E=","value":"eQ==",
      "mod_revision":"3"}},{"type":"DELETE","kv":{"key":"L2E=","mod_revision":"4"}}]}})");
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  ASSERT_EQ(ev->events.size(), 2u);
  EXPECT_EQ(ev->events[0].type, WatchEvent::Type::kPut);
  EXPECT_EQ(ev->events[0].kv.value, "y");
  EXPECT_EQ(ev->events[1].type, WatchEvent::Type::kDelete);
  EXPECT_EQ(ev->revision, 4);
  auto compacted = ParseWatchLine(
      R"({"result":{"header":{"revision":"9"},"canceled":true,"compact_revision":"5"}})");
  ASSERT_TRUE(compacted.ok());
  EXPECT_TRUE(compacted->canceled);
  EXPECT_EQ(compacted->compact_revision, 5);
  EXPECT_EQ(ParseWatchLine(R"({"error":{"grpc_code":14}})").status().code(),
            StatusCode::kUnavailable);
  for (const char* bad : {"", "[]", "{", R"({"result":5})", R"({"result":{"events":{}}})",
                          R"({"result":{"events":[{"type":"PUT"}]}})",
                          R"({"result":{"events":[{"type":"X","kv":{"key":"L2E="}}]}})",
                          R"({"result":{"created":"yes"}})"}) {
    EXPECT_FALSE(ParseWatchLine(bad).ok()) << bad;
  }
}

TEST(Base64, RoundTripsStrings) {
  for (const std::string s : {"", "a", "ab", "abc", "/kvpush/m/decode/1"}) {
    auto back = Base64DecodeString(Base64Encode(std::string_view(s)));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, s);
  }
}

using Type = MembershipChange::Type;

TEST(MembershipCore, AddsAndRemovesCompatibleInstances) {
  MembershipCore core("/kvpush/");
  const InstanceRecord p = Rec("prefill", "http://h:1", 7, 1);
  const InstanceRecord d = Rec("decode", "http://h:2", 7, 2);
  auto c = core.Reset({Kv(p)});
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].type, Type::kAdd);
  EXPECT_EQ(c[0].record, p);
  EXPECT_EQ(core.reference_compat_hash(), 7u);
  c = core.Put(Kv(d));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].record, d);
  EXPECT_TRUE(core.Put(Kv(d)).empty()) << "a renewal of the same value changes nothing";
  c = core.Delete(d.Key("/kvpush/"));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].type, Type::kRemove);
  EXPECT_TRUE(core.Delete("/kvpush/unknown").empty());
  EXPECT_EQ(core.admitted().size(), 1u);
}

TEST(MembershipCore, NeverAdmitsAnIncompatibleInstance) {
  MembershipCore core("/kvpush/");
  const InstanceRecord a = Rec("prefill", "http://h:1", 7, 1);
  const InstanceRecord b = Rec("decode", "http://h:2", 7, 2);
  const InstanceRecord odd = Rec("decode", "http://h:3", 8, 3);
  // The majority hash wins the first listing.
  auto c = core.Reset({Kv(odd), Kv(a), Kv(b)});
  EXPECT_EQ(c.size(), 2u);
  EXPECT_EQ(core.reference_compat_hash(), 7u);
  EXPECT_EQ(core.refused(), 1u);
  EXPECT_FALSE(core.admitted().contains(odd.Key("/kvpush/")));
  // Still refused after more events, while a compatible instance remains.
  EXPECT_TRUE(core.Put(Kv(odd)).empty());
  core.Delete(a.Key("/kvpush/"));
  EXPECT_FALSE(core.admitted().contains(odd.Key("/kvpush/")));
  // Once the last compatible one left, the fleet's hash is adopted (rolling upgrade).
  c = core.Delete(b.Key("/kvpush/"));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].type, Type::kRemove);
  EXPECT_EQ(c[1].type, Type::kAdd);
  EXPECT_EQ(c[1].record, odd);
  EXPECT_EQ(core.reference_compat_hash(), 8u);
}

TEST(MembershipCore, IgnoresMalformedAndColocatedRecords) {
  MembershipCore core("/kvpush/");
  const InstanceRecord both = Rec("both", "http://h:1", 7, 1);
  std::vector<KeyValue> kvs = {
      Kv(both), KeyValue{"/kvpush/m/decode/5", "{oops", 1, 0},
      KeyValue{"/kvpush/m/decode/6", Rec("decode", "http://h:2", 7, 9).ToJson().dump(), 1, 0}};
  EXPECT_TRUE(core.Reset(kvs).empty());
  EXPECT_EQ(core.refused(), 3u);
  EXPECT_EQ(core.reference_compat_hash(), 0u);
}

TEST(MembershipCore, AChangedValueIsARemoveThenAnAdd) {
  MembershipCore core("/kvpush/");
  InstanceRecord d = Rec("decode", "http://h:2", 7, 2);
  core.Reset({Kv(d)});
  d.url = "http://h:3";
  auto c = core.Put(Kv(d));
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].type, Type::kRemove);
  EXPECT_EQ(c[0].record.url, "http://h:2");
  EXPECT_EQ(c[1].type, Type::kAdd);
  EXPECT_EQ(c[1].record.url, "http://h:3");
}

TEST(MembershipCore, AResetDiffsAgainstTheLastMembership) {
  MembershipCore core("/kvpush/");
  const InstanceRecord a = Rec("prefill", "http://h:1", 7, 1);
  const InstanceRecord b = Rec("decode", "http://h:2", 7, 2);
  const InstanceRecord c2 = Rec("decode", "http://h:3", 7, 3);
  core.Reset({Kv(a), Kv(b)});
  auto c = core.Reset({Kv(a), Kv(c2)});
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].type, Type::kRemove);
  EXPECT_EQ(c[0].record, b);
  EXPECT_EQ(c[1].type, Type::kAdd);
  EXPECT_EQ(c[1].record, c2);
}

}  // namespace
}  // namespace kvpush::discovery
