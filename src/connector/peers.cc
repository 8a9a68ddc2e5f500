// PeerRegistry: handshakes, endpoints, liveness.
#include "connector/peers.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace kvpush::connector {

std::vector<xfer::Desc> ArenaChunkDescs(const KvLayout& L, xfer::RegionId region) {
  std::vector<xfer::Desc> descs;
  descs.reserve(static_cast<size_t>(L.num_layers) * 2 * static_cast<size_t>(L.num_blocks));
  for (int32_t layer = 0; layer < L.num_layers; ++layer) {
    for (KvKind kind : {KvKind::kKey, KvKind::kValue}) {
      for (BlockId b = 0; b < L.num_blocks; ++b) {
        descs.push_back(xfer::Desc{region, L.offset(layer, kind, b), L.chunk_bytes()});
      }
    }
  }
  return descs;
}

PeerRegistry::PeerRegistry(xfer::Agent& agent, HandshakeInfo self,
                           std::chrono::milliseconds watchdog, PeerAuth* auth, std::string api_key,
                           std::string tls_ca_file)
    : agent_(agent),
      self_(std::move(self)),
      watchdog_(watchdog),
      api_key_(std::move(api_key)),
      tls_ca_file_(std::move(tls_ca_file)),
      auth_(auth),
      flights_([this](const std::string& key) { return Handshake(key); }) {}

Status PeerRegistry::Adopt(const HandshakeInfo& peer) {
  KVP_RETURN_IF_ERROR(CheckCompatible(self_, peer));
  {
    MutexLock lock(mu_);
    auto it = peers_.find(peer.engine_id);
    if (it != peers_.end() && it->second.info.incarnation == peer.incarnation) {
      auto alive = agent_.GetPeer(peer.engine_id);
      if (alive.ok() && alive->alive) return Status::Ok();  // already known and healthy
    }
  }
  auto loaded = agent_.LoadRemoteMetadata(peer.agent_metadata);
  if (!loaded.ok()) {
    return Unavailable("loading the agent metadata of '" + peer.engine_id +
                       "': " + loaded.status().ToString());
  }
  // Before anything is built per block: a peer's num_blocks sizes the descriptor list below.
  KVP_RETURN_IF_ERROR(CheckPeerPool(peer));
  xfer::RegionId rid;
  rid.index = peer.kv_region_index;
  rid.generation = peer.kv_region_generation;
  auto list = agent_.PrepareRemote(peer.engine_id, ArenaChunkDescs(peer.layout, rid));
  if (!list.ok()) {
    return Unavailable("preparing the KV region of '" + peer.engine_id +
                       "': " + list.status().ToString());
  }
  MutexLock lock(mu_);
  auto it = peers_.find(peer.engine_id);
  if (it != peers_.end()) (void)agent_.ReleaseList(it->second.remote_list);
  peers_[peer.engine_id] = PeerState{peer, *list};
  if (loaded->restarted) {
    spdlog::warn("kv connector: peer '{}' restarted (incarnation {:016x} -> {:016x})",
                 peer.engine_id, loaded->previous_incarnation, peer.incarnation);
  } else {
    spdlog::info("kv connector: handshake with '{}' ({}, incarnation {:016x})", peer.engine_id,
                 peer.role, peer.incarnation);
  }
  ++handshakes_;
  return Status::Ok();
}

Result<nlohmann::json> PeerRegistry::HandleHandshake(const nlohmann::json& body,
                                                     const std::string& peer_addr) {
  if (auth_ != nullptr) {
    if (!PeerAuth::IsAuthStep(body)) return auth_->RefuseUnauthenticated(peer_addr);
    return HandleAuthStep(body, peer_addr);
  }
  if (PeerAuth::IsAuthStep(body)) {
    return FailedPrecondition(
        "the peer sent an authenticated handshake but this instance has no "
        "--kv-auth-key-file: start both with the same key file");
  }
  KVP_ASSIGN_OR_RETURN(HandshakeInfo peer, HandshakeInfo::FromJson(body));
  KVP_RETURN_IF_ERROR(Adopt(peer));
  return self_.ToJson();
}

Result<nlohmann::json> PeerRegistry::HandleAuthStep(const nlohmann::json& body,
                                                    const std::string& peer_addr) {
  const auto& a = body["kv_auth"];
  const std::string step = a.is_object() && a.contains("step") && a["step"].is_string()
                               ? a["step"].get<std::string>()
                               : std::string();
  if (step == "hello") return auth_->AnswerHello(body);
  if (step != "proof") return InvalidArgument("kv_auth: 'step' must be hello or proof");
  KVP_ASSIGN_OR_RETURN(PeerAuth::Proof proof, auth_->CheckProof(body, peer_addr));
  // Only now, the client having proved the key, are its metadata loaded and ours sent.
  KVP_ASSIGN_OR_RETURN(HandshakeInfo peer, HandshakeInfo::FromJson(proof.document));
  KVP_RETURN_IF_ERROR(Adopt(peer));
  auth_->AddSession(peer.engine_id, proof.nc, proof.ns);
  return auth_->SignServerDocument(self_.ToJson(), proof.nc, proof.ns);
}

std::string PeerRegistry::AliveEndpoint(const std::string& key) const {
  MutexLock lock(mu_);
  auto it = endpoints_.find(key);
  if (it == endpoints_.end()) return {};
  auto p = agent_.GetPeer(it->second);
  return p.ok() && p->alive ? it->second : std::string();
}

Result<std::string> PeerRegistry::EnsurePeer(const std::string& host, int port,
                                             HandshakeFlights::Clock::time_point deadline,
                                             const std::function<bool()>& cancelled, bool https) {
  const std::string endpoint = host + ":" + std::to_string(port);
  if (std::string id = AliveEndpoint(endpoint); !id.empty()) return id;
  return flights_.Await(https ? "https://" + endpoint : endpoint, deadline, cancelled);
}

Result<std::string> PeerRegistry::Handshake(const std::string& key) {
  const bool https = key.rfind("https://", 0) == 0;
  const std::string endpoint = https ? key.substr(8) : key;  // "host:port"
  // Another flight of this endpoint may have finished just before this one began.
  if (std::string id = AliveEndpoint(endpoint); !id.empty()) return id;
  const size_t colon = endpoint.rfind(':');
  const std::string host = endpoint.substr(0, colon);
  const int port = std::stoi(endpoint.substr(colon + 1));
  std::string nc, ns;
  KVP_ASSIGN_OR_RETURN(HandshakeInfo peer, Exchange(host, port, https, key, nc, ns));
  KVP_RETURN_IF_ERROR(Adopt(peer));
  if (auth_ != nullptr) auth_->AddSession(peer.engine_id, nc, ns);
  MutexLock lock(mu_);
  endpoints_[endpoint] = peer.engine_id;
  return peer.engine_id;
}

namespace {

/// Why a call to `key` got no answer, naming a TLS refusal as such.
std::string TransportError(httplib::Client& cli, httplib::Error e, const std::string& key,
                           const std::string& ca_file) {
  switch (e) {
    case httplib::Error::SSLServerVerification: {
      const long v = cli.get_openssl_verify_result();
      return std::string("TLS certificate verification failed: ") +
             (v != X509_V_OK ? X509_verify_cert_error_string(v)
                             : "the certificate does not name the host") +
             " (trusted CAs: " + (ca_file.empty() ? "the system's" : "--ssl-ca-certs " + ca_file) +
             ")";
    }
    case httplib::Error::SSLConnection:
      return "TLS handshake failed (does " + key + " serve HTTPS?)";
    case httplib::Error::SSLLoadingCerts:
      return "cannot load the CA certificates of --ssl-ca-certs " + ca_file;
    default:
      return httplib::to_string(e);
  }
}

/// POSTs `body` to /kv/handshake; the answer's JSON when HTTP 200.
Result<nlohmann::json> PostHandshake(httplib::Client& cli, const std::string& key,
                                     const nlohmann::json& body, const std::string& ca_file) {
  auto res = cli.Post("/kv/handshake", body.dump(), "application/json");
  if (!res) {
    return Unavailable("handshake with " + key +
                       " failed: " + TransportError(cli, res.error(), key, ca_file));
  }
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (res->status != 200) {
    std::string msg = res->body;
    if (!j.is_discarded() && j.contains("error") && j["error"].contains("message") &&
        j["error"]["message"].is_string()) {
      msg = j["error"]["message"].get<std::string>();
    }
    if (res->status == 409) return FailedPrecondition("peer " + key + " refused: " + msg);
    return Unavailable("handshake with " + key + ": HTTP " + std::to_string(res->status) + ": " +
                       msg);
  }
  if (j.is_discarded()) return Unavailable("handshake with " + key + ": answer is not JSON");
  return j;
}

}  // namespace

Result<HandshakeInfo> PeerRegistry::Exchange(const std::string& host, int port, bool https,
                                             const std::string& key, std::string& nc,
                                             std::string& ns) {
  // https: httplib's SSLClient, the peer's certificate and host name verified (its default);
  // never retried over plain HTTP.
  httplib::Client cli = https ? httplib::Client("https://" + host + ":" + std::to_string(port))
                              : httplib::Client(host, port);
  if (https && !tls_ca_file_.empty()) cli.set_ca_cert_path(tls_ca_file_);
  cli.set_tcp_nodelay(true);
  cli.set_connection_timeout(2, 0);
  if (!api_key_.empty()) cli.set_bearer_token_auth(api_key_);
  // A request whose handshake outlasts the watchdog would give up on its KV anyway.
  const auto read_ms = std::clamp<int64_t>(watchdog_.count(), 1000, 10000);
  cli.set_read_timeout(read_ms / 1000, (read_ms % 1000) * 1000);
  nlohmann::json doc;
  if (auth_ == nullptr) {
    KVP_ASSIGN_OR_RETURN(doc, PostHandshake(cli, key, self_.ToJson(), tls_ca_file_));
    if (PeerAuth::IsAuthStep(doc)) {
      return FailedPrecondition("peer " + key +
                                " answered an authenticated handshake but this instance has no "
                                "--kv-auth-key-file: start both with the same key file");
    }
  } else {
    // Our document (the keys of our memory) goes out only after the peer proved the key.
    KVP_ASSIGN_OR_RETURN(nlohmann::json challenge,
                         PostHandshake(cli, key, auth_->ClientHello(nc), tls_ca_file_));
    KVP_ASSIGN_OR_RETURN(ns, auth_->CheckChallenge(challenge, nc, key));
    KVP_ASSIGN_OR_RETURN(
        nlohmann::json answer,
        PostHandshake(cli, key, auth_->ClientProof(self_.ToJson(), nc, ns), tls_ca_file_));
    KVP_ASSIGN_OR_RETURN(doc, auth_->CheckServerDocument(answer, nc, ns, key));
  }
  auto peer = HandshakeInfo::FromJson(doc);
  if (!peer.ok()) {
    return Unavailable("handshake with " + key + ": " + peer.status().message());
  }
  return *peer;
}

std::optional<PeerState> PeerRegistry::Get(const std::string& engine_id) const {
  MutexLock lock(mu_);
  auto it = peers_.find(engine_id);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

int64_t PeerRegistry::handshakes() const {
  MutexLock lock(mu_);
  return handshakes_;
}

std::optional<PeerView> PeerRegistry::Find(const std::string& engine_id) const {
  PeerView view;
  {
    MutexLock lock(mu_);
    auto it = peers_.find(engine_id);
    if (it == peers_.end()) return std::nullopt;
    view = PeerView{it->second.info.layout.num_blocks, it->second.info.incarnation, 0};
  }
  auto p = agent_.GetPeer(engine_id);
  if (p.ok()) view.connection = p->connection;
  return view;
}

std::string PeerRegistry::EngineIdAt(const std::string& host, int port) const {
  MutexLock lock(mu_);
  auto it = endpoints_.find(host + ":" + std::to_string(port));
  return it == endpoints_.end() ? std::string() : it->second;
}

std::optional<std::string> PeerRegistry::Failure(const std::string& engine_id) const {
  auto peer = agent_.GetPeer(engine_id);
  // Dropped here (a fence): no evidence about the peer's process.
  if (peer.ok() && (peer->alive || peer->dropped_here)) return std::nullopt;
  return peer.ok() ? peer->failure.ToString() : peer.status().ToString();
}

bool PeerRegistry::Fenced(const std::string& engine_id, uint64_t connection) const {
  return agent_.PeerFenced(engine_id, connection);
}

}  // namespace kvpush::connector
