// ConnectorStats: the P/D connector's counters for /metrics (docs/pd_protocol.md, DESIGN.md §6).
#pragma once

#include <array>
#include <cstdint>

namespace kvpush::connector {

/// Counters for /metrics. Monotonic except the gauges marked.
struct ConnectorStats {
  int64_t handshakes = 0;
  int64_t push_targets_sent = 0;
  int64_t push_targets_received = 0;
  /// D, push: PUSH_TARGETs started with part of their blocks, the rest announced as the pool
  /// freed them (a reservation in parts).
  int64_t push_targets_partial = 0;
  int64_t writes_posted = 0;  ///< layer WRITE transfers
  int64_t bytes_written = 0;
  int64_t kv_ready_sent = 0;
  /// P, push: KV_READYs that were the notification of the transfer's last WRITE (the rest went
  /// as a message of their own after every WRITE ended).
  int64_t kv_ready_on_write = 0;
  int64_t kv_ready_received = 0;
  int64_t reads_completed = 0;
  int64_t bytes_read = 0;
  int64_t transfers_failed = 0;
  int64_t watchdog_expired = 0;
  int64_t leases_expired = 0;
  int64_t not_needed = 0;           ///< full prefix hits on D (no KV moved)
  int64_t not_needed_received = 0;  ///< P, push: NOT_NEEDED messages received
  int64_t pins_sent = 0;            ///< pull (D): PIN requests sent
  int64_t pins_refused = 0;         ///< pull (P): PIN refused (lease expired, unknown, wrong state)
  int64_t pins_held = 0;  ///< pull (P): PINs that came before the prefill's end, held until it
  /// D: received blocks whose checksums were verified, and verifications that failed.
  int64_t blocks_verified = 0;
  int64_t checksum_mismatches = 0;
  /// D: time spent verifying once the KV is complete (on the TTFT path; connector thread).
  int64_t verify_ns_sum = 0;
  /// D, push: time spent hashing chunks as LAYER_READY said they landed (off the TTFT path).
  int64_t verify_early_ns_sum = 0;
  int64_t checksum_ns_sum = 0;    ///< P: time spent hashing blocks (connector thread)
  int64_t transfers_aborted = 0;  ///< POST /kv/abort that found a live producer or target
  int64_t bad_messages = 0;       ///< malformed or unexpected peer messages dropped
  /// Control messages (not KV WRITEs/READs) that failed to post or to complete
  /// (vllm:nixl_num_failed_notifications).
  int64_t messages_failed = 0;
  /// D: P's first tokens not taken because P's request sampled under other settings
  /// (FirstTokenBinding differs); the engine computed the last prompt token instead.
  int64_t first_tokens_unbound = 0;
  /// Push, P side: from the engine finishing the request (prefill done, first token sampled) to
  /// KV_READY posted: the part of the handoff P adds after its compute (the last layer's WRITE
  /// not yet complete, plus the connector thread's wake-up). The last layer's WRITE is posted as
  /// soon as its K/V are stored, before that layer's attention and FFN, so it mostly overlaps.
  int64_t push_tail_ns_sum = 0;
  int64_t push_tail_count = 0;
  /// Pull, D side: from posting the READ to its completion.
  int64_t read_ns_sum = 0;
  int64_t read_count = 0;
  /// KV WRITEs (P, push) and READs (D, pull) posted: descriptors selected (one per (layer, K|V,
  /// block) chunk) and backend ops after coalescing adjacent chunks (equal when nothing coalesces,
  /// e.g. `--kv-block-allocation scattered`).
  int64_t descriptors_posted = 0;
  int64_t transfer_ops_posted = 0;
  /// Control messages sent to peers on their own (PUSH_TARGET parts, PIN, PINNED parts, CANCEL,
  /// ...; not the notifications that ride on a WRITE), and their payload bytes as sent (MAC
  /// trailer included).
  int64_t control_messages_sent = 0;
  int64_t control_bytes_sent = 0;
  /// --kv-auth-key-file set; refusals of unauthenticated or forged handshakes and messages,
  /// indexed by AuthFailure (peer_auth.h).
  bool auth_enabled = false;
  std::array<int64_t, 7> auth_failures{};
  /// D: loads given up (the request recomputed or failed) while a WRITE or READ could still
  /// land in their blocks, which were kept out of use (quarantined) until it could not; and the
  /// quarantines that ended (P's CANCEL_ACK / TRANSFER_FAILED / late KV_READY, the READ settled,
  /// P dead or restarted).
  int64_t quarantines = 0;
  int64_t quarantines_released = 0;
  /// D: connections to a prefill instance fenced because it left a quarantined transfer
  /// unanswered for broken_peer_ms while alive (a broken peer: docs/reliability.md).
  int64_t peers_fenced = 0;
  /// D: /kv/transfer_status queries sent about quarantined transfers (the liveness query), and
  /// the quarantines they ended (P answered "settled").
  int64_t status_queries = 0;
  int64_t status_settled = 0;
  int64_t producers_active = 0;       ///< gauge
  int64_t consumers_waiting = 0;      ///< gauge: every consumer, quarantined ones included
  int64_t consumers_quarantined = 0;  ///< gauge
  int64_t blocks_quarantined = 0;     ///< gauge: announced/read-into blocks held out of use
};

}  // namespace kvpush::connector
