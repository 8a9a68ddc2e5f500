// Agent: the upper layer of the transfer engine. It owns one Backend and keeps all bookkeeping:
// registered regions, peers and their incarnations, prepared descriptor lists, transfers, stall
// deadlines and received notifications (DESIGN.md §4, docs/xfer.md).
//
// Typical use (P/D push, the WRITE side):
//   auto agent = Agent::Create({.name = "prefill-0"}, MakeUcxBackend(...)).value();
//   auto arena = agent->AllocateRegion(bytes, MemoryType::kHost);        // or RegisterRegion
//   send(agent->ExportMetadata());  agent->LoadRemoteMetadata(peer_blob);  // out of band
//   ListHandle src = agent->PrepareLocal(local_descs);                      // once
//   ListHandle dst = agent->PrepareRemote("decode-0", remote_descs);        // once
//   TransferHandle t = agent->CreateTransfer({Op::kWrite, src, {}, dst, {}, notif});
//   agent->Post(t);  agent->Wait(t, deadline);  ...  agent->Post(t) again (re-post)
//
// Thread-safety: every method may be called from any thread concurrently. Calls are short (one
// mutex, no I/O); Post hands work to the backend's progress thread. Wait blocks the caller only.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "xfer/backend.h"
#include "xfer/eager_frame.h"
#include "xfer/metadata.h"
#include "xfer/slot_table.h"
#include "xfer/types.h"

namespace kvpush::xfer {

/// What describes a transfer: op, the local and remote prepared lists, optional index lists that
/// choose (and order) a subset of each list's entries (empty = all entries in order), and an
/// optional notification payload delivered to the peer after all the data. The local and remote
/// selections are byte streams of equal total length: local byte k moves to/from remote byte k.
struct TransferSpec {
  Op op = Op::kWrite;
  ListHandle local;
  std::vector<uint32_t> local_indices;
  ListHandle remote;
  std::vector<uint32_t> remote_indices;
  std::vector<uint8_t> notification;  ///< empty: no notification
};

/// What LoadRemoteMetadata found.
struct PeerLoadResult {
  bool new_peer = false;   ///< first time this name was loaded
  bool restarted = false;  ///< name was known with another incarnation: old state was dropped
  uint64_t previous_incarnation = 0;
};

/// A snapshot of what the agent knows about a peer.
struct PeerInfo {
  uint64_t incarnation = 0;
  bool alive = false;     ///< false after a backend error or invalidation
  Status failure;         ///< why it is not alive
  uint32_t restarts = 0;  ///< new incarnations seen for this name
  size_t regions = 0;
  /// While alive: the id of the current connection to the peer (unique in this agent; a
  /// reconnect gives a new one). 0 while not alive.
  uint64_t connection = 0;
  /// Not alive because this agent dropped it (InvalidatePeer, FencePeer), not because the
  /// transport reported it failed or a new incarnation answered: no evidence that the peer's
  /// process is gone.
  bool dropped_here = false;
};

/// A registered region allocated through the backend.
struct AllocatedRegion {
  RegionId id;
  std::byte* data = nullptr;
  uint64_t length = 0;
};

/// A prepared list's shape: original descriptor count and count after coalescing adjacent ranges.
struct ListInfo {
  size_t descriptors = 0;
  size_t coalesced = 0;
  uint64_t bytes = 0;
};

class Agent final : private BackendSink {
 public:
  /// Creates an agent over `backend`. Errors: kInvalidArgument (empty/long name, zero stall
  /// timeout).
  static Result<std::unique_ptr<Agent>> Create(AgentOptions options,
                                               std::unique_ptr<Backend> backend);
  ~Agent() override;
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  const std::string& name() const { return options_.name; }
  uint64_t incarnation() const { return options_.incarnation; }
  const BackendCaps& backend_caps() const { return backend_->caps(); }
  /// The backend's issue-path counters (benchmarks).
  BackendStats backend_stats() const { return backend_->stats(); }

  // ---- Regions ----
  /// Registers caller-owned memory [addr, addr+length); the caller keeps it alive until
  /// DeregisterRegion. Errors: kInvalidArgument (null/empty), kUnimplemented (memory type).
  Result<RegionId> RegisterRegion(void* addr, uint64_t length, MemoryType type);
  /// Allocates `length` bytes through the backend (zeroed, page-aligned) and registers them. Use
  /// this when backend_caps().allocates_for_one_sided: it is what makes UCX shm truly one-sided.
  Result<AllocatedRegion> AllocateRegion(uint64_t length, MemoryType type);
  /// Deregisters (and frees, if allocated). Errors: kNotFound (stale id), kFailedPrecondition while
  /// a prepared list still references the region.
  Status DeregisterRegion(RegionId id);

  // ---- Metadata and peers ----
  /// Encodes this agent's metadata (name, incarnation, backend address, region table with keys).
  Result<std::vector<uint8_t>> ExportMetadata();
  /// Validates and loads a peer's metadata, connecting to it. Same incarnation: refreshes the
  /// region table. New incarnation: drops all state of the old one first (in-flight transfers fail
  /// with kPeerGone, its prepared lists go stale). Errors: those of DecodeMetadata;
  /// kInvalidArgument (own name, other backend), kUnavailable (connect failed).
  Result<PeerLoadResult> LoadRemoteMetadata(std::span<const uint8_t> blob);
  /// Drops a peer: in-flight transfers to it fail with kPeerGone(reason), lists go stale, the
  /// backend disconnects. Errors: kNotFound.
  Status InvalidatePeer(std::string_view peer, std::string_view reason = "invalidated by caller");
  /// Snapshot of a peer. Errors: kNotFound.
  Result<PeerInfo> GetPeer(std::string_view peer);
  /// Fences `peer`'s connection `connection` (PeerInfo::connection): drops the peer as
  /// InvalidatePeer does and has the backend tear that connection down (Backend::Fence) so that
  /// nothing the peer issued over it — a WRITE queued, in flight or posted later — can land in
  /// this agent's memory; PeerFenced(peer, connection) turns true once the backend confirmed it.
  /// The peer is reached again only after a new LoadRemoteMetadata (a new connection). A
  /// connection that is no longer current (dropped or replaced already) is left as it is: it is
  /// fenced only if FencePeer dropped it. Errors: kNotFound (unknown peer), kUnimplemented (the
  /// backend cannot fence: backend_caps().fences_peers false; nothing is dropped).
  Status FencePeer(std::string_view peer, uint64_t connection, std::string_view reason);
  /// True once connection `connection` of `peer` was fenced (FencePeer) and the backend
  /// confirmed the teardown: from then on nothing the peer issued over it can land here. The
  /// last 64 fenced connections of each peer are remembered.
  bool PeerFenced(std::string_view peer, uint64_t connection);

  // ---- Prepared descriptor lists ----
  /// Validates local descriptors (region live, length > 0, in bounds), resolves keys and coalesces
  /// adjacent ranges. Errors: kNotFound (region), kOutOfRange, kInvalidArgument (empty, zero
  /// length).
  Result<ListHandle> PrepareLocal(std::span<const Desc> descs);
  /// Same for a peer's regions (bounds-checked against the peer's exported region table).
  /// Errors additionally: kNotFound (peer), kPeerGone (peer failed).
  Result<ListHandle> PrepareRemote(std::string_view peer, std::span<const Desc> descs);
  Result<ListInfo> GetListInfo(ListHandle list);
  /// Frees a list. Transfers made from it stay valid. Errors: kNotFound.
  Status ReleaseList(ListHandle list);

  // ---- Transfers ----
  /// Builds a re-postable transfer: selects entries, pairs the two byte streams and coalesces into
  /// flat ops. Cost O(selected entries); nothing on the Post path depends on descriptor count
  /// except the backend's own issue loop. Errors: kNotFound (list), kInvalidArgument (lists of the
  /// wrong side, byte totals differ, notification too large), kOutOfRange (index), kUnimplemented
  /// (op).
  Result<TransferHandle> CreateTransfer(const TransferSpec& spec);
  /// A transfer with no data, only a notification to `peer` (a standalone notification).
  Result<TransferHandle> CreateNotification(std::string_view peer,
                                            std::span<const uint8_t> payload);
  /// Number of backend ops a transfer posts (after coalescing). Errors: kNotFound.
  Result<size_t> TransferOpCount(TransferHandle t);
  /// Posts a transfer that is not in progress. Starts its stall deadline (AgentOptions::
  /// stall_timeout plus its bytes' time at stall_floor_bytes_per_s, moved on by each completion
  /// to the same peer). Errors: kNotFound,
  /// kFailedPrecondition (in progress, or its previous post ended early and is not settled yet:
  /// TransferStatus::settled), kPeerGone (peer failed/restarted/invalidated), or the
  /// backend's post error (the transfer is then in kError with it).
  Status Post(TransferHandle t);
  /// The transfer's state, error and whether the backend has settled it. Errors: kNotFound.
  Result<TransferStatus> GetStatus(TransferHandle t);
  /// Waits until the transfer is not in progress or `deadline` passes (then returns kInProgress).
  Result<TransferStatus> Wait(TransferHandle t, TimePoint deadline);
  /// Cancels an in-progress transfer: it ends in kError(kCancelled) and its notification is
  /// guaranteed not to be sent. Data ops already handed to the network may still land until
  /// GetStatus reports it settled (TransferStatus::settled).
  /// Errors: kNotFound, kFailedPrecondition (not in progress, or too late: notification already
  /// committed to the network; the transfer then completes normally).
  Status Cancel(TransferHandle t);
  /// Frees a transfer (cancelling it if in progress). Errors: kNotFound.
  Status ReleaseTransfer(TransferHandle t);

  // ---- Notifications received ----
  /// Takes all notifications received so far, in arrival order.
  std::vector<Notification> TakeNotifications();
  /// Waits until at least `min_count` notifications are queued or `deadline` passes, then takes
  /// all.
  std::vector<Notification> WaitNotifications(size_t min_count, TimePoint deadline);

 private:
  struct Region {
    void* addr = nullptr;
    uint64_t length = 0;
    MemoryType type = MemoryType::kHost;
    bool allocated = false;
    uint32_t list_refs = 0;
    std::unique_ptr<BackendRegion> backend;
  };
  struct RemoteRegion {
    RegionInfo info;
    std::shared_ptr<BackendRemoteRegion> backend;
  };
  struct Peer {
    uint64_t incarnation = 0;
    uint64_t generation = 0;  // bumps on every (re)connect and on invalidation
    bool alive = true;
    bool dropped_here = false;  // dropped by InvalidatePeer / FencePeer (PeerInfo::dropped_here)
    Status failure;
    uint32_t restarts = 0;
    TimePoint last_progress{};  // last successful completion of a post to this peer
    std::shared_ptr<BackendPeer> backend;
    std::map<uint32_t, RemoteRegion> regions;  // by RegionId::index
  };
  struct Entry {        // one original descriptor, resolved
    uint64_t addr = 0;  // local virtual address, or remote offset/address per caps
    uint64_t length = 0;
    uint32_t region = 0;            // local region slot index, or remote region index
    const void* backend = nullptr;  // BackendRegion* or BackendRemoteRegion*
  };
  struct List {
    bool remote = false;
    std::string peer;
    uint64_t peer_generation = 0;
    std::vector<Entry> entries;
    std::vector<Entry> runs;              // coalesced view of all entries
    std::vector<uint32_t> local_regions;  // distinct local region slots referenced (refcounts)
    std::vector<std::shared_ptr<BackendRemoteRegion>> keepalive;
    uint64_t bytes = 0;
  };
  struct Transfer {
    Op op = Op::kWrite;
    std::string peer;
    uint64_t peer_generation = 0;
    std::shared_ptr<BackendPeer> backend_peer;
    std::shared_ptr<const OpBatch> batch;
    std::vector<uint8_t> notification_frame;
    TransferState state = TransferState::kIdle;
    Status error;
    uint32_t seq = 0;      // bumps on every post and release: stale completions are ignored
    bool settled = true;   // false from Post until the backend reports the post's end
    TimePoint deadline{};  // post + stall_timeout + TimeAtStallFloor; later while its peer
                           // makes progress (the watchdog moves it on)
    std::shared_ptr<PostControl> control;
    // Eager WRITE (agent_eager.cc): sent as one frame with its notification; done once the
    // backend reported the frame sent and the target acknowledged the copy.
    bool eager = false;
    std::vector<EagerRange> eager_ranges;     // the target ranges, in byte-stream order
    std::vector<uint8_t> eager_notification;  // the notification payload
    uint64_t target_incarnation = 0;          // the peer's incarnation when the transfer was made
    bool eager_sent = false;                  // this post: the backend reported the frame sent
    bool eager_acked = false;                 // this post: the target acknowledged it
    Status eager_ack_status;                  // what the target answered
  };

  Agent(AgentOptions options, std::unique_ptr<Backend> backend);
  // BackendSink
  void OnPostDone(uint64_t token, Status status) override;
  void OnMessage(std::span<const uint8_t> frame) override;
  void OnPeerError(const BackendPeer* peer, Status status) override;
  void OnPeerFenced(const BackendPeer* peer) override EXCLUDES(mu_);
  /// Target side of an eager WRITE: checks the sender and every range, copies the data, queues
  /// the notification, then acknowledges (agent_eager.cc).
  void OnEagerWrite(std::span<const uint8_t> frame) EXCLUDES(mu_);
  /// Initiator side: the target's acknowledgement of an eager WRITE.
  void OnEagerAck(std::span<const uint8_t> frame) EXCLUDES(mu_);
  /// What an eager post's frame is built from (taken under mu_, built outside it).
  struct EagerParts {
    std::shared_ptr<const OpBatch> batch;
    std::vector<EagerRange> ranges;
    std::vector<uint8_t> notification;
    uint64_t target_incarnation = 0;
  };
  /// Appends the target range of `n` bytes at `roff` into remote run `r` of `peer` to `ranges`,
  /// merged with the last one when it continues it. False when the peer no longer lists r's
  /// region (the transfer then goes as a plain WRITE, which will fail on its own).
  static bool AddEagerRange(const Peer& peer, const Entry& r, uint64_t roff, uint64_t n, bool va,
                            std::vector<EagerRange>* ranges);
  /// Whether `t` (a WRITE with `notification_bytes`, its ranges in t.eager_ranges) goes as an
  /// eager frame, by size against the options and the backend's caps.
  bool EagerFits(const Transfer& t, size_t notification_bytes) const;
  /// The eager frame of post `token`: header, ranges, the local bytes, the notification.
  std::vector<uint8_t> EagerFrame(const EagerParts& parts, uint64_t token) const;
  /// Settles an eager post once both the backend's report and the target's ack are in.
  void SettleEagerLocked(Transfer& t) REQUIRES(mu_);
  /// An ack this agent (as a target) still has to get out: posted again when the transport
  /// refused it, at once a few times, then by the watchdog thread with a backoff until it goes
  /// out, the peer is dropped or kAckRetryFor passed (agent_eager.cc). The sender's WRITE is
  /// done only once an ack arrives, and its stall deadline moves on while other posts to this
  /// agent complete: an ack given up too early would leave it in progress for good.
  struct PendingAck {
    std::shared_ptr<BackendPeer> peer;
    std::vector<uint8_t> frame;
    int attempts = 0;
    TimePoint retry_at{};    ///< when the watchdog posts it again ({}: not waiting for a retry)
    TimePoint give_up_at{};  ///< no retry after this (its first post + kAckRetryFor)
  };
  /// How long a refused ack is tried again.
  static constexpr std::chrono::seconds kAckRetryFor{60};
  /// The watchdog's part: the acks whose retry is due at `now` (marked as no longer waiting;
  /// the watchdog posts them with mu_ released); the earliest retry still to come lowers `*next`.
  std::vector<std::pair<uint32_t, PendingAck>> DueAcksLocked(TimePoint now, TimePoint* next)
      REQUIRES(mu_);
  /// Acks are posted with this index in their token (no transfer slot has it) and the ack's id
  /// in the sequence half.
  static constexpr uint32_t kAckTokenIndex = 0xffffffffu;
  static bool IsAckToken(uint64_t token);
  void PostAck(uint32_t id, PendingAck ack) EXCLUDES(mu_);
  /// The backend's report on ack `id`'s post: done, or posted again.
  void OnAckPosted(uint32_t id, Status status) EXCLUDES(mu_);

  // All *Locked helpers require mu_.
  void FailPeerTransfersLocked(const std::string& peer, const Status& why) REQUIRES(mu_);
  /// How a peer is dropped: on evidence that it failed or restarted, on this agent's own
  /// decision (InvalidatePeer), or fenced (FencePeer: Backend::Fence, recorded in fencing_).
  enum class Drop : uint8_t { kEvidence, kHere, kFence };
  void DropPeerLocked(const std::string& name, Peer& peer, const Status& why,
                      Drop how = Drop::kEvidence) REQUIRES(mu_);
  void FinishLocked(Transfer& t, Status status) REQUIRES(mu_);
  /// The backend is done with t's post (or never took it): settled, and finished with `status`
  /// unless the agent ended it early (then its first status stays and waiters are woken).
  void SettleLocked(Transfer& t, Status status) REQUIRES(mu_);
  /// The backend reported the end of t's current post (OnPostDone, or TryPostInline's kDone).
  /// An eager frame sent waits for its ack (SettleEagerLocked); anything else settles.
  void PostEndedLocked(Transfer& t, Status status) REQUIRES(mu_);
  Result<std::vector<Entry>> SelectRunsLocked(const List& list, const std::vector<uint32_t>& idx,
                                              const char* side) REQUIRES(mu_);
  void WatchdogLoop() EXCLUDES(mu_);
  /// What AgentOptions::stall_floor_bytes_per_s adds to t's stall deadline.
  std::chrono::nanoseconds TimeAtStallFloor(const Transfer& t) const;

  AgentOptions options_;
  std::unique_ptr<Backend> backend_;

  // Guards all bookkeeping. Lock order: the backend's locks (its progress lock, held while it
  // reports to this sink) before mu_; the backend is never called with mu_ held except for
  // calls that never call the sink (Abort, Post).
  Mutex mu_;
  CondVar cv_;  // transfer finished, notification arrived
  SlotTable<Region> regions_ GUARDED_BY(mu_);
  SlotTable<List> lists_ GUARDED_BY(mu_);
  SlotTable<Transfer> transfers_ GUARDED_BY(mu_);
  std::map<std::string, Peer, std::less<>> peers_ GUARDED_BY(mu_);
  std::map<std::string, std::set<uint64_t>, std::less<>> retired_incarnations_ GUARDED_BY(mu_);
  /// Connections being fenced: the backend peer -> (peer name, connection id), until the
  /// backend's OnPeerFenced.
  std::map<const BackendPeer*, std::pair<std::string, uint64_t>> fencing_ GUARDED_BY(mu_);
  /// Fenced connections the backend confirmed, per peer name (the last kFencedKept).
  std::map<std::string, std::deque<uint64_t>, std::less<>> fenced_ GUARDED_BY(mu_);
  static constexpr size_t kFencedKept = 64;
  std::deque<Notification> notifications_ GUARDED_BY(mu_);
  uint64_t next_peer_generation_ GUARDED_BY(mu_) = 1;
  uint32_t post_seq_ GUARDED_BY(mu_) = 0;  // tokens carry a fresh sequence number per post
  std::map<uint32_t, PendingAck> pending_acks_ GUARDED_BY(mu_);  // eager acks in flight, by id
  uint32_t ack_seq_ GUARDED_BY(mu_) = 0;
  size_t in_progress_ GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> finished_{0};  // bumps on every FinishLocked (Wait spins on it)

  CondVar watchdog_cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool watchdog_idle_ GUARDED_BY(mu_) = false;  // watchdog waits without a deadline
  std::thread watchdog_;
};

}  // namespace kvpush::xfer
