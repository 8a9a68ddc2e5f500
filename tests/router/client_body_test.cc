// ClientBody (src/router/client_body.h): the simdjson parse gives nlohmann's document, and a leg
// composed from the client's bytes is the leg the router built.
#include "router/client_body.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "pd/legs.h"
#include "router/flow_mode.h"

namespace kvpush::router {
namespace {

using nlohmann::json;

/// Same values and the same number kinds, recursively (nlohmann's == equates 1 and 1.0).
bool Identical(const json& a, const json& b) {
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!Identical(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      if (!b.contains(it.key()) || !Identical(*it, b[it.key()])) return false;
    }
    return true;
  }
  return a == b;
}

void ExpectSameAsNlohmann(const std::string& text) {
  SCOPED_TRACE(text);
  const json want = json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto got = ParseClientBody(text);
  if (want.is_discarded()) {
    EXPECT_FALSE(got.ok());
    return;
  }
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(Identical(got->doc, want)) << got->doc.dump() << " vs " << want.dump();
}

TEST(ClientBodyTest, ParsesAsNlohmannDoes) {
  for (const char* text : {
           R"({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0.7, "stream": true})",
           R"({"a": -1, "b": 0, "d": 1.0, "e": 1e5, "f": 18446744073709551615})",
           R"({"big": 18446744073709551616, "huge": 1e400, "neg": -9223372036854775809})",
           R"({"s": "caf\u00e9 \ud83d\ude00 \"q\" \\ \n", "n": null, "t": true, "f": false})",
           R"({"dup": 1, "dup": [2], "x": {"dup": 3, "dup": 4}})",
           R"([1, 2, 3])", R"("just a string")", R"(42)", "  {\"pad\" : 1 }  \n",
           R"({"nested": [[[{"a": [1.5, -2, "x"]}]]]})",
           // not JSON: both refuse
           R"({"a": 1,})", R"({"a": 1} x)", R"({"a": 01})", "{\"a\": \"\xff\"}", "", "{",
       }) {
    ExpectSameAsNlohmann(text);
  }
}

TEST(ClientBodyTest, MinusZeroIsTheOneKindThatDiffers) {
  // simdjson reads -0 as the integer 0 and cannot tell it from 0: unsigned here, signed in
  // nlohmann. The same value; nothing the router reads depends on the kind of a zero.
  auto c = ParseClientBody(R"({"c": -0})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->doc["c"], json::parse(R"({"c": -0})")["c"]);
}

TEST(ClientBodyTest, RandomDocumentsParseAsNlohmann) {
  std::mt19937_64 rng(27);
  std::function<json(int)> gen = [&](int depth) -> json {
    switch (rng() % (depth > 3 ? 5 : 7)) {
      case 0: return json(static_cast<int64_t>(rng()) >> (rng() % 64));
      case 1: return json(rng() >> (rng() % 64));
      case 2: return json(std::ldexp(static_cast<double>(rng() % 100000) - 50000, rng() % 80 - 40));
      case 3: return json(std::string(rng() % 5, static_cast<char>('a' + rng() % 26)));
      case 4: return rng() % 2 ? json(nullptr) : json(rng() % 2 == 0);
      case 5: {
        json a = json::array();
        for (size_t i = rng() % 6; i > 0; --i) a.push_back(gen(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (size_t i = rng() % 6; i > 0; --i) o["k" + std::to_string(rng() % 8)] = gen(depth + 1);
        return o;
      }
    }
  };
  for (int i = 0; i < 500; ++i) {
    const json j = gen(0);
    ExpectSameAsNlohmann(j.dump());
    ExpectSameAsNlohmann(j.dump(i % 4));
  }
}

TEST(ClientBodyTest, LegsForwardTheClientsBytesOfWhatTheRouterLeavesAlone) {
  // The prompt's own spacing survives: it is copied, not dumped again.
  const std::string text =
      R"({"prompt": [1,  2,   3], "max_tokens": 9, "stream": true, "stream_options": {"include_usage": true}, "x": "\u00e9"})";
  auto c = ParseClientBody(text);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->members.size(), 5u);
  EXPECT_FALSE(c->Shell().contains("prompt"));  // builders never copy the prompt
  EXPECT_TRUE(c->Shell().contains("x"));
  const json leg = pd::MakePrefillBody(c->Shell(), pd::KvTransferParams::Mode::kPush, "tid");
  const std::string composed = ComposeLegBody(leg, *c);
  EXPECT_NE(composed.find(R"("prompt":[1,  2,   3])"), std::string::npos) << composed;
  EXPECT_NE(composed.find(R"("x":"\u00e9")"), std::string::npos) << composed;
  const json back = json::parse(composed);
  json want = leg;
  want["prompt"] = c->doc["prompt"];
  EXPECT_TRUE(Identical(back, json::parse(want.dump()))) << composed;
  EXPECT_EQ(back["max_tokens"], 1);
  EXPECT_FALSE(back.contains("stream_options"));
  // D's push leg: everything the client sent, plus kv_transfer_params.
  const json d = pd::MakeDecodePushBody(c->doc, "tid", "10.0.0.2", 8100);
  EXPECT_TRUE(Identical(json::parse(ComposeLegBody(d, *c)), json::parse(d.dump())));
  EXPECT_TRUE(Identical(
      json::parse(ComposeLegBody(pd::MakeDecodePushBody(c->Shell(), "tid", "10.0.0.2", 8100), *c)),
      json::parse(d.dump())));
  // Chat: messages are forwarded the same way.
  auto chat = ParseClientBody(R"({"messages": [{"role": "user", "content": "hi"}], "n": 1})");
  ASSERT_TRUE(chat.ok());
  EXPECT_EQ(ComposeLegBody(chat->Shell(), *chat),
            R"({"n":1,"messages":[{"role": "user", "content": "hi"}]})");
}

TEST(ClientBodyTest, AChangedKindIsDumpedNotCopied) {
  auto c = ParseClientBody(R"({"max_tokens": 1.0, "seed": null})");
  ASSERT_TRUE(c.ok());
  json leg = c->doc;
  leg["max_tokens"] = 1;  // equal by value, another kind: the router's 1, not the client's 1.0
  leg["seed"] = 7;
  EXPECT_EQ(ComposeLegBody(leg, *c), R"({"max_tokens":1,"seed":7})");
  leg.erase("seed");
  EXPECT_EQ(ComposeLegBody(leg, *c), R"({"max_tokens":1})");
}

TEST(ClientBodyTest, BodiesTheRouterBuiltAreDumped) {
  const ClientBody built(json{{"prompt", "hi"}, {"n", 2}});
  EXPECT_TRUE(built.members.empty());
  EXPECT_EQ(ComposeLegBody(built.doc, built), built.doc.dump());
  // Not an object: no members, the leg is dumped.
  auto arr = ParseClientBody("[1, 2]");
  ASSERT_TRUE(arr.ok());
  EXPECT_TRUE(arr->members.empty());
}

TEST(ClientBodyTest, DuplicatedKeysForwardTheirLastValue) {
  auto c = ParseClientBody(R"({"prompt": [1], "prompt": [2,  3]})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->doc["prompt"], json::array({2, 3}));
  EXPECT_EQ(ComposeLegBody(c->doc, *c), R"({"prompt":[2,  3]})");
}

}  // namespace
}  // namespace kvpush::router
