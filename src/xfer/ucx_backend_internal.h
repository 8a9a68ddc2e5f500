// Internal to the UCX backend (ucx_backend.cc: setup, regions, peers, progress hooks;
// ucx_post.cc: the post path): its per-region / per-peer / per-post types and the UcxBackend class.
// Not part of the xfer API; include only from those two files. Threading: see ucx_backend.h and the
// lock comments below (the "worker lock" is the ProgressShell's mu()).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "xfer/backend.h"
#include "xfer/progress_shell.h"
#include "xfer/ucx_backend.h"

namespace kvpush::xfer::ucx_internal {

constexpr unsigned kNotifyAmId = 17;

/// Bytes of the sockaddr form of an address blob's payload: family u16, port u16 (network order),
/// then the IPv4 (4) or IPv6 (16) address, zero-padded.
constexpr size_t kSockaddrBytes = 20;

/// The address the tcp preset's listener binds to: the first device of `devices` (the operator's
/// UCX_NET_DEVICES; "" or "lo": the loopback, 127.0.0.1), its IPv4 address, else a
/// non-link-local IPv6 one. Errors: kInvalidArgument ("all"), kUnavailable (no such device, or no
/// address on it).
Result<sockaddr_storage> ListenAddressFor(const std::string& devices);
/// `ss` (AF_INET or AF_INET6) as kSockaddrBytes bytes.
std::vector<uint8_t> PackSockaddr(const sockaddr_storage& ss);
/// The inverse of PackSockaddr; `len` receives the sockaddr's length.
/// Errors: kInvalidArgument (wrong size or family).
Result<sockaddr_storage> ParseSockaddr(std::span<const uint8_t> blob, socklen_t* len);

std::string UcsText(ucs_status_t s);
// Maps a UCX completion error to a Status code that keeps the cause.
Status FromUcs(ucs_status_t s, const std::string& what);

struct UcxRegion : BackendRegion {
  ucp_mem_h memh = nullptr;
  bool allocated = false;
};
// Fields marked "worker lock" are touched only with the owner's ProgressShell::mu() held (the
// analysis cannot name another object's lock from here; every access is in a function that
// REQUIRES it).
struct UcxPeer : BackendPeer {
  ucp_ep_h ep = nullptr;    // worker lock
  bool closed = false;      // worker lock
  bool failed = false;      // worker lock
  uint64_t pid = 0;         // the peer's process id (from its address)
  uint64_t start_time = 0;  // and its start time (a reused pid has another)
  // shm: the peer's doorbell (an abstract Unix datagram socket its progress thread sleeps on);
  // doorbell_len 0: none (tcp, or a peer without one).
  sockaddr_un doorbell{};
  socklen_t doorbell_len = 0;
  class UcxBackend* owner = nullptr;
};
struct UcxRemote : BackendRemoteRegion {
  ucp_rkey_h rkey = nullptr;  // destroyed under the worker lock in Disconnect
  // The peer's region mapped into this process (ucp_rkey_ptr: shared-memory transports on memory
  // UCX allocated). Ops on it are plain loads/stores on the calling thread: no UCP request, no
  // flush. Null when not mappable. Valid while `rkey` is (both go in Disconnect, under the lock).
  std::byte* direct = nullptr;
  uint64_t base = 0;    // remote virtual address that `direct` maps
  uint64_t length = 0;  // bytes mapped
};

// One accepted post while its flush / notification is outstanding. Worker lock.
struct InFlight {
  PostRequest req;
  class UcxBackend* owner = nullptr;
  bool aborted = false;
  bool reported = false;   // OnPostDone already delivered (shutdown); only free it later
  bool ucx_owned = false;  // a UCX request holds this as user_data: its callback frees it
  // Issued by TryPostInline: a completion found before it returns is handed back to it (kept in
  // inline_status) instead of going to the sink. Cleared before the worker lock is released.
  bool inline_caller = false;
  bool inline_done = false;
  Status inline_status;
};

/// tcp: the largest WRITE sent as one eager AM (BackendCaps::eager_write_max_bytes).
constexpr uint64_t kEagerWriteMaxBytes = 256 * 1024;

class UcxBackend final : public Backend, private ProgressHooks {
 public:
  explicit UcxBackend(const UcxOptions& o)
      : options_(o),
        shell_({.name = "ucx", .linger_ns = o.linger_us * 1000ll, .yield_when_idle = true}) {
    caps_.name = "ucx";
    caps_.needs_target_progress = true;
    caps_.allocates_for_one_sided = true;
    caps_.addressing = AddressMode::kVirtualAddress;
    caps_.key_kind = KeyKind::kProviderIssued;
    caps_.max_message_bytes = 8192;
  }

  Status Init();

  ~UcxBackend() override;

  const BackendCaps& caps() const override { return caps_; }
  void SetSink(BackendSink* sink) override { sink_ = sink; }
  std::vector<uint8_t> LocalAddress() const override { return address_; }

  Result<std::unique_ptr<BackendRegion>> RegisterMemory(void* addr, uint64_t length,
                                                        MemoryType type) override {
    return Map(addr, length, type, false, nullptr);
  }
  Result<std::unique_ptr<BackendRegion>> AllocateMemory(uint64_t length, MemoryType type,
                                                        void** addr) override {
    return Map(nullptr, length, type, true, addr);
  }
  // Registered (caller-owned) memory is unmapped now, synchronously, because the caller may free
  // it next. Memory UCX allocated stays mapped until the worker is destroyed: with emulated RMA a
  // peer's late put is applied by our progress thread at whatever address it names, so the memory
  // must outlive the worker (a peer that might still write is the caller's contract, DESIGN §5).
  // The region's own data is kept by the shell until the progress thread is joined.
  void ReleaseMemory(std::unique_ptr<BackendRegion> region) override;

  Result<std::shared_ptr<BackendPeer>> Connect(std::span<const uint8_t> address) override;

  Result<std::shared_ptr<BackendRemoteRegion>> ImportRegion(BackendPeer* peer,
                                                            std::span<const uint8_t> key,
                                                            uint64_t base,
                                                            uint64_t length) override;

  void Disconnect(std::shared_ptr<BackendPeer> peer,
                  std::vector<std::shared_ptr<BackendRemoteRegion>> regions) override;

  Status Post(PostRequest request) override;
  InlinePost TryPostInline(PostRequest& request, Status* status) override;
  bool ProgressCaller() override;
  BackendStats stats() const override {
    return {stat_posts_.load(), stat_ops_.load(), stat_issue_ns_.load(),
            stat_last_issue_ns_.load()};
  }
  void Abort(uint64_t token) override;

 private:
  Result<std::unique_ptr<BackendRegion>> Map(void* addr, uint64_t length, MemoryType type,
                                             bool allocate, void** out);

  // ---- under the worker lock (the progress thread, or a caller in a fast path) ----

  void Complete(InFlight* f, Status s) REQUIRES(shell_.mu());
  // Drops a finished post from the bookkeeping.
  void Forget(InFlight* f) REQUIRES(shell_.mu()) {
    inflight_.erase(f->req.token);
    if (!f->aborted) --active_;
    --outstanding_;
    shell_.NoteActivity();
  }

  static constexpr size_t kTimedOps = 64;  // issue loops of at least this many ops are timed
  template <typename T, typename V>
  static void Bump(std::atomic<T>& counter, V add) {
    counter.store(counter.load(std::memory_order_relaxed) + static_cast<T>(add),
                  std::memory_order_relaxed);
  }

  static bool AllDirect(const OpBatch& batch) {
    for (const XferOp& op : batch.ops)
      if (static_cast<const UcxRemote*>(op.remote)->direct == nullptr) return false;
    return true;
  }

  // Issues every op of `req`. Ops on a mapped region are copied now; the rest
  // go through ucp_put_nbx / ucp_get_nbx. Returns whether any op went through UCP (a flush must
  // then follow before the data counts as remotely complete).
  Result<bool> IssueOps(const PostRequest& req, UcxPeer* peer) REQUIRES(shell_.mu());

  void Issue(InFlight* f) REQUIRES(shell_.mu());

  static void OnFlushDone(void* request, ucs_status_t status, void* user_data);

  // All data of the post is remotely complete: send the notification (if still wanted).
  void AfterData(InFlight* f) REQUIRES(shell_.mu());

  static void OnAmDone(void* request, ucs_status_t status, void* user_data) {
    auto* f = static_cast<InFlight*>(user_data);
    f->owner->shell_.mu().AssertHeld();  // UCX calls back from ucp_worker_progress or a send
    ucp_request_free(request);
    f->ucx_owned = false;
    if (status == UCS_OK) f->owner->Ring(static_cast<const UcxPeer*>(f->req.peer.get()));
    f->owner->Complete(f, status == UCS_OK ? Status::Ok() : FromUcs(status, "am_send"));
  }

  static ucs_status_t OnAm(void* arg, const void*, size_t, void* data, size_t length,
                           const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxBackend*>(arg);
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return UCS_OK;  // never sent by us
    self->sink_->OnMessage(std::span(static_cast<const uint8_t*>(data), length));
    return UCS_OK;
  }

  static void OnEpError(void* arg, ucp_ep_h, ucs_status_t status) {
    auto* p = static_cast<UcxPeer*>(arg);
    p->failed = true;
    p->owner->sink_->OnPeerError(p, FromUcs(status, "endpoint error"));
  }

  void CloseEp(UcxPeer* p) REQUIRES(shell_.mu());

  // ---- client-server wire-up (tcp preset; ucx_listener.cc) ----

  // Opens the listener on ListenAddressFor(devices), any port; sets listen_addr_.
  // Errors: as ListenAddressFor, kUnavailable (ucp_listener_create).
  Status StartListener(const std::string& devices);
  // A peer's Connect reached the listener: the endpoint that answers it (accepted_).
  static void OnConnRequest(ucp_conn_request_h request, void* arg);
  // An accepted endpoint failed (its peer died or closed): closed by ReapAccepted.
  static void OnAcceptedEpError(void* arg, ucp_ep_h ep, ucs_status_t status);
  // Closes an accepted endpoint (forced when it failed), once.
  void CloseAccepted(ucp_ep_h ep, bool failed) REQUIRES(shell_.mu());
  // Closes the accepted endpoints that failed since the last call.
  void ReapAccepted() REQUIRES(shell_.mu());

  void ReapClosing() REQUIRES(shell_.mu());

  // ---- ProgressHooks: called by the shell's progress thread under the worker lock ----

  bool Progress() override;
  // Busy-poll while work is outstanding (aborted posts do not count: they may never finish).
  bool Busy() override {
    shell_.mu().AssertHeld();
    return active_ > 0 || !closing_.empty();
  }
  int Arm() override {
    shell_.mu().AssertHeld();
    // A ring since the last sleep: a peer sent something; poll once more before sleeping.
    if (DrainDoorbell()) return -1;
    if (ucp_worker_arm(worker_) != UCS_OK) return -1;  // events pending: poll again
    return outstanding_ > 0 ? 10 : idle_timeout_ms_;
  }
  /// shm: wakes `peer`'s progress thread (one datagram to its doorbell) after something was put
  /// in its shared-memory FIFO that it must progress to see (a notification's AM, an emulated
  /// RMA op); the shm transports' event fd does not reliably wake it (Init). No-op without a
  /// doorbell. Never blocks: a full doorbell already has rings pending.
  void Ring(const UcxPeer* peer) const;
  /// Reads every pending ring; true when there was one.
  bool DrainDoorbell();
  void BeginStop() override {
    shell_.mu().AssertHeld();
    for (UcxPeer* p : std::vector<UcxPeer*>(peers_.begin(), peers_.end())) CloseEp(p);
    // The listener stays open until just before the worker is destroyed (~UcxBackend).
    ReapAccepted();
    for (ucp_ep_h ep : std::vector<ucp_ep_h>(accepted_.begin(), accepted_.end()))
      CloseAccepted(ep, false);
  }
  bool Drained() override {
    shell_.mu().AssertHeld();
    return outstanding_ == 0 && closing_.empty();
  }
  // Whatever did not finish by now is failed so that the sink sees every post end.
  void OnStopped() override;
  // shm: the peer's process exited (its pidfd watch); fail it as the tcp preset's error handler
  // does.
  void OnProcessExit(void* tag) override {
    shell_.mu().AssertHeld();
    auto* p = static_cast<UcxPeer*>(tag);
    if (p->failed || p->closed) return;
    p->failed = true;
    sink_->OnPeerError(p, PeerGone("ucx: peer process " + std::to_string(p->pid) + " exited"));
  }

  UcxOptions options_;
  BackendCaps caps_;
  bool peer_errors_ = true;
  bool efd_wakes_ = false;      // the worker's event fd reliably reports completions (tcp)
  int idle_timeout_ms_ = 1000;  // longest epoll sleep when idle
  int doorbell_fd_ = -1;        // shm: this process's doorbell (see Ring); -1: none
  std::string doorbell_name_;   // its abstract socket name (without the leading NUL)
  BackendSink* sink_ = nullptr;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<uint8_t> address_;
  // tcp: peers connect to this agent's listener (UCX client-server) and Connect goes to theirs;
  // shm: to the UCP worker address (docs/xfer.md "Wire-up").
  bool client_server_ = false;
  ucp_listener_h listener_ = nullptr;
  sockaddr_storage listen_addr_{};
  std::atomic<uint64_t> stat_posts_{0}, stat_ops_{0};
  std::atomic<int64_t> stat_issue_ns_{0}, stat_last_issue_ns_{0};

  // The progress thread, its job queue and wake-up, retired regions, the peer-process watch.
  // Its mu() is the worker lock: it guards the UCP worker and everything GUARDED_BY it below
  // (and the fields marked "worker lock" in UcxPeer / InFlight); held by the progress thread
  // while it runs jobs and progresses, and by callers in TryPostInline / ProgressCaller. Lock
  // order: the worker lock before the sink's locks.
  ProgressShell shell_;
  size_t outstanding_ GUARDED_BY(shell_.mu()) = 0;  // accepted posts not yet completed
  size_t active_ GUARDED_BY(shell_.mu()) = 0;  // of those, not aborted (busy-poll only for these)
  std::unordered_map<uint64_t, InFlight*> inflight_ GUARDED_BY(shell_.mu());
  std::unordered_set<UcxPeer*> peers_ GUARDED_BY(shell_.mu());
  std::vector<void*> closing_ GUARDED_BY(shell_.mu());  // ucp_ep_close_nbx requests in flight
  // Endpoints created from peers' connection requests (OnConnRequest), until closed; and those of
  // them that failed, to close after the progress call that reported it.
  std::unordered_set<ucp_ep_h> accepted_ GUARDED_BY(shell_.mu());
  std::vector<ucp_ep_h> accepted_failed_ GUARDED_BY(shell_.mu());
};

}  // namespace kvpush::xfer::ucx_internal
