#include "xfer/libfabric_backend.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <unordered_map>
#include <unordered_set>

#include "common/clock.h"
#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "xfer/byte_io.h"
#include "xfer/progress_shell.h"

namespace kvpush::xfer {
namespace {

constexpr size_t kRecvBuffers = 64;
constexpr size_t kRecvBytes = 8192;

// Busy-poll this long after the last local activity (a completion, a job) before sleeping.
constexpr int64_t kLingerNs = 50'000;
// Progress hold: an initiator whose post is held up by the target (an op got -FI_EAGAIN) asks the
// target to keep polling for kHoldUs, renewed every kHoldRenewNs while the post is in flight; a
// target caps what it grants at kMaxHoldUs per message.
constexpr uint32_t kHoldUs = 2000;
constexpr int64_t kHoldRenewNs = 500'000;
constexpr uint32_t kMaxHoldUs = 10'000;
// Hold frame: u32 magic 'KVPH' | u16 version = 1 | u16 zero | u32 hold duration, microseconds.
// Distinct from notification frames ('KVPN'); a receiver that does not know it drops it.
constexpr uint32_t kHoldMagic = 0x4850564b;
constexpr size_t kHoldFrameBytes = 12;

std::vector<uint8_t> HoldFrame(uint32_t hold_us) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U32(kHoldMagic);
  w.U16(1);
  w.U16(0);
  w.U32(hold_us);
  return out;
}
bool IsHoldFrame(std::span<const uint8_t> m, uint32_t* hold_us) {
  ByteReader r(m);
  uint32_t magic = 0;
  uint16_t version = 0, zero = 0;
  return m.size() == kHoldFrameBytes && r.U32(&magic) && magic == kHoldMagic && r.U16(&version) &&
         version == 1 && r.U16(&zero) && r.U32(hold_us);
}

std::string FiText(ssize_t rc) {
  return fi_strerror(static_cast<int>(rc < 0 ? -rc : rc));
}

Status FromFi(ssize_t err, const std::string& what) {
  int e = static_cast<int>(err < 0 ? -err : err);
  std::string m = "libfabric: " + what + ": " + fi_strerror(e);
  switch (e) {
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_EHOSTUNREACH:
    case FI_ENOTCONN:
    case FI_ESHUTDOWN:
    case FI_EIO:
      return PeerGone(m);
    case FI_ECANCELED:
      return Cancelled(m);
    case FI_ETIMEDOUT:
      return DeadlineExceeded(m);
    case FI_EINVAL:
      return InvalidArgument(m);
    default:
      return Unavailable(m);
  }
}

struct FiRegion : BackendRegion {
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  void* owned = nullptr;
};
struct FiPeer : BackendPeer {
  fi_addr_t addr = FI_ADDR_UNSPEC;
  // Progress lock (the owner's ProgressShell::mu(); every access is in a function that REQUIRES
  // it).
  bool failed = false;
  bool closed = false;
  uint64_t blocked_round = 0;   // issue round in which an op to this peer got -FI_EAGAIN
  int64_t hold_sent_ns = 0;     // when the last hold message was handed to the provider
  bool hold_in_flight = false;  // a hold message to this peer is not yet complete
};
struct FiRemote : BackendRemoteRegion {
  uint64_t key = 0;
};

struct InFlight;
struct HoldSend;
enum class CtxKind : uint8_t { kData, kNotify, kRecv, kHold };
// Completion context; starts with fi_context2 as FI_CONTEXT/FI_CONTEXT2 modes require.
struct Ctx {
  fi_context2 fi;
  CtxKind kind = CtxKind::kData;
  InFlight* flight = nullptr;
  HoldSend* hold = nullptr;
  size_t recv_index = 0;
};
struct InFlight {
  PostRequest req;
  std::vector<Ctx> ctx;  // one per op (one allocation per post)
  Ctx notify;
  size_t next = 0;       // next op to hand to the provider
  size_t remaining = 0;  // ops not yet completed, issued or not
  int64_t issue_start_ns = 0;
  Status error;
  bool aborted = false;
  bool wants_hold = false;  // held up by the target: keep it polling while this post is in flight
};
// One hold message in flight; keeps its peer alive until the provider is done with it.
struct HoldSend {
  Ctx ctx;
  std::shared_ptr<BackendPeer> peer;
};

class LibfabricBackend final : public Backend, private ProgressHooks {
 public:
  explicit LibfabricBackend(LibfabricOptions o)
      : options_(std::move(o)),
        shell_({.name = "libfabric", .linger_ns = kLingerNs, .yield_when_idle = true}) {}

  Status Init() {
    fi_info* hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_RMA;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->fabric_attr->prov_name = strdup(options_.provider.c_str());
    const bool is_shm = options_.provider == "shm";
    int rc = fi_getinfo(FI_VERSION(1, 17), is_shm ? nullptr : options_.node.c_str(), nullptr,
                        is_shm ? 0 : FI_SOURCE, hints, &info_);
    fi_freeinfo(hints);
    if (rc != 0 || info_ == nullptr)
      return Unavailable("libfabric: no provider '" + options_.provider +
                         "' with FI_RMA: " + FiText(rc));
    const uint64_t mr_mode = info_->domain_attr->mr_mode;
    caps_.name = "libfabric";
    caps_.needs_target_progress = info_->domain_attr->data_progress == FI_PROGRESS_MANUAL;
    caps_.addressing =
        (mr_mode & FI_MR_VIRT_ADDR) ? AddressMode::kVirtualAddress : AddressMode::kOffset;
    caps_.key_kind = (mr_mode & FI_MR_PROV_KEY) ? KeyKind::kProviderIssued : KeyKind::kAppChosen;
    caps_.max_message_bytes = kRecvBytes;
    idle_timeout_ms_ = is_shm ? 1 : 1000;
    tx_limit_ = info_->tx_attr->size > 0 ? info_->tx_attr->size : 1024;
    hold_enabled_ = caps_.needs_target_progress;
    // A shm target polls on a timer (no wait fd) and incoming RMA never wakes it, so every WRITE
    // asks for a hold from its first round, not only once it is held up: a stream of small
    // WRITEs then keeps the target polling instead of waiting up to 1 ms each.
    hold_from_start_ = hold_enabled_ && is_shm;
    hold_frame_ = HoldFrame(kHoldUs);
    if ((rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr)) != 0)
      return FromFi(rc, "fi_fabric");
    if ((rc = fi_domain(fabric_, info_, &domain_, nullptr)) != 0) return FromFi(rc, "fi_domain");
    fi_av_attr av_attr{};
    av_attr.type = FI_AV_TABLE;
    if ((rc = fi_av_open(domain_, &av_attr, &av_, nullptr)) != 0) return FromFi(rc, "fi_av_open");
    fi_cq_attr cq_attr{};
    cq_attr.format = FI_CQ_FORMAT_DATA;
    cq_attr.wait_obj = FI_WAIT_FD;
    cq_attr.size = 65536;
    if (fi_cq_open(domain_, &cq_attr, &cq_, nullptr) != 0) {
      cq_attr.wait_obj = FI_WAIT_NONE;  // provider without wait fds: timed polling
      if ((rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)) != 0) return FromFi(rc, "fi_cq_open");
    } else if (fi_control(&cq_->fid, FI_GETWAIT, &cq_fd_) != 0) {
      cq_fd_ = -1;
    }
    if ((rc = fi_endpoint(domain_, info_, &ep_, nullptr)) != 0) return FromFi(rc, "fi_endpoint");
    if ((rc = fi_ep_bind(ep_, &av_->fid, 0)) != 0) return FromFi(rc, "fi_ep_bind(av)");
    if ((rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)) != 0)
      return FromFi(rc, "fi_ep_bind(cq)");
    if ((rc = fi_enable(ep_)) != 0) return FromFi(rc, "fi_enable");
    size_t len = 0;
    fi_getname(&ep_->fid, nullptr, &len);
    address_.resize(len);
    if ((rc = fi_getname(&ep_->fid, address_.data(), &len)) != 0) return FromFi(rc, "fi_getname");
    address_.resize(len);
    recv_pool_.resize(kRecvBuffers * kRecvBytes);
    recv_ctx_.resize(kRecvBuffers);
    {
      MutexLock lock(shell_.mu());  // no thread yet; PostRecv may poll
      for (size_t i = 0; i < kRecvBuffers; ++i) {
        recv_ctx_[i].kind = CtxKind::kRecv;
        recv_ctx_[i].recv_index = i;
        KVP_RETURN_IF_ERROR(PostRecv(i));
      }
    }
    return shell_.Start(this, {cq_fd_});
  }

  ~LibfabricBackend() override {
    shell_.Stop();
    if (ep_) fi_close(&ep_->fid);
    {
      MutexLock lock(shell_.mu());  // the thread is gone; the analysis wants the lock
      for (HoldSend* h : holds_) delete h;
    }
    shell_.ReleaseRetired();  // closes the MRs of allocated memory and frees it
    if (cq_) fi_close(&cq_->fid);
    if (av_) fi_close(&av_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
  }

  const BackendCaps& caps() const override { return caps_; }
  void SetSink(BackendSink* sink) override { sink_ = sink; }
  std::vector<uint8_t> LocalAddress() const override { return address_; }

  Result<std::unique_ptr<BackendRegion>> RegisterMemory(void* addr, uint64_t length,
                                                        MemoryType type) override {
    if (type != MemoryType::kHost) return Unimplemented("libfabric: only host memory");
    auto r = std::make_unique<FiRegion>();
    Status st = shell_.RunSync([&]() -> Status {
      shell_.mu().AssertHeld();  // runs on the progress thread
      uint64_t requested = next_key_++;
      int rc = fi_mr_reg(domain_, addr, length,
                         FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV,
                         0, requested, 0, &r->mr, nullptr);
      if (rc != 0) return FromFi(rc, "fi_mr_reg");
      if (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) {
        if ((rc = fi_mr_bind(r->mr, &ep_->fid, 0)) != 0) return FromFi(rc, "fi_mr_bind");
        if ((rc = fi_mr_enable(r->mr)) != 0) return FromFi(rc, "fi_mr_enable");
      }
      r->desc = fi_mr_desc(r->mr);
      ByteWriter(&r->key).U64(fi_mr_key(r->mr));
      return Status::Ok();
    });
    KVP_RETURN_IF_ERROR(st);
    return std::unique_ptr<BackendRegion>(std::move(r));
  }
  Result<std::unique_ptr<BackendRegion>> AllocateMemory(uint64_t length, MemoryType type,
                                                        void** addr) override {
    const uint64_t rounded = (length + 4095) / 4096 * 4096;
    void* p = std::aligned_alloc(4096, rounded);
    if (p == nullptr) return ResourceExhausted("libfabric: cannot allocate");
    std::memset(p, 0, rounded);
    auto r = RegisterMemory(p, length, type);
    if (!r.ok()) {
      std::free(p);
      return r.status();
    }
    static_cast<FiRegion*>(r->get())->owned = p;
    *addr = p;
    return r;
  }
  // Allocated memory is kept until the endpoint is closed (a late remote write must not land in
  // freed memory); caller memory is deregistered now. The region's own data (its memory
  // descriptor, which a post being issued may read) is kept by the shell until its thread is
  // joined.
  void ReleaseMemory(std::unique_ptr<BackendRegion> region) override {
    auto* r = static_cast<FiRegion*>(region.get());
    if (r->owned != nullptr) {
      fid_mr* mr = r->mr;
      void* owned = r->owned;
      shell_.Retire(std::move(region), [mr, owned] {
        fi_close(&mr->fid);
        std::free(owned);
      });
      return;
    }
    Status s = shell_.RunSync([&] {
      fi_close(&r->mr->fid);
      return Status::Ok();
    });
    (void)s;
    shell_.Retire(std::move(region));
  }

  Result<std::shared_ptr<BackendPeer>> Connect(std::span<const uint8_t> address) override {
    if (address.empty()) return InvalidArgument("libfabric: empty address");
    auto p = std::make_shared<FiPeer>();
    std::vector<uint8_t> a(address.begin(), address.end());
    Status st = shell_.RunSync([&]() -> Status {
      int n = fi_av_insert(av_, a.data(), 1, &p->addr, 0, nullptr);
      return n == 1 ? Status::Ok() : Unavailable("libfabric: fi_av_insert failed");
    });
    KVP_RETURN_IF_ERROR(st);
    return std::shared_ptr<BackendPeer>(std::move(p));
  }
  Result<std::shared_ptr<BackendRemoteRegion>> ImportRegion(BackendPeer*,
                                                            std::span<const uint8_t> key, uint64_t,
                                                            uint64_t) override {
    ByteReader rd(key);
    auto r = std::make_shared<FiRemote>();
    if (!rd.U64(&r->key) || rd.remaining() != 0) return InvalidArgument("libfabric: bad key blob");
    return std::shared_ptr<BackendRemoteRegion>(std::move(r));
  }
  void Disconnect(std::shared_ptr<BackendPeer> peer,
                  std::vector<std::shared_ptr<BackendRemoteRegion>>) override {
    if (peer == nullptr) return;
    shell_.Enqueue([peer] { static_cast<FiPeer*>(peer.get())->closed = true; });
  }

  Status Post(PostRequest request) override {
    if (request.peer == nullptr) return InvalidArgument("libfabric: post without peer");
    auto* f = new InFlight{};
    f->req = std::move(request);
    if (!shell_.Enqueue([this, f] {
          shell_.mu().AssertHeld();  // jobs run under the progress lock
          Issue(f);
        })) {
      delete f;
      return Unavailable("libfabric: backend shut down");
    }
    return Status::Ok();
  }
  void Abort(uint64_t token) override {
    shell_.Enqueue([this, token] {
      shell_.mu().AssertHeld();  // jobs run under the progress lock
      auto it = inflight_.find(token);
      if (it != inflight_.end()) it->second->aborted = true;
    });
  }
  BackendStats stats() const override {
    return {stat_posts_.load(), stat_ops_.load(), stat_issue_ns_.load(),
            stat_last_issue_ns_.load()};
  }

 private:
  Status PostRecv(size_t i) REQUIRES(shell_.mu()) {
    ssize_t rc;
    do {
      rc = fi_recv(ep_, recv_pool_.data() + i * kRecvBytes, kRecvBytes, nullptr, FI_ADDR_UNSPEC,
                   &recv_ctx_[i]);
      if (rc == -FI_EAGAIN) Poll();
    } while (rc == -FI_EAGAIN);
    return rc == 0 ? Status::Ok() : FromFi(rc, "fi_recv");
  }

  void Finish(InFlight* f, Status s) REQUIRES(shell_.mu()) {
    inflight_.erase(f->req.token);
    shell_.NoteActivity();
    sink_->OnPostDone(f->req.token, std::move(s));
    delete f;
  }

  // Registers a post; its ops are handed to the provider by IssueSome.
  void Issue(InFlight* f) REQUIRES(shell_.mu()) {
    auto* peer = static_cast<FiPeer*>(f->req.peer.get());
    if (peer->closed || peer->failed)
      return Finish(f, PeerGone("libfabric: peer disconnected or failed"));
    if (f->req.control->aborted()) return Finish(f, Cancelled("libfabric: aborted before issue"));
    inflight_[f->req.token] = f;
    const size_t n = f->req.batch ? f->req.batch->ops.size() : 0;
    if (n == 0) return AfterData(f);
    f->ctx.resize(n);
    f->remaining = n;
    f->issue_start_ns = NowNs();
    f->wants_hold = hold_from_start_ && f->req.op == Op::kWrite;
    issuing_.push_back(f);
  }

  // Stops handing out a post's ops (the ops already handed out still complete); the post
  // finishes with `why` once they have.
  void StopIssuing(InFlight* f, Status why) REQUIRES(shell_.mu()) {
    f->remaining -= f->req.batch->ops.size() - f->next;
    if (f->error.ok()) f->error = std::move(why);
    if (f->remaining == 0) Finish(f, f->error);
  }

  // Hands queued ops to the provider, oldest post first, while fewer than tx_limit_ are
  // outstanding. An op refused with -FI_EAGAIN is retried in a later round (after the CQ was read);
  // the other posts to that peer wait with it (they keep their order), posts to other peers go on.
  // Returns whether any op was handed over.
  bool IssueSome() REQUIRES(shell_.mu()) {
    bool progressed = false;
    ++round_;
    for (auto it = issuing_.begin(); it != issuing_.end();) {
      InFlight* f = *it;
      auto* peer = static_cast<FiPeer*>(f->req.peer.get());
      if (peer->blocked_round == round_) {
        ++it;
        continue;
      }
      // A stalled peer can keep the queue full: give up once the agent aborted the post.
      if (f->aborted || f->req.control->aborted() || shell_.stop_requested()) {
        it = issuing_.erase(it);
        StopIssuing(f, Cancelled("libfabric: aborted while issuing"));
        continue;
      }
      if (peer->closed || peer->failed) {
        it = issuing_.erase(it);
        StopIssuing(f, PeerGone("libfabric: peer disconnected or failed while issuing"));
        continue;
      }
      const std::vector<XferOp>& ops = f->req.batch->ops;
      const bool write = f->req.op == Op::kWrite;
      while (f->next < ops.size() && outstanding_tx_ < tx_limit_) {
        const XferOp& op = ops[f->next];
        Ctx& c = f->ctx[f->next];
        c.kind = CtxKind::kData;
        c.flight = f;
        iovec iov{reinterpret_cast<void*>(op.local_addr), op.length};
        void* desc = static_cast<const FiRegion*>(op.local)->desc;
        fi_rma_iov rma{op.remote_addr, op.length, static_cast<const FiRemote*>(op.remote)->key};
        fi_msg_rma msg{&iov, &desc, 1, peer->addr, &rma, 1, &c, 0};
        const ssize_t rc = write ? fi_writemsg(ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE)
                                 : fi_readmsg(ep_, &msg, FI_COMPLETION);
        if (rc == -FI_EAGAIN) {
          peer->blocked_round = round_;
          f->wants_hold = hold_enabled_;
          break;
        }
        if (rc != 0) {
          it = issuing_.erase(it);
          StopIssuing(f, FromFi(rc, write ? "fi_writemsg" : "fi_readmsg"));
          f = nullptr;
          break;
        }
        ++f->next;
        ++outstanding_tx_;
        progressed = true;
      }
      if (f == nullptr) continue;
      if (f->next == ops.size()) {
        const int64_t dt = NowNs() - f->issue_start_ns;
        stat_posts_.fetch_add(1);
        stat_ops_.fetch_add(ops.size());
        stat_issue_ns_.fetch_add(dt);
        stat_last_issue_ns_.store(dt);
        it = issuing_.erase(it);
        continue;
      }
      if (outstanding_tx_ >= tx_limit_) break;  // nothing else fits until completions arrive
      ++it;
    }
    return progressed;
  }

  // Sends a hold message to the peer of every post that is held up by its target, at most one in
  // flight per peer and one per kHoldRenewNs. Returns whether any was handed over.
  bool SendHolds() REQUIRES(shell_.mu()) {
    bool sent = false;
    const int64_t now = NowNs();
    for (auto& [token, f] : inflight_) {
      if (!f->wants_hold || f->aborted) continue;
      auto* peer = static_cast<FiPeer*>(f->req.peer.get());
      if (peer->hold_in_flight || peer->closed || peer->failed ||
          now - peer->hold_sent_ns < kHoldRenewNs)
        continue;
      if (spare_hold_ == nullptr) spare_hold_ = std::make_unique<HoldSend>();
      HoldSend* h = spare_hold_.get();
      h->ctx.kind = CtxKind::kHold;
      h->ctx.hold = h;
      const ssize_t rc =
          fi_send(ep_, hold_frame_.data(), hold_frame_.size(), nullptr, peer->addr, &h->ctx);
      if (rc != 0) continue;  // -FI_EAGAIN: next round; anything else shows up on the data ops
      h->peer = f->req.peer;
      holds_.insert(spare_hold_.release());
      peer->hold_in_flight = true;
      peer->hold_sent_ns = now;
      ++outstanding_tx_;
      sent = true;
    }
    return sent;
  }

  void AfterData(InFlight* f) REQUIRES(shell_.mu()) {
    if (!f->error.ok()) return Finish(f, f->error);
    if (f->req.notification.empty()) return Finish(f, Status::Ok());
    if (!f->req.control->BeginNotify())
      return Finish(f, Cancelled("libfabric: aborted before notify"));
    f->notify.kind = CtxKind::kNotify;
    f->notify.flight = f;
    SendNotification(f);
  }

  // Hands the notification to the provider, or queues it for a later round on -FI_EAGAIN.
  void SendNotification(InFlight* f) REQUIRES(shell_.mu()) {
    auto* peer = static_cast<FiPeer*>(f->req.peer.get());
    if (peer->closed || peer->failed)
      return Finish(f, PeerGone("libfabric: peer failed before notify"));
    if (shell_.stop_requested()) return Finish(f, Cancelled("libfabric: backend shut down"));
    const ssize_t rc = fi_send(ep_, f->req.notification.data(), f->req.notification.size(), nullptr,
                               peer->addr, &f->notify);
    if (rc == -FI_EAGAIN) return notify_queue_.push_back(f);
    if (rc != 0) return Finish(f, FromFi(rc, "fi_send"));
    ++outstanding_tx_;
  }
  bool RetryNotifications() REQUIRES(shell_.mu()) {
    if (notify_queue_.empty()) return false;
    std::deque<InFlight*> queue;
    queue.swap(notify_queue_);
    for (InFlight* f : queue) SendNotification(f);
    return notify_queue_.size() < queue.size();
  }

  void OnCompletion(Ctx* c, Status s, size_t len) REQUIRES(shell_.mu()) {
    switch (c->kind) {
      case CtxKind::kRecv:
        if (s.ok()) {
          std::span<const uint8_t> m(recv_pool_.data() + c->recv_index * kRecvBytes, len);
          uint32_t hold_us = 0;
          if (IsHoldFrame(m, &hold_us))
            hot_until_ns_ =
                std::max(hot_until_ns_, NowNs() + int64_t{std::min(hold_us, kMaxHoldUs)} * 1000);
          else
            sink_->OnMessage(m);
        }
        if (!shell_.stopping()) (void)PostRecv(c->recv_index);
        return;
      case CtxKind::kHold: {
        --outstanding_tx_;
        static_cast<FiPeer*>(c->hold->peer.get())->hold_in_flight = false;
        holds_.erase(c->hold);
        delete c->hold;
        return;
      }
      case CtxKind::kNotify:
        --outstanding_tx_;
        return Finish(c->flight, std::move(s));
      case CtxKind::kData: {
        --outstanding_tx_;
        InFlight* f = c->flight;
        if (!s.ok() && f->error.ok()) f->error = std::move(s);
        if (--f->remaining == 0) AfterData(f);
        return;
      }
    }
  }

  // Reads the CQ; returns the number of entries handled.
  size_t Poll() REQUIRES(shell_.mu()) {
    fi_cq_data_entry e[64];
    ssize_t n = fi_cq_read(cq_, e, 64);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i)
        OnCompletion(static_cast<Ctx*>(e[i].op_context), Status::Ok(), e[i].len);
      shell_.NoteActivity();
      return size_t(n);
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) > 0 && err.op_context != nullptr) {
        auto* c = static_cast<Ctx*>(err.op_context);
        Status s = FromFi(err.err, "completion");
        if ((c->kind == CtxKind::kData || c->kind == CtxKind::kNotify) &&
            s.code() == StatusCode::kPeerGone) {
          auto* peer = static_cast<FiPeer*>(c->flight->req.peer.get());
          if (!peer->failed) {
            peer->failed = true;
            sink_->OnPeerError(peer, s);
          }
        }
        OnCompletion(c, s, 0);
      }
      return 1;
    }
    return 0;
  }

  // ---- ProgressHooks: called by the shell's progress thread under the progress lock ----

  bool Progress() override {
    shell_.mu().AssertHeld();
    bool progressed = SendHolds();
    progressed |= IssueSome();
    progressed |= RetryNotifications();
    while (Poll() > 0) progressed = true;
    return progressed;
  }
  // Busy-polls while posts are in flight and while a peer's hold lasts (the shell adds the linger
  // after the last activity).
  bool Busy() override {
    shell_.mu().AssertHeld();
    for (auto& [t, f] : inflight_) {
      if (!f->aborted) return true;
    }
    return NowNs() < hot_until_ns_;
  }
  // Sleeps on the CQ's wait fd and the wake eventfd, at most idle_timeout_ms_ (with manual
  // progress, incoming RMA needs this side to poll); 1 ms when the CQ cannot be waited on now.
  int Arm() override {
    fid* fids[1] = {&cq_->fid};
    const bool can_wait = cq_fd_ >= 0 && fi_trywait(fabric_, fids, 1) == FI_SUCCESS;
    return can_wait ? idle_timeout_ms_ : 1;
  }
  // Posts still outstanding are reported; their contexts are freed after the endpoint closes.
  void OnStopped() override {
    shell_.mu().AssertHeld();
    issuing_.clear();
    notify_queue_.clear();
    std::vector<InFlight*> left;
    for (auto& [t, f] : inflight_) left.push_back(f);
    inflight_.clear();
    for (InFlight* f : left) {
      sink_->OnPostDone(f->req.token, Cancelled("libfabric: backend shut down"));
      orphans_.emplace_back(f);
    }
  }

  LibfabricOptions options_;
  BackendCaps caps_;
  BackendSink* sink_ = nullptr;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_ep* ep_ = nullptr;
  int cq_fd_ = -1;
  int idle_timeout_ms_ = 1000;
  size_t tx_limit_ = 1024;  // most transmit ops handed to the provider at once (tx_attr->size)
  bool hold_enabled_ = false;
  bool hold_from_start_ = false;  // shm: WRITEs ask for a hold before any -FI_EAGAIN
  std::vector<uint8_t> hold_frame_;
  std::vector<uint8_t> address_;
  std::vector<uint8_t> recv_pool_;  // receive buffers, handed to the provider (fi_recv)
  std::vector<Ctx> recv_ctx_;
  std::atomic<uint64_t> stat_posts_{0}, stat_ops_{0};
  std::atomic<int64_t> stat_issue_ns_{0}, stat_last_issue_ns_{0};

  // The progress thread, its job queue and wake-up, retired regions. Its mu() (the progress lock)
  // is held by that thread while it runs jobs and hooks, and guards the endpoint's progress state
  // below; no other thread takes it while the thread runs.
  ProgressShell shell_;
  uint64_t next_key_ GUARDED_BY(shell_.mu()) = 1;
  int64_t hot_until_ns_ GUARDED_BY(shell_.mu()) = 0;  // a peer's hold: keep polling until then
  uint64_t round_ GUARDED_BY(shell_.mu()) = 0;
  size_t outstanding_tx_ GUARDED_BY(shell_.mu()) = 0;
  std::unordered_map<uint64_t, InFlight*> inflight_ GUARDED_BY(shell_.mu());
  // Posts with ops not yet handed to the provider, in order.
  std::list<InFlight*> issuing_ GUARDED_BY(shell_.mu());
  // Notifications refused with -FI_EAGAIN.
  std::deque<InFlight*> notify_queue_ GUARDED_BY(shell_.mu());
  // Hold messages in flight (freed after the endpoint).
  std::unordered_set<HoldSend*> holds_ GUARDED_BY(shell_.mu());
  std::unique_ptr<HoldSend> spare_hold_ GUARDED_BY(shell_.mu());  // reused after a refused send
  std::vector<std::unique_ptr<InFlight>> orphans_ GUARDED_BY(shell_.mu());
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeLibfabricBackend(const LibfabricOptions& options) {
  auto b = std::make_unique<LibfabricBackend>(options);
  KVP_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace kvpush::xfer
