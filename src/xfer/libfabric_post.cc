// The libfabric backend's post path (libfabric_backend_internal.h): posts handed to the provider in
// rounds (tx_attr->size at most outstanding, -FI_EAGAIN retried), progress holds to a target that
// holds a post up, notifications after the data, and completion-queue handling.
#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>

#include "common/clock.h"
#include "xfer/byte_io.h"
#include "xfer/libfabric_backend_internal.h"

namespace kvpush::xfer::libfabric_internal {

bool IsHoldFrame(std::span<const uint8_t> m, uint32_t* hold_us) {
  ByteReader r(m);
  uint32_t magic = 0;
  uint16_t version = 0, zero = 0;
  return m.size() == kHoldFrameBytes && r.U32(&magic) && magic == kHoldMagic && r.U16(&version) &&
         version == 1 && r.U16(&zero) && r.U32(hold_us);
}

Status LibfabricBackend::Post(PostRequest request) {
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

Status LibfabricBackend::PostRecv(size_t i) {
  ssize_t rc;
  do {
    rc = fi_recv(ep_, recv_pool_.data() + i * recv_bytes_, recv_bytes_, nullptr, FI_ADDR_UNSPEC,
                 &recv_ctx_[i]);
    if (rc == -FI_EAGAIN) Poll();
  } while (rc == -FI_EAGAIN);
  return rc == 0 ? Status::Ok() : FromFi(rc, "fi_recv");
}

void LibfabricBackend::Issue(InFlight* f) {
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

bool LibfabricBackend::IssueSome() {
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

bool LibfabricBackend::SendHolds() {
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

void LibfabricBackend::AfterData(InFlight* f) {
  if (!f->error.ok()) return Finish(f, f->error);
  if (f->req.notification.empty()) return Finish(f, Status::Ok());
  if (!f->req.control->BeginNotify())
    return Finish(f, Cancelled("libfabric: aborted before notify"));
  f->notify.kind = CtxKind::kNotify;
  f->notify.flight = f;
  SendNotification(f);
}

void LibfabricBackend::SendNotification(InFlight* f) {
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

void LibfabricBackend::OnCompletion(Ctx* c, Status s, size_t len) {
  switch (c->kind) {
    case CtxKind::kRecv:
      if (s.ok()) {
        std::span<const uint8_t> m(recv_pool_.data() + c->recv_index * recv_bytes_, len);
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

size_t LibfabricBackend::Poll() {
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

}  // namespace kvpush::xfer::libfabric_internal
