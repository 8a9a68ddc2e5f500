// Internal to the libfabric backend (libfabric_backend.cc: setup, regions, peers, progress hooks;
// libfabric_post.cc: issuing, progress holds, notifications, completions): its constants, the
// per-region / per-peer / per-post types and the LibfabricBackend class. Not part of the xfer API;
// include only from those two files. Threading: see libfabric_backend.h; the progress lock is the
// ProgressShell's mu().
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "xfer/backend.h"
#include "xfer/libfabric_backend.h"
#include "xfer/progress_shell.h"

namespace kvpush::xfer::libfabric_internal {

constexpr size_t kRecvBuffers = 64;
/// Bytes of each posted receive on shm (notifications only).
constexpr size_t kRecvBytesShm = 8192;
/// tcp;ofi_rxm sends a message eagerly only up to its buffer size (FI_OFI_RXM_BUFFER_SIZE,
/// 16384 by default, less its own header); a larger one goes by rendezvous, which waits for
/// both sides' progress threads and took 1.5 ms for a 20 KiB frame here, five times a WRITE and
/// its notification. So eager WRITE frames stay within it: messages up to the buffer size less
/// kRxmHeaderRoom, eager WRITEs' data up to that less kEagerFrameRoom (docs/xfer.md).
constexpr size_t kRxmDefaultBufferSize = 16384;
constexpr size_t kRxmHeaderRoom = 256;
constexpr size_t kEagerFrameRoom = 4096;
/// rxm's buffer size in this process: FI_OFI_RXM_BUFFER_SIZE when set and sane, else 16384.
size_t RxmBufferSize();

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

/// The hold frame asking the target to keep polling for `hold_us` microseconds.
std::vector<uint8_t> HoldFrame(uint32_t hold_us);
/// True if `m` is a hold frame; `*hold_us` receives its duration.
bool IsHoldFrame(std::span<const uint8_t> m, uint32_t* hold_us);
std::string FiText(ssize_t rc);
/// Maps a libfabric error (negative or positive errno) to a Status code that keeps the cause.
Status FromFi(ssize_t err, const std::string& what);

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

  Status Init();

  ~LibfabricBackend() override;

  const BackendCaps& caps() const override { return caps_; }
  void SetSink(BackendSink* sink) override { sink_ = sink; }
  std::vector<uint8_t> LocalAddress() const override { return address_; }

  Result<std::unique_ptr<BackendRegion>> RegisterMemory(void* addr, uint64_t length,
                                                        MemoryType type) override;
  Result<std::unique_ptr<BackendRegion>> AllocateMemory(uint64_t length, MemoryType type,
                                                        void** addr) override;
  // Allocated memory is kept until the endpoint is closed (a late remote write must not land in
  // freed memory); caller memory is deregistered now. The region's own data (its memory
  // descriptor, which a post being issued may read) is kept by the shell until its thread is
  // joined.
  void ReleaseMemory(std::unique_ptr<BackendRegion> region) override;

  Result<std::shared_ptr<BackendPeer>> Connect(std::span<const uint8_t> address) override;
  Result<std::shared_ptr<BackendRemoteRegion>> ImportRegion(BackendPeer*,
                                                            std::span<const uint8_t> key, uint64_t,
                                                            uint64_t) override;
  void Disconnect(std::shared_ptr<BackendPeer> peer,
                  std::vector<std::shared_ptr<BackendRemoteRegion>>) override {
    if (peer == nullptr) return;
    shell_.Enqueue([peer] { static_cast<FiPeer*>(peer.get())->closed = true; });
  }

  Status Post(PostRequest request) override;
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
  Status PostRecv(size_t i) REQUIRES(shell_.mu());

  void Finish(InFlight* f, Status s) REQUIRES(shell_.mu()) {
    inflight_.erase(f->req.token);
    shell_.NoteActivity();
    sink_->OnPostDone(f->req.token, std::move(s));
    delete f;
  }

  // Registers a post; its ops are handed to the provider by IssueSome.
  void Issue(InFlight* f) REQUIRES(shell_.mu());

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
  bool IssueSome() REQUIRES(shell_.mu());

  // Sends a hold message to the peer of every post that is held up by its target, at most one in
  // flight per peer and one per kHoldRenewNs. Returns whether any was handed over.
  bool SendHolds() REQUIRES(shell_.mu());

  void AfterData(InFlight* f) REQUIRES(shell_.mu());

  // Hands the notification to the provider, or queues it for a later round on -FI_EAGAIN.
  void SendNotification(InFlight* f) REQUIRES(shell_.mu());
  bool RetryNotifications() REQUIRES(shell_.mu()) {
    if (notify_queue_.empty()) return false;
    std::deque<InFlight*> queue;
    queue.swap(notify_queue_);
    for (InFlight* f : queue) SendNotification(f);
    return notify_queue_.size() < queue.size();
  }

  void OnCompletion(Ctx* c, Status s, size_t len) REQUIRES(shell_.mu());

  // Reads the CQ; returns the number of entries handled.
  size_t Poll() REQUIRES(shell_.mu());

  // ---- ProgressHooks: called by the shell's progress thread under the progress lock ----

  bool Progress() override;
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
  void OnStopped() override;

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
  size_t recv_bytes_ = kRecvBytesShm;  // bytes of each posted receive buffer
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

}  // namespace kvpush::xfer::libfabric_internal
