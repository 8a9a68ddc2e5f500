// pd::ParseKvTransferParams and pd::ToJson: the `kv_transfer_params` request field and the pull
// answer (docs/pd_protocol.md §1).
#include "pd/kv_transfer_params.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace kvpush::pd {
namespace {

using nlohmann::json;
using Role = KvTransferParams::Role;
using Mode = KvTransferParams::Mode;

const std::string kTid = "0123456789abcdef0123456789abcdef";

KvTransferParams Ok(const json& j) {
  auto r = ParseKvTransferParams(j);
  if (auto* e = std::get_if<ParamError>(&r)) {
    ADD_FAILURE() << j.dump() << ": " << e->message << " (param " << e->param << ")";
    return {};
  }
  return std::get<KvTransferParams>(r);
}

ParamError Err(const json& j) {
  auto r = ParseKvTransferParams(j);
  if (auto* e = std::get_if<ParamError>(&r)) return *e;
  ADD_FAILURE() << j.dump() << " was accepted";
  return {};
}

json ProducerPush() {
  return {{"do_remote_decode", true},
          {"do_remote_prefill", false},
          {"transfer_mode", "push"},
          {"transfer_id", kTid}};
}

json ConsumerPush() {
  return {{"do_remote_prefill", true}, {"do_remote_decode", false}, {"transfer_mode", "push"},
          {"transfer_id", kTid},       {"remote_host", "10.0.0.7"}, {"remote_port", 8100}};
}

// P's pull answer (§1), as D receives it.
json ConsumerPull() {
  return json::parse(R"({"do_remote_prefill": true, "do_remote_decode": false,
      "transfer_mode": "pull", "transfer_id": ")" +
                     kTid + R"(",
      "remote_engine_id": "prefill-10.0.0.7:8100", "remote_host": "10.0.0.7",
      "remote_port": 8100, "remote_block_ids": [3, 4, 5], "remote_request_id": ")" +
                     kTid + R"(",
      "num_prompt_tokens": 37, "prompt_hash": "00000000deadbeef", "first_token_id": 42,
      "first_token_logprob": -0.125, "lease_ms": 30000, "tp_size": 1})");
}

TEST(KvTransferParams, NullIsColocated) {
  const auto p = Ok(json());
  EXPECT_EQ(p.role, Role::kNone);
  EXPECT_TRUE(p.transfer_id.empty());
  EXPECT_EQ(p.pull_profile, std::nullopt);
  EXPECT_EQ(p.first_token_id, -1);
}

// Note: the header says "both or neither" of the flags is an error; the code (deliberately,
// "nothing asked of the connector") treats neither as colocated. This pins the code's behaviour.
TEST(KvTransferParams, NeitherFlagIsColocated) {
  EXPECT_EQ(Ok(json::object()).role, Role::kNone);
  EXPECT_EQ(Ok({{"do_remote_decode", false}, {"do_remote_prefill", false}}).role, Role::kNone);
  EXPECT_EQ(Ok({{"do_remote_decode", nullptr}, {"transfer_id", "junk"}}).role, Role::kNone);
}

TEST(KvTransferParams, NonObjectRefused) {
  for (const json& j : {json(1), json("x"), json::array({1}), json(true)}) {
    const auto e = Err(j);
    EXPECT_EQ(e.param, "kv_transfer_params");
    EXPECT_EQ(e.message, "kv_transfer_params must be an object");
  }
}

TEST(KvTransferParams, ProducerPush) {
  const auto p = Ok(ProducerPush());
  EXPECT_EQ(p.role, Role::kProducer);
  EXPECT_EQ(p.mode, Mode::kPush);
  EXPECT_EQ(p.transfer_id, kTid);
  EXPECT_TRUE(p.remote_host.empty());
  EXPECT_EQ(p.remote_port, 0);
  EXPECT_TRUE(p.remote_block_ids.empty());
}

TEST(KvTransferParams, ProducerPull) {
  auto j = ProducerPush();
  j["transfer_mode"] = "pull";
  auto p = Ok(j);
  EXPECT_EQ(p.role, Role::kProducer);
  EXPECT_EQ(p.mode, Mode::kPull);
  EXPECT_EQ(p.transfer_id, kTid);
  // vLLM's default (no transfer_mode) is pull.
  j.erase("transfer_mode");
  p = Ok(j);
  EXPECT_EQ(p.mode, Mode::kPull);
  EXPECT_EQ(p.role, Role::kProducer);
}

TEST(KvTransferParams, ConsumerPush) {
  const auto p = Ok(ConsumerPush());
  EXPECT_EQ(p.role, Role::kConsumer);
  EXPECT_EQ(p.mode, Mode::kPush);
  EXPECT_EQ(p.transfer_id, kTid);
  EXPECT_EQ(p.remote_host, "10.0.0.7");
  EXPECT_EQ(p.remote_port, 8100);
}

TEST(KvTransferParams, ConsumerPushRequiresHostAndPort) {
  for (const char* drop : {"remote_host", "remote_port"}) {
    auto j = ConsumerPush();
    j.erase(drop);
    const auto e = Err(j);
    EXPECT_EQ(e.param, "kv_transfer_params.remote_host") << drop;
    EXPECT_NE(e.message.find("remote_port"), std::string::npos) << e.message;
  }
  auto j = ConsumerPush();
  j["remote_host"] = "";
  EXPECT_EQ(Err(j).param, "kv_transfer_params.remote_host");
  j = ConsumerPush();
  j["remote_port"] = 0;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.remote_host");
  j = ConsumerPush();
  j["remote_port"] = 65536;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.remote_port");
  j["remote_port"] = -1;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.remote_port");
  j["remote_port"] = 65535;
  EXPECT_EQ(Ok(j).remote_port, 65535);
}

// An https producer (docs/pd_protocol.md §1): "remote_scheme": "https" makes D's handshake
// with P go over TLS; "http" or no member is plain HTTP (vLLM's instances send none).
TEST(KvTransferParams, RemoteSchemeNamesAnHttpsProducer) {
  EXPECT_FALSE(Ok(ConsumerPush()).remote_https);
  auto j = ConsumerPush();
  j["remote_scheme"] = "https";
  EXPECT_TRUE(Ok(j).remote_https);
  j["remote_scheme"] = "http";
  EXPECT_FALSE(Ok(j).remote_https);
  j["remote_scheme"] = nullptr;
  EXPECT_FALSE(Ok(j).remote_https);
  for (const json& bad : {json("HTTPS"), json("ftp"), json(""), json(true), json("https://")}) {
    j["remote_scheme"] = bad;
    const ParamError e = Err(j);
    EXPECT_EQ(e.param, "kv_transfer_params.remote_scheme") << bad.dump();
  }
  auto pull = ConsumerPull();
  pull["remote_scheme"] = "https";
  EXPECT_TRUE(Ok(pull).remote_https);
}

TEST(KvTransferParams, ConsumerPull) {
  const auto p = Ok(ConsumerPull());
  EXPECT_EQ(p.role, Role::kConsumer);
  EXPECT_EQ(p.mode, Mode::kPull);
  EXPECT_EQ(p.transfer_id, kTid);
  EXPECT_EQ(p.remote_engine_id, "prefill-10.0.0.7:8100");
  EXPECT_EQ(p.remote_host, "10.0.0.7");
  EXPECT_EQ(p.remote_port, 8100);
  EXPECT_EQ(p.remote_block_ids, (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(p.num_prompt_tokens, 37);
  EXPECT_EQ(p.prompt_hash, 0xdeadbeefull);
  EXPECT_EQ(p.first_token_id, 42);
  EXPECT_EQ(p.first_token_logprob, -0.125f);
  EXPECT_EQ(p.pull_profile, std::nullopt);  // not given: instance default
}

TEST(KvTransferParams, ConsumerPullRequiresBlockIds) {
  auto j = ConsumerPull();
  j.erase("remote_block_ids");
  auto e = Err(j);
  EXPECT_EQ(e.param, "kv_transfer_params.remote_block_ids");
  j["remote_block_ids"] = json::array();
  EXPECT_EQ(Err(j).param, "kv_transfer_params.remote_block_ids");
  j["remote_block_ids"] = nullptr;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.remote_block_ids");
  // Pull consumers need host/port as well.
  j = ConsumerPull();
  j.erase("remote_host");
  EXPECT_EQ(Err(j).param, "kv_transfer_params.remote_host");
}

TEST(KvTransferParams, BlockIdRange) {
  auto j = ConsumerPull();
  j["remote_block_ids"] = {0, 0x7fffffff};
  EXPECT_EQ(Ok(j).remote_block_ids, (std::vector<int32_t>{0, 0x7fffffff}));
  for (const json& bad : {json{-1}, json{int64_t{0x80000000}}, json{1, "2"}, json{1.5}, json("3,4"),
                          json{{{"id", 1}}}}) {
    j["remote_block_ids"] = bad;
    const auto e = Err(j);
    EXPECT_EQ(e.param, "kv_transfer_params.remote_block_ids") << bad.dump();
  }
}

TEST(KvTransferParams, BothFlagsRefused) {
  auto j = ConsumerPull();
  j["do_remote_decode"] = true;
  const auto e = Err(j);
  EXPECT_EQ(e.param, "kv_transfer_params.do_remote_prefill");
  EXPECT_NE(e.message.find("do_remote_decode"), std::string::npos) << e.message;
}

TEST(KvTransferParams, BadTransferIdRefused) {
  for (const char* bad :
       {"", "abc", "0123456789ABCDEF0123456789abcdef", "0123456789abcdef0123456789abcdeg",
        "0123456789abcdef0123456789abcdef0", "0123456789abcdef0123456789abcde"}) {
    auto j = ProducerPush();
    j["transfer_id"] = bad;
    EXPECT_EQ(Err(j).param, "kv_transfer_params.transfer_id") << bad;
  }
  auto j = ProducerPush();
  j.erase("transfer_id");  // and no remote_request_id either
  EXPECT_EQ(Err(j).param, "kv_transfer_params.transfer_id");
  j["transfer_id"] = std::string(65, 'a');
  EXPECT_EQ(Err(j).param, "kv_transfer_params.transfer_id");
}

TEST(KvTransferParams, RemoteRequestIdStandsInForTransferId) {
  const std::string rid = "fedcba9876543210fedcba9876543210";
  auto j = ConsumerPull();
  j.erase("transfer_id");
  j["remote_request_id"] = rid;
  EXPECT_EQ(Ok(j).transfer_id, rid);
  // transfer_id wins when both are present.
  j["transfer_id"] = kTid;
  EXPECT_EQ(Ok(j).transfer_id, kTid);
  // A vLLM-style request id (not 32 hex) is refused as the transfer id.
  j.erase("transfer_id");
  j["remote_request_id"] = "cmpl-1234";
  EXPECT_EQ(Err(j).param, "kv_transfer_params.transfer_id");
  j["remote_request_id"] = 5;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.remote_request_id");
}

TEST(KvTransferParams, WrongTypesName400Param) {
  struct Case {
    const char* field;
    json value;
  };
  const std::vector<Case> cases = {
      {"do_remote_decode", "true"},
      {"do_remote_decode", 1},
      {"do_remote_prefill", "yes"},
      {"transfer_mode", 1},
      {"transfer_mode", "both"},
      {"transfer_mode", "PUSH"},
      {"transfer_id", 12},
      {"remote_engine_id", 3},
      {"remote_host", false},
      {"remote_port", "8100"},
      {"remote_port", 8100.5},
      {"remote_block_ids", 3},
      {"num_prompt_tokens", "37"},
      {"num_prompt_tokens", -1},
      {"prompt_hash", 3735928559},
      {"prompt_hash", "xyz"},
      {"prompt_hash", "00000000000000001"},
      {"first_token_id", "42"},
      {"first_token_id", -2},
      {"first_token_logprob", "-0.1"},
      {"pull_profile", 1},
      {"pull_profile", "nixl"},
      {"remote_engine_id", std::string(256, 'e')},
      {"remote_host", std::string(256, 'h')},
  };
  for (const auto& c : cases) {
    auto j = ProducerPush();
    j[c.field] = c.value;
    const auto e = Err(j);
    EXPECT_EQ(e.param, std::string("kv_transfer_params.") + c.field) << c.value.dump();
    EXPECT_NE(e.message.find(std::string("kv_transfer_params.") + c.field), std::string::npos)
        << e.message;
  }
}

TEST(KvTransferParams, NullFieldsAreAbsent) {
  auto j = ProducerPush();
  for (const char* k : {"remote_engine_id", "remote_host", "remote_port", "remote_block_ids",
                        "num_prompt_tokens", "prompt_hash", "first_token_id", "first_token_logprob",
                        "pull_profile", "remote_request_id"}) {
    j[k] = nullptr;
  }
  const auto p = Ok(j);
  EXPECT_EQ(p.role, Role::kProducer);
  EXPECT_EQ(p.first_token_id, -1);
  EXPECT_EQ(p.pull_profile, std::nullopt);
}

TEST(KvTransferParams, PullProfile) {
  auto j = ConsumerPull();
  j["pull_profile"] = "vllm";
  EXPECT_EQ(Ok(j).pull_profile, PullProfile::kVllm);
  j["pull_profile"] = "fast";
  EXPECT_EQ(Ok(j).pull_profile, PullProfile::kFast);
  j["pull_profile"] = "";
  EXPECT_EQ(Ok(j).pull_profile, std::nullopt);
  j["pull_profile"] = "Fast";
  EXPECT_EQ(Err(j).param, "kv_transfer_params.pull_profile");
}

TEST(KvTransferParams, UnknownFieldsIgnored) {
  auto j = ConsumerPull();
  j["tp_size"] = 8;
  j["some_future_vllm_field"] = {{"x", 1}};
  EXPECT_EQ(Ok(j).role, Role::kConsumer);
}

TEST(KvTransferParams, FirstTokenId) {
  auto j = ConsumerPull();
  j.erase("first_token_logprob");
  j["first_token_id"] = -1;
  EXPECT_EQ(Ok(j).first_token_id, -1);
  j["first_token_id"] = 0;
  EXPECT_EQ(Ok(j).first_token_id, 0);
  j["first_token_logprob"] = 0;  // integers are numbers too
  EXPECT_EQ(Ok(j).first_token_logprob, 0.0f);
}

// Found by fuzz/kv_transfer_params_fuzz.cc: a logprob without its token was accepted and then
// dropped by ToJson (the object did not read back equal); it is refused now.
TEST(KvTransferParams, FirstTokenLogprobNeedsItsToken) {
  auto j = ConsumerPull();
  j.erase("first_token_id");
  EXPECT_EQ(Err(j).param, "kv_transfer_params.first_token_logprob");
  j["first_token_id"] = -1;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.first_token_logprob");
  j["first_token_logprob"] = 0;  // 0 is the default: nothing is lost
  EXPECT_EQ(Ok(j).first_token_id, -1);
}

// Found by fuzz/kv_transfer_params_fuzz.cc: 2^64 - 1 was read as int64 -1, a valid first_token_id.
TEST(KvTransferParams, IntegersBeyondInt64AreOutOfRange) {
  auto j = ConsumerPull();
  j["first_token_id"] = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(Err(j).param, "kv_transfer_params.first_token_id");
  j["first_token_id"] = uint64_t{1} << 63;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.first_token_id");
  j["first_token_id"] = uint64_t{0x7fffffff};  // an unsigned JSON number in range is fine
  EXPECT_EQ(Ok(j).first_token_id, 0x7fffffff);
}

// A logprob beyond float's range would have become infinite (the fuzz target's finiteness check).
TEST(KvTransferParams, FirstTokenLogprobMustFitAFloat) {
  auto j = ConsumerPull();
  j["first_token_logprob"] = 1e300;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.first_token_logprob");
  j["first_token_logprob"] = -1e39;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.first_token_logprob");
  j["first_token_logprob"] = -3.0e38;
  EXPECT_FLOAT_EQ(Ok(j).first_token_logprob, -3.0e38f);
}

TEST(KvTransferParams, PromptHashIsHex) {
  auto j = ConsumerPull();
  j["prompt_hash"] = "ffffffffffffffff";
  EXPECT_EQ(Ok(j).prompt_hash, ~0ull);
  j["prompt_hash"] = "0";
  EXPECT_EQ(Ok(j).prompt_hash, 0ull);
}

// Found by fuzz/kv_transfer_params_fuzz.cc: a prompt_hash without num_prompt_tokens was accepted
// and then dropped by ToJson (which writes the hash with the count); it is refused now.
TEST(KvTransferParams, PromptHashNeedsTheTokenCount) {
  auto j = ConsumerPull();
  j.erase("num_prompt_tokens");
  EXPECT_EQ(Err(j).param, "kv_transfer_params.prompt_hash");
  j["num_prompt_tokens"] = 0;
  EXPECT_EQ(Err(j).param, "kv_transfer_params.prompt_hash");
  j["prompt_hash"] = "0";  // 0 is the default: nothing is lost
  EXPECT_EQ(Ok(j).num_prompt_tokens, 0);
}

// prompt_hash is 1-16 hex digits and nothing else (docs/pd_protocol.md §1): a sign, white space or
// a "0x" prefix is refused (it once went through strtoull, which took "-1" as 0xffffffffffffffff).
TEST(KvTransferParams, PromptHashRefusesNonHexForms) {
  for (const char* bad : {"-1", " ff", "+ff", "0x10", "-0"}) {
    auto j = ConsumerPull();
    j["prompt_hash"] = bad;
    EXPECT_EQ(Err(j).param, "kv_transfer_params.prompt_hash") << "'" << bad << "'";
  }
}

// ToJson is ParseKvTransferParams' inverse: every accepted form written back reads back equal.
TEST(KvTransferParams, ToJsonReadsBackEqual) {
  auto pull_with_profile = ConsumerPull();
  pull_with_profile["pull_profile"] = "vllm";
  auto https = ConsumerPush();
  https["remote_scheme"] = "https";
  for (const json& j : {ProducerPush(), ConsumerPush(), ConsumerPull(), pull_with_profile, https}) {
    const KvTransferParams p = Ok(j);
    EXPECT_EQ(Ok(ToJson(p)), p) << j.dump() << " -> " << ToJson(p).dump();
  }
}

// The legs carry exactly the members a leg needs (the P and D push legs' wire form).
TEST(KvTransferParams, ToJsonWritesOnlyWhatIsGiven) {
  EXPECT_EQ(ToJson(Ok(ProducerPush())), ProducerPush());
  EXPECT_EQ(ToJson(Ok(ConsumerPush())), ConsumerPush());
  auto https = ConsumerPush();
  https["remote_scheme"] = "https";
  EXPECT_EQ(ToJson(Ok(https)), https);
}

// P's pull answer: the 15 members of docs/pd_protocol.md §1, which D reads back as its params.
TEST(PullAnswer, CarriesEveryPullFieldAndVllmsExtras) {
  PullAnswer a;
  a.params = Ok(ConsumerPull());
  a.lease_ms = 30000;
  const json j = ToJson(a);
  json want = ConsumerPull();
  EXPECT_EQ(j, want) << j.dump();
  EXPECT_EQ(Ok(j), a.params);
}

}  // namespace
}  // namespace kvpush::pd
