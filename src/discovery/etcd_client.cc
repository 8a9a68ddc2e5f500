#include "discovery/etcd_client.h"

#include <httplib.h>

#include <charconv>

#include "common/encoding.h"

namespace kvpush::discovery {
namespace {

/// Longest watch message accepted before the stream is refused (etcd's default request limit is
/// 1.5 MiB; discovery values are < 1 KiB).
constexpr size_t kMaxWatchLine = 16u << 20;

void SetTimeouts(httplib::Client& cli, std::chrono::milliseconds connect,
                 std::chrono::milliseconds read) {
  cli.set_connection_timeout(connect.count() / 1000, (connect.count() % 1000) * 1000);
  cli.set_read_timeout(read.count() / 1000, (read.count() % 1000) * 1000);
  cli.set_write_timeout(connect.count() / 1000, (connect.count() % 1000) * 1000);
}

/// etcd's error document {"error": "...", "message": "...", "code": N} as a Status.
Status GatewayError(const nlohmann::json& j, int http_status) {
  std::string msg = "etcd: HTTP " + std::to_string(http_status);
  int code = -1;
  if (j.is_object()) {
    auto m = j.find("message");
    if (m != j.end() && m->is_string()) msg = "etcd: " + m->get<std::string>();
    auto c = j.find("code");
    if (c != j.end() && c->is_number_integer()) code = c->get<int>();
  }
  if (code == 5) return NotFound(msg);  // gRPC NOT_FOUND (e.g. "requested lease not found")
  if (code == 3) return InvalidArgument(msg);
  return Unavailable(msg);
}

}  // namespace

Result<int64_t> ReadInt64(const nlohmann::json& obj, const char* field) {
  if (!obj.is_object())
    return InvalidArgument(std::string("etcd: '") + field + "': not in an object");
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return int64_t{0};
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) {
    const std::string& s = it->get_ref<const std::string&>();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc() && p == s.data() + s.size() && !s.empty()) return v;
  }
  return InvalidArgument(std::string("etcd: '") + field + "' is not a 64-bit integer");
}

Result<KeyValue> ParseKeyValue(const nlohmann::json& kv) {
  if (!kv.is_object()) return InvalidArgument("etcd: a kv is not an object");
  KeyValue out;
  for (auto [field, dst] : {std::pair{"key", &out.key}, std::pair{"value", &out.value}}) {
    auto it = kv.find(field);
    if (it == kv.end()) continue;  // proto3 omits empty bytes
    if (!it->is_string())
      return InvalidArgument(std::string("etcd: kv '") + field + "' not a string");
    auto d = Base64DecodeString(it->get<std::string>());
    if (!d.ok()) return InvalidArgument(std::string("etcd: kv '") + field + "' is not base64");
    *dst = std::move(d).value();
  }
  if (out.key.empty()) return InvalidArgument("etcd: kv without a key");
  KVP_ASSIGN_OR_RETURN(out.mod_revision, ReadInt64(kv, "mod_revision"));
  KVP_ASSIGN_OR_RETURN(out.lease, ReadInt64(kv, "lease"));
  return out;
}

Result<RangeResult> ParseRangeResponse(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("etcd: range answer is not an object");
  RangeResult r;
  auto h = j.find("header");
  if (h == j.end() || !h->is_object()) return InvalidArgument("etcd: range answer has no header");
  KVP_ASSIGN_OR_RETURN(r.revision, ReadInt64(*h, "revision"));
  if (r.revision < 1) return InvalidArgument("etcd: range revision must be >= 1");
  auto kvs = j.find("kvs");
  if (kvs == j.end()) return r;
  if (!kvs->is_array()) return InvalidArgument("etcd: range 'kvs' is not an array");
  for (const auto& kv : *kvs) {
    KVP_ASSIGN_OR_RETURN(KeyValue p, ParseKeyValue(kv));
    r.kvs.push_back(std::move(p));
  }
  return r;
}

Result<WatchMessage> ParseWatchLine(const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("etcd watch: message is not JSON");
  if (auto e = j.find("error"); e != j.end()) {
    return Unavailable("etcd watch: " + (e->is_object() ? e->dump() : std::string("error")));
  }
  auto res = j.find("result");
  if (res == j.end() || !res->is_object()) return InvalidArgument("etcd watch: no 'result'");
  WatchMessage m;
  auto flag = [&](const char* k, bool& out) -> Status {
    auto it = res->find(k);
    if (it == res->end()) return Status::Ok();
    if (!it->is_boolean()) return InvalidArgument(std::string("etcd watch: '") + k + "' not bool");
    out = it->get<bool>();
    return Status::Ok();
  };
  KVP_RETURN_IF_ERROR(flag("created", m.created));
  KVP_RETURN_IF_ERROR(flag("canceled", m.canceled));
  if (auto h = res->find("header"); h != res->end()) {
    KVP_ASSIGN_OR_RETURN(m.revision, ReadInt64(*h, "revision"));
  }
  KVP_ASSIGN_OR_RETURN(m.compact_revision, ReadInt64(*res, "compact_revision"));
  if (auto r = res->find("cancel_reason"); r != res->end() && r->is_string()) {
    m.cancel_reason = r->get<std::string>();
  }
  auto evs = res->find("events");
  if (evs == res->end()) return m;
  if (!evs->is_array()) return InvalidArgument("etcd watch: 'events' is not an array");
  for (const auto& e : *evs) {
    if (!e.is_object()) return InvalidArgument("etcd watch: an event is not an object");
    WatchEvent ev;
    if (auto t = e.find("type"); t != e.end()) {
      if (t->is_string() && t->get<std::string>() == "DELETE") {
        ev.type = WatchEvent::Type::kDelete;
      } else if (!(t->is_string() && t->get<std::string>() == "PUT")) {
        return InvalidArgument("etcd watch: unknown event type");
      }
    }
    auto kv = e.find("kv");
    if (kv == e.end()) return InvalidArgument("etcd watch: event without 'kv'");
    KVP_ASSIGN_OR_RETURN(ev.kv, ParseKeyValue(*kv));
    m.events.push_back(std::move(ev));
  }
  return m;
}

void WatchCanceller::Cancel() {
  MutexLock lock(mu_);
  cancelled_ = true;
  // stop() only shuts a socket that exists: a watch still connecting is stopped by a later
  // round. Bounded (5 s) in case the watch thread is stuck elsewhere.
  for (int round = 0; client_ != nullptr && round < 250; ++round) {
    client_->stop();
    detached_.WaitFor(lock, std::chrono::milliseconds(20));
  }
}

bool WatchCanceller::cancelled() const {
  MutexLock lock(mu_);
  return cancelled_;
}

bool WatchCanceller::Attach(httplib::Client* client) {
  MutexLock lock(mu_);
  if (cancelled_) return false;
  client_ = client;
  return true;
}

void WatchCanceller::Detach() {
  MutexLock lock(mu_);
  client_ = nullptr;
  detached_.NotifyAll();
}

EtcdClient::EtcdClient(std::vector<EtcdEndpoint> endpoints, std::chrono::milliseconds timeout)
    : endpoints_(std::move(endpoints)), timeout_(timeout) {}

Result<nlohmann::json> EtcdClient::Call(const std::string& path, const nlohmann::json& request) {
  if (endpoints_.empty()) return Unavailable("etcd: no endpoint");
  const std::string text = request.dump();
  std::string last_error;
  const size_t first = current_.load();
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    const size_t i = (first + k) % endpoints_.size();
    const EtcdEndpoint& e = endpoints_[i];
    httplib::Client cli(e.host, e.port);
    SetTimeouts(cli, timeout_, timeout_);
    // The gateway ends an error answer with HTTP trailers (Grpc-Trailer-*), which this
    // cpp-httplib does not parse (the call fails with Error::Read after the body arrived): read
    // status and body through handlers, and accept a complete JSON body with its status.
    int status = 0;
    std::string body;
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.body = text;
    req.set_header("Content-Type", "application/json");
    req.response_handler = [&](const httplib::Response& r) {
      status = r.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      if (body.size() + n > kMaxWatchLine) return false;
      body.append(data, n);
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = cli.send(req, res, err);
    const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
    if (!sent && (status == 0 || j.is_discarded())) {
      last_error = e.host + ":" + std::to_string(e.port) + ": " + httplib::to_string(err);
      continue;
    }
    current_.store(i);
    if (status != 200) return GatewayError(j, status);
    if (j.is_discarded() || !j.is_object()) {
      return InvalidArgument("etcd: " + path + " answered with something other than JSON");
    }
    return j;
  }
  return Unavailable("etcd: " + path + ": no endpoint answered (last: " + last_error + ")");
}

Result<int64_t> EtcdClient::LeaseGrant(int64_t ttl_s) {
  KVP_ASSIGN_OR_RETURN(nlohmann::json j, Call("/v3/lease/grant", {{"TTL", ttl_s}}));
  KVP_ASSIGN_OR_RETURN(int64_t id, ReadInt64(j, "ID"));
  if (id == 0) return Unavailable("etcd: lease grant returned no lease id");
  return id;
}

Result<int64_t> EtcdClient::LeaseKeepAlive(int64_t lease) {
  // A streaming call in gRPC; over the gateway one request gets one {"result": ...} answer.
  KVP_ASSIGN_OR_RETURN(nlohmann::json j,
                       Call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}));
  auto r = j.find("result");
  if (r == j.end() || !r->is_object()) return InvalidArgument("etcd: keepalive without 'result'");
  KVP_ASSIGN_OR_RETURN(int64_t ttl, ReadInt64(*r, "TTL"));
  if (ttl <= 0) return NotFound("etcd: lease " + std::to_string(lease) + " expired");
  return ttl;
}

Status EtcdClient::LeaseRevoke(int64_t lease) {
  auto j = Call("/v3/lease/revoke", {{"ID", std::to_string(lease)}});
  if (!j.ok() && j.status().code() != StatusCode::kNotFound) return j.status();
  return Status::Ok();
}

Result<int64_t> EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  nlohmann::json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  KVP_ASSIGN_OR_RETURN(nlohmann::json j, Call("/v3/kv/put", body));
  auto h = j.find("header");
  if (h == j.end()) return InvalidArgument("etcd: put answer without header");
  return ReadInt64(*h, "revision");
}

Status EtcdClient::Delete(const std::string& key) {
  auto j = Call("/v3/kv/deleterange", {{"key", Base64Encode(key)}});
  return j.ok() ? Status::Ok() : j.status();
}

Result<std::optional<KeyValue>> EtcdClient::Get(const std::string& key) {
  KVP_ASSIGN_OR_RETURN(nlohmann::json j, Call("/v3/kv/range", {{"key", Base64Encode(key)}}));
  KVP_ASSIGN_OR_RETURN(RangeResult r, ParseRangeResponse(j));
  for (KeyValue& kv : r.kvs) {
    if (kv.key == key) return std::optional<KeyValue>(std::move(kv));
  }
  return std::optional<KeyValue>();
}

Result<RangeResult> EtcdClient::RangePrefix(const std::string& prefix) {
  KVP_ASSIGN_OR_RETURN(nlohmann::json j,
                       Call("/v3/kv/range", {{"key", Base64Encode(prefix)},
                                             {"range_end", Base64Encode(PrefixRangeEnd(prefix))}}));
  return ParseRangeResponse(j);
}

Status EtcdClient::Watch(const std::string& prefix, int64_t start_revision,
                         const std::function<void(const WatchMessage&)>& on_message,
                         WatchCanceller& canceller, std::chrono::seconds idle_timeout) {
  const EtcdEndpoint& e = endpoints_[current_.load() % endpoints_.size()];
  httplib::Client cli(e.host, e.port);
  SetTimeouts(cli, timeout_, idle_timeout);
  if (!canceller.Attach(&cli)) return Cancelled("etcd watch: cancelled");
  const nlohmann::json body = {{"create_request",
                                {{"key", Base64Encode(prefix)},
                                 {"range_end", Base64Encode(PrefixRangeEnd(prefix))},
                                 {"start_revision", std::to_string(start_revision)}}}};
  std::string buffer;
  Status failure = Status::Ok();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v3/watch";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buffer.append(data, n);
    size_t nl;
    while ((nl = buffer.find('\n')) != std::string::npos) {
      const std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      auto m = ParseWatchLine(line);
      if (!m.ok()) {
        failure = m.status();
        return false;
      }
      if (m->canceled || m->compact_revision != 0) {
        failure = Aborted("etcd watch: cancelled by etcd (compact_revision " +
                          std::to_string(m->compact_revision) + ", " + m->cancel_reason + ")");
        return false;
      }
      on_message(*m);
    }
    if (buffer.size() > kMaxWatchLine) {
      failure = InvalidArgument("etcd watch: message longer than 16 MiB");
      return false;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = cli.send(req, res, err);
  canceller.Detach();
  if (canceller.cancelled()) return Cancelled("etcd watch: cancelled");
  if (!failure.ok()) return failure;
  if (!ok) return Unavailable("etcd watch: " + httplib::to_string(err));
  if (res.status != 200) return Unavailable("etcd watch: HTTP " + std::to_string(res.status));
  return Unavailable("etcd watch: stream ended");
}

}  // namespace kvpush::discovery
