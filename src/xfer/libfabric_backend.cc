#include "xfer/libfabric_backend.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "common/clock.h"
#include "xfer/byte_io.h"

namespace kvpush::xfer {
namespace {

constexpr size_t kRecvBuffers = 64;
constexpr size_t kRecvBytes = 8192;

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
  bool failed = false;  // progress thread only
  bool closed = false;  // progress thread only
};
struct FiRemote : BackendRemoteRegion {
  uint64_t key = 0;
};

struct InFlight;
enum class CtxKind : uint8_t { kData, kNotify, kRecv };
// Completion context; starts with fi_context2 as FI_CONTEXT/FI_CONTEXT2 modes require.
struct Ctx {
  fi_context2 fi;
  CtxKind kind = CtxKind::kData;
  InFlight* flight = nullptr;
  size_t recv_index = 0;
};
struct InFlight {
  PostRequest req;
  std::vector<Ctx> ctx;  // one per op (one allocation per post)
  Ctx notify;
  size_t remaining = 0;
  Status error;
  bool aborted = false;
};

class LibfabricBackend final : public Backend {
 public:
  explicit LibfabricBackend(LibfabricOptions o) : options_(std::move(o)) {}

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
    for (size_t i = 0; i < kRecvBuffers; ++i) {
      recv_ctx_[i].kind = CtxKind::kRecv;
      recv_ctx_[i].recv_index = i;
      KVP_RETURN_IF_ERROR(PostRecv(i));
    }
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    for (int fd : {cq_fd_, wake_fd_}) {
      if (fd < 0) continue;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = fd;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    }
    thread_ = std::thread([this] { ProgressLoop(); });
    return Status::Ok();
  }

  ~LibfabricBackend() override {
    if (thread_.joinable()) {
      shutdown_.store(true);
      Enqueue([this] { stopping_ = true; });
      thread_.join();
    }
    if (ep_) fi_close(&ep_->fid);
    for (fid_mr* mr : close_at_exit_) fi_close(&mr->fid);
    for (void* p : free_at_exit_) std::free(p);
    if (cq_) fi_close(&cq_->fid);
    if (av_) fi_close(&av_->fid);
    if (domain_) fi_close(&domain_->fid);
    if (fabric_) fi_close(&fabric_->fid);
    if (info_) fi_freeinfo(info_);
    if (wake_fd_ >= 0) close(wake_fd_);
    if (epoll_fd_ >= 0) close(epoll_fd_);
  }

  const BackendCaps& caps() const override { return caps_; }
  void SetSink(BackendSink* sink) override { sink_ = sink; }
  std::vector<uint8_t> LocalAddress() const override { return address_; }

  Result<std::unique_ptr<BackendRegion>> RegisterMemory(void* addr, uint64_t length,
                                                        MemoryType type) override {
    if (type != MemoryType::kHost) return Unimplemented("libfabric: only host memory");
    auto r = std::make_unique<FiRegion>();
    Status st = RunSync([&]() -> Status {
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
  // freed memory); caller memory is deregistered now.
  void ReleaseMemory(std::unique_ptr<BackendRegion> region) override {
    auto* r = static_cast<FiRegion*>(region.get());
    if (r->owned != nullptr) {
      std::lock_guard lock(mu_);
      close_at_exit_.push_back(r->mr);
      free_at_exit_.push_back(r->owned);
      retired_regions_.push_back(std::move(region));
      return;
    }
    Status s = RunSync([&] {
      fi_close(&r->mr->fid);
      return Status::Ok();
    });
    (void)s;
    std::lock_guard lock(mu_);
    retired_regions_.push_back(std::move(region));
  }

  Result<std::shared_ptr<BackendPeer>> Connect(std::span<const uint8_t> address) override {
    if (address.empty()) return InvalidArgument("libfabric: empty address");
    auto p = std::make_shared<FiPeer>();
    std::vector<uint8_t> a(address.begin(), address.end());
    Status st = RunSync([&]() -> Status {
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
    Enqueue([peer] { static_cast<FiPeer*>(peer.get())->closed = true; });
  }

  Status Post(PostRequest request) override {
    if (request.peer == nullptr) return InvalidArgument("libfabric: post without peer");
    auto* f = new InFlight{std::move(request), {}, {}, 0, Status::Ok(), false};
    Enqueue([this, f] { Issue(f); });
    return Status::Ok();
  }
  void Abort(uint64_t token) override {
    Enqueue([this, token] {
      auto it = inflight_.find(token);
      if (it != inflight_.end()) it->second->aborted = true;
    });
  }
  BackendStats stats() const override {
    return {stat_posts_.load(), stat_ops_.load(), stat_issue_ns_.load(),
            stat_last_issue_ns_.load()};
  }

 private:
  Status PostRecv(size_t i) {
    ssize_t rc;
    do {
      rc = fi_recv(ep_, recv_pool_.data() + i * kRecvBytes, kRecvBytes, nullptr, FI_ADDR_UNSPEC,
                   &recv_ctx_[i]);
      if (rc == -FI_EAGAIN) Poll();
    } while (rc == -FI_EAGAIN);
    return rc == 0 ? Status::Ok() : FromFi(rc, "fi_recv");
  }

  void Enqueue(std::function<void()> job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
      pending_.fetch_add(1, std::memory_order_seq_cst);
    }
    if (sleeping_.load(std::memory_order_seq_cst)) {
      uint64_t one = 1;
      ssize_t n = write(wake_fd_, &one, sizeof(one));
      (void)n;
    }
  }
  Status RunSync(const std::function<Status()>& fn) {
    if (!thread_.joinable() || std::this_thread::get_id() == thread_.get_id()) return fn();
    std::promise<Status> done;
    Enqueue([&] { done.set_value(fn()); });
    return done.get_future().get();
  }

  void Finish(InFlight* f, Status s) {
    inflight_.erase(f->req.token);
    last_activity_ns_ = NowNs();
    sink_->OnPostDone(f->req.token, std::move(s));
    delete f;
  }

  void Issue(InFlight* f) {
    auto* peer = static_cast<FiPeer*>(f->req.peer.get());
    if (peer->closed || peer->failed)
      return Finish(f, PeerGone("libfabric: peer disconnected or failed"));
    if (f->req.control->aborted()) return Finish(f, Cancelled("libfabric: aborted before issue"));
    inflight_[f->req.token] = f;
    const auto& ops = f->req.batch ? f->req.batch->ops : std::vector<XferOp>{};
    if (ops.empty()) return AfterData(f);
    const int64_t t0 = NowNs();
    f->ctx.resize(ops.size());
    f->remaining = ops.size();
    const bool write = f->req.op == Op::kWrite;
    for (size_t i = 0; i < ops.size(); ++i) {
      const XferOp& op = ops[i];
      f->ctx[i].kind = CtxKind::kData;
      f->ctx[i].flight = f;
      iovec iov{reinterpret_cast<void*>(op.local_addr), op.length};
      void* desc = static_cast<const FiRegion*>(op.local)->desc;
      fi_rma_iov rma{op.remote_addr, op.length, static_cast<const FiRemote*>(op.remote)->key};
      fi_msg_rma msg{&iov, &desc, 1, peer->addr, &rma, 1, &f->ctx[i], 0};
      ssize_t rc;
      while (true) {
        rc = write ? fi_writemsg(ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE)
                   : fi_readmsg(ep_, &msg, FI_COMPLETION);
        if (rc != -FI_EAGAIN) break;
        // A stalled peer can keep the queue full: give up once the agent aborted the post.
        if (f->req.control->aborted() || shutdown_.load()) {
          rc = -FI_ECANCELED;
          break;
        }
        Poll();
      }
      if (rc != 0) {
        // Ops already posted still complete; account for the ones that never will.
        f->remaining -= ops.size() - i;
        f->error = FromFi(rc, write ? "fi_writemsg" : "fi_readmsg");
        if (f->remaining == 0) Finish(f, f->error);
        return;
      }
    }
    const int64_t dt = NowNs() - t0;
    stat_posts_.fetch_add(1);
    stat_ops_.fetch_add(ops.size());
    stat_issue_ns_.fetch_add(dt);
    stat_last_issue_ns_.store(dt);
  }

  void AfterData(InFlight* f) {
    if (!f->error.ok()) return Finish(f, f->error);
    if (f->req.notification.empty()) return Finish(f, Status::Ok());
    if (!f->req.control->BeginNotify())
      return Finish(f, Cancelled("libfabric: aborted before notify"));
    auto* peer = static_cast<FiPeer*>(f->req.peer.get());
    if (peer->closed || peer->failed)
      return Finish(f, PeerGone("libfabric: peer failed before notify"));
    f->notify.kind = CtxKind::kNotify;
    f->notify.flight = f;
    ssize_t rc;
    while ((rc = fi_send(ep_, f->req.notification.data(), f->req.notification.size(), nullptr,
                         peer->addr, &f->notify)) == -FI_EAGAIN) {
      if (shutdown_.load()) {
        rc = -FI_ECANCELED;
        break;
      }
      Poll();
    }
    if (rc != 0) Finish(f, FromFi(rc, "fi_send"));
  }

  void OnCompletion(Ctx* c, Status s, size_t len) {
    switch (c->kind) {
      case CtxKind::kRecv:
        if (s.ok())
          sink_->OnMessage(std::span(recv_pool_.data() + c->recv_index * kRecvBytes, len));
        if (!stopping_) (void)PostRecv(c->recv_index);
        return;
      case CtxKind::kNotify:
        return Finish(c->flight, std::move(s));
      case CtxKind::kData: {
        InFlight* f = c->flight;
        if (!s.ok() && f->error.ok()) f->error = std::move(s);
        if (--f->remaining == 0) AfterData(f);
        return;
      }
    }
  }

  // Reads the CQ; returns the number of entries handled.
  size_t Poll() {
    fi_cq_data_entry e[64];
    ssize_t n = fi_cq_read(cq_, e, 64);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i)
        OnCompletion(static_cast<Ctx*>(e[i].op_context), Status::Ok(), e[i].len);
      last_activity_ns_ = NowNs();
      return size_t(n);
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry err{};
      if (fi_cq_readerr(cq_, &err, 0) > 0 && err.op_context != nullptr) {
        auto* c = static_cast<Ctx*>(err.op_context);
        Status s = FromFi(err.err, "completion");
        if (c->kind != CtxKind::kRecv && s.code() == StatusCode::kPeerGone) {
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

  void RunJobs() {
    std::deque<std::function<void()>> jobs;
    {
      std::lock_guard lock(mu_);
      jobs.swap(jobs_);
      pending_.store(0, std::memory_order_seq_cst);
    }
    for (auto& j : jobs) j();
    if (!jobs.empty()) last_activity_ns_ = NowNs();
  }

  void ProgressLoop() {
    while (!stopping_) {
      RunJobs();
      while (Poll() > 0) {
      }
      size_t active = 0;
      for (auto& [t, f] : inflight_) active += f->aborted ? 0 : 1;
      if (active > 0 || NowNs() - last_activity_ns_ < 50'000) continue;
      sleeping_.store(true, std::memory_order_seq_cst);
      if (pending_.load(std::memory_order_seq_cst) == 0) {
        fid* fids[1] = {&cq_->fid};
        bool can_wait = cq_fd_ >= 0 && fi_trywait(fabric_, fids, 1) == FI_SUCCESS;
        epoll_event ev[2];
        int n = epoll_wait(epoll_fd_, ev, 2, can_wait ? idle_timeout_ms_ : 1);
        for (int i = 0; i < n; ++i)
          if (ev[i].data.fd == wake_fd_) {
            uint64_t v;
            ssize_t r = read(wake_fd_, &v, sizeof(v));
            (void)r;
          }
      }
      sleeping_.store(false, std::memory_order_seq_cst);
    }
    // Posts still outstanding are reported; their contexts are freed after the endpoint closes.
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
  int cq_fd_ = -1, wake_fd_ = -1, epoll_fd_ = -1;
  int idle_timeout_ms_ = 1000;
  std::vector<uint8_t> address_;
  std::vector<uint8_t> recv_pool_;
  std::vector<Ctx> recv_ctx_;

  std::mutex mu_;
  std::deque<std::function<void()>> jobs_;
  std::vector<fid_mr*> close_at_exit_;
  std::vector<void*> free_at_exit_;
  // Released regions' backend data: a post still being issued on the progress thread may read it
  // (its memory descriptor), so it is freed only after that thread has been joined.
  std::vector<std::unique_ptr<BackendRegion>> retired_regions_;
  std::atomic<size_t> pending_{0};
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> shutdown_{false};
  std::thread thread_;
  std::atomic<uint64_t> stat_posts_{0}, stat_ops_{0};
  std::atomic<int64_t> stat_issue_ns_{0}, stat_last_issue_ns_{0};

  // Progress thread only.
  bool stopping_ = false;
  uint64_t next_key_ = 1;
  int64_t last_activity_ns_ = 0;
  std::unordered_map<uint64_t, InFlight*> inflight_;
  std::vector<std::unique_ptr<InFlight>> orphans_;
};

}  // namespace

Result<std::unique_ptr<Backend>> MakeLibfabricBackend(const LibfabricOptions& options) {
  auto b = std::make_unique<LibfabricBackend>(options);
  KVP_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace kvpush::xfer
