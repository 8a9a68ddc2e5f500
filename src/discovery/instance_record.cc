#include "discovery/instance_record.h"

#include <cstdio>

#include "common/encoding.h"

namespace kvpush::discovery {
namespace {

/// "HOST:PORT" → endpoint. Errors: kInvalidArgument.
Result<EtcdEndpoint> ParseHostPort(const std::string& what, const std::string& hp) {
  const size_t colon = hp.rfind(':');
  if (colon == std::string::npos) return InvalidArgument(what + ": missing port (HOST:PORT)");
  EtcdEndpoint e;
  e.host = hp.substr(0, colon);
  const std::string port = hp.substr(colon + 1);
  if (e.host.empty()) return InvalidArgument(what + ": missing host");
  if (e.host.find_first_of("@?#[]/ ") != std::string::npos) {
    return InvalidArgument(what + ": unsupported characters in host");
  }
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgument(what + ": port must be a number in [1, 65535]");
  }
  e.port = std::stoi(port);
  if (e.port < 1 || e.port > 65535) {
    return InvalidArgument(what + ": port must be a number in [1, 65535]");
  }
  return e;
}

bool Printable(char c) {
  return c > 0x20 && c < 0x7f;
}

}  // namespace

Result<std::vector<EtcdEndpoint>> ParseDiscoveryUrl(const std::string& url) {
  const std::string scheme = "etcd://";
  const std::string what = "--discovery '" + url + "'";
  if (url.rfind(scheme, 0) != 0) {
    return InvalidArgument(what + ": expected etcd://HOST:PORT[,HOST:PORT...]");
  }
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) return InvalidArgument(what + ": a path is not allowed");
  std::vector<EtcdEndpoint> out;
  size_t start = 0;
  while (true) {
    const size_t comma = rest.find(',', start);
    const std::string part =
        rest.substr(start, comma == std::string::npos ? rest.npos : comma - start);
    KVP_ASSIGN_OR_RETURN(EtcdEndpoint e, ParseHostPort(what, part));
    out.push_back(std::move(e));
    if (out.size() > 16) return InvalidArgument(what + ": at most 16 endpoints");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Status ValidatePrefix(const std::string& prefix) {
  if (prefix.size() < 2 || prefix.size() > 128 || prefix.front() != '/' || prefix.back() != '/') {
    return InvalidArgument("--discovery-prefix '" + prefix +
                           "': must start and end with '/' (2..128 bytes), e.g. /kvpush/");
  }
  for (char c : prefix) {
    if (!Printable(c)) {
      return InvalidArgument("--discovery-prefix: only printable ASCII without spaces");
    }
  }
  return Status::Ok();
}

std::string EscapeSegment(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '%' || c == '/' || !Printable(c)) {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

std::string InstanceRecord::Key(const std::string& prefix) const {
  return prefix + EscapeSegment(model) + "/" + role + "/" + Hex64(incarnation);
}

nlohmann::json InstanceRecord::ToJson() const {
  return {{"version", kRecordVersion},
          {"role", role},
          {"model", model},
          {"url", url},
          {"compat_hash", Hex64(compat_hash)},
          {"incarnation", Hex64(incarnation)},
          {"started_at", started_at},
          {"pid", pid}};
}

Result<InstanceRecord> InstanceRecord::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("discovery record: not a JSON object");
  auto str = [&](const char* k, std::string& out) -> Status {
    auto it = j.find(k);
    if (it == j.end() || !it->is_string()) {
      return InvalidArgument(std::string("discovery record: '") + k + "' must be a string");
    }
    out = it->get<std::string>();
    return Status::Ok();
  };
  auto num = [&](const char* k, int64_t lo, int64_t hi, int64_t& out) -> Status {
    auto it = j.find(k);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < lo ||
        it->get<int64_t>() > hi) {
      return InvalidArgument(std::string("discovery record: '") + k + "' must be an integer in [" +
                             std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    out = it->get<int64_t>();
    return Status::Ok();
  };
  int64_t version = 0;
  KVP_RETURN_IF_ERROR(num("version", 0, 1 << 20, version));
  if (version != kRecordVersion) {
    return InvalidArgument("discovery record: version " + std::to_string(version) +
                           " (this build reads " + std::to_string(kRecordVersion) + ")");
  }
  InstanceRecord r;
  std::string compat, inc;
  KVP_RETURN_IF_ERROR(str("role", r.role));
  if (r.role != "prefill" && r.role != "decode" && r.role != "both") {
    return InvalidArgument("discovery record: 'role' must be prefill, decode or both");
  }
  KVP_RETURN_IF_ERROR(str("model", r.model));
  if (r.model.empty() || r.model.size() > 256) {
    return InvalidArgument("discovery record: 'model' must be 1..256 bytes");
  }
  KVP_RETURN_IF_ERROR(str("url", r.url));
  const std::string scheme = r.url.rfind("http://", 0) == 0    ? "http://"
                             : r.url.rfind("https://", 0) == 0 ? "https://"
                                                               : "";
  if (scheme.empty()) {
    return InvalidArgument("discovery record: 'url' must be http://HOST:PORT or https://HOST:PORT");
  }
  auto hp = ParseHostPort("discovery record: 'url'", r.url.substr(scheme.size()));
  if (!hp.ok()) return hp.status();
  r.url = scheme + hp->host + ":" + std::to_string(hp->port);
  KVP_RETURN_IF_ERROR(str("compat_hash", compat));
  auto c = ParseHex64(compat);
  if (!c.ok()) return InvalidArgument("discovery record: 'compat_hash' must be 1-16 hex digits");
  r.compat_hash = *c;
  KVP_RETURN_IF_ERROR(str("incarnation", inc));
  auto i = ParseHex64(inc);
  if (!i.ok()) return InvalidArgument("discovery record: 'incarnation' must be 1-16 hex digits");
  r.incarnation = *i;
  KVP_RETURN_IF_ERROR(num("started_at", 0, int64_t{1} << 40, r.started_at));
  KVP_RETURN_IF_ERROR(num("pid", 0, int64_t{1} << 32, r.pid));
  return r;
}

Result<InstanceRecord> InstanceRecord::Parse(const std::string& prefix, const std::string& key,
                                             const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("discovery record: value is not JSON");
  KVP_ASSIGN_OR_RETURN(InstanceRecord r, FromJson(j));
  if (r.Key(prefix) != key) {
    return InvalidArgument("discovery record: key '" + key + "' does not match its value (" +
                           r.Key(prefix) + ")");
  }
  return r;
}

}  // namespace kvpush::discovery
