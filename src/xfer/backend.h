// Backend: the thin lower layer of the transfer engine (UCX's uct to the Agent's ucp).
//
// A backend moves bytes and messages; it makes no policy decisions and keeps no bookkeeping beyond
// its own opaque per-region and per-peer objects, which it hands to the Agent and gets back on
// every call. It advertises what it can do in BackendCaps; the Agent decides (addressing,
// allocation, whether a target progress thread is needed) from those capabilities.
//
// Threading contract: every method may be called from any thread, concurrently. Post(),
// TryPostInline() and Abort() never call the BackendSink synchronously: errors found while posting
// are returned; everything later is reported through the sink from the backend's own thread(s), or
// from a thread inside ProgressCaller(). The sink is set once, before the first Post, and must
// outlive the backend.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "xfer/types.h"

namespace kvpush::xfer {

/// How a remote op names its target bytes.
enum class AddressMode : uint8_t {
  kOffset = 0,          ///< byte offset from the start of the remote region (FI_MR_VIRT_ADDR off)
  kVirtualAddress = 1,  ///< remote virtual address = exported base + offset (UCX, FI_MR_VIRT_ADDR)
};

/// Where remote keys come from.
enum class KeyKind : uint8_t {
  kNone = 0,       ///< in-process: the region table index is enough
  kAppChosen = 1,  ///< the application picks the key (libfabric FI_MR_PROV_KEY off)
  kProviderIssued =
      2,  ///< the provider issues a key blob at registration (UCX rkey, FI_MR_PROV_KEY)
};

/// What a backend can do. Fixed for the lifetime of the backend.
struct BackendCaps {
  std::string name;                      ///< "loopback", "ucx", "libfabric", "fault(<inner>)"
  bool read = true;                      ///< supports Op::kRead
  bool write = true;                     ///< supports Op::kWrite
  bool needs_target_progress = true;     ///< target must run a progress thread for RMA to complete
  bool allocates_for_one_sided = false;  ///< AllocateRegion gives a faster (truly one-sided) path
  AddressMode addressing = AddressMode::kOffset;
  KeyKind key_kind = KeyKind::kNone;
  uint32_t max_message_bytes = 4096;  ///< largest SendMessage / notification frame, bytes
  /// Largest WRITE (data bytes) that the Agent may send as one eager frame with its notification
  /// (docs/xfer.md, "Eager WRITEs"), or 0: the backend's WRITE with a notification is already one
  /// message's worth of latency (shm mappings, loopback). A backend that sets it carries frames of
  /// up to max_message_bytes, which must leave room for the frame's header.
  uint64_t eager_write_max_bytes = 0;
  /// Fence() tears a peer's connection down so that nothing the peer issued over it can be
  /// applied to this process's memory once OnPeerFenced reports it (docs/xfer.md, *Fencing a
  /// peer*). False: Fence is a plain Disconnect and is never reported (the peer maps this
  /// process's memory itself, or its transport would take its writes over a new connection).
  bool fences_peers = false;
};

/// Backend-private data of a registered local region (e.g. a ucp_mem_h and its packed rkey).
struct BackendRegion {
  virtual ~BackendRegion() = default;
  std::vector<uint8_t> key;  ///< remote-access key blob exported in metadata (may be empty)
};
/// Backend-private data of a connected peer (e.g. a ucp_ep_h).
struct BackendPeer {
  virtual ~BackendPeer() = default;
};
/// Backend-private data of one of a peer's regions (e.g. an unpacked ucp_rkey_h).
struct BackendRemoteRegion {
  virtual ~BackendRemoteRegion() = default;
};

/// One contiguous RMA operation, fully resolved by the Agent. Flat and trivially copyable.
struct XferOp {
  uint64_t local_addr = 0;   ///< local virtual address
  uint64_t remote_addr = 0;  ///< remote offset or virtual address, per BackendCaps::addressing
  uint64_t length = 0;       ///< bytes, > 0
  const BackendRegion* local = nullptr;         ///< backend data of the local region
  const BackendRemoteRegion* remote = nullptr;  ///< backend data of the remote region
};

/// Shared between the Agent and the backend for one post; decides the race between the backend
/// sending the notification and the Agent cancelling / timing out the transfer.
struct PostControl {
  static constexpr int kPending = 0;    ///< data in flight, notification not sent
  static constexpr int kNotifying = 1;  ///< backend committed to sending the notification
  static constexpr int kAborted = 2;    ///< agent cancelled: backend must not send it
  std::atomic<int> state{kPending};
  /// Backend side: true if the notification may be sent now (moves kPending -> kNotifying).
  bool BeginNotify() {
    int expected = kPending;
    return state.compare_exchange_strong(expected, kNotifying, std::memory_order_acq_rel);
  }
  /// Agent side: true if the transfer was aborted before the notification (kPending -> kAborted).
  bool Abort() {
    int expected = kPending;
    return state.compare_exchange_strong(expected, kAborted, std::memory_order_acq_rel);
  }
  bool aborted() const { return state.load(std::memory_order_acquire) == kAborted; }
};

/// An immutable, shareable array of ops; the backend keeps a reference while they are in flight.
struct OpBatch {
  std::vector<XferOp> ops;
  uint64_t total_bytes = 0;
};

/// One post: ops of one transfer plus an optional notification frame sent after the data.
struct PostRequest {
  uint64_t token = 0;  ///< echoed in BackendSink::OnPostDone
  Op op = Op::kWrite;
  std::shared_ptr<BackendPeer> peer;     ///< kept alive by the post; may be disconnected meanwhile
  std::shared_ptr<const OpBatch> batch;  ///< may be empty (notification only)
  std::vector<uint8_t> notification;     ///< empty: none
  std::shared_ptr<PostControl> control;  ///< never null
};

/// What TryPostInline did with a post.
enum class InlinePost : uint8_t {
  kNotTaken = 0,  ///< nothing happened: the request is untouched, call Post
  kAccepted = 1,  ///< issued on the caller's thread; as if Post returned OK (OnPostDone follows)
  kDone = 2,      ///< finished on the caller's thread with the returned status; no OnPostDone
};

/// Receives asynchronous events from a backend. Called from backend threads; must be thread-safe
/// and must not call back into the backend's Post/SendMessage synchronously with locks it holds.
class BackendSink {
 public:
  virtual ~BackendSink() = default;
  /// A post finished: OK means all data is visible at its destination and the notification (if
  /// any, and not aborted) was handed to the network after it. Called exactly once per accepted
  /// post.
  virtual void OnPostDone(uint64_t token, Status status) = 0;
  /// A message (notification frame) arrived from some peer.
  virtual void OnMessage(std::span<const uint8_t> frame) = 0;
  /// The backend detected that a connected peer failed (connection reset, endpoint timeout).
  virtual void OnPeerError(const BackendPeer* peer, Status status) = 0;
  /// The connection `peer` that Backend::Fence was asked to end is torn down: no operation the
  /// peer issued over it (queued, in flight or posted later) can be applied to this process's
  /// memory any more. Called once per Fence of a backend with BackendCaps::fences_peers, from a
  /// backend thread; `peer` is only an identity here (never dereferenced). Default: ignored.
  virtual void OnPeerFenced(const BackendPeer* peer) { (void)peer; }
};

/// Counters of a backend's issue path (for benchmarks). Zero where a backend does not count.
struct BackendStats {
  uint64_t posts = 0;         ///< posts issued to the network
  uint64_t ops = 0;           ///< RMA ops issued
  int64_t issue_ns = 0;       ///< total time spent in the per-op issue loops, ns
  int64_t last_issue_ns = 0;  ///< duration of the last timed post's issue loop (a backend may
                              ///< time only posts of many ops; ucx: >= 64)
};

/// The backend interface. See the file comment for the threading contract.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual const BackendCaps& caps() const = 0;
  /// Sets the event sink. Call once before anything else.
  virtual void SetSink(BackendSink* sink) = 0;
  /// Opaque address blob that peers pass to Connect (e.g. the UCP worker address).
  virtual std::vector<uint8_t> LocalAddress() const = 0;

  /// Registers caller-owned memory [addr, addr + length). Errors: kInvalidArgument, kUnimplemented
  /// (memory type), kResourceExhausted / kInternal from the provider.
  virtual Result<std::unique_ptr<BackendRegion>> RegisterMemory(void* addr, uint64_t length,
                                                                MemoryType type) = 0;
  /// Allocates and registers `length` bytes owned by the backend (zeroed, page-aligned); `*addr`
  /// receives the address. Errors as RegisterMemory.
  virtual Result<std::unique_ptr<BackendRegion>> AllocateMemory(uint64_t length, MemoryType type,
                                                                void** addr) = 0;
  /// Deregisters (and frees, if allocated) a region. No new op may reference it afterwards; the
  /// backend keeps the region's own data until it is destroyed, because a post that is still
  /// being issued on its progress thread may read it.
  virtual void ReleaseMemory(std::unique_ptr<BackendRegion> region) = 0;

  /// Connects to a peer from its LocalAddress blob. Errors: kInvalidArgument (bad blob),
  /// kUnavailable (unreachable).
  virtual Result<std::shared_ptr<BackendPeer>> Connect(std::span<const uint8_t> address) = 0;
  /// Imports one of the peer's regions from its key blob and base address.
  virtual Result<std::shared_ptr<BackendRemoteRegion>> ImportRegion(BackendPeer* peer,
                                                                    std::span<const uint8_t> key,
                                                                    uint64_t base,
                                                                    uint64_t length) = 0;
  /// Drops a peer: outstanding posts to it complete with kPeerGone (or are already complete), then
  /// its remote regions become unusable. The shared_ptrs may be released by the caller afterwards.
  virtual void Disconnect(std::shared_ptr<BackendPeer> peer,
                          std::vector<std::shared_ptr<BackendRemoteRegion>> regions) = 0;
  /// Disconnect, and more where caps().fences_peers: the connection is torn down so that no
  /// operation the peer issued over it — queued, in flight or posted later — can be applied to
  /// this process's memory, and BackendSink::OnPeerFenced(peer) follows once that holds (never
  /// synchronously). The peer can reach this process again only over a new connection, which
  /// only a new Connect from its side makes. Default (no fencing): Disconnect.
  virtual void Fence(std::shared_ptr<BackendPeer> peer,
                     std::vector<std::shared_ptr<BackendRemoteRegion>> regions) {
    Disconnect(std::move(peer), std::move(regions));
  }

  /// Starts a post. Returns an error (and reports nothing later) if it cannot be started; otherwise
  /// OnPostDone(token, ...) follows exactly once.
  virtual Status Post(PostRequest request) = 0;
  /// Optional caller-thread fast path: issues the post on the calling thread when that needs no
  /// waiting (e.g. the backend's worker is free and no earlier work is queued, so per-thread post
  /// order is kept) and the post is small enough to be worth it. kNotTaken leaves `request`
  /// untouched; otherwise it is consumed, and for kDone `*status` is the post's final status
  /// (OK: all data visible at the destination and the notification handed to the network).
  /// Never calls the sink. The default never takes a post.
  virtual InlinePost TryPostInline(PostRequest& request, Status* status) {
    (void)request;
    (void)status;
    return InlinePost::kNotTaken;
  }
  /// Optional: drives the backend's progress on the calling thread if no other thread is doing so
  /// right now (never blocks). Completions found are reported through the sink synchronously, so
  /// the caller must not hold any lock the sink takes. Returns true if anything progressed.
  virtual bool ProgressCaller() { return false; }
  /// Best effort: stop working on a post whose control was aborted (it still reports OnPostDone).
  virtual void Abort(uint64_t token) = 0;
  /// Issue-path counters; safe to call from any thread.
  virtual BackendStats stats() const { return {}; }
};

}  // namespace kvpush::xfer
