// libfabric backend: RDM endpoints with FI_RMA for data and FI_MSG for notifications, one progress
// thread that owns the endpoint and its completion queue (other threads hand it work through a
// queue), sleeping on the CQ's wait fd (FI_WAIT_FD + fi_trywait) when nothing is outstanding.
//
// Providers: "tcp;ofi_rxm" (works here; offset addressing, application-chosen keys) and "shm"
// (virtual-address addressing); "efa" on AWS. Both addressing modes (FI_MR_VIRT_ADDR or offsets)
// and both key kinds (FI_MR_PROV_KEY or keys chosen by this backend) are handled from what the
// provider returns in fi_info; BackendCaps reports the result.
//
// Notification-after-data: every WRITE is posted with FI_DELIVERY_COMPLETE, so its completion
// means the data is visible at the target; the notification is sent only after all of a post's
// writes completed. READ completions mean the data is local. (Local completion of a plain write,
// FI_TRANSMIT_COMPLETE, is never taken as remote visibility.)
//
// Issuing: the progress thread hands ops to the provider in rounds between reads of the CQ, never
// more than tx_attr->size outstanding; an op refused with -FI_EAGAIN is retried in a later round,
// and posts to other peers go on meanwhile.
//
// Target progress: with FI_PROGRESS_MANUAL (both providers here) a target's provider moves data
// only while the target polls, incoming RMA gives the target no completion to notice, and an idle
// target polls only every 1 ms (shm). So an initiator whose post is held up by its target (an op
// got -FI_EAGAIN), and on shm every WRITE post from its first round, sends the target a 12-byte
// "hold" message (magic 'KVPH', not a notification frame) every 0.5 ms while that post is in
// flight; the target busy-polls for 2 ms after each. shm needs
// this: a write of <= 4 KiB with FI_DELIVERY_COMPLETE takes shm's SAR protocol, one in flight per
// peer, each needing a target poll (18,880 8-byte writes: 22 s without holds, 72 ms with).
// The progress thread, its job queue, wake-up and linger are the shared ProgressShell
// (progress_shell.h). Code: libfabric_backend.cc (setup, regions, peers, progress hooks),
// libfabric_post.cc (issuing, holds, notifications, completions).
// Thread-safety: as Backend.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "xfer/backend.h"

namespace kvpush::xfer {

struct LibfabricOptions {
  std::string provider = "tcp;ofi_rxm";  ///< fi_getinfo provider name
  std::string node = "127.0.0.1";        ///< local address to bind (tcp); loopback only in tests
};

/// Opens fabric, domain, AV, CQ and endpoint. Errors: kUnavailable with fi_strerror text when the
/// provider is missing or lacks FI_RMA on this machine.
Result<std::unique_ptr<Backend>> MakeLibfabricBackend(const LibfabricOptions& options);

}  // namespace kvpush::xfer
