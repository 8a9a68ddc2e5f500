#include "xfer/ucx_backend.h"

#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "xfer/progress_shell.h"

namespace kvpush::xfer {
namespace {

constexpr unsigned kNotifyAmId = 17;

// LocalAddress() = this header, then the UCP worker address. The pid lets a shared-memory peer
// (same host and pid namespace, which UCX's posix transport assumes too: /proc/<pid>/fd) watch
// this process exit through a pidfd.
constexpr uint32_t kAddressMagic = 0x5855564b;  // "KVUX"
constexpr uint32_t kAddressVersion = 1;
// magic u32, version u32, pid u64, process start time u64 (host byte order: same-host use only).
constexpr size_t kAddressHeader = 24;

std::string UcsText(ucs_status_t s) {
  return ucs_status_string(s);
}

// Maps a UCX completion error to a Status code that keeps the cause.
Status FromUcs(ucs_status_t s, const std::string& what) {
  std::string m = "ucx: " + what + ": " + UcsText(s);
  switch (s) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
      return PeerGone(m);
    case UCS_ERR_CANCELED:
      return Cancelled(m);
    case UCS_ERR_TIMED_OUT:
      return DeadlineExceeded(m);
    case UCS_ERR_NO_MEMORY:
    case UCS_ERR_NO_RESOURCE:
      return ResourceExhausted(m);
    case UCS_ERR_INVALID_PARAM:
    case UCS_ERR_INVALID_ADDR:
      return InvalidArgument(m);
    default:
      return Unavailable(m);
  }
}

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

class UcxBackend final : public Backend, private ProgressHooks {
 public:
  explicit UcxBackend(const UcxOptions& o)
      : options_(o),
        shell_({.name = "ucx", .linger_ns = o.linger_us * 1000ll, .yield_when_idle = false}) {
    caps_.name = "ucx";
    caps_.needs_target_progress = true;
    caps_.allocates_for_one_sided = true;
    caps_.addressing = AddressMode::kVirtualAddress;
    caps_.key_kind = KeyKind::kProviderIssued;
    caps_.max_message_bytes = 8192;
  }

  Status Init() {
    std::string tls, devices;
    if (options_.preset == "tcp") {
      tls = "tcp";
      // Loopback unless the operator chose the devices (UCX_NET_DEVICES, e.g. the veth or NIC
      // that reaches the peers: P and D on different hosts or network namespaces).
      const char* env = std::getenv("UCX_NET_DEVICES");
      devices = env != nullptr && env[0] != '\0' ? "" : "lo";
      peer_errors_ = true;
      efd_wakes_ = true;
    } else if (options_.preset == "shm") {
      tls = "posix,sysv,cma";
      peer_errors_ = false;
      // Wakeups through the shm transports' event fd were not reliable with UCX 1.13 here (an AM
      // could sit until the next timeout), so the thread re-polls after at most 1 ms asleep.
      idle_timeout_ms_ = 1;
    } else {
      return InvalidArgument("ucx: unknown preset '" + options_.preset + "' (tcp, shm)");
    }
    if (!options_.transports.empty()) tls = options_.transports;
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return FromUcs(s, "ucp_config_read");
    ucp_config_modify(config, "TLS", tls.c_str());
    if (!devices.empty()) ucp_config_modify(config, "NET_DEVICES", devices.c_str());
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
    params.name = "kvpush-xfer";
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) return FromUcs(s, "ucp_init (TLS=" + tls + ")");
    ucp_worker_params_t wp{};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // One worker, used by the progress thread and by callers' fast paths, always under
    // worker_mu_: serialized access.
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    s = ucp_worker_create(context_, &wp, &worker_);
    if (s != UCS_OK) return FromUcs(s, "ucp_worker_create");
    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    s = ucp_worker_get_address(worker_, &addr, &addr_len);
    if (s != UCS_OK) return FromUcs(s, "ucp_worker_get_address");
    address_.resize(kAddressHeader);
    const uint64_t pid = static_cast<uint64_t>(getpid());
    const uint64_t start = ProcessStartTime(pid);
    std::memcpy(address_.data(), &kAddressMagic, 4);
    std::memcpy(address_.data() + 4, &kAddressVersion, 4);
    std::memcpy(address_.data() + 8, &pid, 8);
    std::memcpy(address_.data() + 16, &start, 8);
    address_.insert(address_.end(), reinterpret_cast<uint8_t*>(addr),
                    reinterpret_cast<uint8_t*>(addr) + addr_len);
    ucp_worker_release_address(worker_, addr);
    ucp_am_handler_param_t ap{};
    ap.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    ap.id = kNotifyAmId;
    ap.cb = &UcxBackend::OnAm;
    ap.arg = this;
    s = ucp_worker_set_am_recv_handler(worker_, &ap);
    if (s != UCS_OK) return FromUcs(s, "ucp_worker_set_am_recv_handler");
    int efd = -1;
    s = ucp_worker_get_efd(worker_, &efd);
    if (s != UCS_OK) return FromUcs(s, "ucp_worker_get_efd");
    return shell_.Start(this, {efd});
  }

  ~UcxBackend() override {
    shell_.Stop();
    if (worker_ != nullptr) {
      // Let pending wireup messages go out first (e.g. the reply to a peer that connected just
      // before shutdown): UCX 1.13 asserts when ucp_worker_destroy purges a pending wireup REP
      // ("ucp_request.c:684 ... got REP message"). Progress until 20 idle rounds, at most 200 ms.
      const int64_t until = NowNs() + 200'000'000;
      for (int idle = 0; idle < 20 && NowNs() < until;) {
        if (ucp_worker_progress(worker_) != 0) {
          idle = 0;
        } else {
          ++idle;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
      ucp_worker_destroy(worker_);
    }
    shell_.ReleaseRetired();  // unmaps the memory UCX allocated (after the worker is gone)
    if (context_ != nullptr) ucp_cleanup(context_);
  }

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
  void ReleaseMemory(std::unique_ptr<BackendRegion> region) override {
    auto* r = static_cast<UcxRegion*>(region.get());
    if (r->allocated) {
      ucp_mem_h memh = r->memh;
      shell_.Retire(std::move(region), [this, memh] { ucp_mem_unmap(context_, memh); });
      return;
    }
    Status s = shell_.RunSync([&] {
      ucp_mem_unmap(context_, r->memh);
      return Status::Ok();
    });
    (void)s;
    shell_.Retire(std::move(region));
  }

  Result<std::shared_ptr<BackendPeer>> Connect(std::span<const uint8_t> address) override {
    if (address.size() < kAddressHeader + 8) return InvalidArgument("ucx: address blob too short");
    uint32_t magic = 0, version = 0;
    uint64_t pid = 0, start = 0;
    std::memcpy(&magic, address.data(), 4);
    std::memcpy(&version, address.data() + 4, 4);
    std::memcpy(&pid, address.data() + 8, 8);
    std::memcpy(&start, address.data() + 16, 8);
    if (magic != kAddressMagic || version != kAddressVersion)
      return InvalidArgument("ucx: not a kvpush UCX address (magic/version " +
                             std::to_string(magic) + "/" + std::to_string(version) + ")");
    if (pid == 0 || pid > 0x3fffffff) return InvalidArgument("ucx: address names pid 0 or > 2^30");
    auto peer = std::make_shared<UcxPeer>();
    peer->owner = this;
    peer->pid = pid;
    peer->start_time = start;
    std::vector<uint8_t> addr(address.begin() + kAddressHeader, address.end());
    Status st = shell_.RunSync([&]() -> Status {
      shell_.mu().AssertHeld();  // runs on the progress thread
      ucp_ep_params_t ep{};
      ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
      ep.address = reinterpret_cast<const ucp_address_t*>(addr.data());
      if (peer_errors_) {
        ep.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
        ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
        ep.err_handler.cb = &UcxBackend::OnEpError;
        ep.err_handler.arg = peer.get();
      }
      ucs_status_t s = ucp_ep_create(worker_, &ep, &peer->ep);
      if (s != UCS_OK) return Unavailable("ucx: ucp_ep_create: " + UcsText(s));
      peers_.insert(peer.get());
      // Without UCX's peer error mode (shm), a peer's exit would only show as a stall; the
      // shell's pidfd watch fails it at once instead (OnProcessExit).
      if (!peer_errors_) shell_.WatchProcess(peer->pid, peer->start_time, peer.get());
      return Status::Ok();
    });
    KVP_RETURN_IF_ERROR(st);
    return std::shared_ptr<BackendPeer>(std::move(peer));
  }

  Result<std::shared_ptr<BackendRemoteRegion>> ImportRegion(BackendPeer* peer,
                                                            std::span<const uint8_t> key,
                                                            uint64_t base,
                                                            uint64_t length) override {
    if (key.empty()) return InvalidArgument("ucx: empty rkey blob");
    auto r = std::make_shared<UcxRemote>();
    auto* p = static_cast<UcxPeer*>(peer);
    Status st = shell_.RunSync([&]() -> Status {
      shell_.mu().AssertHeld();  // runs on the progress thread
      if (p->closed) return PeerGone("ucx: peer closed");
      ucs_status_t s = ucp_ep_rkey_unpack(p->ep, key.data(), &r->rkey);
      if (s != UCS_OK) return InvalidArgument("ucx: ucp_ep_rkey_unpack: " + UcsText(s));
      // Shared-memory transports can map the peer's region here; then its ops are plain copies.
      void* mapped = nullptr;
      if (options_.direct_access && length > 0 && ucp_rkey_ptr(r->rkey, base, &mapped) == UCS_OK &&
          mapped != nullptr) {
        void* last = nullptr;  // the whole region must be mapped, not just its first byte
        if (ucp_rkey_ptr(r->rkey, base + length - 1, &last) == UCS_OK &&
            static_cast<std::byte*>(last) == static_cast<std::byte*>(mapped) + (length - 1)) {
          r->direct = static_cast<std::byte*>(mapped);
          r->base = base;
          r->length = length;
        }
      }
      return Status::Ok();
    });
    KVP_RETURN_IF_ERROR(st);
    return std::shared_ptr<BackendRemoteRegion>(std::move(r));
  }

  void Disconnect(std::shared_ptr<BackendPeer> peer,
                  std::vector<std::shared_ptr<BackendRemoteRegion>> regions) override {
    if (peer == nullptr) return;
    shell_.Enqueue([this, peer, regions = std::move(regions)] {
      shell_.mu().AssertHeld();  // jobs run under the worker lock
      auto* p = static_cast<UcxPeer*>(peer.get());
      CloseEp(p);
      for (auto& r : regions) {
        auto* u = static_cast<UcxRemote*>(r.get());
        if (u->rkey != nullptr) ucp_rkey_destroy(u->rkey);
        u->rkey = nullptr;
        u->direct = nullptr;
      }
    });
  }

  Status Post(PostRequest request) override {
    if (request.peer == nullptr) return InvalidArgument("ucx: post without peer");
    auto* f = new InFlight{std::move(request), this, false};
    if (!shell_.Enqueue([this, f] {
          shell_.mu().AssertHeld();  // jobs run under the worker lock
          Issue(f);
        })) {
      delete f;
      return Unavailable("ucx: backend shut down");
    }
    return Status::Ok();
  }
  InlinePost TryPostInline(PostRequest& request, Status* status) override {
    if (request.peer == nullptr) return InlinePost::kNotTaken;
    if (request.batch && request.batch->total_bytes > options_.inline_max_bytes)
      return InlinePost::kNotTaken;
    // Earlier work still queued for the progress thread goes first (per-thread post order).
    if (shell_.HasPendingJobs()) return InlinePost::kNotTaken;
    if (!shell_.mu().TryLock()) return InlinePost::kNotTaken;
    MutexLock lock(shell_.mu(), std::adopt_lock);
    if (shell_.stopping() || shell_.HasPendingJobs()) return InlinePost::kNotTaken;
    auto* peer = static_cast<UcxPeer*>(request.peer.get());
    // Data only, every op on a mapped region: copy it here, nothing to allocate or complete.
    if (request.notification.empty() && request.batch && !peer->closed && !peer->failed &&
        !request.control->aborted() && AllDirect(*request.batch)) {
      auto via_ucp = IssueOps(request, peer);
      *status = via_ucp.ok() ? Status::Ok() : via_ucp.status();
      return InlinePost::kDone;
    }
    auto* f = new InFlight{std::move(request), this};
    f->inline_caller = true;
    Issue(f);
    // Issue never frees an inline post: Complete hands it back here. (The analyzer forgets
    // inline_caller across ucp_am_send_nbx, which only keeps f as the request's user_data.)
    // NOLINTNEXTLINE(clang-analyzer-cplusplus.NewDelete)
    if (f->inline_done) {
      *status = std::move(f->inline_status);
      delete f;  // done inline: no UCX request refers to it
      return InlinePost::kDone;
    }
    f->inline_caller = false;  // from now on its completion goes to the sink
    lock.Unlock();
    // The progress thread sees this completion through the worker's event fd where that is
    // reliable (tcp); otherwise it is woken to poll for it.
    if (!efd_wakes_) shell_.Wake();
    return InlinePost::kAccepted;
  }
  bool ProgressCaller() override {
    if (!shell_.mu().TryLock()) return false;
    MutexLock lock(shell_.mu(), std::adopt_lock);
    if (shell_.stopping()) return false;
    bool any = false;
    while (ucp_worker_progress(worker_) != 0) any = true;
    if (any) shell_.NoteActivity();
    return any;
  }
  BackendStats stats() const override {
    return {stat_posts_.load(), stat_ops_.load(), stat_issue_ns_.load(),
            stat_last_issue_ns_.load()};
  }
  void Abort(uint64_t token) override {
    shell_.Enqueue([this, token] {
      shell_.mu().AssertHeld();  // jobs run under the worker lock
      auto it = inflight_.find(token);
      if (it != inflight_.end() && !it->second->aborted) {
        it->second->aborted = true;
        --active_;
      }
    });
  }

 private:
  Result<std::unique_ptr<BackendRegion>> Map(void* addr, uint64_t length, MemoryType type,
                                             bool allocate, void** out) {
    if (type != MemoryType::kHost) return Unimplemented("ucx: only host memory is supported");
    auto r = std::make_unique<UcxRegion>();
    Status st = shell_.RunSync([&]() -> Status {
      ucp_mem_map_params_t mp{};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS;
      mp.address = addr;
      mp.length = length;
      mp.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
      r->allocated = allocate;
      ucs_status_t s = ucp_mem_map(context_, &mp, &r->memh);
      if (s != UCS_OK) return ResourceExhausted("ucx: ucp_mem_map: " + UcsText(s));
      if (allocate) {
        ucp_mem_attr_t attr{};
        attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
        ucp_mem_query(r->memh, &attr);
        *out = attr.address;
        std::memset(attr.address, 0, length);
      }
      void* rkey = nullptr;
      size_t rkey_len = 0;
      s = ucp_rkey_pack(context_, r->memh, &rkey, &rkey_len);
      if (s != UCS_OK) {
        ucp_mem_unmap(context_, r->memh);
        return Internal("ucx: ucp_rkey_pack: " + UcsText(s));
      }
      r->key.assign(static_cast<uint8_t*>(rkey), static_cast<uint8_t*>(rkey) + rkey_len);
      ucp_rkey_buffer_release(rkey);
      return Status::Ok();
    });
    KVP_RETURN_IF_ERROR(st);
    return std::unique_ptr<BackendRegion>(std::move(r));
  }

  // ---- under the worker lock (the progress thread, or a caller in a fast path) ----

  void Complete(InFlight* f, Status s) REQUIRES(shell_.mu()) {
    if (f->inline_caller) {  // TryPostInline reports it and frees f (a fresh post: not reported)
      Forget(f);
      f->inline_done = true;
      f->inline_status = std::move(s);
      return;
    }
    if (f->reported) {  // late UCX callback after shutdown already reported it
      delete f;
      return;
    }
    Forget(f);
    sink_->OnPostDone(f->req.token, std::move(s));
    if (!f->ucx_owned) delete f;
  }
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
  Result<bool> IssueOps(const PostRequest& req, UcxPeer* peer) REQUIRES(shell_.mu()) {
    const bool write = req.op == Op::kWrite;
    bool via_ucp = false;
    ucp_request_param_t param{};
    const std::vector<XferOp>& ops = req.batch->ops;
    const int64_t t0 = ops.size() >= kTimedOps ? NowNs() : 0;
    for (const XferOp& op : ops) {
      const auto* remote = static_cast<const UcxRemote*>(op.remote);
      void* local = reinterpret_cast<void*>(op.local_addr);
      if (remote->direct != nullptr) {
        // The Agent checked the range against the peer's region table; this guards the mapping.
        if (op.remote_addr < remote->base || op.length > remote->length ||
            op.remote_addr - remote->base > remote->length - op.length)
          return OutOfRange("ucx: op outside the mapped peer region");
        std::byte* mapped = remote->direct + (op.remote_addr - remote->base);
        if (write) {
          std::memcpy(mapped, local, op.length);
        } else {
          std::memcpy(local, mapped, op.length);
        }
        continue;
      }
      via_ucp = true;
      param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
      param.memh = static_cast<const UcxRegion*>(op.local)->memh;
      ucs_status_ptr_t p =
          write ? ucp_put_nbx(peer->ep, local, op.length, op.remote_addr, remote->rkey, &param)
                : ucp_get_nbx(peer->ep, local, op.length, op.remote_addr, remote->rkey, &param);
      if (UCS_PTR_IS_ERR(p)) return FromUcs(UCS_PTR_STATUS(p), write ? "put" : "get");
      if (p != nullptr) ucp_request_free(p);  // completes in the background; flush covers it
    }
    // Direct stores must be visible to the peer before anything sent after them (the
    // notification's stores into the peer's shm FIFO): a release fence orders them (free on x86,
    // `dmb ish` on Arm).
#if !defined(__SANITIZE_THREAD__)  // GCC's TSan rejects fences; TSan builds run on x86 (TSO)
    std::atomic_thread_fence(std::memory_order_release);
#endif
    // Counters: one writer (the worker lock holder), so plain load + store, no locked RMW. The
    // clock is read only for posts big enough for the issue loop to matter (it costs as much as
    // a small post).
    Bump(stat_posts_, 1);
    Bump(stat_ops_, ops.size());
    if (t0 != 0) {
      const int64_t dt = NowNs() - t0;
      Bump(stat_issue_ns_, dt);
      stat_last_issue_ns_.store(dt, std::memory_order_relaxed);
    }
    return via_ucp;
  }

  void Issue(InFlight* f) REQUIRES(shell_.mu()) {
    ++outstanding_;
    ++active_;
    inflight_[f->req.token] = f;
    auto* peer = static_cast<UcxPeer*>(f->req.peer.get());
    if (peer->closed || peer->failed)
      return Complete(f, PeerGone("ucx: peer disconnected or failed"));
    if (f->req.control->aborted()) return Complete(f, Cancelled("ucx: aborted before issue"));
    if (f->req.batch && !f->req.batch->ops.empty()) {
      auto via_ucp = IssueOps(f->req, peer);
      if (!via_ucp.ok()) return Complete(f, via_ucp.status());
      if (*via_ucp) {
        ucp_request_param_t param{};
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
        param.cb.send = &UcxBackend::OnFlushDone;
        param.user_data = f;
        ucs_status_ptr_t p = ucp_ep_flush_nbx(peer->ep, &param);
        if (UCS_PTR_IS_ERR(p)) return Complete(f, FromUcs(UCS_PTR_STATUS(p), "flush"));
        if (p != nullptr) {
          f->ucx_owned = true;  // OnFlushDone follows
          return;
        }
      }
    }
    AfterData(f);
  }

  static void OnFlushDone(void* request, ucs_status_t status, void* user_data) {
    auto* f = static_cast<InFlight*>(user_data);
    f->owner->shell_.mu().AssertHeld();  // UCX calls back from ucp_worker_progress
    ucp_request_free(request);
    f->ucx_owned = false;
    if (status != UCS_OK || f->reported) return f->owner->Complete(f, FromUcs(status, "flush"));
    f->owner->AfterData(f);
  }

  // All data of the post is remotely complete: send the notification (if still wanted).
  void AfterData(InFlight* f) REQUIRES(shell_.mu()) {
    if (f->req.notification.empty()) return Complete(f, Status::Ok());
    if (!f->req.control->BeginNotify()) return Complete(f, Cancelled("ucx: aborted before notify"));
    auto* peer = static_cast<UcxPeer*>(f->req.peer.get());
    if (peer->closed || peer->failed)
      return Complete(f, PeerGone("ucx: peer failed before notify"));
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_AM_SEND_FLAG_EAGER;
    param.cb.send = &UcxBackend::OnAmDone;
    param.user_data = f;
    ucs_status_ptr_t p =
        ucp_am_send_nbx(peer->ep, kNotifyAmId, nullptr, 0, f->req.notification.data(),
                        f->req.notification.size(), &param);
    if (UCS_PTR_IS_ERR(p)) return Complete(f, FromUcs(UCS_PTR_STATUS(p), "am_send"));
    if (p == nullptr) return Complete(f, Status::Ok());
    f->ucx_owned = true;  // OnAmDone follows
  }

  static void OnAmDone(void* request, ucs_status_t status, void* user_data) {
    auto* f = static_cast<InFlight*>(user_data);
    f->owner->shell_.mu().AssertHeld();  // UCX calls back from ucp_worker_progress or a send
    ucp_request_free(request);
    f->ucx_owned = false;
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

  void CloseEp(UcxPeer* p) REQUIRES(shell_.mu()) {
    if (p->closed) return;
    p->closed = true;
    peers_.erase(p);
    shell_.UnwatchProcess(p);
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(p->ep, &param);
    if (r != nullptr && !UCS_PTR_IS_ERR(r)) closing_.push_back(r);
  }

  void ReapClosing() REQUIRES(shell_.mu()) {
    for (size_t i = 0; i < closing_.size();) {
      if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
        ucp_request_free(closing_[i]);
        closing_[i] = closing_.back();
        closing_.pop_back();
      } else {
        ++i;
      }
    }
  }

  // ---- ProgressHooks: called by the shell's progress thread under the worker lock ----

  bool Progress() override {
    shell_.mu().AssertHeld();
    bool progressed = false;
    while (ucp_worker_progress(worker_) != 0) progressed = true;
    if (progressed) shell_.NoteActivity();  // stay hot while traffic flows (target)
    ReapClosing();
    return progressed;
  }
  // Busy-poll while work is outstanding (aborted posts do not count: they may never finish).
  bool Busy() override {
    shell_.mu().AssertHeld();
    return active_ > 0 || !closing_.empty();
  }
  int Arm() override {
    shell_.mu().AssertHeld();
    if (ucp_worker_arm(worker_) != UCS_OK) return -1;  // events pending: poll again
    return outstanding_ > 0 ? 10 : idle_timeout_ms_;
  }
  void BeginStop() override {
    shell_.mu().AssertHeld();
    for (UcxPeer* p : std::vector<UcxPeer*>(peers_.begin(), peers_.end())) CloseEp(p);
  }
  bool Drained() override {
    shell_.mu().AssertHeld();
    return outstanding_ == 0 && closing_.empty();
  }
  // Whatever did not finish by now is failed so that the sink sees every post end.
  void OnStopped() override {
    shell_.mu().AssertHeld();
    std::vector<InFlight*> left;
    for (auto& [t, f] : inflight_) left.push_back(f);
    for (InFlight* f : left) {
      bool owned = f->ucx_owned;
      Complete(f, Cancelled("ucx: backend shut down"));  // deletes f unless UCX still holds it
      // Complete() freed f unless UCX still owns it; only then is it touched again.
      if (owned) f->reported = true;  // NOLINT(clang-analyzer-cplusplus.NewDelete)
    }
  }
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
  BackendSink* sink_ = nullptr;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::vector<uint8_t> address_;
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
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeUcxBackend(const UcxOptions& options) {
  auto b = std::make_unique<UcxBackend>(options);
  KVP_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace kvpush::xfer
