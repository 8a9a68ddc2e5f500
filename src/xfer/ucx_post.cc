// The UCX backend's post path (ucx_backend_internal.h): Post / TryPostInline / ProgressCaller /
// Abort, issuing ops (UCP put/get or copies into mapped peer regions), the flush that makes them
// remotely complete, the notification after the data, and completion.
#include <ucp/api/ucp.h>

#include <cstring>

#include "xfer/ucx_backend_internal.h"

namespace kvpush::xfer::ucx_internal {

Status UcxBackend::Post(PostRequest request) {
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

InlinePost UcxBackend::TryPostInline(PostRequest& request, Status* status) {
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

bool UcxBackend::ProgressCaller() {
  if (!shell_.mu().TryLock()) return false;
  MutexLock lock(shell_.mu(), std::adopt_lock);
  if (shell_.stopping()) return false;
  bool any = false;
  while (ucp_worker_progress(worker_) != 0) any = true;
  if (any) shell_.NoteActivity();
  return any;
}

void UcxBackend::Abort(uint64_t token) {
  shell_.Enqueue([this, token] {
    shell_.mu().AssertHeld();  // jobs run under the worker lock
    auto it = inflight_.find(token);
    if (it != inflight_.end() && !it->second->aborted) {
      it->second->aborted = true;
      --active_;
    }
  });
}

void UcxBackend::Complete(InFlight* f, Status s) {
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

Result<bool> UcxBackend::IssueOps(const PostRequest& req, UcxPeer* peer) {
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

void UcxBackend::Issue(InFlight* f) {
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
      Ring(peer);  // emulated RMA on shm needs the peer's progress
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

void UcxBackend::OnFlushDone(void* request, ucs_status_t status, void* user_data) {
  auto* f = static_cast<InFlight*>(user_data);
  f->owner->shell_.mu().AssertHeld();  // UCX calls back from ucp_worker_progress
  ucp_request_free(request);
  f->ucx_owned = false;
  if (status != UCS_OK || f->reported) return f->owner->Complete(f, FromUcs(status, "flush"));
  f->owner->AfterData(f);
}

void UcxBackend::AfterData(InFlight* f) {
  if (f->req.notification.empty()) return Complete(f, Status::Ok());
  if (!f->req.control->BeginNotify()) return Complete(f, Cancelled("ucx: aborted before notify"));
  auto* peer = static_cast<UcxPeer*>(f->req.peer.get());
  if (peer->closed || peer->failed) return Complete(f, PeerGone("ucx: peer failed before notify"));
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
  if (p == nullptr) {
    Ring(peer);  // the notification sits in the peer's FIFO: wake it (OnAmDone does otherwise)
    return Complete(f, Status::Ok());
  }
  f->ucx_owned = true;  // OnAmDone follows
}

}  // namespace kvpush::xfer::ucx_internal
