// UCX backend (UCP): RMA put/get with rkeys, active messages for notifications, and one progress
// thread. The UCP worker is used under one lock (UCS_THREAD_MODE_SERIALIZED): by the progress
// thread, which runs queued work and sleeps in epoll on the worker's event fd when nothing is
// outstanding (busy-polling only while posts are in flight), and by callers' fast paths: a small
// post is issued on the caller's thread when the worker is free and nothing is queued ahead
// (TryPostInline), and a waiter progresses the worker itself (ProgressCaller), so a short
// transfer crosses no thread. On shared memory, a peer region UCX allocated is mapped into this
// process (ucp_rkey_ptr) and its ops are plain memcpy: no UCP request, no flush.
//
// Notification-after-data: the notification AM is sent only from the completion callback of a
// ucp_ep_flush_nbx issued after the transfer's last put/get; flush completion means the RMA is
// remotely complete on every transport (a fence only orders, and an AM can be handled on another
// lane before an emulated put is applied). docs/xfer.md "Backend choices" has the reasoning.
//
// Transport presets (UcxOptions::preset):
//   "tcp" : UCX_TLS=tcp on the loopback device, UCP_ERR_HANDLING_MODE_PEER (peer death is reported
//           as kPeerGone). RMA over tcp is emulated by the target's progress thread.
//   "shm" : UCX_TLS=sm (posix, sysv, cma), no peer error mode (it excludes posix/sysv). Regions
//           allocated through the backend (ucp_mem_map ALLOCATE) are truly one-sided; registered
//           user memory goes through cma or AM emulation. Peer death shows up as the stall
//           deadline. Event-fd wakeups of these transports were unreliable here, so the idle thread
//           sleeps at most 1 ms between polls (about 1000 cheap wakeups/s, no busy core).
// The progress thread, its job queue, wake-up, linger and the pidfd peer watch are the shared
// ProgressShell (progress_shell.h); its lock is the worker lock. Code: ucx_backend.cc (setup,
// regions, peers, progress hooks), ucx_post.cc (the post path).
// Thread-safety: as Backend.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "xfer/backend.h"

namespace kvpush::xfer {

struct UcxOptions {
  std::string preset = "tcp";  ///< "tcp" or "shm" (see file comment)
  /// Overrides UCX_TLS of the preset when non-empty (e.g. "posix,cma" for experiments).
  std::string transports;
  /// Busy-poll this long after the last activity (a job, a completion, or any incoming traffic)
  /// before sleeping in epoll, microseconds. Keeps a target hot while a stream of emulated RMA
  /// arrives; an idle thread still sleeps.
  int linger_us = 50;
  /// Posts of at most this many bytes are issued on the caller's thread when the worker is free
  /// and nothing is queued ahead of them (Backend::TryPostInline); larger ones go to the progress
  /// thread, so a big copy never runs inside Agent::Post. 0 = always hand off.
  uint64_t inline_max_bytes = 256 * 1024;
  /// Map peers' regions with ucp_rkey_ptr where the transport allows it (shm, on memory UCX
  /// allocated) and move their bytes with plain copies instead of UCP requests.
  bool direct_access = true;
};

/// Creates the UCP context, worker and progress thread. Errors: kInvalidArgument (unknown preset),
/// kUnavailable (UCX init failed, with UCX's status string).
Result<std::unique_ptr<Backend>> MakeUcxBackend(const UcxOptions& options);

}  // namespace kvpush::xfer
