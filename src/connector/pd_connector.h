// PdConnector: the P/D KV connector of one instance (DESIGN.md §3, §5, §6; docs/pd_protocol.md).
//
// It joins the engine (through the KvConnector hooks) and the transfer engine (one xfer::Agent
// whose registered region is the engine's KV arena). Per request it plays one of four parts,
// chosen by the request's pd::KvTransferParams:
//   push producer (P): after each layer of the request is computed, the connector thread posts
//     the WRITE of that layer's blocks into D's target blocks (or all layers at once when D's
//     PUSH_TARGET arrives after the prefill), then sends KV_READY carrying the first token once
//     every WRITE completed; P's blocks are held until then.
//   push consumer (D): allocates blocks for the uncached tail, sends PUSH_TARGET, waits (without
//     touching the engine thread) for KV_READY; watchdog -> CANCEL/CANCEL_ACK -> failure policy.
//   pull producer (P): holds the blocks under a lease and returns vLLM-style kv_transfer_params.
//   pull consumer (D): READs P's blocks (from the engine thread before the next forward pass in
//     the vllm profile, from the connector thread at once in the fast profile), sends RELEASE.
//
// Structure: PdConnector is the shell. The protocol itself (per-transfer state, timers, every
// decision) is TransferCore (transfer_core.h), a single-threaded state machine that the shell
// feeds and whose actions it carries out with the xfer::Agent; the peers (handshakes, endpoints,
// liveness) are PeerRegistry (peers.h).
// Threads: the engine thread calls the hooks (they only queue events and never block); one
// connector thread (the "writer") owns the TransferCore: it feeds it the queued events, the
// agent's notifications, transfer completions and timer ticks, and carries out its actions;
// HTTP threads call HandleHandshake/EnsurePeer/ValidateRequest. Idle, the connector thread
// sleeps on a condition variable (1 s safety timeout; 20 ms while transfers are tracked). Step
// and layer events wake it only while a target is attached or waiting
// (TransferCore::wants_layer_events); otherwise they wait for its next wake-up.
#pragma once

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "connector/connector_stats.h"
#include "connector/handshake.h"
#include "connector/kv_transfer_config.h"
#include "connector/messages.h"
#include "connector/peers.h"
#include "connector/transfer_core.h"
#include "connector/transfer_status_client.h"
#include "engine/kv_connector.h"
#include "kv/layout.h"
#include "pd/checks.h"
#include "pd/kv_transfer_params.h"
#include "xfer/agent.h"

namespace kvpush::connector {

struct ConnectorOptions {
  KvTransferConfig config;
  KvLayout layout;  ///< the engine's resolved layout (EngineCore::LayoutFor)
  uint64_t model_fingerprint = 0;
  std::string role_name = "both";            ///< "prefill", "decode", "both"
  std::string advertise_host = "127.0.0.1";  ///< how peers reach this instance's HTTP port
  int advertise_port = 0;                    ///< may be set later (set_advertised_port)
  /// This instance serves HTTPS only (`serve --ssl-certfile`): its pull answers tell D so
  /// (`"remote_scheme": "https"`).
  bool advertise_https = false;
  /// `serve --ssl-ca-certs`: the PEM CA certificates an https peer's certificate must chain to
  /// when this instance handshakes with it ("" = the system's store).
  std::string tls_ca_file;
  /// `serve --kv-auth-key-file`: when set, peers are authenticated with the shared key it holds
  /// (peer_auth.h); empty: no authentication.
  std::string auth_key_file;
  /// `serve --api-key`: the Bearer token of this instance's calls to its peers' /kv/* endpoints
  /// (a deployment's instances share one key); "" = none.
  std::string api_key;
};

/// The shell of the P/D connector: owns the xfer::Agent, the KV arena it registers, the
/// PeerRegistry, the TransferCore and the connector thread that drives the core. The KvConnector
/// hooks run on the engine thread and only queue events (never block); HandleHandshake,
/// EnsurePeer, ValidateRequest, AbortTransfer and stats() are thread-safe; the CoreActions are
/// carried out on the connector thread only. Destruction stops and joins the connector thread,
/// then drops the agent before the arena.
class PdConnector final : public KvConnector, private LayerObserver, private CoreActions {
 public:
  /// Creates the agent and backend, allocates (through the backend when that makes one-sided
  /// access work) and registers the KV arena, and starts the connector thread.
  /// Errors: kInvalidArgument (layout), kUnavailable (backend), kResourceExhausted (arena).
  static Result<std::unique_ptr<PdConnector>> Create(ConnectorOptions options);
  ~PdConnector() override;
  PdConnector(const PdConnector&) = delete;
  PdConnector& operator=(const PdConnector&) = delete;

  /// The registered KV arena (layout.total_bytes() bytes) for Engine::Create.
  std::span<std::byte> kv_memory() { return arena_; }
  const std::string& engine_id() const { return agent_->name(); }
  const KvTransferConfig& config() const { return options_.config; }
  /// Tokens per KV block of this instance (its peers' too: the handshake requires it).
  int32_t block_size() const { return options_.layout.block_size; }
  /// This instance's compatibility hash (HandshakeInfo::CompatHash: what a peer must match to
  /// exchange KV with it); discovery publishes it. Thread-safe.
  uint64_t compat_hash() const { return SelfInfo().CompatHash(); }
  /// This process's agent incarnation (random per start); discovery keys use it. Thread-safe.
  uint64_t incarnation() const;
  /// Sets the port advertised in pull kv_transfer_params (after the HTTP server bound it).
  void set_advertised_port(int port) { advertise_port_.store(port); }

  /// POST /kv/handshake: validates the peer's document, loads its agent metadata and answers
  /// with this instance's document (with --kv-auth-key-file: one step of the authenticated
  /// exchange, peer_auth.h). `peer_addr` ("ip:port" of the caller) names it in refusal logs.
  /// Thread-safe. Errors: kInvalidArgument (malformed: HTTP 400), kFailedPrecondition
  /// (incompatible or not authenticated: HTTP 409, names the reason), kUnavailable.
  Result<nlohmann::json> HandleHandshake(const nlohmann::json& body,
                                         const std::string& peer_addr = "");

  /// Makes sure the instance at host:port is handshaken (cached per peer; a peer that failed
  /// or restarted is handshaken again). Returns its engine id. Thread-safe. Callers naming one
  /// host:port share one handshake (2 s to connect + clamp(watchdog_ms, 1 s, 10 s) to answer);
  /// each waits for it until watchdog_ms from now at most, or until `cancelled` (may be empty)
  /// turns true; while a failed endpoint is probed again in the background, its failure is
  /// answered at once (PeerRegistry, HandshakeFlights). `https`: the peer serves HTTPS (the
  /// leg's `remote_scheme`); the handshake goes over TLS, verified against tls_ca_file.
  /// Errors: kUnavailable (unreachable, HTTP error, TLS refused), kFailedPrecondition
  /// (incompatible), kDeadlineExceeded, kAborted.
  Result<std::string> EnsurePeer(const std::string& host, int port,
                                 const std::function<bool()>& cancelled = {}, bool https = false);

  /// Checks a request's P/D params against this instance's role and, for a pull consumer,
  /// against the prompt (token count, prompt hash, block count). A `continuation` (the request
  /// carries kvpush_resume: a migration's legs) may be a producer leg on any P/D instance: the
  /// instance whose prefix cache holds the context computes the rest and pushes it, whatever
  /// its role. Thread-safe. Errors: kInvalidArgument with the reason.
  Status ValidateRequest(const pd::KvTransferParams& p, std::span<const int32_t> prompt,
                         bool continuation = false) const;

  /// POST /kv/abort: transfer `tid` is dead (the router saw the other leg fail, or the client
  /// left). The id is tombstoned (a later P leg, target or READ of it is refused) and a producer
  /// of it drops its prefill (if still running), cancels its WRITEs, tells D, and frees its
  /// blocks as soon as no WRITE can land any more, instead of at lease expiry. A consumer of it
  /// is left to the engine (the server aborts the request, which cancels the load).
  /// Thread-safe, non-blocking; an unknown or malformed id is ignored.
  void AbortTransfer(const std::string& tid);

  /// POST /kv/transfer_status (connector/transfer_status.h; docs/pd_protocol.md §2b): a decode
  /// instance asks about its quarantined push transfers; each is cancelled here and answered
  /// "settled" or "pending" (TransferCore::AnswerTransferStatus) by the connector thread.
  /// Thread-safe; waits 2 s at most. Errors: kInvalidArgument (malformed query: HTTP 400),
  /// kFailedPrecondition (--kv-auth-key-file set: the answer would not be authenticated, so
  /// it is not offered: 409), kDeadlineExceeded (the connector thread did not answer in time).
  Result<nlohmann::json> HandleTransferStatus(const nlohmann::json& body);

  /// Snapshot of the counters. Thread-safe.
  ConnectorStats stats() const;
  /// The handoff timelines of the transfers that ended here (handoff_timeline.h). Thread-safe.
  const HandoffTimelineLog& timelines() const { return timelines_; }
  /// The same, to set its observer (HandoffTimelineLog::SetObserver) before any transfer.
  HandoffTimelineLog& mutable_timelines() { return timelines_; }

  // KvConnector (engine thread).
  void BindEngine(std::function<void()> wake, std::function<void(int64_t)> abort) override;
  KvMatch GetNumMatchedTokens(const Sequence& seq, int32_t num_local_computed) override;
  void OnBlocksAllocated(const Sequence& seq, std::span<const BlockId> blocks,
                         int32_t num_external_tokens) override;
  bool AcceptsPartialBlocks(const Sequence& seq) const override;
  void OnBlocksExtended(const Sequence& seq, std::span<const BlockId> added) override;
  LayerObserver* BeginStep(std::span<const SequenceChunk> batch) override;
  bool OnRequestFinished(const Sequence& seq, std::span<const BlockId> blocks,
                         RequestOutput& out) override;
  void OnRequestRejected(const GenerationRequest& request) override;
  std::vector<int64_t> GetFinished() override;
  std::vector<KvLoadResult> GetFinishedLoading() override;
  bool HasPendingWork() const override;

 private:
  explicit PdConnector(ConnectorOptions options);
  Status Init();
  // LayerObserver (engine thread): queues "layer done" for the connector thread.
  void OnLayerDone(int32_t layer) override;
  HandshakeInfo SelfInfo() const;

  // CoreActions (connector thread).
  Result<TransferToken> PostTransfer(const TransferOrder& order) override;
  Result<TransferToken> SendMessage(const std::string& peer, const PdMessage& m) override;
  void Cancel(TransferToken token) override;
  void ReleaseBlocks(int64_t seq_id) override;
  void FinishLoad(KvLoadResult result) override;
  void AbortRequest(int64_t seq_id) override;
  void HandRead(PendingRead read) override;
  Status FencePeer(const std::string& peer, uint64_t connection, const std::string& why) override;
  void QueryTransferStatus(const std::string& peer, const std::string& host, int port,
                           TransferStatusQuery query) override;

  /// Creates (does not post) the transfer of `order` against the peer's chunk list.
  /// Errors: kNotFound (peer not handshaken), the agent's. Thread-safe.
  Result<xfer::TransferHandle> CreateTransfer(const TransferOrder& order);
  /// Engine thread (vllm pull profile): posts a READ the core handed over; queues kReadPosted.
  void PostHandedRead(PendingRead& r);

  /// Queues `ev` for the connector thread; wakes it unless `wake` is false (the event then waits
  /// for the thread's next wake-up).
  void Push(EngineEvent ev, bool wake = true);
  void Loop();
  /// Feeds one queued event to the core (connector thread).
  void HandleEvent(EngineEvent ev);
  /// Reports every ended transfer to the core (connector thread).
  void PollTransfers();
  /// Copies the core's counters where stats() reads them (connector thread).
  void PublishStats();
  /// What a pull producer returns for `seq`, whose prompt's KV `blocks` hold (engine thread).
  pd::PullAnswer PullAnswerFor(const Sequence& seq, std::span<const BlockId> blocks) const;

  ConnectorOptions options_;
  std::unique_ptr<xfer::Agent> agent_;
  xfer::RegionId arena_region_;
  std::span<std::byte> arena_;
  void* owned_arena_ = nullptr;  ///< arena allocated here (backend did not allocate it)
  xfer::ListHandle local_list_;  ///< every (layer, K|V, block) chunk of the own arena
  std::vector<uint8_t> agent_metadata_;
  std::atomic<int> advertise_port_{0};
  SystemClock clock_;
  std::unique_ptr<PeerAuth> auth_;       ///< null without --kv-auth-key-file; thread-safe
  std::unique_ptr<PeerRegistry> peers_;  ///< thread-safe
  std::unique_ptr<TransferCore> core_;   ///< connector thread only
  /// D: asks prefill instances about quarantined transfers (its own thread; thread-safe).
  std::unique_ptr<TransferStatusClient> status_client_;
  HandoffTimelineLog timelines_;         ///< thread-safe
  /// TransferCore::wants_layer_events() as of the connector thread's last pass: the engine
  /// thread wakes the connector thread for step and layer events only while it is true.
  std::atomic<bool> layer_events_wanted_{true};

  std::function<void()> wake_engine_;
  std::function<void(int64_t)> abort_request_;

  // Engine-thread-only state.
  std::unordered_map<int64_t, int32_t> push_producers_;    ///< seq_id -> prompt tokens
  std::unordered_map<int64_t, int32_t> consumers_engine_;  ///< seq_id -> waiting (1)
  int64_t engine_holds_ = 0;
  int64_t engine_waiting_ = 0;

  // Inbox (engine/HTTP threads -> connector thread).
  Mutex mu_;
  CondVar cv_;
  std::vector<EngineEvent> inbox_ GUARDED_BY(mu_);
  /// POST /kv/transfer_status requests waiting for the connector thread (HandleTransferStatus).
  struct StatusRequest {
    TransferStatusQuery query;
    std::shared_ptr<std::promise<TransferStatusAnswer>> reply;
  };
  std::vector<StatusRequest> status_requests_ GUARDED_BY(mu_);
  bool agent_event_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;

  // Outbox (connector thread -> engine thread).
  Mutex out_mu_;
  std::vector<int64_t> release_ids_ GUARDED_BY(out_mu_);
  std::vector<KvLoadResult> loads_done_ GUARDED_BY(out_mu_);
  /// vllm pull profile: READs whose lease P pinned, posted by the engine thread at its next
  /// BeginStep (skipped there when the request stopped waiting meanwhile).
  std::vector<PendingRead> reads_to_post_ GUARDED_BY(out_mu_);

  mutable Mutex stats_mu_;
  /// The core's counters as of its last publication.
  ConnectorStats published_ GUARDED_BY(stats_mu_);
  /// Descriptors of READs posted by the engine thread.
  int64_t engine_descriptors_ GUARDED_BY(stats_mu_) = 0;
  int64_t transfer_ops_ GUARDED_BY(stats_mu_) = 0;  ///< backend ops of every WRITE/READ posted
  int64_t control_messages_ GUARDED_BY(stats_mu_) = 0;  ///< messages sent on their own
  int64_t control_bytes_ GUARDED_BY(stats_mu_) = 0;     ///< their payload bytes

  std::thread thread_;
};

}  // namespace kvpush::connector
