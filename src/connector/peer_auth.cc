// PeerAuth: HMAC-SHA256 handshake and message authentication (see peer_auth.h).
#include "connector/peer_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <iterator>

namespace kvpush::connector {
namespace {

constexpr std::string_view kMagic = "KVA1";

std::string ToHex(std::span<const uint8_t> b) {
  static constexpr char kD[] = "0123456789abcdef";
  std::string s;
  s.reserve(b.size() * 2);
  for (uint8_t c : b) {
    s.push_back(kD[c >> 4]);
    s.push_back(kD[c & 15]);
  }
  return s;
}

bool IsNonceHex(const std::string& s) {
  if (s.size() != 2 * PeerAuth::kNonceBytes) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

std::string FreshNonce() {
  std::array<uint8_t, PeerAuth::kNonceBytes> n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    // No entropy is a broken host; a predictable nonce would silently allow replays.
    spdlog::critical("kv auth: RAND_bytes failed");
    std::abort();
  }
  return ToHex(n);
}

std::string_view AsView(std::span<const uint8_t> b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

/// The "kv_auth" object of `j` with string fields `names`, or an error naming the missing one.
Status AuthFields(const nlohmann::json& j, std::initializer_list<const char*> names) {
  if (!j.is_object() || !j.contains("kv_auth") || !j["kv_auth"].is_object()) {
    return FailedPrecondition("no kv_auth object");
  }
  for (const char* n : names) {
    if (!j["kv_auth"].contains(n) || !j["kv_auth"][n].is_string()) {
      return InvalidArgument(std::string("kv_auth: '") + n + "' must be a string");
    }
  }
  return Status::Ok();
}

std::string Field(const nlohmann::json& j, const char* name) {
  return j["kv_auth"][name].get<std::string>();
}

bool MacEquals(const std::string& hex, const std::array<uint8_t, PeerAuth::kMacBytes>& mac) {
  const std::string want = ToHex(mac);
  return hex.size() == want.size() && CRYPTO_memcmp(hex.data(), want.data(), want.size()) == 0;
}

}  // namespace

std::string_view AuthFailureName(AuthFailure f) {
  switch (f) {
    case AuthFailure::kHandshakeNoAuth:
      return "handshake_no_auth";
    case AuthFailure::kHandshakeBadMac:
      return "handshake_bad_mac";
    case AuthFailure::kHandshakeReplay:
      return "handshake_replay";
    case AuthFailure::kMessageNoMac:
      return "message_no_mac";
    case AuthFailure::kMessageUnknownSession:
      return "message_unknown_session";
    case AuthFailure::kMessageBadMac:
      return "message_bad_mac";
    case AuthFailure::kMessageReplay:
      return "message_replay";
  }
  return "unknown";
}

PeerAuth::PeerAuth(std::vector<uint8_t> key) : key_(std::move(key)) {}

Result<std::unique_ptr<PeerAuth>> PeerAuth::FromKey(std::vector<uint8_t> key) {
  if (key.size() < kMinKeyBytes) {
    return InvalidArgument("kv auth key: " + std::to_string(key.size()) + " bytes, need at least " +
                           std::to_string(kMinKeyBytes));
  }
  return std::unique_ptr<PeerAuth>(new PeerAuth(std::move(key)));
}

Result<std::unique_ptr<PeerAuth>> PeerAuth::FromKeyFile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    return IoError("--kv-auth-key-file " + path + ": " + std::strerror(errno));
  }
  if ((st.st_mode & (S_IRWXO | S_IWGRP)) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return FailedPrecondition("--kv-auth-key-file " + path + ": mode " + mode +
                              " lets other users read or change the key; chmod 600 it");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return IoError("--kv-auth-key-file " + path + ": cannot open");
  std::vector<uint8_t> key((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!key.empty() &&
         (key.back() == '\n' || key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) {
    key.pop_back();
  }
  if (key.size() < kMinKeyBytes) {
    return FailedPrecondition("--kv-auth-key-file " + path + ": the key has " +
                              std::to_string(key.size()) + " bytes, at least " +
                              std::to_string(kMinKeyBytes) + " are required");
  }
  return FromKey(std::move(key));
}

void PeerAuth::set_self(std::string engine_id) {
  MutexLock lock(mu_);
  self_ = std::move(engine_id);
}

std::array<uint8_t, PeerAuth::kMacBytes> PeerAuth::Mac(
    std::span<const uint8_t> key, std::string_view label,
    std::span<const std::string_view> parts) const {
  // label, then each part length-prefixed (u32 LE), so that no two inputs share an encoding.
  std::string in(label);
  for (std::string_view p : parts) {
    const auto n = static_cast<uint32_t>(p.size());
    for (int i = 0; i < 4; ++i) in.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    in.append(p);
  }
  std::array<uint8_t, kMacBytes> out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(in.data()), in.size(), out.data(), &len);
  return out;
}

Status PeerAuth::Refuse(AuthFailure kind, const std::string& peer, const std::string& why) {
  const auto k = static_cast<size_t>(kind);
  const auto now = std::chrono::steady_clock::now();
  int64_t suppressed = -1;
  {
    MutexLock lock(mu_);
    ++failures_[k];
    if (now - last_log_[k] >= std::chrono::seconds(1)) {
      last_log_[k] = now;
      suppressed = std::exchange(suppressed_[k], 0);
    } else {
      ++suppressed_[k];
    }
  }
  if (suppressed >= 0) {
    spdlog::warn("kv auth: refused {} from {}: {} ({} more of this kind not logged)",
                 AuthFailureName(kind), peer.empty() ? "an unnamed peer" : peer, why, suppressed);
  }
  return FailedPrecondition("peer authentication failed: " + why);
}

AuthFailureCounts PeerAuth::failures() const {
  MutexLock lock(mu_);
  return failures_;
}

// --- Handshake -------------------------------------------------------------------------------

bool PeerAuth::IsAuthStep(const nlohmann::json& body) {
  return body.is_object() && body.contains("kv_auth");
}

nlohmann::json PeerAuth::ClientHello(std::string& nonce_out) {
  nonce_out = FreshNonce();
  return {{"kv_auth", {{"version", 1}, {"step", "hello"}, {"client_nonce", nonce_out}}}};
}

Result<nlohmann::json> PeerAuth::AnswerHello(const nlohmann::json& body) {
  KVP_RETURN_IF_ERROR(AuthFields(body, {"step", "client_nonce"}));
  const std::string nc = Field(body, "client_nonce");
  if (!IsNonceHex(nc)) return InvalidArgument("kv_auth: malformed client_nonce");
  const std::string ns = FreshNonce();
  {
    MutexLock lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(pending_, [&](const auto& e) { return now - e.second > kNonceTtl; });
    if (pending_.size() >= kMaxPendingNonces) pending_.erase(pending_.begin());
    pending_[ns] = now;
  }
  const std::array<std::string_view, 2> parts{nc, ns};
  const auto mac = Mac(key_, "kvpush-auth-v1 challenge", parts);
  return nlohmann::json{{"kv_auth",
                         {{"version", 1},
                          {"step", "challenge"},
                          {"client_nonce", nc},
                          {"server_nonce", ns},
                          {"mac", ToHex(mac)}}}};
}

Result<std::string> PeerAuth::CheckChallenge(const nlohmann::json& answer, const std::string& nc,
                                             const std::string& peer_addr) {
  if (!IsAuthStep(answer)) {
    return Refuse(AuthFailure::kHandshakeNoAuth, peer_addr,
                  "the peer answered without kv_auth (is it started without "
                  "--kv-auth-key-file?)");
  }
  KVP_RETURN_IF_ERROR(AuthFields(answer, {"client_nonce", "server_nonce", "mac"}));
  const std::string ns = Field(answer, "server_nonce");
  if (Field(answer, "client_nonce") != nc || !IsNonceHex(ns)) {
    return Refuse(AuthFailure::kHandshakeBadMac, peer_addr, "challenge for another nonce");
  }
  const std::array<std::string_view, 2> parts{nc, ns};
  if (!MacEquals(Field(answer, "mac"), Mac(key_, "kvpush-auth-v1 challenge", parts))) {
    return Refuse(AuthFailure::kHandshakeBadMac, peer_addr,
                  "the peer's challenge MAC does not verify (different key?)");
  }
  return ns;
}

nlohmann::json PeerAuth::ClientProof(const nlohmann::json& document, const std::string& nc,
                                     const std::string& ns) {
  const std::string doc = document.dump();
  const std::array<std::string_view, 3> parts{nc, ns, doc};
  return {{"kv_auth",
           {{"version", 1},
            {"step", "proof"},
            {"client_nonce", nc},
            {"server_nonce", ns},
            {"mac", ToHex(Mac(key_, "kvpush-auth-v1 client", parts))}}},
          {"document", doc}};
}

Result<PeerAuth::Proof> PeerAuth::CheckProof(const nlohmann::json& body,
                                             const std::string& peer_addr) {
  KVP_RETURN_IF_ERROR(AuthFields(body, {"client_nonce", "server_nonce", "mac"}));
  if (!body.contains("document") || !body["document"].is_string()) {
    return InvalidArgument("kv_auth: 'document' must be a string");
  }
  Proof p{nlohmann::json(), Field(body, "client_nonce"), Field(body, "server_nonce")};
  const std::string doc = body["document"].get<std::string>();
  const std::array<std::string_view, 3> parts{p.nc, p.ns, doc};
  if (!MacEquals(Field(body, "mac"), Mac(key_, "kvpush-auth-v1 client", parts))) {
    return Refuse(AuthFailure::kHandshakeBadMac, peer_addr,
                  "handshake proof MAC does not verify (different key?)");
  }
  bool fresh = false;
  {
    MutexLock lock(mu_);
    auto it = pending_.find(p.ns);
    fresh = it != pending_.end() && std::chrono::steady_clock::now() - it->second <= kNonceTtl;
    if (it != pending_.end()) pending_.erase(it);  // one use
  }
  if (!fresh) {
    return Refuse(AuthFailure::kHandshakeReplay, peer_addr,
                  "handshake proof for a server nonce not issued, expired or used");
  }
  p.document = nlohmann::json::parse(doc, nullptr, false);
  if (p.document.is_discarded()) return InvalidArgument("kv_auth: document is not JSON");
  return p;
}

nlohmann::json PeerAuth::SignServerDocument(const nlohmann::json& document, const std::string& nc,
                                            const std::string& ns) {
  const std::string doc = document.dump();
  const std::array<std::string_view, 3> parts{nc, ns, doc};
  return {{"kv_auth",
           {{"version", 1},
            {"step", "document"},
            {"client_nonce", nc},
            {"server_nonce", ns},
            {"mac", ToHex(Mac(key_, "kvpush-auth-v1 server", parts))}}},
          {"document", doc}};
}

Result<nlohmann::json> PeerAuth::CheckServerDocument(const nlohmann::json& answer,
                                                     const std::string& nc, const std::string& ns,
                                                     const std::string& peer_addr) {
  if (!IsAuthStep(answer)) {
    return Refuse(AuthFailure::kHandshakeNoAuth, peer_addr, "the peer's document has no kv_auth");
  }
  KVP_RETURN_IF_ERROR(AuthFields(answer, {"mac"}));
  if (!answer.contains("document") || !answer["document"].is_string()) {
    return InvalidArgument("kv_auth: 'document' must be a string");
  }
  const std::string doc = answer["document"].get<std::string>();
  const std::array<std::string_view, 3> parts{nc, ns, doc};
  if (!MacEquals(Field(answer, "mac"), Mac(key_, "kvpush-auth-v1 server", parts))) {
    return Refuse(AuthFailure::kHandshakeBadMac, peer_addr,
                  "the peer's document MAC does not verify");
  }
  auto j = nlohmann::json::parse(doc, nullptr, false);
  if (j.is_discarded()) return InvalidArgument("kv_auth: document is not JSON");
  return j;
}

Status PeerAuth::RefuseUnauthenticated(const std::string& peer_addr) {
  return Refuse(AuthFailure::kHandshakeNoAuth, peer_addr,
                "this instance requires authenticated peers (--kv-auth-key-file); the handshake "
                "carried no kv_auth");
}

void PeerAuth::AddSession(const std::string& peer, const std::string& nc, const std::string& ns) {
  Session s;
  const std::array<std::string_view, 2> parts{nc, ns};
  const auto id = Mac(key_, "kvpush-auth-v1 session-id", parts);
  std::memcpy(s.id.data(), id.data(), s.id.size());
  s.key = Mac(key_, "kvpush-auth-v1 session-key", parts);
  MutexLock lock(mu_);
  auto& v = sessions_[peer];
  v.push_back(s);
  if (v.size() > kSessionsPerPeer) v.erase(v.begin());
}

void PeerAuth::DropSessions(const std::string& peer) {
  MutexLock lock(mu_);
  sessions_.erase(peer);
}

// --- Messages --------------------------------------------------------------------------------

std::array<uint8_t, PeerAuth::kMacBytes> PeerAuth::MessageMac(
    const Session& s, const std::string& sender, const std::string& receiver, uint64_t seq,
    std::span<const uint8_t> message) const {
  std::array<char, 8> seq_le{};
  for (int i = 0; i < 8; ++i) seq_le[i] = static_cast<char>((seq >> (8 * i)) & 0xff);
  const std::array<std::string_view, 5> parts{sender, receiver, AsView(s.id),
                                              std::string_view(seq_le.data(), seq_le.size()),
                                              AsView(message)};
  return Mac(s.key, "kvpush-auth-v1 msg", parts);
}

Result<std::vector<uint8_t>> PeerAuth::Seal(const std::string& peer,
                                            std::span<const uint8_t> message) {
  MutexLock lock(mu_);
  auto it = sessions_.find(peer);
  if (it == sessions_.end() || it->second.empty()) {
    return FailedPrecondition("no authenticated session with '" + peer + "'");
  }
  Session& s = it->second.back();
  const uint64_t seq = ++s.send_seq;
  const auto mac = MessageMac(s, self_, peer, seq, message);
  std::vector<uint8_t> out(message.begin(), message.end());
  out.insert(out.end(), kMagic.begin(), kMagic.end());
  out.insert(out.end(), s.id.begin(), s.id.end());
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>((seq >> (8 * i)) & 0xff));
  out.insert(out.end(), mac.begin(), mac.end());
  return out;
}

Result<std::span<const uint8_t>> PeerAuth::Open(const std::string& peer,
                                                std::span<const uint8_t> payload) {
  if (payload.size() < kTrailerBytes ||
      AsView(payload.subspan(payload.size() - kTrailerBytes, kMagic.size())) != kMagic) {
    return Refuse(AuthFailure::kMessageNoMac, peer, "control message without a MAC trailer");
  }
  const size_t n = payload.size() - kTrailerBytes;
  const std::span<const uint8_t> message = payload.first(n);
  const std::span<const uint8_t> id = payload.subspan(n + kMagic.size(), kSessionIdBytes);
  uint64_t seq = 0;
  for (int i = 7; i >= 0; --i) {
    seq = (seq << 8) | payload[n + kMagic.size() + kSessionIdBytes + static_cast<size_t>(i)];
  }
  const std::span<const uint8_t> mac = payload.last(kMacBytes);
  AuthFailure kind;
  std::string why;
  {
    MutexLock lock(mu_);
    Session* s = nullptr;
    if (auto it = sessions_.find(peer); it != sessions_.end()) {
      for (Session& c : it->second) {
        if (std::memcmp(c.id.data(), id.data(), kSessionIdBytes) == 0) s = &c;
      }
    }
    if (s == nullptr) {
      kind = AuthFailure::kMessageUnknownSession;
      why = "control message for no session with this peer";
    } else if (const auto want = MessageMac(*s, peer, self_, seq, message);
               CRYPTO_memcmp(want.data(), mac.data(), kMacBytes) != 0) {
      kind = AuthFailure::kMessageBadMac;
      why = "control message MAC does not verify";
    } else if (seq == 0 || (seq <= s->recv_max && (s->recv_max - seq >= kReplayWindow ||
                                                   s->seen.test(s->recv_max - seq)))) {
      kind = AuthFailure::kMessageReplay;
      why = "control message sequence number " + std::to_string(seq) + " replayed or too old";
    } else {
      if (seq > s->recv_max) {
        const uint64_t shift = seq - s->recv_max;
        s->seen = shift >= kReplayWindow ? std::bitset<kReplayWindow>() : s->seen << shift;
        s->recv_max = seq;
      }
      s->seen.set(s->recv_max - seq);
      return message;
    }
  }
  return Refuse(kind, peer, why);
}

}  // namespace kvpush::connector
