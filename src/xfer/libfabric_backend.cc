#include "xfer/libfabric_backend.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <cstdlib>
#include <cstring>

#include "common/clock.h"
#include "xfer/byte_io.h"
#include "xfer/libfabric_backend_internal.h"

namespace kvpush::xfer {
namespace libfabric_internal {

std::vector<uint8_t> HoldFrame(uint32_t hold_us) {
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.U32(kHoldMagic);
  w.U16(1);
  w.U16(0);
  w.U32(hold_us);
  return out;
}
size_t RxmBufferSize() {
  // The operator's FI_OFI_RXM_BUFFER_SIZE (read, never set, here), else rxm's default.
  const char* env = std::getenv("FI_OFI_RXM_BUFFER_SIZE");
  const long v = env != nullptr ? std::strtol(env, nullptr, 10) : 0;
  return v >= static_cast<long>(kRxmHeaderRoom + kEagerFrameRoom + 1024) && v <= (64l << 20)
             ? static_cast<size_t>(v)
             : kRxmDefaultBufferSize;
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

Status LibfabricBackend::Init() {
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
  // tcp: a WRITE's notification waits for FI_DELIVERY_COMPLETE (a round trip); a small WRITE
  // goes as one eager frame instead (the Agent's), as large as rxm sends eagerly.
  recv_bytes_ = is_shm ? kRecvBytesShm : RxmBufferSize() - kRxmHeaderRoom;
  caps_.max_message_bytes = static_cast<uint32_t>(recv_bytes_);
  caps_.eager_write_max_bytes = is_shm ? 0 : recv_bytes_ - kEagerFrameRoom;
  idle_timeout_ms_ = is_shm ? 1 : 1000;
  tx_limit_ = info_->tx_attr->size > 0 ? info_->tx_attr->size : 1024;
  hold_enabled_ = caps_.needs_target_progress;
  // A shm target polls on a timer (no wait fd) and incoming RMA never wakes it, so every WRITE
  // asks for a hold from its first round, not only once it is held up: a stream of small
  // WRITEs then keeps the target polling instead of waiting up to 1 ms each.
  hold_from_start_ = hold_enabled_ && is_shm;
  hold_frame_ = HoldFrame(kHoldUs);
  if ((rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr)) != 0) return FromFi(rc, "fi_fabric");
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
  recv_pool_.resize(kRecvBuffers * recv_bytes_);
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

LibfabricBackend::~LibfabricBackend() {
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

Result<std::unique_ptr<BackendRegion>> LibfabricBackend::RegisterMemory(void* addr, uint64_t length,
                                                                        MemoryType type) {
  if (type != MemoryType::kHost) return Unimplemented("libfabric: only host memory");
  auto r = std::make_unique<FiRegion>();
  Status st = shell_.RunSync([&]() -> Status {
    shell_.mu().AssertHeld();  // runs on the progress thread
    uint64_t requested = next_key_++;
    int rc = fi_mr_reg(domain_, addr, length,
                       FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_SEND | FI_RECV, 0,
                       requested, 0, &r->mr, nullptr);
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

Result<std::unique_ptr<BackendRegion>> LibfabricBackend::AllocateMemory(uint64_t length,
                                                                        MemoryType type,
                                                                        void** addr) {
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

void LibfabricBackend::ReleaseMemory(std::unique_ptr<BackendRegion> region) {
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

Result<std::shared_ptr<BackendPeer>> LibfabricBackend::Connect(std::span<const uint8_t> address) {
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

Result<std::shared_ptr<BackendRemoteRegion>> LibfabricBackend::ImportRegion(
    BackendPeer*, std::span<const uint8_t> key, uint64_t, uint64_t) {
  ByteReader rd(key);
  auto r = std::make_shared<FiRemote>();
  if (!rd.U64(&r->key) || rd.remaining() != 0) return InvalidArgument("libfabric: bad key blob");
  return std::shared_ptr<BackendRemoteRegion>(std::move(r));
}

bool LibfabricBackend::Progress() {
  shell_.mu().AssertHeld();
  bool progressed = SendHolds();
  progressed |= IssueSome();
  progressed |= RetryNotifications();
  while (Poll() > 0) progressed = true;
  return progressed;
}

void LibfabricBackend::OnStopped() {
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

}  // namespace libfabric_internal

Result<std::unique_ptr<Backend>> MakeLibfabricBackend(const LibfabricOptions& options) {
  auto b = std::make_unique<libfabric_internal::LibfabricBackend>(options);
  KVP_RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace kvpush::xfer
