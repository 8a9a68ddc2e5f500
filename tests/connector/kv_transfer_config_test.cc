// KvTransferConfig::Parse: `kvpush serve --kv-transfer-config JSON` (vLLM's shape).
#include "connector/kv_transfer_config.h"

#include <gtest/gtest.h>

namespace kvpush::connector {
namespace {

using namespace std::chrono_literals;

KvTransferConfig Ok(std::string_view json, std::string_view role = "both") {
  auto r = KvTransferConfig::Parse(json, role);
  EXPECT_TRUE(r.ok()) << json << ": " << r.status().ToString();
  return r.ok() ? r.value() : KvTransferConfig{};
}

// Parse must fail with kInvalidArgument and a message containing every `needles`.
void Err(std::string_view json, std::vector<std::string> needles, std::string_view role = "both") {
  auto r = KvTransferConfig::Parse(json, role);
  ASSERT_FALSE(r.ok()) << json << " was accepted";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << json;
  for (const auto& n : needles) {
    EXPECT_NE(r.status().message().find(n), std::string::npos)
        << json << ": '" << r.status().message() << "' does not mention '" << n << "'";
  }
}

TEST(KvTransferConfig, Defaults) {
  for (const char* json : {"", "{}"}) {
    const auto c = Ok(json, "both");
    EXPECT_EQ(c.kv_connector, "PushConnector");
    EXPECT_EQ(c.role, KvRole::kBoth);
    EXPECT_EQ(c.backend, "ucx:tcp");
    EXPECT_EQ(c.engine_id, "");
    EXPECT_EQ(c.lease, 30000ms);
    EXPECT_EQ(c.watchdog, 10000ms);
    EXPECT_EQ(c.cancel_ack, 2000ms);
    EXPECT_EQ(c.stall, 5000ms);
    EXPECT_EQ(c.failure_policy, FailurePolicy::kRecompute);
    EXPECT_EQ(c.pull_profile, pd::PullProfile::kFast);
    EXPECT_TRUE(c.layerwise);
    EXPECT_EQ(c.layerwise_min_bytes, 256u * 1024u);
    EXPECT_EQ(c.eager_write_max_bytes, 256u * 1024u);
    EXPECT_TRUE(c.verify_checksums);
  }
  // Default lease outlasts the default watchdog + 1 s (the handshake rule).
  const KvTransferConfig d;
  EXPECT_GT(d.lease, d.watchdog + 1000ms);
}

TEST(KvTransferConfig, RoleComesFromTheCommandLine) {
  EXPECT_EQ(Ok("", "prefill").role, KvRole::kProducer);
  EXPECT_EQ(Ok("", "decode").role, KvRole::kConsumer);
  EXPECT_EQ(Ok("", "both").role, KvRole::kBoth);
  Err("", {"--role"}, "router");
  // No --role: kv_role decides, as in vLLM's launch lines; neither: kv_both.
  EXPECT_EQ(Ok("{}", "").role, KvRole::kBoth);
  EXPECT_EQ(Ok(R"({"kv_role": "kv_producer"})", "").role, KvRole::kProducer);
  EXPECT_EQ(Ok(R"({"kv_role": "kv_consumer"})", "").role, KvRole::kConsumer);
  EXPECT_EQ(Ok(R"({"kv_role": "kv_both"})", "").role, KvRole::kBoth);
  Err(R"({"kv_role": "kv_producer"})", {"contradicts --role decode"}, "decode");
  EXPECT_EQ(KvRoleName(KvRole::kProducer), "kv_producer");
  EXPECT_EQ(KvRoleName(KvRole::kConsumer), "kv_consumer");
  EXPECT_EQ(KvRoleName(KvRole::kBoth), "kv_both");
  EXPECT_EQ(pd::PullProfileName(pd::PullProfile::kVllm), "vllm");
  EXPECT_EQ(pd::PullProfileName(pd::PullProfile::kFast), "fast");
}

// vLLM's spellings (docs/configuration.md, "vLLM's keys"), each agreeing with kvpush's own key.
TEST(KvTransferConfig, VllmNamesAndKeys) {
  EXPECT_EQ(Ok(R"({"kv_connector": "NixlConnector"})").kv_connector, "PullConnector");
  EXPECT_EQ(Ok(R"({"kv_connector": "NixlPullConnector"})").kv_connector, "PullConnector");
  EXPECT_EQ(Ok(R"({"kv_connector": "NixlPushConnector"})").kv_connector, "PushConnector");
  Err(R"({"kv_connector": "LMCacheConnectorV1"})", {"LMCacheConnectorV1", "NixlPushConnector"});
  EXPECT_EQ(Ok(R"({"kv_load_failure_policy": "fail"})").failure_policy, FailurePolicy::kFail);
  EXPECT_EQ(Ok(R"({"kv_load_failure_policy": "recompute",
                   "kv_connector_extra_config": {"failure_policy": "recompute"}})")
                .failure_policy,
            FailurePolicy::kRecompute);
  Err(R"({"kv_load_failure_policy": "fail",
          "kv_connector_extra_config": {"failure_policy": "recompute"}})",
      {"kv_load_failure_policy", "contradicts"});
  Err(R"({"kv_load_failure_policy": "retry"})", {"kv_load_failure_policy"});
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"backends": ["UCX"]}})").backend, "ucx:tcp");
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"backends": ["LIBFABRIC"]}})").backend,
            "libfabric:tcp");
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"backends": ["UCX"], "backend": "ucx:shm"}})")
                .backend,
            "ucx:shm");
  Err(R"({"kv_connector_extra_config": {"backends": ["UCX"], "backend": "libfabric:tcp"}})",
      {"backends", "contradicts"});
  Err(R"({"kv_connector_extra_config": {"backends": ["UCX", "LIBFABRIC"]}})", {"one name"});
  Err(R"({"kv_connector_extra_config": {"backends": ["GDS"]}})", {"GDS"});
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"kv_lease_duration": 45}})").lease, 45000ms);
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"kv_lease_duration": 7.5}})").lease, 7500ms);
  Err(R"({"kv_connector_extra_config": {"kv_lease_duration": 0}})", {"kv_lease_duration"});
  Err(R"({"kv_connector_extra_config": {"kv_lease_duration": "30"}})", {"kv_lease_duration"});
  Err(R"({"kv_connector_extra_config": {"kv_lease_duration": 30, "lease_ms": 20000}})",
      {"contradicts lease_ms"});
}

TEST(KvTransferConfig, EveryFieldParsed) {
  const auto c = Ok(R"({"kv_connector": "PullConnector", "kv_role": "kv_consumer",
      "kv_buffer_device": "cpu",
      "kv_connector_extra_config": {"backend": "libfabric:shm", "lease_ms": 45000,
        "watchdog_ms": 1234, "cancel_ack_ms": 777, "stall_ms": 999, "failure_policy": "fail",
        "pull_profile": "vllm", "layerwise": false, "engine_id": "decode-a",
        "verify_checksums": false, "layerwise_min_bytes": 0, "eager_write_max_bytes": 0}})",
                    "decode");
  EXPECT_EQ(c.kv_connector, "PullConnector");
  EXPECT_EQ(c.role, KvRole::kConsumer);
  EXPECT_EQ(c.backend, "libfabric:shm");
  EXPECT_EQ(c.lease, 45000ms);
  EXPECT_EQ(c.watchdog, 1234ms);
  EXPECT_EQ(c.cancel_ack, 777ms);
  EXPECT_EQ(c.stall, 999ms);
  EXPECT_EQ(c.failure_policy, FailurePolicy::kFail);
  EXPECT_EQ(c.pull_profile, pd::PullProfile::kVllm);
  EXPECT_FALSE(c.layerwise);
  EXPECT_EQ(c.layerwise_min_bytes, 0u);
  EXPECT_EQ(c.eager_write_max_bytes, 0u);
  EXPECT_FALSE(c.verify_checksums);
  EXPECT_EQ(c.engine_id, "decode-a");

  // The other value of each enum-like field, and a top-level engine_id.
  const auto d = Ok(R"({"kv_connector": "PushConnector", "engine_id": "p-1",
      "kv_connector_extra_config": {"failure_policy": "recompute", "pull_profile": "fast",
        "layerwise": true, "backend": "ucx:shm"}})",
                    "prefill");
  EXPECT_EQ(d.kv_connector, "PushConnector");
  EXPECT_EQ(d.role, KvRole::kProducer);
  EXPECT_EQ(d.engine_id, "p-1");
  EXPECT_EQ(d.backend, "ucx:shm");
  EXPECT_EQ(d.failure_policy, FailurePolicy::kRecompute);
  EXPECT_EQ(d.pull_profile, pd::PullProfile::kFast);
  EXPECT_TRUE(d.layerwise);
}

TEST(KvTransferConfig, ConnectorNames) {
  EXPECT_EQ(Ok(R"({"kv_connector": "NixlConnector"})").kv_connector, "PullConnector");
  EXPECT_EQ(Ok(R"({"kv_connector": "PullConnector"})").kv_connector, "PullConnector");
  EXPECT_EQ(Ok(R"({"kv_connector": "KvpushPushConnector"})").kv_connector, "PushConnector");
  EXPECT_EQ(Ok(R"({"kv_connector": "PushConnector"})").kv_connector, "PushConnector");
  Err(R"({"kv_connector": "LMCacheConnectorV1"})", {"kv_connector", "LMCacheConnectorV1"});
  Err(R"({"kv_connector": "nixlconnector"})", {"kv_connector"});
}

TEST(KvTransferConfig, EveryBackendSpecAccepted) {
  for (const char* b : {"ucx:tcp", "ucx:shm", "libfabric:tcp", "libfabric:shm", "loopback"}) {
    const auto c = Ok(std::string(R"({"kv_connector_extra_config": {"backend": ")") + b + "\"}}");
    EXPECT_EQ(c.backend, b);
  }
}

TEST(KvTransferConfig, RefusesNonObjectJson) {
  for (const char* json : {"[]", "1", "\"PushConnector\"", "null", "true", "{", "{\"a\":}", "x"}) {
    Err(json, {"--kv-transfer-config", "JSON object"});
  }
}

TEST(KvTransferConfig, RefusesUnknownFields) {
  Err(R"({"kv_conector": "PushConnector"})", {"unknown field", "kv_conector"});
  Err(R"({"kv_connector_extra_config": {"lease": 1000}})",
      {"kv_connector_extra_config", "unknown field", "'lease'"});
  Err(R"({"kv_connector_extra_config": {"lease_ms": 40000, "watchdog": 10}})",
      {"kv_connector_extra_config", "'watchdog'"});
}

TEST(KvTransferConfig, RefusesWrongTypes) {
  Err(R"({"kv_connector": 1})", {"kv_connector"});
  Err(R"({"kv_role": true})", {"kv_role"});
  Err(R"({"engine_id": 7})", {"engine_id"});
  Err(R"({"kv_connector_extra_config": "backend=ucx:tcp"})", {"kv_connector_extra_config"});
  Err(R"({"kv_connector_extra_config": []})", {"kv_connector_extra_config"});
  Err(R"({"kv_connector_extra_config": {"backend": 1}})", {"backend"});
  Err(R"({"kv_connector_extra_config": {"engine_id": ["a"]}})", {"engine_id"});
  for (const char* f : {"lease_ms", "watchdog_ms", "cancel_ack_ms", "stall_ms"}) {
    for (const char* v : {"\"30000\"", "30000.5", "true", "null", "[1]"}) {
      Err(std::string(R"({"kv_connector_extra_config": {")") + f + "\": " + v + "}}",
          {std::string("kv_connector_extra_config.") + f, "integer"});
    }
  }
  Err(R"({"kv_connector_extra_config": {"failure_policy": 1}})", {"failure_policy"});
  Err(R"({"kv_connector_extra_config": {"pull_profile": true}})", {"pull_profile"});
  Err(R"({"kv_connector_extra_config": {"layerwise": "true"}})", {"layerwise", "boolean"});
  Err(R"({"kv_connector_extra_config": {"layerwise": 1}})", {"layerwise"});
  Err(R"({"kv_connector_extra_config": {"verify_checksums": "yes"}})", {"verify_checksums"});
  for (const char* v : {"-1", "1.5", "\"65536\"", "true", "1099511627777"}) {
    Err(std::string(R"({"kv_connector_extra_config": {"layerwise_min_bytes": )") + v + "}}",
        {"layerwise_min_bytes", "integer"});
  }
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"layerwise_min_bytes": 1099511627776}})", "both")
                .layerwise_min_bytes,
            uint64_t{1} << 40);
  for (const char* v : {"-1", "1.5", "\"4096\"", "false", "1073741825"}) {
    Err(std::string(R"({"kv_connector_extra_config": {"eager_write_max_bytes": )") + v + "}}",
        {"eager_write_max_bytes", "integer"});
  }
  for (const char* v : {"15", "3073", "-1", "16.5", "\"64\"", "null"}) {
    Err(std::string(R"({"kv_connector_extra_config": {"block_list_part_bytes": )") + v + "}}",
        {"block_list_part_bytes", "[16, 3072]"});
  }
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"block_list_part_bytes": 16}})", "both")
                .block_list_part_bytes,
            16u);
  EXPECT_EQ(Ok("{}", "both").block_list_part_bytes, 3072u);
}

TEST(KvTransferConfig, MillisecondRanges) {
  struct Range {
    const char* field;
    int64_t lo, hi;
    std::chrono::milliseconds KvTransferConfig::*member;
  };
  const std::vector<Range> ranges = {
      {"lease_ms", 100, 3600000, &KvTransferConfig::lease},
      {"watchdog_ms", 10, 3600000, &KvTransferConfig::watchdog},
      {"cancel_ack_ms", 10, 600000, &KvTransferConfig::cancel_ack},
      {"stall_ms", 10, 600000, &KvTransferConfig::stall},
  };
  auto json = [](const char* f, int64_t v) {
    return std::string(R"({"kv_connector_extra_config": {")") + f + "\": " + std::to_string(v) +
           "}}";
  };
  for (const auto& r : ranges) {
    EXPECT_EQ(Ok(json(r.field, r.lo)).*r.member, std::chrono::milliseconds(r.lo)) << r.field;
    EXPECT_EQ(Ok(json(r.field, r.hi)).*r.member, std::chrono::milliseconds(r.hi)) << r.field;
    Err(json(r.field, r.lo - 1),
        {std::string("kv_connector_extra_config.") + r.field, std::to_string(r.lo - 1)});
    Err(json(r.field, r.hi + 1),
        {std::string("kv_connector_extra_config.") + r.field, std::to_string(r.hi + 1)});
    Err(json(r.field, -1), {r.field});
  }
}

TEST(KvTransferConfig, RefusesUnknownEnumValues) {
  Err(R"({"kv_connector_extra_config": {"backend": "rdma"}})",
      {"backend", "rdma", "ucx:tcp", "libfabric:shm"});
  Err(R"({"kv_connector_extra_config": {"backend": ""}})", {"backend"});
  Err(R"({"kv_connector_extra_config": {"backend": "UCX:TCP"}})", {"backend"});
  Err(R"({"kv_connector_extra_config": {"failure_policy": "retry"}})", {"failure_policy"});
  Err(R"({"kv_connector_extra_config": {"failure_policy": "Fail"}})", {"failure_policy"});
  Err(R"({"kv_connector_extra_config": {"pull_profile": "nixl"}})", {"pull_profile"});
  Err(R"({"kv_connector_extra_config": {"pull_profile": ""}})", {"pull_profile"});
  Err(R"({"kv_role": "kv_router"})", {"kv_role", "kv_router"});
}

TEST(KvTransferConfig, KvRoleMustAgreeWithRole) {
  EXPECT_EQ(Ok(R"({"kv_role": "kv_producer"})", "prefill").role, KvRole::kProducer);
  EXPECT_EQ(Ok(R"({"kv_role": "kv_consumer"})", "decode").role, KvRole::kConsumer);
  EXPECT_EQ(Ok(R"({"kv_role": "kv_both"})", "both").role, KvRole::kBoth);
  // --role both takes the JSON's narrower role.
  EXPECT_EQ(Ok(R"({"kv_role": "kv_producer"})", "both").role, KvRole::kProducer);
  EXPECT_EQ(Ok(R"({"kv_role": "kv_consumer"})", "both").role, KvRole::kConsumer);
  Err(R"({"kv_role": "kv_consumer"})", {"kv_role", "kv_consumer", "--role prefill"}, "prefill");
  Err(R"({"kv_role": "kv_producer"})", {"kv_role", "kv_producer", "--role decode"}, "decode");
  Err(R"({"kv_role": "kv_both"})", {"kv_role", "--role decode"}, "decode");
}

TEST(KvTransferConfig, EngineIdLength) {
  EXPECT_EQ(Ok(R"({"engine_id": ")" + std::string(200, 'e') + "\"}").engine_id.size(), 200u);
  Err(R"({"engine_id": ")" + std::string(201, 'e') + "\"}", {"engine_id"});
}

TEST(KvTransferConfig, BrokenPeerBound) {
  // Default: four cancel deadlines, following cancel_ack_ms when only that is given.
  EXPECT_EQ(KvTransferConfig{}.broken_peer, 8000ms);
  EXPECT_EQ(Ok("{}").broken_peer, 8000ms);
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"cancel_ack_ms": 500}})").broken_peer, 2000ms);
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"cancel_ack_ms": 600000}})").broken_peer,
            2400000ms);
  // Given: any value in [cancel_ack_ms, 1 h].
  const auto c = Ok(R"({"kv_connector_extra_config": {"cancel_ack_ms": 500,
      "broken_peer_ms": 1500}})");
  EXPECT_EQ(c.broken_peer, 1500ms);
  EXPECT_EQ(Ok(R"({"kv_connector_extra_config": {"cancel_ack_ms": 500, "broken_peer_ms": 500}})")
                .broken_peer,
            500ms);
  Err(R"({"kv_connector_extra_config": {"cancel_ack_ms": 500, "broken_peer_ms": 499}})",
      {"broken_peer_ms (499) must be at least cancel_ack_ms (500)"});
  Err(R"({"kv_connector_extra_config": {"broken_peer_ms": 3600001}})",
      {"kv_connector_extra_config.broken_peer_ms", "3600001"});
  Err(R"({"kv_connector_extra_config": {"broken_peer_ms": "8000"}})",
      {"kv_connector_extra_config.broken_peer_ms", "integer"});
  EXPECT_NE(c.ToString().find("broken_peer_ms=1500"), std::string::npos) << c.ToString();
  EXPECT_NE(KvTransferConfig{}.ToString().find("broken_peer_ms=8000"), std::string::npos);
}

TEST(KvTransferConfig, ToStringMentionsEveryField) {
  auto c = Ok(R"({"kv_connector": "NixlConnector",
      "kv_connector_extra_config": {"backend": "ucx:shm", "lease_ms": 45000,
        "watchdog_ms": 1234, "cancel_ack_ms": 777, "stall_ms": 999, "failure_policy": "fail",
        "pull_profile": "vllm", "layerwise": false, "engine_id": "decode-a",
        "verify_checksums": false}})",
              "decode");
  const std::string s = c.ToString();
  for (const char* want :
       {"kv_connector=PullConnector", "kv_role=kv_consumer", "backend=ucx:shm",
        "engine_id=decode-a", "lease_ms=45000", "watchdog_ms=1234", "cancel_ack_ms=777",
        "stall_ms=999", "failure_policy=fail", "pull_profile=vllm", "layerwise=false"}) {
    EXPECT_NE(s.find(want), std::string::npos) << "'" << s << "' lacks '" << want << "'";
  }
  EXPECT_EQ(s.find('\n'), std::string::npos);
  const std::string d = KvTransferConfig{}.ToString();
  for (const char* want :
       {"kv_connector=PushConnector", "kv_role=kv_both", "backend=ucx:tcp", "engine_id=(auto)",
        "lease_ms=30000", "watchdog_ms=10000", "cancel_ack_ms=2000", "stall_ms=5000",
        "failure_policy=recompute", "pull_profile=fast", "layerwise=true"}) {
    EXPECT_NE(d.find(want), std::string::npos) << "'" << d << "' lacks '" << want << "'";
  }
}

}  // namespace
}  // namespace kvpush::connector
