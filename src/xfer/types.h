// Value types of the transfer engine API: handles, descriptors, operations and transfer states.
//
// Handles (RegionId, ListHandle, TransferHandle) are (index, generation) pairs into tables owned by
// the Agent; every handle passed in is checked against the table's generation, so a stale or forged
// handle is refused with kNotFound instead of touching freed state. Handles are plain values:
// copyable and safe to pass between threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace kvpush::xfer {

/// Where a region's memory lives. Only kHost is implemented; kDevice is reserved so that device
/// memory (GPU HBM) can be added without an API change. Encoded as one byte in metadata.
enum class MemoryType : uint8_t { kHost = 0, kDevice = 1 };

/// Direction of a one-sided transfer, seen from the initiator: kRead pulls remote bytes into local
/// memory, kWrite pushes local bytes into remote memory.
enum class Op : uint8_t { kRead = 0, kWrite = 1 };

/// Packs an (index, generation) pair into one comparable 64-bit value.
struct HandleBits {
  uint32_t index = 0;
  uint32_t generation = 0;  ///< 0 is never issued: a default-constructed handle is invalid
  uint64_t packed() const { return (static_cast<uint64_t>(generation) << 32) | index; }
  static HandleBits Unpack(uint64_t v) {
    return {static_cast<uint32_t>(v & 0xffffffffu), static_cast<uint32_t>(v >> 32)};
  }
  friend bool operator==(const HandleBits&, const HandleBits&) = default;
};

/// A registered region of an agent (local, or a peer's as listed in its metadata).
struct RegionId : HandleBits {};
/// A prepared descriptor list (local or remote).
struct ListHandle : HandleBits {};
/// A prepared, re-postable transfer.
struct TransferHandle : HandleBits {};

/// One byte range inside a region: `length` bytes at `offset` bytes from the region start.
/// For a local list `region` is a local RegionId; for a remote list it is the peer's RegionId as
/// exported in its metadata. Requirement: length > 0 and offset + length <= region length.
struct Desc {
  RegionId region;
  uint64_t offset = 0;
  uint64_t length = 0;
};

/// Lifecycle of a transfer. kIdle: prepared, never posted (or reset). kInProgress: posted, not
/// finished. kDone: all data is visible at the destination and the notification (if any) was sent.
/// kError: finished with an error; TransferStatus::error says why (kPeerGone, kDeadlineExceeded,
/// kCancelled, kOutOfRange, kInvalidArgument, kUnavailable, kInternal, ...).
enum class TransferState : uint8_t { kIdle = 0, kInProgress, kDone, kError };

/// Returns "idle", "in_progress", "done" or "error".
const char* TransferStateName(TransferState s);

/// State of a transfer plus the error when state == kError.
struct TransferStatus {
  TransferState state = TransferState::kIdle;
  Status error;
  /// True once the backend reported the post's end: none of its data ops can land any more and
  /// its notification will not be sent later. A transfer the agent ended early (Agent::Cancel,
  /// the stall deadline, its peer dropped) is kError with settled false until then; memory the
  /// post writes into (a READ's local blocks, a WRITE's remote ones) is safe to reuse only once it
  /// is true. Always true for kIdle and kDone.
  bool settled = true;
};

/// A notification received from a peer: who sent it (name and incarnation) and its payload.
struct Notification {
  std::string peer;
  uint64_t peer_incarnation = 0;
  std::vector<uint8_t> payload;
  /// This agent's connection to the sender (PeerInfo::connection) when it arrived; 0 when none
  /// was alive. A message that arrived before a reconnect carries the old one.
  uint64_t connection = 0;
};

/// Agent configuration. Plain value; validated by Agent::Create.
struct AgentOptions {
  /// Agent name, unique among the agents that talk to each other. 1..255 bytes.
  std::string name;
  /// Incarnation id; 0 picks a random non-zero 64-bit value (the normal case). Tests may fix it.
  uint64_t incarnation = 0;
  /// A posted transfer ends in kDeadlineExceeded once this long passed since the later of its
  /// post and the last successful completion of any post to the same peer (its connection's
  /// last progress): a transfer queued behind others that keep completing is not stalled, one
  /// whose peer stopped answering is (docs/xfer.md, *Stall deadline*).
  std::chrono::milliseconds stall_timeout{10000};
  /// A post's deadline also allows its bytes the time they take at this bandwidth, bytes per
  /// second (0: none): one large op completes only at its end, so a 4 GiB READ over tcp would
  /// otherwise be "stalled" while it moves. The default, 100 MB/s, gives 4 GiB 43 s more; a
  /// wedged peer is still found within stall_timeout of its last completion plus that.
  uint64_t stall_floor_bytes_per_s = 100'000'000;
  /// Agent::Wait spins this long before blocking on a condition variable, microseconds (0 = block
  /// at once). While it spins it drives the backend's progress on the caller's thread
  /// (Backend::ProgressCaller), so a short transfer completes without any thread hand-off; after
  /// it the backend's own progress thread completes it and the waiter is woken.
  int wait_spin_us = 100;
  /// Largest notification payload accepted for sending, bytes (receivers refuse larger frames).
  uint32_t max_notification_bytes = 4096;
  /// A WRITE with a notification that moves at most this many bytes goes as one eager frame (its
  /// data and notification in one message, acknowledged by the target: docs/xfer.md, "Eager
  /// WRITEs") where the backend offers it (BackendCaps::eager_write_max_bytes, which also caps
  /// it); 0 (the default) never. Either way the transfer completes once its data is visible at
  /// the target. Needs every target to have loaded this agent's metadata (a symmetric exchange,
  /// as kvpush's P/D handshake): a target checks an eager frame's sender against the peers it
  /// knows and acknowledges through its own connection to it, and drops a frame from a stranger
  /// (the transfer then ends at its stall deadline).
  uint64_t eager_write_max_bytes = 0;
  /// Optional: called whenever a transfer finishes (any state) or a notification arrives, so an
  /// owner can wake its own thread instead of blocking in Wait/WaitNotifications. Called on the
  /// backend's progress thread or the agent's watchdog, with the agent's lock held: it must only
  /// set a flag / notify (never call back into the agent).
  std::function<void()> on_event;
};

}  // namespace kvpush::xfer
