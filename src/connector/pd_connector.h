// PdConnector: the P/D KV connector of one instance (DESIGN.md §3, §5, §6; docs/pd_protocol.md).
//
// It joins the engine (through the KvConnector hooks) and the transfer engine (one xfer::Agent
// whose registered region is the engine's KV arena). Per request it plays one of four parts,
// chosen by the request's KvTransferParams:
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
// Threads: the engine thread calls the hooks (they only queue events and never block); one
// connector thread (the "writer") owns all per-transfer state, posts transfers and handles
// notifications; HTTP threads call HandleHandshake/EnsurePeer/ValidateRequest. Idle, the
// connector thread sleeps on a condition variable (1 s safety timeout).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "connector/handshake.h"
#include "connector/kv_transfer_config.h"
#include "connector/messages.h"
#include "engine/kv_connector.h"
#include "kv/layout.h"
#include "xfer/agent.h"

namespace kvpush::connector {

struct ConnectorOptions {
  KvTransferConfig config;
  KvLayout layout;  ///< the engine's resolved layout (EngineCore::LayoutFor)
  uint64_t model_fingerprint = 0;
  std::string role_name = "both";  ///< "prefill", "decode", "both"
  std::string advertise_host = "127.0.0.1";  ///< how peers reach this instance's HTTP port
  int advertise_port = 0;                    ///< may be set later (set_advertised_port)
};

/// Counters for /metrics. Monotonic except the gauges marked.
struct ConnectorStats {
  int64_t handshakes = 0;
  int64_t push_targets_sent = 0;
  int64_t push_targets_received = 0;
  int64_t writes_posted = 0;  ///< layer WRITE transfers
  int64_t bytes_written = 0;
  int64_t kv_ready_sent = 0;
  int64_t kv_ready_received = 0;
  int64_t reads_completed = 0;
  int64_t bytes_read = 0;
  int64_t transfers_failed = 0;
  int64_t watchdog_expired = 0;
  int64_t leases_expired = 0;
  int64_t not_needed = 0;       ///< full prefix hits on D (no KV moved)
  int64_t pins_sent = 0;        ///< pull (D): PIN requests sent
  int64_t pins_refused = 0;     ///< pull (P): PIN refused (lease expired, unknown, wrong state)
  /// D: received blocks whose checksums were verified, and verifications that failed.
  int64_t blocks_verified = 0;
  int64_t checksum_mismatches = 0;
  /// D: time spent verifying once the KV is complete (on the TTFT path; connector thread).
  int64_t verify_ns_sum = 0;
  /// D, push: time spent hashing chunks as LAYER_READY said they landed (off the TTFT path).
  int64_t verify_early_ns_sum = 0;
  int64_t checksum_ns_sum = 0;  ///< P: time spent hashing blocks (connector thread)
  int64_t transfers_aborted = 0;  ///< POST /kv/abort that found a live producer or target
  int64_t bad_messages = 0;     ///< malformed or unexpected peer messages dropped
  /// Push, P side: from the engine finishing the request (prefill done, first token sampled) to
  /// KV_READY posted: the part of the handoff P adds after its compute (the last layer's WRITE
  /// not yet complete, plus the connector thread's wake-up). The last layer's WRITE is posted as
  /// soon as its K/V are stored, before that layer's attention and FFN, so it mostly overlaps.
  int64_t push_tail_ns_sum = 0;
  int64_t push_tail_count = 0;
  /// Pull, D side: from posting the READ to its completion.
  int64_t read_ns_sum = 0;
  int64_t read_count = 0;
  /// KV WRITEs (P, push) and READs (D, pull) posted: descriptors selected (one per (layer, K|V,
  /// block) chunk) and backend ops after coalescing adjacent chunks (equal when nothing coalesces,
  /// e.g. `--kv-block-allocation scattered`).
  int64_t descriptors_posted = 0;
  int64_t transfer_ops_posted = 0;
  int64_t producers_active = 0;  ///< gauge
  int64_t consumers_waiting = 0;  ///< gauge
};

class PdConnector final : public KvConnector, private LayerObserver {
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
  /// Sets the port advertised in pull kv_transfer_params (after the HTTP server bound it).
  void set_advertised_port(int port) { advertise_port_.store(port); }

  /// POST /kv/handshake: validates the peer's document, loads its agent metadata and answers
  /// with this instance's document. Thread-safe. Errors: kInvalidArgument (malformed: HTTP 400),
  /// kFailedPrecondition (incompatible: HTTP 409, names the difference), kUnavailable.
  Result<nlohmann::json> HandleHandshake(const nlohmann::json& body);

  /// Makes sure the instance at host:port is handshaken (cached per peer; a peer that failed
  /// or restarted is handshaken again). Returns its engine id. Thread-safe; blocks on HTTP (at
  /// most 2 s to connect + clamp(watchdog_ms, 1 s, 10 s) to answer), and only callers naming the
  /// same host:port wait for each other.
  /// Errors: kUnavailable (unreachable, HTTP error), kFailedPrecondition (incompatible).
  Result<std::string> EnsurePeer(const std::string& host, int port);

  /// Checks a request's P/D params against this instance's role and, for a pull consumer,
  /// against the prompt (token count, prompt hash, block count). Thread-safe.
  /// Errors: kInvalidArgument with the reason.
  Status ValidateRequest(const KvTransferParams& p, std::span<const int32_t> prompt) const;

  /// POST /kv/abort: transfer `tid` is dead (the router saw the other leg fail, or the client
  /// left). The id is tombstoned (a later P leg, target or READ of it is refused) and a producer
  /// of it drops its prefill (if still running), cancels its WRITEs, tells D, and frees its
  /// blocks as soon as no WRITE can land any more, instead of at lease expiry. A consumer of it
  /// is left to the engine (the server aborts the request, which cancels the load).
  /// Thread-safe, non-blocking; an unknown or malformed id is ignored.
  void AbortTransfer(const std::string& tid);

  /// Snapshot of the counters. Thread-safe.
  ConnectorStats stats() const;

  // KvConnector (engine thread).
  void BindEngine(std::function<void()> wake, std::function<void(int64_t)> abort) override;
  KvMatch GetNumMatchedTokens(const Sequence& seq, int32_t num_local_computed) override;
  void OnBlocksAllocated(const Sequence& seq, std::span<const BlockId> blocks,
                         int32_t num_external_tokens) override;
  LayerObserver* BeginStep(std::span<const SequenceChunk> batch) override;
  bool OnRequestFinished(const Sequence& seq, std::span<const BlockId> blocks,
                         RequestOutput& out) override;
  void OnRequestRejected(const GenerationRequest& request) override;
  std::vector<int64_t> GetFinished() override;
  std::vector<KvLoadResult> GetFinishedLoading() override;
  bool HasPendingWork() const override;

 private:
  // ---- events from the engine thread to the connector thread ----
  struct StepChunk {
    int64_t seq_id = 0;
    int32_t end_pos = 0;  ///< tokens computed once this step's layer is done
    std::vector<BlockId> blocks;
  };
  struct Event {
    enum Kind : uint8_t {
      kProducerStart,
      kStep,
      kLayer,
      kProducerDone,
      kConsumerStart,
      kConsumerNotNeeded,
      kConsumerAbort,
      kReadPosted,
      kAbortTransfer,
      kConsumerRejected,
    } kind = kStep;
    int64_t seq_id = 0;
    KvTransferParams params;
    int32_t num_prompt_tokens = 0;
    uint64_t prompt_hash = 0;
    std::vector<BlockId> blocks;
    int32_t local_tokens = 0;
    int32_t external_tokens = 0;
    int64_t arrival_ns = 0;  ///< NowNs() when the request reached the engine
    std::vector<StepChunk> chunks;
    int32_t layer = 0;
    bool ok = false;
    TokenOutput token;
    Status error;
    xfer::TransferHandle transfer;
  };

  // ---- connector-thread state ----
  struct Producer {
    int64_t seq_id = 0;
    std::string tid;
    KvTransferParams::Mode mode = KvTransferParams::Mode::kPush;
    int32_t n = 0;  ///< prompt tokens
    uint64_t prompt_hash = 0;
    std::vector<BlockId> blocks;
    std::vector<int32_t> layer_done;  ///< per layer: tokens whose K/V are computed
    std::vector<int32_t> layer_sent;  ///< per layer: table index of the next block to send
    bool finished = false;            ///< the engine finished the request (blocks held)
    bool finished_ok = false;
    TokenOutput token;
    bool has_target = false;
    bool pinned = false;  ///< pull: a D pinned the lease (PIN answered); `peer` is that D
    std::string peer;
    uint32_t first_block = 0;
    std::vector<BlockId> dst;
    bool dropped = false;  ///< NOT_NEEDED, CANCEL or failure: no (more) writes
    bool cancel_ack_due = false;
    bool fail_due = false;
    Status failure;
    int outstanding = 0;
    bool ready_posted = false;
    bool released = false;
    TimePoint lease_deadline = TimePoint::max();
    int64_t finished_ns = 0;  ///< when the engine finished the request (first token sampled)
    /// Push: h(layer, kind, block) of each block-table entry, [i * 2L + layer * 2 + kind],
    /// filled as each layer's WRITE is posted (kv/block_checksum.h).
    std::vector<uint64_t> chunk_sums;
    /// Pull: c(block) of each block-table entry, computed when the prefill finished.
    std::vector<uint64_t> block_sums;
    /// Pull: a PIN that arrived before the connector thread saw the prefill finish (P's HTTP
    /// answer can overtake the engine's event); answered when it does.
    std::optional<std::pair<std::string, PdMessage>> early_pin;
  };
  struct Consumer {
    int64_t seq_id = 0;
    std::string tid;
    KvTransferParams::Mode mode = KvTransferParams::Mode::kPush;
    std::string peer;
    std::vector<BlockId> blocks;
    int32_t local_tokens = 0;
    int32_t external_tokens = 0;
    int32_t n = 0;
    uint64_t prompt_hash = 0;
    /// Deadline of the whole load, counted from the request's arrival (queue time included).
    TimePoint deadline{};
    /// Blocks [first_block, first_block + num_blocks) of the block table receive remote KV.
    uint32_t first_block = 0;
    uint32_t num_blocks = 0;
    PullProfile profile = PullProfile::kVllm;
    bool take_first_token = false;  ///< pull: P's first token is appended (no recompute)
    bool pin_sent = false;          ///< pull: PIN sent, PINNED or a refusal awaited
    bool read_handed = false;       ///< pull vllm: READ handed to the engine thread to post
    uint64_t expected_digest = 0;   ///< from KV_READY / PINNED
    /// h(layer, kind, block) of the received blocks, [(i - first_block) * 2L + layer * 2 + kind],
    /// filled as LAYER_READY notifications say chunks landed (push), the rest at verification.
    std::vector<uint64_t> chunk_sums;
    std::vector<uint8_t> chunk_hashed;
    bool cancelling = false;
    TimePoint cancel_deadline{};
    bool aborted = false;  ///< the engine finished it while waiting: release, don't resume
    bool read_posted = false;
    int64_t read_posted_ns = 0;
    std::optional<TokenOutput> first_token;  ///< pull fast profile
  };
  enum class XferKind : uint8_t { kWrite, kReady, kMessage, kRead };
  struct Outstanding {
    std::string tid;
    XferKind kind = XferKind::kMessage;
    uint64_t bytes = 0;
  };
  struct PeerState {
    HandshakeInfo info;
    xfer::ListHandle remote_list;  ///< every (layer, K|V, block) chunk of the peer's arena
  };

  explicit PdConnector(ConnectorOptions options);
  Status Init();
  // LayerObserver (engine thread): queues "layer done" for the writer.
  void OnLayerDone(int32_t layer) override;
  HandshakeInfo SelfInfo() const;
  /// Loads a peer's handshake document (compat check, agent metadata, remote list). Thread-safe.
  Status AdoptPeer(const HandshakeInfo& peer);
  std::optional<PeerState> FindPeer(const std::string& engine_id) const;
  uint32_t EntryIndex(int32_t num_blocks, int32_t layer, KvKind kind, BlockId block) const;

  void Push(Event ev);
  void Loop();
  void HandleEvent(Event& ev);
  void HandleMessage(const xfer::Notification& n);
  void PollTransfers();
  void Timers();
  /// Sends `m` to `peer` as a standalone notification (tracked until done).
  void SendMessage(const std::string& peer, const PdMessage& m);
  /// Sends a message that carries only its tag and transfer id (CANCEL, CANCEL_ACK, RELEASE, ...).
  void SendSignal(const std::string& peer, MsgTag tag, const std::string& tid);
  /// Sends TRANSFER_FAILED with `code` and `why`.
  void SendFailure(const std::string& peer, const std::string& tid, StatusCode code,
                   const std::string& why);
  /// Cancels every outstanding transfer of kind `kind` that belongs to transfer `tid`.
  void CancelOutstanding(const std::string& tid, XferKind kind);
  /// The request's pull profile, or the instance default when it names none.
  PullProfile ResolvePullProfile(const KvTransferParams& p) const;
  void Tombstone(const std::string& tid);
  bool IsTombstoned(const std::string& tid) const;
  /// Posts `spec`, tracking it as `kind` for transfer `tid`. Returns false on failure.
  bool PostTracked(const xfer::TransferSpec& spec, const std::string& tid, XferKind kind,
                   uint64_t bytes, Status* error);

  // Producer (P) side: pd_connector_producer.cc.
  void OnProducerStart(Event& ev);
  void OnStep(Event& ev);
  void OnLayer(int32_t layer);
  void OnProducerDone(Event& ev);
  /// OnProducerDone's body: records the prefill's outcome, checksums (pull) or posts (push).
  void FinishProducer(Producer& p, Event& ev);
  void OnPushTarget(const std::string& peer, PdMessage& m);
  void AttachTarget(Producer& p, const std::string& peer, PdMessage& m);
  void TryPostLayer(Producer& p, int32_t layer);
  void TryPostAll(Producer& p);
  void AdvanceProducer(Producer& p);
  void DropProducer(Producer& p, Status why, bool tell_peer);
  void ReleaseProducer(Producer& p);
  void OnProducerTransferDone(const Outstanding& o, const xfer::TransferStatus& st);
  void OnProducerMessage(const std::string& peer, PdMessage& m);
  /// Pull: D asks to pin transfer m.transfer_id's lease; answers PINNED or TRANSFER_FAILED.
  void OnPin(const std::string& peer, const PdMessage& m);
  /// Push: KvDigest of the producer's target blocks from its chunk hashes.
  uint64_t PushDigest(const Producer& p) const;
  void OnAbortTransfer(const std::string& tid);

  // Consumer (D) side: pd_connector_consumer.cc.
  void OnConsumerStart(Event& ev);
  void OnConsumerAbort(Event& ev);
  void OnConsumerMessage(const std::string& peer, PdMessage& m);
  void OnConsumerTransferDone(const Outstanding& o, const xfer::TransferStatus& st);
  /// Pull: P pinned the lease; posts (fast) or hands to the engine thread (vllm) the READ.
  void OnPinned(Consumer& c, PdMessage& m);
  /// Push: LAYER_READY says layer m.layer of blocks [m.first_block, +m.num_blocks) landed:
  /// checksums those chunks now, while P computes the next layers.
  void OnLayerReady(Consumer& c, const PdMessage& m);
  /// Hashes chunk (layer, kind) of the consumer's i-th received block into c.chunk_sums.
  void HashReceivedChunk(Consumer& c, size_t i, int32_t layer, KvKind kind);
  /// Recomputes the digest of the consumer's received blocks (hashing the chunks no LAYER_READY
  /// covered) and compares it with the one P sent. Counts the check; on a mismatch returns
  /// kDataLoss (the blocks must not be used).
  Status VerifyReceived(Consumer& c);
  void CompleteConsumer(Consumer& c, Status status, std::optional<TokenOutput> token);
  /// Builds the READ of a pull consumer (local D blocks <- remote P blocks).
  Result<xfer::TransferSpec> BuildRead(const std::string& peer, std::span<const BlockId> local,
                                       std::span<const int32_t> remote);

  ConnectorOptions options_;
  std::unique_ptr<xfer::Agent> agent_;
  xfer::RegionId arena_region_;
  std::span<std::byte> arena_;
  void* owned_arena_ = nullptr;  ///< arena allocated here (backend did not allocate it)
  xfer::ListHandle local_list_;  ///< every (layer, K|V, block) chunk of the own arena
  std::vector<uint8_t> agent_metadata_;
  std::atomic<int> advertise_port_{0};

  std::function<void()> wake_engine_;
  std::function<void(int64_t)> abort_request_;

  // Engine-thread-only state.
  std::unordered_map<int64_t, int32_t> push_producers_;  ///< seq_id -> prompt tokens
  std::unordered_map<int64_t, int32_t> consumers_engine_;  ///< seq_id -> waiting (1)
  struct PendingRead {
    int64_t seq_id;
    std::string tid;
    std::string peer;
    std::vector<BlockId> local;
    std::vector<int32_t> remote;
  };
  int64_t engine_holds_ = 0;
  int64_t engine_waiting_ = 0;

  // Inbox (engine/HTTP threads -> connector thread).
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> inbox_;
  bool agent_event_ = false;
  bool stopping_ = false;

  // Outbox (connector thread -> engine thread).
  std::mutex out_mu_;
  std::vector<int64_t> release_ids_;
  std::vector<KvLoadResult> loads_done_;
  /// vllm pull profile: READs whose lease P pinned, posted by the engine thread at its next
  /// BeginStep (skipped there when the request stopped waiting meanwhile).
  std::vector<PendingRead> reads_to_post_;

  // Peers (HTTP threads, connector thread, engine thread).
  mutable std::mutex peers_mu_;
  std::map<std::string, PeerState, std::less<>> peers_;       ///< by engine id
  std::map<std::string, std::string, std::less<>> endpoints_;  ///< "host:port" -> engine id
  /// One lock per "host:port": outgoing handshakes to one endpoint are serialized, and a peer
  /// that hangs holds up only the requests that name it. Guarded by peers_mu_.
  std::map<std::string, std::shared_ptr<std::mutex>, std::less<>> handshake_locks_;

  // Connector-thread-only state.
  std::unordered_map<std::string, Producer> producers_;  ///< by transfer id
  std::unordered_map<int64_t, std::string> producer_by_seq_;
  std::unordered_map<std::string, Consumer> consumers_;  ///< by transfer id
  struct PendingTarget {
    std::string peer;
    PdMessage msg;
    TimePoint expiry;
  };
  std::unordered_map<std::string, PendingTarget> pending_targets_;
  std::unordered_map<uint64_t, Outstanding> outstanding_;  ///< by TransferHandle::packed()
  std::unordered_map<std::string, TimePoint> tombstones_;
  std::deque<std::pair<TimePoint, std::string>> tombstone_order_;
  std::vector<StepChunk> step_chunks_;
  TimePoint next_timer_check_{};

  mutable std::mutex stats_mu_;
  ConnectorStats stats_;

  std::thread thread_;
};

}  // namespace kvpush::connector
