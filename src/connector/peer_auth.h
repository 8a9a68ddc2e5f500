// PeerAuth: authenticated P/D peers (`serve --kv-auth-key-file`, docs/pd_protocol.md §5).
//
// All instances of a deployment share one secret key K (>= 32 bytes, a file readable by its owner
// only). The handshake becomes two HTTP round trips:
//   1. client -> server  {"kv_auth": {"step": "hello", "client_nonce": Nc}}
//      server -> client  {"kv_auth": {"step": "challenge", "client_nonce": Nc, "server_nonce": Ns,
//                                     "mac": HMAC(K, "kvpush-auth-v1 challenge" | Nc | Ns)}}
//   2. client -> server  {"kv_auth": {"step": "proof", Nc, Ns, "mac": HMAC(K, "kvpush-auth-v1
//                          client" | Nc | Ns | D)}, "document": D}   (D: the handshake JSON text)
//      server -> client  {"kv_auth": {"step": "document", Nc, Ns, "mac": HMAC(K, "kvpush-auth-v1
//                          server" | Nc | Ns | D')}, "document": D'}
// Nonces are 16 random bytes (RAND_bytes), hex. The client sends its document (agent metadata:
// the keys of its memory) only after the server proved K over the client's fresh nonce; the server
// answers with its own only after the client proved K over the server's fresh nonce, which it
// accepts once (a recorded proof cannot be replayed). Both ends then hold a session of that
// handshake: id = first 8 bytes of HMAC(K, "kvpush-auth-v1 session-id" | Nc | Ns), key
// Ks = HMAC(K, "kvpush-auth-v1 session-key" | Nc | Ns).
//
// Every control message (standalone notification or the notification of a WRITE) is sealed:
//   payload = message | "KVA1" | session_id[8] | seq u64 LE | mac[32]
//   mac = HMAC(Ks, "kvpush-auth-v1 msg" | u8 len | sender | u8 len | receiver | session_id | seq |
//              message)
// seq counts per (session, direction) from 1; the receiver keeps an anti-replay window of the
// last kReplayWindow sequence numbers (notifications may be reordered a little across transfers),
// so a message is accepted at most once and never from another session or direction.
// Thread-safe (one mutex): HTTP threads (handshakes), the connector thread and the engine thread
// (seal/open) call it.
#pragma once

#include <array>
#include <bitset>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"

namespace kvpush::connector {

/// Why a peer was refused: the `kind` label of kvpush_kv_auth_failures_total.
enum class AuthFailure : uint8_t {
  kHandshakeNoAuth = 0,    ///< a keyed instance got an unauthenticated handshake (or answer)
  kHandshakeBadMac,        ///< a handshake step whose MAC does not verify
  kHandshakeReplay,        ///< a proof naming a server nonce not issued, expired or already used
  kMessageNoMac,           ///< a control message without the auth trailer
  kMessageUnknownSession,  ///< a trailer naming no session with that peer
  kMessageBadMac,          ///< a control message whose MAC does not verify
  kMessageReplay,          ///< a sequence number already accepted or older than the window
};
inline constexpr size_t kNumAuthFailures = 7;

/// The metric label of `f` ("handshake_bad_mac", ...).
std::string_view AuthFailureName(AuthFailure f);

/// Refusal counters, indexed by AuthFailure.
using AuthFailureCounts = std::array<int64_t, kNumAuthFailures>;

class PeerAuth {
 public:
  static constexpr size_t kMinKeyBytes = 32;
  static constexpr size_t kNonceBytes = 16;
  static constexpr size_t kSessionIdBytes = 8;
  static constexpr size_t kMacBytes = 32;
  /// Bytes a sealed message carries after the message: magic, session id, seq, MAC.
  static constexpr size_t kTrailerBytes = 4 + kSessionIdBytes + 8 + kMacBytes;
  static constexpr uint64_t kReplayWindow = 4096;
  /// Sessions kept per peer engine id (concurrent handshakes in both directions, restarts).
  static constexpr size_t kSessionsPerPeer = 4;
  /// A server nonce must be answered within this time; at most kMaxPendingNonces outstanding.
  static constexpr std::chrono::seconds kNonceTtl{30};
  static constexpr size_t kMaxPendingNonces = 1024;

  /// Reads the key from `path`: the file's bytes, trailing whitespace removed, must be at least
  /// kMinKeyBytes; the file must not be readable or writable by others nor writable by its group.
  /// Errors: kIoError (cannot read), kFailedPrecondition (permissions, too short), naming the file.
  static Result<std::unique_ptr<PeerAuth>> FromKeyFile(const std::string& path);
  /// Errors: kInvalidArgument (shorter than kMinKeyBytes).
  static Result<std::unique_ptr<PeerAuth>> FromKey(std::vector<uint8_t> key);

  /// The engine id this instance signs as (its agent name); set once before use.
  void set_self(std::string engine_id);

  // --- Handshake, client side ---
  /// Step 1 request; `nonce_out` receives Nc (hex) for the next calls.
  nlohmann::json ClientHello(std::string& nonce_out);
  /// Checks the server's challenge for Nc; returns Ns (hex).
  /// Errors: kPermissionDenied-like kFailedPrecondition naming the reason (bad MAC, no kv_auth).
  Result<std::string> CheckChallenge(const nlohmann::json& answer, const std::string& nc,
                                     const std::string& peer_addr);
  /// Step 2 request: `document` (this instance's handshake JSON) with the client proof.
  nlohmann::json ClientProof(const nlohmann::json& document, const std::string& nc,
                             const std::string& ns);
  /// Checks the server's signed document; returns the document JSON.
  /// Errors: kFailedPrecondition (no kv_auth, bad MAC), kInvalidArgument (malformed).
  Result<nlohmann::json> CheckServerDocument(const nlohmann::json& answer, const std::string& nc,
                                             const std::string& ns, const std::string& peer_addr);

  // --- Handshake, server side ---
  /// True when `body` is a step of the authenticated handshake (has "kv_auth").
  static bool IsAuthStep(const nlohmann::json& body);
  /// Answers a hello with a challenge (remembers Ns). Errors: kInvalidArgument (malformed).
  Result<nlohmann::json> AnswerHello(const nlohmann::json& body);
  /// The verified client proof: the client's document and the nonces.
  struct Proof {
    nlohmann::json document;
    std::string nc;
    std::string ns;
  };
  /// Verifies a proof (MAC, Ns issued here, unexpired, unused; Ns is consumed).
  /// Errors: kFailedPrecondition (refused, counted), kInvalidArgument (malformed).
  Result<Proof> CheckProof(const nlohmann::json& body, const std::string& peer_addr);
  /// The server's answer to a verified proof: `document` signed for (nc, ns).
  nlohmann::json SignServerDocument(const nlohmann::json& document, const std::string& nc,
                                    const std::string& ns);
  /// Counts and logs (rate-limited) a refusal of an unauthenticated handshake from `peer_addr`.
  Status RefuseUnauthenticated(const std::string& peer_addr);

  /// Both sides, once the peer's document was adopted: the session of handshake (nc, ns) with
  /// `peer` becomes the one Seal uses; older ones are still accepted by Open (up to
  /// kSessionsPerPeer).
  void AddSession(const std::string& peer, const std::string& nc, const std::string& ns);
  /// Drops every session with `peer` (a new incarnation replaced it).
  void DropSessions(const std::string& peer);

  // --- Messages ---
  /// `message` followed by the trailer for `peer`'s newest session.
  /// Errors: kFailedPrecondition (no authenticated session with `peer`).
  Result<std::vector<uint8_t>> Seal(const std::string& peer, std::span<const uint8_t> message);
  /// Verifies a payload claimed to come from `peer`; returns the message without its trailer
  /// (a view into `payload`). A refusal is counted, logged (rate-limited) and returned as
  /// kPermissionDenied-like kFailedPrecondition; the replay window moves only on success.
  Result<std::span<const uint8_t>> Open(const std::string& peer, std::span<const uint8_t> payload);

  /// Refusals so far, by kind.
  AuthFailureCounts failures() const;

 private:
  explicit PeerAuth(std::vector<uint8_t> key);
  struct Session {
    std::array<uint8_t, kSessionIdBytes> id{};
    std::array<uint8_t, kMacBytes> key{};
    uint64_t send_seq = 0;            ///< last sequence number sent
    uint64_t recv_max = 0;            ///< highest sequence number accepted
    std::bitset<kReplayWindow> seen;  ///< bit (recv_max - s) set: s accepted
  };
  std::array<uint8_t, kMacBytes> Mac(std::span<const uint8_t> key, std::string_view label,
                                     std::span<const std::string_view> parts) const;
  std::array<uint8_t, kMacBytes> MessageMac(const Session& s, const std::string& sender,
                                            const std::string& receiver, uint64_t seq,
                                            std::span<const uint8_t> message) const;
  Status Refuse(AuthFailure kind, const std::string& peer, const std::string& why);

  const std::vector<uint8_t> key_;
  mutable Mutex mu_;
  std::string self_ GUARDED_BY(mu_);
  /// Ns
  std::map<std::string, std::chrono::steady_clock::time_point, std::less<>> pending_
      GUARDED_BY(mu_);
  /// By peer, newest last.
  std::map<std::string, std::vector<Session>, std::less<>> sessions_ GUARDED_BY(mu_);
  AuthFailureCounts failures_ GUARDED_BY(mu_){};
  std::array<std::chrono::steady_clock::time_point, kNumAuthFailures> last_log_ GUARDED_BY(mu_){};
  std::array<int64_t, kNumAuthFailures> suppressed_ GUARDED_BY(mu_){};
};

}  // namespace kvpush::connector
