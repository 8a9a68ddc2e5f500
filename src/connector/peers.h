// PeerRegistry: the instances a P/D connector exchanges KV with (docs/pd_protocol.md §2):
// the handshake (server side HandleHandshake, client side EnsurePeer over HTTP), the compatibility
// check, loading a peer's agent metadata and preparing the chunk list of its KV region, the
// "host:port" -> engine id endpoints, and liveness / invalidation through the xfer::Agent.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "connector/handshake.h"
#include "connector/handshake_flights.h"
#include "connector/peer_auth.h"
#include "connector/transfer_core.h"
#include "kv/layout.h"
#include "xfer/agent.h"

namespace kvpush::connector {

/// One (layer, K|V, block) descriptor per chunk of an arena laid out as `layout` in `region`,
/// in arena order, so that entry index = offset / chunk_bytes (TransferCore::EntryIndex).
std::vector<xfer::Desc> ArenaChunkDescs(const KvLayout& layout, xfer::RegionId region);

/// A handshaken peer: its document and the prepared list of every chunk of its KV arena.
struct PeerState {
  HandshakeInfo info;
  xfer::ListHandle remote_list;
};

/// Thread-safe: HTTP threads (handshakes), the connector thread (lookups, liveness) and the
/// engine thread (lookups) call it concurrently. Outgoing handshakes go through
/// HandshakeFlights: callers naming one "host:port" share one attempt, a failure is answered at
/// once while a background probe retries, and each caller waits until its own deadline at most;
/// different endpoints do not wait for each other.
class PeerRegistry final : public PeerDirectory {
 public:
  /// `agent` must outlive the registry. `self` is this instance's handshake document.
  /// `watchdog` bounds how long an outgoing handshake waits for its answer
  /// (clamp(watchdog, 1 s, 10 s); 2 s to connect). `auth` (may be null: no authentication;
  /// must outlive the registry) makes both handshake directions the authenticated two-step
  /// exchange of peer_auth.h and refuses unauthenticated peers. `api_key`: sent as the Bearer
  /// token of each POST /kv/handshake (the peer's --api-key; "" = none). `tls_ca_file`: the PEM
  /// CA certificates an https peer's certificate must chain to (`serve --ssl-ca-certs`; "" =
  /// the system's store).
  PeerRegistry(xfer::Agent& agent, HandshakeInfo self, std::chrono::milliseconds watchdog,
               PeerAuth* auth = nullptr, std::string api_key = {}, std::string tls_ca_file = {});
  PeerRegistry(const PeerRegistry&) = delete;
  PeerRegistry& operator=(const PeerRegistry&) = delete;

  const HandshakeInfo& self() const { return self_; }

  /// Loads a peer's document: compatibility check, agent metadata, remote chunk list (cached
  /// per (engine id, incarnation) while the peer is alive).
  /// Errors: kFailedPrecondition (incompatible), kUnavailable (metadata or region refused).
  Status Adopt(const HandshakeInfo& peer);

  /// POST /kv/handshake: validates and adopts the peer's document; answers with self(). With
  /// authentication: answers a hello with a challenge, and a verified proof with self() signed;
  /// an unauthenticated body is refused. `peer_addr` ("ip:port") names the caller in logs.
  /// Errors: kInvalidArgument (malformed), kFailedPrecondition (incompatible, or refused by
  /// authentication either way round), kUnavailable.
  Result<nlohmann::json> HandleHandshake(const nlohmann::json& body,
                                         const std::string& peer_addr = "");

  /// Makes sure the instance at host:port is handshaken (see PdConnector::EnsurePeer): at once
  /// when it is known and alive, else through the endpoint's handshake flight
  /// (HandshakeFlights::Await with `deadline` and `cancelled`). `https`: the peer serves HTTPS;
  /// the handshake goes over TLS, its certificate verified against `tls_ca_file` (its own
  /// flight, keyed "https://host:port"). Returns its engine id.
  /// Errors: kUnavailable (unreachable, HTTP error, bad answer, TLS refused — "TLS certificate
  /// verification failed: ..."; or, while the endpoint is being probed after a failure, that
  /// failure at once), kFailedPrecondition (refused as incompatible), kDeadlineExceeded (the
  /// handshake outlasted `deadline`), kAborted (`cancelled`).
  Result<std::string> EnsurePeer(const std::string& host, int port,
                                 HandshakeFlights::Clock::time_point deadline,
                                 const std::function<bool()>& cancelled = {}, bool https = false);

  /// A copy of the peer's state, or nullopt when it was never handshaken.
  std::optional<PeerState> Get(const std::string& engine_id) const;

  /// Handshakes completed (counter).
  int64_t handshakes() const;

  // PeerDirectory
  std::optional<PeerView> Find(const std::string& engine_id) const override;
  std::string EngineIdAt(const std::string& host, int port) const override;
  std::optional<std::string> Failure(const std::string& engine_id) const override;
  bool Fenced(const std::string& engine_id, uint64_t connection) const override;

 private:
  /// The engine id known at `key` ("host:port") when its peer is alive, else "".
  std::string AliveEndpoint(const std::string& key) const;
  /// The authenticated handshake, server side (auth_ set).
  Result<nlohmann::json> HandleAuthStep(const nlohmann::json& body, const std::string& peer_addr);
  /// One handshake with `key` ("host:port", or "https://host:port" over TLS), run by its
  /// flight: exchange, adopt, remember the endpoint. Returns the engine id.
  Result<std::string> Handshake(const std::string& key);
  /// Client side: the peer's document, plain or through the authenticated exchange, over HTTP
  /// or (`https`) TLS.
  Result<HandshakeInfo> Exchange(const std::string& host, int port, bool https,
                                 const std::string& key, std::string& nc, std::string& ns);

  xfer::Agent& agent_;
  const HandshakeInfo self_;
  const std::chrono::milliseconds watchdog_;
  const std::string api_key_;
  const std::string tls_ca_file_;
  PeerAuth* const auth_;
  mutable Mutex mu_;
  std::map<std::string, PeerState, std::less<>> peers_;        ///< by engine id
  std::map<std::string, std::string, std::less<>> endpoints_;  ///< "host:port" -> engine id
  int64_t handshakes_ GUARDED_BY(mu_) = 0;
  /// Last: destroyed first, joining flight threads that still use the members above.
  HandshakeFlights flights_;
};

}  // namespace kvpush::connector
