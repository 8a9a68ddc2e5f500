// TransferCore: the P/D transfer protocol as a single-threaded state machine (DESIGN.md §3, §6;
// docs/pd_protocol.md §3). It owns the producer table (P: push WRITEs, KV_READY, pull leases and
// PINs) and the consumer table (D: push targets, PINs and READs, watchdog, checksums), the
// tombstones and the outstanding transfers. It reads no wall clock, starts no thread and touches
// no transfer engine: inputs are engine events, peer messages, transfer completions and ticks;
// outputs are actions on a CoreActions (post a WRITE/READ, send a message, cancel, release blocks,
// finish a load, abort a request, hand a READ to the engine thread, invalidate a peer).
// PdConnector is the shell that feeds it from its connector thread and carries the actions out
// with an xfer::Agent; tests drive it directly with a ManualClock and recording fakes.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "connector/block_list.h"
#include "connector/connector_stats.h"
#include "connector/handoff_timeline.h"
#include "connector/kv_transfer_config.h"
#include "connector/messages.h"
#include "connector/peer_auth.h"
#include "connector/transfer_events.h"
#include "connector/transfer_status.h"
#include "engine/kv_connector.h"
#include "kv/block_checksum.h"
#include "kv/layout.h"
#include "xfer/types.h"

namespace kvpush::connector {

/// What the core needs to know of a handshaken peer.
struct PeerView {
  int32_t num_blocks = 0;    ///< blocks in the peer's KV pool (its layout)
  uint64_t incarnation = 0;  ///< the handshaken process (a restart gives a new one)
  /// The transfer engine's connection to the peer now (xfer::PeerInfo::connection): a message
  /// sent now goes over it. 0: none alive.
  uint64_t connection = 0;
};

/// The peers the core may talk to: PeerRegistry in production, a fake in tests. Called only on
/// the core's thread; implementations that other threads change must be thread-safe.
class PeerDirectory {
 public:
  virtual ~PeerDirectory() = default;
  /// The peer with agent name `engine_id` when it was handshaken, else nullopt.
  virtual std::optional<PeerView> Find(const std::string& engine_id) const = 0;
  /// The engine id handshaken at host:port, or "" when none was.
  virtual std::string EngineIdAt(const std::string& host, int port) const = 0;
  /// nullopt while the transfer engine considers `engine_id` alive, or while it is not alive
  /// only because this instance dropped it (CoreActions::FencePeer: no evidence about the
  /// peer's process); else why it is not (unknown, failed: its connection broke or its process
  /// exited, restarted). The core treats a failure as proof that the peer's process can write
  /// nothing more into this instance's memory (docs/reliability.md, *Quarantine*).
  virtual std::optional<std::string> Failure(const std::string& engine_id) const = 0;
  /// True once connection `connection` to `engine_id` was fenced (CoreActions::FencePeer) and
  /// the transport confirmed its teardown: nothing the peer issued over it can land here any
  /// more (xfer::Agent::PeerFenced).
  virtual bool Fenced(const std::string& engine_id, uint64_t connection) const = 0;
};

/// A WRITE (push, P -> D) or READ (pull, D <- P) the core asks to post: entries of the local and
/// the peer's chunk lists (one entry per (layer, K|V, block) chunk, index TransferCore::
/// EntryIndex), pairwise; `notification` (may be empty) is delivered to the peer once the data
/// is visible there.
struct TransferOrder {
  xfer::Op op = xfer::Op::kWrite;
  std::string peer;
  std::vector<uint32_t> local_indices;
  std::vector<uint32_t> remote_indices;
  std::vector<uint8_t> notification;
};

/// The READ (pull, D <- P) of P's blocks `remote` (in a pool of `peer_num_blocks` blocks) into
/// D's blocks `local` (pairwise) of an arena laid out as `layout`: every layer, K and V.
/// Errors: kInvalidArgument (counts differ or are zero, a remote block outside P's pool). Pure.
Result<TransferOrder> MakeReadOrder(const KvLayout& layout, const std::string& peer,
                                    int32_t peer_num_blocks, std::span<const BlockId> local,
                                    std::span<const int32_t> remote);

/// A pull READ in the vllm profile: posted by the engine thread before its next forward pass.
struct PendingRead {
  int64_t seq_id = 0;
  std::string tid;
  std::string peer;
  std::vector<BlockId> local;   ///< D's blocks, in prompt order
  std::vector<int32_t> remote;  ///< P's blocks (from PINNED), pairwise with `local`
};

/// The actions the core takes. PdConnector carries them out; tests record them. Every method
/// is called on the core's thread, from inside a TransferCore input method.
class CoreActions {
 public:
  virtual ~CoreActions() = default;
  /// Posts a WRITE or READ. Returns the token its end will be reported with
  /// (TransferCore::OnTransferDone), or why it could not be posted (then no end is reported).
  virtual Result<TransferToken> PostTransfer(const TransferOrder& order) = 0;
  /// Sends `m` to `peer` as a standalone notification. Returns its token (its end is reported
  /// like a transfer's), or why it could not be sent (the core logs and goes on).
  virtual Result<TransferToken> SendMessage(const std::string& peer, const PdMessage& m) = 0;
  /// Cancels a posted transfer; its end is still reported.
  virtual void Cancel(TransferToken token) = 0;
  /// The engine may free the blocks of request `seq_id` (its KvConnector::GetFinished).
  virtual void ReleaseBlocks(int64_t seq_id) = 0;
  /// An asynchronous KV load ended (KvConnector::GetFinishedLoading).
  virtual void FinishLoad(KvLoadResult result) = 0;
  /// Asks the engine to abort request `seq_id` (a prefill nobody needs any more).
  virtual void AbortRequest(int64_t seq_id) = 0;
  /// Hands a READ to the engine thread (vllm pull profile); its post comes back as a
  /// kReadPosted event.
  virtual void HandRead(PendingRead read) = 0;
  /// Fences connection `connection` to `peer` (xfer::Agent::FencePeer): the peer is dropped
  /// (transfers to it fail; the next handshake connects again) and the transport tears the
  /// connection down so that nothing the peer issued over it can land here;
  /// PeerDirectory::Fenced says when that is confirmed. Until then blocks a WRITE of it may
  /// target are not reusable. Errors: kUnimplemented (the transport cannot fence: nothing is
  /// dropped), kNotFound (unknown peer).
  virtual Status FencePeer(const std::string& peer, uint64_t connection,
                           const std::string& why) = 0;
  /// Asks the prefill instance `peer` at host:port (over its HTTP port: POST
  /// /kv/transfer_status) to cancel the push transfers of `query` and to say which of them can
  /// no longer write here. Asynchronous: exactly one TransferStatusEvent comes back.
  virtual void QueryTransferStatus(const std::string& peer, const std::string& host, int port,
                                   TransferStatusQuery query) = 0;
};


/// Per-transfer protocol state of a producer (P). See docs/pd_protocol.md §3.
enum class ProducerState : uint8_t {
  kPrefilling,  ///< the engine computes the prompt; push WRITEs go out layer by layer
  kHeld,        ///< prefill done: blocks held under the lease (push: until every WRITE ended)
  kPinned,      ///< pull: a D pinned the lease (PINNED sent); until RELEASE or the lease ends
  /// push: KV_READY on its way, either as a message once every WRITE was done (blocks released),
  /// or as the notification of the last WRITE (blocks released once it ended).
  kReadyPosted,
  kDropping,  ///< no (more) WRITEs: waits for posted ones to end and the engine to finish
};

/// Per-transfer protocol state of a consumer (D).
enum class ConsumerState : uint8_t {
  kAwaitingKv,  ///< push: PUSH_TARGET sent, waiting for KV_READY
  kPinSent,     ///< pull: PIN sent, waiting for PINNED or a refusal
  kReadHanded,  ///< pull vllm: READ handed to the engine thread, not posted yet
  kReading,     ///< pull: READ posted
  kCancelling,  ///< watchdog or abort: CANCEL sent / READ cancelled, waiting for its end
  /// No CANCEL_ACK (push) or READ end (pull) within cancel_ack_ms: the request was told its load
  /// failed (recompute into fresh blocks, or fail) and the announced blocks are held out of use
  /// until nothing can land in them: P's CANCEL_ACK, TRANSFER_FAILED or late KV_READY (sent only
  /// once its WRITEs settled), the READ settled, or P dead or restarted. CANCEL is re-sent with
  /// backoff meanwhile. P alive but silent for broken_peer_ms: its connection is fenced, and
  /// the fence confirmed ends every quarantine of that connection.
  kQuarantined,
};

/// "prefilling", "held", "pinned", "ready_posted", "dropping" (logs, tests).
const char* ProducerStateName(ProducerState s);
/// "awaiting_kv", "pin_sent", "read_handed", "reading", "cancelling", "quarantined" (logs,
/// tests).
const char* ConsumerStateName(ConsumerState s);

/// The single-threaded protocol core. Not thread-safe: one thread (PdConnector's connector
/// thread, or a test) calls every method. `clock`, `peers` and `actions` must outlive it;
/// `arena` is the instance's KV memory (layout.total_bytes() bytes), read for checksums.
class TransferCore {
 public:
  TransferCore(KvTransferConfig config, KvLayout layout, std::span<const std::byte> arena,
               const Clock& clock, const PeerDirectory& peers, CoreActions& actions);

  // ---- inputs ----
  /// An engine or HTTP event (one of EngineEvent's types).
  void HandleEvent(EngineEvent ev);
  /// A notification from `peer`: authenticated (when set_auth gave a PeerAuth: a payload whose
  /// MAC trailer does not verify, is missing or replayed is counted there and dropped, changing
  /// nothing here), then decoded and validated; a malformed one is counted in bad_messages and
  /// dropped.
  void HandleMessage(const std::string& peer, std::span<const uint8_t> payload,
                     uint64_t connection = 0);
  /// Authenticates every later HandleMessage with `auth` (must outlive the core; null: none).
  void set_auth(PeerAuth* auth) { auth_ = auth; }
  /// A decoded message from `peer` that arrived over connection `connection` (the transfer
  /// engine's connection to the peer when it arrived, xfer::Notification::connection; 0:
  /// none). A push target is bound to it: its WRITEs go only over that connection (a peer that
  /// fenced it and connected again may have reused the blocks).
  void HandleDecoded(const std::string& peer, PdMessage& m, uint64_t connection = 0);
  /// The transfer or message `token` ended (done, cancelled or failed). Unknown tokens are
  /// ignored.
  void OnTransferDone(TransferToken token, const xfer::TransferStatus& status);
  /// Timers: tombstone expiry, unmatched targets, leases, watchdogs, peer liveness, cancel
  /// deadlines, liveness queries. Runs at most every 10 ms of clock time; call it often.
  void Tick();
  /// P: POST /kv/transfer_status from D `query.engine_id`: each transfer is cancelled as a
  /// CANCEL from that D would (the engine's prefill aborted, WRITEs cancelled, the id
  /// tombstoned), then answered "settled" when no WRITE of it is outstanding (none ever will
  /// be) and "pending" while one is.
  TransferStatusAnswer AnswerTransferStatus(const TransferStatusQuery& query);

  // ---- queries ----
  /// True while any transfer is tracked (the shell then wakes up more often).
  bool busy() const;
  /// True while a layer event can make the core post something now: a push producer with a
  /// target is prefilling, or a target waits for its request. When false the shell queues step
  /// and layer events without waking its thread (they are applied at its next wake-up, before
  /// any message, so a target arriving meanwhile still sees every computed layer).
  bool wants_layer_events() const;
  /// Tokens of every posted transfer and message not yet reported ended.
  std::vector<TransferToken> OutstandingTokens() const;
  /// Counters (gauges producers_active / consumers_waiting filled in).
  ConnectorStats stats() const;
  /// The handoff timelines (handoff_timeline.h) of the transfers that ended since the last call,
  /// in the order they ended.
  std::vector<HandoffRecord> TakeFinishedRecords() { return std::exchange(finished_records_, {}); }
  std::optional<ProducerState> producer_state(const std::string& tid) const;
  std::optional<ConsumerState> consumer_state(const std::string& tid) const;
  bool IsTombstoned(const std::string& tid) const;
  size_t num_producers() const { return producers_.size(); }
  size_t num_consumers() const { return consumers_.size(); }
  size_t num_pending_targets() const { return pending_targets_.size(); }
  /// Index of chunk (layer, kind, block) in a chunk list of an arena with `num_blocks` blocks.
  static uint32_t EntryIndex(int32_t num_blocks, int32_t layer, KvKind kind, BlockId block);

 private:
  enum class XferKind : uint8_t { kWrite, kReady, kMessage, kRead };
  struct Outstanding {
    std::string tid;
    XferKind kind = XferKind::kMessage;
    uint64_t bytes = 0;
  };
  struct Producer {
    int64_t seq_id = 0;
    std::string tid;
    std::string request_id;  ///< ProducerStartEvent::request_id
    pd::KvTransferParams::Mode mode = pd::KvTransferParams::Mode::kPush;
    ProducerState state = ProducerState::kPrefilling;
    int32_t n = 0;  ///< prompt tokens
    uint64_t prompt_hash = 0;
    std::vector<BlockId> blocks;
    std::vector<int32_t> layer_done;  ///< per layer: tokens whose K/V are computed
    std::vector<int32_t> layer_sent;  ///< per layer: table index of the next block to send
    bool engine_done = false;         ///< the engine finished the request (blocks held)
    bool answer_needed =
        false;  ///< ProducerStartEvent::answer_needed: never aborted for NOT_NEEDED
    TokenOutput token;
    uint64_t first_token_binding = 0;  ///< of the request that sampled `token`
    /// The D of this transfer: push, the one whose target was attached; pull, the one that
    /// pinned the lease. Empty until then.
    std::string peer;
    /// Push: the connection to `peer` the target arrived over (PeerView::connection then): the
    /// only one its WRITEs may go over (WriteTarget).
    uint64_t target_connection = 0;
    uint32_t first_block = 0;
    /// Push: D's target blocks for block-table entries [first_block, first_block +
    /// target.total()), as its parts arrived: D may announce them over time, as its pool frees
    /// blocks (docs/pd_protocol.md §3, *A target in parts*). Entries before covered() are
    /// written as they are computed; KV_READY waits for the whole list.
    BlockListAssembly target;
    /// Push: the decode blocks the target named so far (indexed by block id; a block named twice
    /// is refused, whichever parts name it).
    std::vector<bool> target_named;
    bool cancel_ack_due = false;  ///< kDropping: answer CANCEL_ACK once no WRITE can land
    bool fail_due = false;        ///< kDropping: send TRANSFER_FAILED once no WRITE can land
    Status failure;
    int outstanding = 0;  ///< WRITEs posted and not ended
    bool released = false;
    /// kReadyPosted: KV_READY is the notification of the last WRITE (not a message of its own);
    /// the blocks are released once that WRITE ended.
    bool ready_on_write = false;
    TimePoint lease_deadline = TimePoint::max();
    int64_t finished_ns = 0;  ///< when the engine finished the request (first token sampled)
    /// Push: the chunk hashes of the block-table entries sent so far, and their block checksums
    /// (KV_READY's digest covers entries [first_block, n / block_size)).
    KvDigestBuilder sent_sums;
    /// Pull: c(block) of each block-table entry, computed when the prefill finished.
    std::vector<uint64_t> block_sums;
    /// Pull: a PIN that arrived before the prefill's end was seen; answered then.
    std::optional<std::pair<std::string, PdMessage>> early_pin;
    HandoffRecord timeline;
    bool targeted() const { return mode == pd::KvTransferParams::Mode::kPush && !peer.empty(); }
    /// Push: block-table entries [0, covered()) have a target block on D (or are D's local hit).
    int32_t covered() const { return static_cast<int32_t>(first_block + target.prefix()); }
  };
  struct Consumer {
    int64_t seq_id = 0;
    std::string tid;
    std::string request_id;  ///< ConsumerStartEvent::request_id
    pd::KvTransferParams::Mode mode = pd::KvTransferParams::Mode::kPush;
    ConsumerState state = ConsumerState::kAwaitingKv;
    std::string peer;
    std::vector<BlockId> blocks;
    int32_t local_tokens = 0;
    int32_t external_tokens = 0;
    int32_t n = 0;
    uint64_t prompt_hash = 0;
    /// Of the whole load, from the request's arrival; push: also from the last LAYER_READY that
    /// brought chunks not seen before (a transfer streaming in is not stuck).
    TimePoint deadline{};
    /// Blocks [first_block, first_block + num_blocks) of the block table receive remote KV.
    uint32_t first_block = 0;
    uint32_t num_blocks = 0;
    /// Push: target blocks [0, announced) were sent to P. Less than num_blocks while the engine
    /// reserves the rest as its pool frees blocks (ConsumerBlocksEvent); `blocks` holds the
    /// table so far.
    uint32_t announced = 0;
    pd::PullProfile profile = pd::PullProfile::kVllm;
    bool take_first_token = false;  ///< pull: P's first token is appended (no recompute)
    uint64_t first_token_binding = 0;  ///< of this request; P's token must have the same
    uint64_t expected_digest = 0;   ///< from KV_READY / PINNED
    /// The chunk hashes of the received blocks (block i: table entry first_block + i), made when
    /// the first LAYER_READY or the final check needs them.
    KvDigestBuilder received_sums;
    TimePoint cancel_deadline{};
    /// kQuarantined: when CANCEL is sent again (push), doubling from cancel_ack_ms up to 30 s.
    TimePoint next_cancel{};
    std::chrono::milliseconds cancel_backoff{0};
    /// kQuarantined: since when; P silent broken_peer_ms after it is fenced.
    TimePoint quarantined_at{};
    /// kQuarantined, push: when P is asked again over HTTP (QueryTransferStatus), and the
    /// interval, doubling from cancel_ack_ms up to max(cancel_ack_ms, broken_peer_ms / 2).
    TimePoint next_query{};
    std::chrono::milliseconds query_backoff{0};
    /// P's HTTP address from the request (kv_transfer_params remote_host / remote_port).
    std::string peer_host;
    int peer_port = 0;
    bool fence_asked = false;       ///< FencePeer was asked for peer_connection (or refused)
    uint64_t peer_incarnation = 0;  ///< of `peer` when the request started (0: unknown)
    /// The connection the PUSH_TARGET / PIN went over (PeerView::connection); 0 when unknown
    /// (none alive, or it changed while the request was being sent): then no fence ends this
    /// consumer, only P's answer or its death.
    uint64_t peer_connection = 0;
    /// The engine no longer waits for this load (it finished the request, or was told the load
    /// failed at quarantine): the end releases the held blocks instead of finishing a load.
    bool aborted = false;
    int64_t read_posted_ns = 0;
    std::optional<TokenOutput> first_token;  ///< pull fast profile
    /// Pull: the PINNED parts received so far when P's list comes in several (block_list.h).
    BlockListAssembly pinned_parts;
    /// Why a cancel began when not the watchdog's (a PUSH_TARGET of unknown fate): what the
    /// request is told when the cancel ends. OK: the watchdog's message.
    Status cancel_reason;
    HandoffRecord timeline;
  };
  /// The parts of a PUSH_TARGET received before its prefill request (`msg` holds the first
  /// part's header, no ids); attached, whole or not, when the request arrives.
  struct PendingTarget {
    std::string peer;
    PdMessage msg;
    TimePoint expiry;
    BlockListAssembly parts;
    uint64_t connection = 0;  ///< it arrived over (kMixedConnections: parts over several)
    bool partial() const { return !parts.complete(); }
  };
  /// PendingTarget::connection of a target whose parts came over different connections: no
  /// connection matches it, so it is never written (WriteTarget).
  static constexpr uint64_t kMixedConnections = ~uint64_t{0};

  // transfer_core.cc
  void OnNotNeededOrRejected(const pd::KvTransferParams& params, bool rejected);
  void SendMessage(const std::string& peer, const PdMessage& m);
  void SendSignal(const std::string& peer, MsgTag tag, const std::string& tid);
  void SendFailure(const std::string& peer, const std::string& tid, StatusCode code,
                   const std::string& why);
  void CancelOutstanding(const std::string& tid, XferKind kind);
  bool PostTracked(const TransferOrder& order, const std::string& tid, XferKind kind,
                   uint64_t bytes, Status* error);
  /// Adds a posted KV op (descriptors, bytes, `post_ns` inside the post call) to its transfer's
  /// HandoffRecord (vLLM's nixl_* histograms, HandoffTimelineLog::Xfers).
  void NoteKvOpPosted(const std::string& tid, XferKind kind, const TransferOrder& order,
                      int64_t post_ns);
  void Tombstone(const std::string& tid);
  /// The timeline of transfer `tid` here (its producer's, else its consumer's), or null.
  HandoffRecord* TimelineOf(const std::string& tid);
  /// Marks `phase` now on `r`.
  void Mark(HandoffRecord& r, HandoffPhase phase) const { r.Mark(phase, clock_.NowNanos()); }
  void ExpireTimers(TimePoint now);
  void CheckConsumerTimers(TimePoint now);
  void Quarantine(Consumer& c, TimePoint now);
  /// Push: CANCEL sent, kCancelling until CANCEL_ACK, TRANSFER_FAILED, KV_READY, P gone or the
  /// cancel deadline (then kQuarantined).
  void BeginPushCancel(Consumer& c, TimePoint now);
  /// A message of `c` (PUSH_TARGET, PIN, CANCEL) completed with an error: it may or may not have
  /// been delivered.
  void OnConsumerMessageFailed(Consumer& c, const Status& error);
  /// What a consumer whose cancel ended is told (`cancel_reason`, else the watchdog's message).
  Status CancelledLoadStatus(const Consumer& c) const;
  /// Why nothing of `c`'s peer can land any more: its process is known to be gone (failed or
  /// restarted since c started), or c's connection to it was fenced and the fence confirmed
  /// (unless c's own READ is still outstanding: it ends when it settles). nullopt otherwise.
  std::optional<std::string> PeerGoneReason(const Consumer& c) const;
  /// `c` quarantined for broken_peer_ms while its peer lives: fence its connection, once for
  /// every consumer on it (docs/reliability.md, *A broken peer*).
  void FenceBrokenPeer(Consumer& c);
  /// The connection to `peer` now (PeerView::connection; 0: none).
  uint64_t ConnectionTo(const std::string& peer) const;
  /// True while a READ of transfer `tid` is posted and not settled.
  bool ReadOutstanding(const std::string& tid) const;
  /// True while a WRITE (or KV_READY) of transfer `tid` is posted and not settled.
  bool WriteOutstanding(const std::string& tid) const;
  /// Quarantined push consumers whose query is due: asked of their P, one query per peer (and
  /// per kMaxStatusTransfers ids) while none to that peer is in flight.
  void QueryQuarantines(TimePoint now);
  void OnTransferStatus(TransferStatusEvent& ev);
  std::string PeerOf(const pd::KvTransferParams& p) const;

  // producer.cc
  /// The request id of transfer `tid` ("" when no producer or consumer has it): the id its log
  /// lines carry (LogRequestScope, common/log.h).
  std::string_view RequestIdOf(const std::string& tid) const;
  /// The request id of the transfer `ev` is about ("" when none is known yet).
  std::string_view RequestIdOf(const EngineEvent& ev) const;
  void OnProducerStart(ProducerStartEvent& ev);
  void OnStep(StepEvent& ev);
  void OnLayer(int32_t layer);
  void OnProducerDone(ProducerDoneEvent& ev);
  void FinishProducer(Producer& p, ProducerDoneEvent& ev);
  void OnProducerMessage(const std::string& peer, PdMessage& m);
  void OnProducerCancel(const std::string& peer, const PdMessage& m);
  void OnPushTarget(const std::string& peer, PdMessage& m);
  /// Adds a part of a target whose prefill request has not arrived (pending for at most the
  /// lease), or refuses it (TRANSFER_FAILED sent, the parts dropped).
  void AddPendingPart(const std::string& peer, PdMessage& m, uint64_t connection);
  /// Why target part `m` cannot belong to the target whose first part had header `first`, or
  /// "" when it can (same prompt, block range, list length).
  static std::string PartMismatch(const PdMessage& first, const PdMessage& m);
  /// Attaches the target whose header is `header` and whose parts so far are `parts` (they
  /// arrived over `connection`), or refuses it (TRANSFER_FAILED): the prompt must be the one
  /// computed here, the range the prompt's uncached blocks, every block in D's pool and named
  /// once. Writes what is computed and covered.
  void AttachTarget(Producer& p, const std::string& peer, const PdMessage& header,
                    BlockListAssembly parts, uint64_t connection);
  /// A further part of `p`'s attached target: validated as AttachTarget does, then what it
  /// covers is written once computed. A malformed part drops the transfer (TRANSFER_FAILED once
  /// no WRITE can land); a part from another instance is refused to it alone.
  void ExtendTarget(Producer& p, const std::string& peer, const PdMessage& m, uint64_t connection);
  /// Checks the ids [from, target.total()) received so far in `p`'s target (range, named once)
  /// and marks them named. Returns why not ("" when fine).
  std::string NameTargetBlocks(Producer& p, const PeerView& peer, uint32_t from, uint32_t count);
  /// Writes what the target covers now (all at once after the prefill, layer by layer during
  /// it) and advances. False when p was dropped (it may be gone).
  bool PostCovered(Producer& p);
  /// Post what is computed and not sent yet. False when the producer was dropped meanwhile
  /// (it may have been erased: the caller must not touch it any more).
  bool TryPostAll(Producer& p);
  /// During the prefill: the WRITE of `layer`'s computed blocks not sent yet, with LAYER_READY
  /// as its notification, once they amount to layerwise_min_bytes, or, in the prompt's last
  /// chunk, once waiting would leave at least that much for after the prefill (DeferredBytes):
  /// then only the last layer's share remains for the end, whatever the chunk alignment. The
  /// last layer's WRITE that would complete the prompt waits for the engine's end (PostRest).
  /// Same return as TryPostAll.
  bool TryPostLayer(Producer& p, int32_t layer);
  /// What the WRITE after the prefill would carry if `layer`'s `bytes` (the prompt's last chunk,
  /// complete) waited for it: those bytes for this and every later layer, plus what the earlier
  /// layers left unsent. Pure.
  uint64_t DeferredBytes(const Producer& p, int32_t layer, uint64_t bytes) const;
  /// Over layers [0, layers): the blocks before table entry `upto` each of them has not sent
  /// yet, summed (a block counts once per layer). Pure.
  size_t UnsentBlocks(const Producer& p, int32_t layers, int32_t upto) const;
  /// After the prefill: ONE WRITE of every chunk the target covers and was not sent yet, all
  /// layers, whose notification is KV_READY when that completes the target and no other WRITE of
  /// the transfer is in flight (then the transfer needs no message of its own). Same return as
  /// TryPostAll.
  bool PostRest(Producer& p);
  PdMessage KvReadyMessage(const Producer& p) const;
  /// The peer a WRITE of `p`'s blocks [.., upto) goes to; drops `p` (then nullopt; p may be
  /// gone) when its block table is shorter or its D is no longer known.
  std::optional<PeerView> WriteTarget(Producer& p, int32_t upto);
  /// An empty WRITE order to `p`'s D, room reserved for `blocks` blocks' K and V.
  TransferOrder NewWriteOrder(const Producer& p, size_t blocks) const;
  /// Appends layer `layer`'s K and V chunks of `p`'s block-table entries [from, upto), paired
  /// with D's target blocks in a pool of `peer_num_blocks`.
  void AppendLayerChunks(TransferOrder& order, const Producer& p, int32_t peer_num_blocks,
                         int32_t layer, int32_t from, int32_t upto) const;
  /// Posts `order` (a WRITE of `bytes`; `what` names it in the failure): counted as in flight
  /// and on the timeline. Returns the time it was posted; nullopt when the post failed and `p`
  /// was dropped (it may be gone).
  std::optional<int64_t> PostWrite(Producer& p, const TransferOrder& order, uint64_t bytes,
                                   const std::string& what);
  /// KV_READY of `p` was posted at `post_ns` (alone or on a WRITE): state, timeline, counters.
  void NoteKvReadyPosted(Producer& p, int64_t post_ns);
  void HashSentChunks(Producer& p, int32_t layer, int32_t from, int32_t upto);
  void OnProducerTransferDone(const Outstanding& o, const xfer::TransferStatus& st);
  void DropProducer(Producer& p, Status why, bool tell_peer);
  void ReleaseProducer(Producer& p);
  void AdvanceProducer(Producer& p);
  void PostKvReady(Producer& p);
  void EraseProducer(Producer& p);
  uint64_t PushDigest(const Producer& p) const;
  void OnPin(const std::string& peer, const PdMessage& m);
  void OnAbortTransfer(const std::string& tid);

  // consumer.cc
  void OnConsumerStart(ConsumerStartEvent& ev);
  /// Push: more of a target's blocks were reserved; their parts go to P now.
  void OnConsumerBlocks(ConsumerBlocksEvent& ev);
  /// Push: sends the PUSH_TARGET parts of target entries [announced, what `blocks` holds).
  void AnnounceTargetBlocks(Consumer& c);
  void OnReadPosted(ReadPostedEvent& ev);
  void SendConsumerRequest(Consumer& c);
  /// The PUSH_TARGET parts (push) or the PIN (pull) of `c`, whose header `m` holds.
  void SendRequestMessages(Consumer& c, PdMessage& m);
  void OnConsumerAbort(const ConsumerAbortEvent& ev);
  void OnConsumerMessage(const std::string& peer, PdMessage& m);
  void OnKvReady(Consumer& c, PdMessage& m);
  /// Whether P's first token in `m` (KV_READY, PINNED) was sampled under `c`'s settings
  /// (FirstTokenBinding); counts and logs the other case.
  bool TokenIsBound(const Consumer& c, const PdMessage& m);
  void OnConsumerTransferDone(const Outstanding& o, const xfer::TransferStatus& st);
  void OnPinned(Consumer& c, PdMessage& m);
  /// Adds a PINNED part; true when `m` now holds P's whole, duplicate-free list. False while
  /// parts are missing, or when the answer was malformed (then `c` completed with kDataLoss).
  bool AddPinnedPart(Consumer& c, PdMessage& m);
  bool CheckPinnedList(Consumer& c, const PdMessage& m);
  void OnLayerReady(Consumer& c, const PdMessage& m);
  /// Hashes chunk (layer, kind) of received block i once; true when it was not hashed before.
  /// c's received chunk hashes, made (sized for c.num_blocks) on first use. Lazily: a consumer
  /// whose check is off never allocates them.
  KvDigestBuilder& ReceivedSums(Consumer& c) const;
  bool HashReceivedChunk(Consumer& c, size_t i, int32_t layer, KvKind kind);
  Status VerifyReceived(Consumer& c);
  void CompleteConsumer(Consumer& c, Status status, std::optional<TokenOutput> token);
  Result<TransferOrder> BuildRead(const std::string& peer, std::span<const BlockId> local,
                                  std::span<const int32_t> remote) const;

  const KvTransferConfig config_;
  const KvLayout layout_;
  const std::span<const std::byte> arena_;
  const Clock& clock_;
  const PeerDirectory& peers_;
  CoreActions& actions_;
  PeerAuth* auth_ = nullptr;  ///< thread-safe itself; null without --kv-auth-key-file
  /// The connection the message being handled arrived over (HandleDecoded's argument).
  uint64_t arrived_on_ = 0;

  std::unordered_map<std::string, Producer> producers_;  ///< by transfer id
  std::unordered_map<int64_t, std::string> producer_by_seq_;
  std::unordered_map<std::string, Consumer> consumers_;  ///< by transfer id
  std::unordered_map<std::string, PendingTarget> pending_targets_;
  std::unordered_map<TransferToken, Outstanding> outstanding_;
  std::unordered_map<std::string, TimePoint> tombstones_;
  std::deque<std::pair<TimePoint, std::string>> tombstone_order_;
  std::vector<StepChunk> step_chunks_;
  std::vector<HandoffRecord> finished_records_;
  /// D: peers with a /kv/transfer_status query in flight (at most one each).
  std::unordered_map<std::string, bool> status_in_flight_;
  TimePoint next_timer_check_{};
  ConnectorStats stats_;
};

}  // namespace kvpush::connector
