// The pure parts of kvpush's etcd discovery (docs/deployment.md §"What etcd holds"): the
// etcd://HOST:PORT[,HOST:PORT...] endpoint list, the key an instance registers under, and the JSON
// document stored as its value. No I/O.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush::discovery {

/// Version of the value document; readers refuse other versions.
inline constexpr int kRecordVersion = 1;
/// Default key prefix (--discovery-prefix).
inline constexpr const char* kDefaultPrefix = "/kvpush/";

/// One etcd client endpoint. Value type.
struct EtcdEndpoint {
  std::string host;
  int port = 0;
};

/// Parses "etcd://HOST:PORT[,HOST:PORT...]" (at most 16 endpoints). Errors: kInvalidArgument
/// naming what is wrong (scheme, host, port outside [1, 65535], a path).
Result<std::vector<EtcdEndpoint>> ParseDiscoveryUrl(const std::string& url);

/// Checks a key prefix: starts with '/', ends with '/', 2..128 bytes of printable ASCII.
/// Errors: kInvalidArgument.
Status ValidatePrefix(const std::string& prefix);

/// The model-name key segment: '%' and '/' (and bytes outside printable ASCII) percent-encoded,
/// so a served model name like "org/model" stays one segment.
std::string EscapeSegment(const std::string& s);

/// The etcd range_end that selects every key starting with `prefix` (prefix with its last byte
/// incremented; "\0" for an empty prefix, i.e. all keys).
std::string PrefixRangeEnd(const std::string& prefix);

/// What one registered instance publishes. The document's fields, all required:
///   {"version": 1, "role": "prefill"|"decode"|"both", "model": served model name,
///    "url": "http[s]://HOST:PORT", "compat_hash": 16 hex digits, "incarnation": 16 hex digits,
///    "started_at": unix seconds, "pid": process id}
struct InstanceRecord {
  std::string role;  ///< "prefill", "decode" or "both"
  std::string model;
  std::string url;  ///< normalized http://HOST:PORT or https://HOST:PORT (TLS)
  uint64_t compat_hash = 0;
  uint64_t incarnation = 0;
  int64_t started_at = 0;  ///< unix seconds
  int64_t pid = 0;

  /// `<prefix><EscapeSegment(model)>/<role>/<16 hex incarnation>`.
  std::string Key(const std::string& prefix) const;
  nlohmann::json ToJson() const;
  /// Parses and validates a value document: every field present with its type and range, role
  /// known, url http[s]://HOST:PORT, model 1..256 bytes. Errors: kInvalidArgument naming the field.
  static Result<InstanceRecord> FromJson(const nlohmann::json& j);
  /// FromJson of `text`, and checks that `key` is the record's Key(prefix) (a value copied under
  /// another key is refused). Errors: kInvalidArgument.
  static Result<InstanceRecord> Parse(const std::string& prefix, const std::string& key,
                                      const std::string& text);

  bool operator==(const InstanceRecord&) const = default;
};

}  // namespace kvpush::discovery
