// EtcdClient: a small client of etcd v3's JSON gateway (HTTP POST /v3/..., keys and values
// base64, 64-bit integers as decimal strings; etcd 3.4 serves both /v3/ and /v3beta/, this uses
// /v3/). Only what discovery needs: leases (grant, keep-alive, revoke), put, delete, range over a
// prefix, and a watch stream over a prefix. Every field etcd returns is validated (types, ranges,
// base64); a malformed answer is an error, never a crash (fuzz-safe parsers below are pure).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "discovery/instance_record.h"

namespace httplib {
class Client;
}

namespace kvpush::discovery {

/// One key-value pair as etcd returns it (key and value decoded from base64). Value type.
struct KeyValue {
  std::string key;
  std::string value;
  int64_t mod_revision = 0;
  int64_t lease = 0;  ///< 0: none
};

/// A range's pairs and the store revision it was read at.
struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;
};

/// One watch event: a put (create or update) or a delete (value empty) of `kv.key`.
struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;
};

/// One message of the watch stream.
struct WatchMessage {
  bool created = false;   ///< the watch is set up
  bool canceled = false;  ///< etcd ended the watch (e.g. compacted revision): re-list
  int64_t revision = 0;   ///< header revision
  int64_t compact_revision = 0;
  std::string cancel_reason;
  std::vector<WatchEvent> events;
};

/// Reads a 64-bit integer field that the gateway writes as a decimal string (or a JSON integer).
/// An absent field is 0 (proto3 omits zero values). Errors: kInvalidArgument naming the field.
Result<int64_t> ReadInt64(const nlohmann::json& obj, const char* field);
/// Parses a KeyValue object ("key"/"value" base64). Errors: kInvalidArgument.
Result<KeyValue> ParseKeyValue(const nlohmann::json& kv);
/// Parses a /v3/kv/range answer. Errors: kInvalidArgument.
Result<RangeResult> ParseRangeResponse(const nlohmann::json& j);
/// Parses one newline-delimited message of the /v3/watch stream ({"result": {...}} or
/// {"error": {...}}). Errors: kInvalidArgument (malformed), kUnavailable (an error message).
Result<WatchMessage> ParseWatchLine(const std::string& line);

/// Cancels a running EtcdClient::Watch from another thread (shuts its socket). Thread-safe;
/// once cancelled, every later Watch given it returns kCancelled at once.
class WatchCanceller {
 public:
  void Cancel();
  bool cancelled() const;

 private:
  friend class EtcdClient;
  /// False when already cancelled.
  bool Attach(httplib::Client* client);
  void Detach();

  mutable Mutex mu_;
  httplib::Client* client_ GUARDED_BY(mu_) = nullptr;
  bool cancelled_ GUARDED_BY(mu_) = false;
  CondVar detached_;  ///< notified by Detach()
};

/// Blocking calls to one etcd cluster through its JSON gateway. Each call tries the endpoints in
/// turn, starting at the one that answered last, and each connect/read is bounded by `timeout`.
/// Thread-safe (a fresh connection per call; no state but the current endpoint index).
class EtcdClient {
 public:
  EtcdClient(std::vector<EtcdEndpoint> endpoints, std::chrono::milliseconds timeout);

  /// Grants a lease of `ttl_s` seconds. Returns its id. Errors: kUnavailable.
  Result<int64_t> LeaseGrant(int64_t ttl_s);
  /// Renews a lease once. Returns its TTL (s). Errors: kNotFound (expired or revoked),
  /// kUnavailable.
  Result<int64_t> LeaseKeepAlive(int64_t lease);
  /// Revokes a lease (deleting its keys). An unknown lease is not an error. Errors: kUnavailable.
  Status LeaseRevoke(int64_t lease);
  /// Puts `key` = `value`, attached to `lease` (0: none). Returns the new revision.
  Result<int64_t> Put(const std::string& key, const std::string& value, int64_t lease);
  /// Deletes `key`. Errors: kUnavailable.
  Status Delete(const std::string& key);
  /// The pair of exactly `key`, or nullopt when absent. Errors: kUnavailable, kInvalidArgument.
  Result<std::optional<KeyValue>> Get(const std::string& key);
  /// Every pair whose key starts with `prefix`. Errors: kUnavailable, kInvalidArgument (bad
  /// answer).
  Result<RangeResult> RangePrefix(const std::string& prefix);

  /// Watches keys under `prefix` from `start_revision`, calling `on_message` for each message
  /// (on this thread) until the stream ends. Returns kCancelled after `canceller` fired,
  /// kUnavailable when etcd went away or the stream was idle for `idle_timeout`,
  /// kAborted when etcd cancelled the watch (compaction: re-list), kInvalidArgument for a
  /// malformed message.
  Status Watch(const std::string& prefix, int64_t start_revision,
               const std::function<void(const WatchMessage&)>& on_message,
               WatchCanceller& canceller, std::chrono::seconds idle_timeout);

  const std::vector<EtcdEndpoint>& endpoints() const { return endpoints_; }

 private:
  /// POSTs `request` to `path` ("/v3/..."); returns the answer's JSON. Errors: kUnavailable (no
  /// endpoint answered, or etcd's error), kNotFound (gRPC code 5), kInvalidArgument (not JSON).
  Result<nlohmann::json> Call(const std::string& path, const nlohmann::json& request);

  std::vector<EtcdEndpoint> endpoints_;
  std::chrono::milliseconds timeout_;
  std::atomic<size_t> current_{0};  ///< index of the endpoint to try first
};

}  // namespace kvpush::discovery
