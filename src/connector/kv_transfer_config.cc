#include "connector/kv_transfer_config.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "xfer/backend_factory.h"

namespace kvpush::connector {

std::string_view KvRoleName(KvRole r) {
  switch (r) {
    case KvRole::kProducer:
      return "kv_producer";
    case KvRole::kConsumer:
      return "kv_consumer";
    case KvRole::kBoth:
      return "kv_both";
  }
  return "?";
}

namespace {

Result<std::chrono::milliseconds> Ms(const nlohmann::json& j, const char* key, int64_t lo,
                                     int64_t hi, std::chrono::milliseconds def) {
  if (!j.contains(key)) return def;
  const auto& v = j[key];
  if (!v.is_number_integer()) {
    return InvalidArgument(std::string("kv_connector_extra_config.") + key +
                           " must be an integer (milliseconds)");
  }
  const auto x = v.get<int64_t>();
  if (x < lo || x > hi) {
    return InvalidArgument(std::string("kv_connector_extra_config.") + key + " must be in [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "] ms, got " +
                           std::to_string(x));
  }
  return std::chrono::milliseconds(x);
}

/// A byte count of `key` in [0, 2^max_log2], or `def` when absent.
Result<uint64_t> Bytes(const nlohmann::json& j, const char* key, int max_log2, uint64_t def) {
  if (!j.contains(key)) return def;
  const auto& v = j[key];
  if (!v.is_number_unsigned() || v.get<uint64_t>() > (uint64_t{1} << max_log2)) {
    return InvalidArgument(std::string(key) + " must be an integer in [0, 2^" +
                           std::to_string(max_log2) + "]");
  }
  return v.get<uint64_t>();
}

/// vLLM's NIXL backend names (kv_connector_extra_config.backends) as kvpush backends.
Result<std::string> BackendFromVllm(const nlohmann::json& backends) {
  if (!backends.is_array() || backends.size() != 1 || !backends[0].is_string()) {
    return InvalidArgument(
        "kv_connector_extra_config.backends must be a list of one name, [\"UCX\"] or "
        "[\"LIBFABRIC\"] (kvpush runs one transport per instance; \"backend\" names it "
        "exactly: ucx:tcp, ucx:shm, libfabric:tcp, libfabric:shm)");
  }
  const std::string name = backends[0].get<std::string>();
  if (name == "UCX") return std::string("ucx:tcp");
  if (name == "LIBFABRIC") return std::string("libfabric:tcp");
  return InvalidArgument("kv_connector_extra_config.backends: '" + name +
                         "' is not a backend kvpush has (UCX, LIBFABRIC)");
}

/// vLLM's spellings of kvpush settings (docs/configuration.md, "vLLM's keys"): the top-level
/// kv_load_failure_policy, and kv_connector_extra_config.backends and .kv_lease_duration
/// (seconds). One given beside kvpush's own key for the same setting must agree with it.
Status ApplyVllmSynonyms(const nlohmann::json& top, const nlohmann::json& extra,
                         KvTransferConfig& c) {
  if (top.contains("kv_load_failure_policy")) {
    const auto& v = top["kv_load_failure_policy"];
    FailurePolicy p;
    if (v == "recompute") {
      p = FailurePolicy::kRecompute;
    } else if (v == "fail") {
      p = FailurePolicy::kFail;
    } else {
      return InvalidArgument("kv_load_failure_policy must be \"recompute\" or \"fail\"");
    }
    if (extra.contains("failure_policy") && p != c.failure_policy) {
      return InvalidArgument(
          "kv_load_failure_policy contradicts kv_connector_extra_config.failure_policy");
    }
    c.failure_policy = p;
  }
  if (extra.contains("backends")) {
    KVP_ASSIGN_OR_RETURN(std::string b, BackendFromVllm(extra["backends"]));
    const bool same_transport = c.backend.rfind(b.substr(0, b.find(':')), 0) == 0;
    if (extra.contains("backend") && !same_transport) {
      return InvalidArgument("kv_connector_extra_config.backends contradicts backend '" +
                             c.backend + "'");
    }
    if (!extra.contains("backend")) c.backend = b;
  }
  if (extra.contains("kv_lease_duration")) {
    const auto& v = extra["kv_lease_duration"];
    const double s = v.is_number() ? v.get<double>() : -1;
    if (!(s >= 0.1 && s <= 3600)) {
      return InvalidArgument(
          "kv_connector_extra_config.kv_lease_duration must be a number of seconds in [0.1, "
          "3600]");
    }
    const auto lease = std::chrono::milliseconds(std::llround(s * 1000));
    if (extra.contains("lease_ms") && lease != c.lease) {
      return InvalidArgument("kv_connector_extra_config.kv_lease_duration contradicts lease_ms");
    }
    c.lease = lease;
  }
  return Status::Ok();
}

}  // namespace

Result<KvTransferConfig> KvTransferConfig::Parse(std::string_view text, std::string_view role) {
  KvTransferConfig c;
  if (role == "prefill") {
    c.role = KvRole::kProducer;
  } else if (role == "decode") {
    c.role = KvRole::kConsumer;
  } else if (role == "both" || role.empty()) {
    c.role = KvRole::kBoth;
  } else {
    return InvalidArgument("--role must be prefill, decode or both");
  }
  nlohmann::json j = nlohmann::json::object();
  if (!text.empty()) {
    j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidArgument("--kv-transfer-config is not a JSON object");
    }
  }
  for (const auto& [k, v] : j.items()) {
    if (k != "kv_connector" && k != "kv_role" && k != "kv_connector_extra_config" &&
        k != "kv_buffer_device" && k != "engine_id" && k != "kv_load_failure_policy") {
      return InvalidArgument("--kv-transfer-config: unknown field '" + k + "'");
    }
  }
  if (j.contains("kv_connector")) {
    if (!j["kv_connector"].is_string()) return InvalidArgument("kv_connector must be a string");
    const std::string name = j["kv_connector"].get<std::string>();
    if (name == "PushConnector" || name == "KvpushPushConnector" || name == "NixlPushConnector") {
      c.kv_connector = "PushConnector";
    } else if (name == "PullConnector" || name == "NixlConnector" ||
               name == "NixlPullConnector") {
      c.kv_connector = "PullConnector";
    } else {
      return InvalidArgument("kv_connector '" + name +
                             "' is not supported (PushConnector or NixlPushConnector: push; "
                             "PullConnector, NixlConnector or NixlPullConnector: pull)");
    }
  }
  if (j.contains("kv_role")) {
    if (!j["kv_role"].is_string()) return InvalidArgument("kv_role must be a string");
    const std::string r = j["kv_role"].get<std::string>();
    KvRole jr;
    if (r == "kv_producer") {
      jr = KvRole::kProducer;
    } else if (r == "kv_consumer") {
      jr = KvRole::kConsumer;
    } else if (r == "kv_both") {
      jr = KvRole::kBoth;
    } else {
      return InvalidArgument("kv_role must be kv_producer, kv_consumer or kv_both, got '" + r +
                             "'");
    }
    if (role != "both" && !role.empty() && jr != c.role) {
      return InvalidArgument("kv_role '" + r + "' contradicts --role " + std::string(role));
    }
    c.role = jr;
  }
  if (j.contains("engine_id")) {
    if (!j["engine_id"].is_string()) return InvalidArgument("engine_id must be a string");
    c.engine_id = j["engine_id"].get<std::string>();
  }
  if (j.contains("kv_connector_extra_config")) {
    const auto& x = j["kv_connector_extra_config"];
    if (!x.is_object()) return InvalidArgument("kv_connector_extra_config must be an object");
    for (const auto& [k, v] : x.items()) {
      static const char* kKnown[] = {"backend",
                                     "lease_ms",
                                     "watchdog_ms",
                                     "cancel_ack_ms",
                                     "stall_ms",
                                     "failure_policy",
                                     "pull_profile",
                                     "layerwise",
                                     "partial_targets",
                                     "engine_id",
                                     "verify_checksums",
                                     "layerwise_min_bytes",
                                     "block_list_part_bytes",
                                     "eager_write_max_bytes",
                                     "broken_peer_ms",
                                     "backends",
                                     "kv_lease_duration"};
      bool known = false;
      for (const char* kk : kKnown) known = known || k == kk;
      if (!known) return InvalidArgument("kv_connector_extra_config: unknown field '" + k + "'");
    }
    if (x.contains("backend")) {
      if (!x["backend"].is_string()) return InvalidArgument("backend must be a string");
      c.backend = x["backend"].get<std::string>();
    }
    if (x.contains("engine_id")) {
      if (!x["engine_id"].is_string()) return InvalidArgument("engine_id must be a string");
      c.engine_id = x["engine_id"].get<std::string>();
    }
    KVP_ASSIGN_OR_RETURN(c.lease, Ms(x, "lease_ms", 100, 3600000, c.lease));
    KVP_ASSIGN_OR_RETURN(c.watchdog, Ms(x, "watchdog_ms", 10, 3600000, c.watchdog));
    KVP_ASSIGN_OR_RETURN(c.cancel_ack, Ms(x, "cancel_ack_ms", 10, 600000, c.cancel_ack));
    KVP_ASSIGN_OR_RETURN(c.stall, Ms(x, "stall_ms", 10, 600000, c.stall));
    // Unless given: kBrokenPeerCancelAcks cancel deadlines (the CANCEL re-sent twice meanwhile).
    c.broken_peer = std::min<std::chrono::milliseconds>(c.cancel_ack * kBrokenPeerCancelAcks,
                                                        std::chrono::milliseconds(3600000));
    KVP_ASSIGN_OR_RETURN(c.broken_peer, Ms(x, "broken_peer_ms", 10, 3600000, c.broken_peer));
    if (c.broken_peer < c.cancel_ack) {
      return InvalidArgument("broken_peer_ms (" + std::to_string(c.broken_peer.count()) +
                             ") must be at least cancel_ack_ms (" +
                             std::to_string(c.cancel_ack.count()) + ")");
    }
    if (x.contains("failure_policy")) {
      const auto& v = x["failure_policy"];
      if (v == "recompute") {
        c.failure_policy = FailurePolicy::kRecompute;
      } else if (v == "fail") {
        c.failure_policy = FailurePolicy::kFail;
      } else {
        return InvalidArgument("failure_policy must be \"recompute\" or \"fail\"");
      }
    }
    if (x.contains("pull_profile")) {
      const auto& v = x["pull_profile"];
      auto profile = v.is_string() ? pd::ParsePullProfile(v.get<std::string>()) : std::nullopt;
      if (!profile) return InvalidArgument("pull_profile must be \"vllm\" or \"fast\"");
      c.pull_profile = *profile;
    }
    if (x.contains("layerwise")) {
      if (!x["layerwise"].is_boolean()) return InvalidArgument("layerwise must be a boolean");
      c.layerwise = x["layerwise"].get<bool>();
    }
    if (x.contains("partial_targets")) {
      if (!x["partial_targets"].is_boolean()) {
        return InvalidArgument("partial_targets must be a boolean");
      }
      c.partial_targets = x["partial_targets"].get<bool>();
    }
    KVP_ASSIGN_OR_RETURN(c.layerwise_min_bytes,
                         Bytes(x, "layerwise_min_bytes", 40, c.layerwise_min_bytes));
    KVP_ASSIGN_OR_RETURN(c.eager_write_max_bytes,
                         Bytes(x, "eager_write_max_bytes", 30, c.eager_write_max_bytes));
    if (x.contains("block_list_part_bytes")) {
      const auto& v = x["block_list_part_bytes"];
      if (!v.is_number_unsigned() || v.get<uint64_t>() < 16 ||
          v.get<uint64_t>() > kMaxBlockListBytes) {
        return InvalidArgument("block_list_part_bytes must be an integer in [16, " +
                               std::to_string(kMaxBlockListBytes) + "]");
      }
      c.block_list_part_bytes = v.get<uint32_t>();
    }
    if (x.contains("verify_checksums")) {
      if (!x["verify_checksums"].is_boolean()) {
        return InvalidArgument("verify_checksums must be a boolean");
      }
      c.verify_checksums = x["verify_checksums"].get<bool>();
    }
  }
  KVP_RETURN_IF_ERROR(ApplyVllmSynonyms(
      j, j.contains("kv_connector_extra_config") ? j["kv_connector_extra_config"]
                                                 : nlohmann::json::object(),
      c));
  bool backend_known = c.backend == "loopback";  // in-process (tests)
  for (const auto& b : xfer::MultiProcessBackendSpecs()) backend_known |= b == c.backend;
  if (!backend_known) {
    std::string list;
    for (const auto& b : xfer::MultiProcessBackendSpecs()) list += (list.empty() ? "" : ", ") + b;
    return InvalidArgument("backend '" + c.backend + "' is not one of: " + list);
  }
  if (c.engine_id.size() > 200) return InvalidArgument("engine_id is longer than 200 bytes");
  return c;
}

std::string KvTransferConfig::ToString() const {
  return "kv_connector=" + kv_connector + " kv_role=" + std::string(KvRoleName(role)) +
         " backend=" + backend + " engine_id=" + (engine_id.empty() ? "(auto)" : engine_id) +
         " lease_ms=" + std::to_string(lease.count()) +
         " watchdog_ms=" + std::to_string(watchdog.count()) +
         " cancel_ack_ms=" + std::to_string(cancel_ack.count()) +
         " stall_ms=" + std::to_string(stall.count()) +
         " broken_peer_ms=" + std::to_string(broken_peer.count()) +
         " failure_policy=" + (failure_policy == FailurePolicy::kRecompute ? "recompute" : "fail") +
         " pull_profile=" + std::string(pd::PullProfileName(pull_profile)) +
         " layerwise=" + (layerwise ? "true" : "false") +
         " partial_targets=" + (partial_targets ? "true" : "false") +
         " layerwise_min_bytes=" + std::to_string(layerwise_min_bytes) +
         " eager_write_max_bytes=" + std::to_string(eager_write_max_bytes) +
         " block_list_part_bytes=" + std::to_string(block_list_part_bytes) +
         " verify_checksums=" + (verify_checksums ? "true" : "false");
}

}  // namespace kvpush::connector
