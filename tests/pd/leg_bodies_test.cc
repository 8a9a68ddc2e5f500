// pd/legs.h: the bodies of a P/D request's two legs, which the router writes
// (docs/pd_protocol.md §1).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "pd/legs.h"

namespace kvpush::pd {
namespace {

using nlohmann::json;

TEST(LegBodies, PrefillLegCarriesOneTokenNoStreamAndTransferParams) {
  json client = {{"model", "m"},     {"prompt", "hi"},
                 {"max_tokens", 20}, {"max_completion_tokens", 20},
                 {"stream", true},   {"stream_options", {{"include_usage", true}}},
                 {"seed", 7},        {"min_tokens", 5}};
  json p = MakePrefillBody(client, KvTransferParams::Mode::kPull, "ab");
  EXPECT_EQ(p["max_tokens"], 1);
  EXPECT_EQ(p["min_tokens"], 5);  // P clamps it: no EOS or stop id as the first token
  EXPECT_FALSE(p.contains("max_completion_tokens"));
  EXPECT_EQ(p["stream"], false);
  EXPECT_FALSE(p.contains("stream_options"));
  EXPECT_EQ(p["seed"], 7);
  EXPECT_EQ(p["prompt"], "hi");
  EXPECT_EQ(p["kv_transfer_params"], json({{"do_remote_decode", true},
                                           {"do_remote_prefill", false},
                                           {"transfer_mode", "pull"},
                                           {"transfer_id", "ab"}}));
}

TEST(LegBodies, DecodePushLegNamesThePrefillInstance) {
  json client = {{"prompt", "hi"}, {"stream", true}, {"seed", 3}, {"max_tokens", 9}};
  json d = MakeDecodePushBody(client, "t1", "10.0.0.2", 8100);
  EXPECT_EQ(d["stream"], true);
  EXPECT_EQ(d["max_tokens"], 9);
  EXPECT_EQ(d["kv_transfer_params"]["do_remote_prefill"], true);
  EXPECT_EQ(d["kv_transfer_params"]["do_remote_decode"], false);
  EXPECT_EQ(d["kv_transfer_params"]["transfer_mode"], "push");
  EXPECT_EQ(d["kv_transfer_params"]["transfer_id"], "t1");
  EXPECT_EQ(d["kv_transfer_params"]["remote_host"], "10.0.0.2");
  EXPECT_EQ(d["kv_transfer_params"]["remote_port"], 8100);
  EXPECT_FALSE(d["kv_transfer_params"].contains("remote_scheme"));  // plain HTTP: as vLLM's
  // An https P: D is told to handshake with it over TLS.
  json tls = MakeDecodePushBody(client, "t1", "10.0.0.2", 8100, /*prefill_https=*/true);
  EXPECT_EQ(tls["kv_transfer_params"]["remote_scheme"], "https");
  EXPECT_EQ(tls["kv_transfer_params"]["remote_host"], "10.0.0.2");
}

TEST(LegBodies, DecodePullLegCopiesPrefillParamsVerbatim) {
  json client = {{"prompt", "hi"}, {"seed", 3}};
  json kvp = {{"do_remote_prefill", true}, {"remote_block_ids", {3, 4}}, {"lease_ms", 30000}};
  auto d = MakeDecodePullBody(client, {{"choices", json::array()}, {"kv_transfer_params", kvp}},
                              PullProfile::kVllm);
  ASSERT_TRUE(d.ok());
  json want = kvp;
  want["pull_profile"] = "vllm";
  EXPECT_EQ((*d)["kv_transfer_params"], want);
  auto no_profile = MakeDecodePullBody(client, {{"kv_transfer_params", kvp}}, std::nullopt);
  EXPECT_EQ((*no_profile)["kv_transfer_params"], kvp);
  auto missing = MakeDecodePullBody(client, {{"choices", json::array()}}, std::nullopt);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "prefill instance returned no kv_transfer_params");
}

}  // namespace
}  // namespace kvpush::pd
