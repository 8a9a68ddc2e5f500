// KvTransferConfig: the typed, validated form of `kvpush serve --kv-transfer-config JSON` (vLLM's
// --kv-transfer-config shape: kv_connector, kv_role, kv_connector_extra_config).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "connector/messages.h"
#include "pd/kv_transfer_params.h"

namespace kvpush::connector {

/// What a decode instance does when the KV of a request does not arrive (DESIGN.md §6).
enum class FailurePolicy : uint8_t { kRecompute = 0, kFail = 1 };

/// Instance role in P/D serving.
enum class KvRole : uint8_t { kProducer = 0, kConsumer = 1, kBoth = 2 };

/// KvTransferConfig::broken_peer when `broken_peer_ms` is not given: this many cancel
/// deadlines (CANCEL re-sent after 1 and 3 of them meanwhile).
inline constexpr int kBrokenPeerCancelAcks = 4;

struct KvTransferConfig {
  /// "PushConnector" (kvpush push, the default for the router's push mode) or "PullConnector"
  /// (also accepted: "NixlConnector"). Both connectors serve both modes per request; this picks
  /// the instance's default mode for requests that do not say.
  std::string kv_connector = "PushConnector";
  KvRole role = KvRole::kBoth;
  std::string backend = "ucx:tcp";             ///< xfer backend spec (xfer/backend_factory.h)
  std::string engine_id;                       ///< agent name; "" = "<role>-<host>:<port>"
  std::chrono::milliseconds lease{30000};      ///< P holds blocks for a pull / unmatched push
  std::chrono::milliseconds watchdog{10000};   ///< D waits for KV at most this long
  std::chrono::milliseconds cancel_ack{2000};  ///< D waits for P's CANCEL_ACK this long
  std::chrono::milliseconds stall{5000};       ///< transfer stall deadline (xfer)
  /// D: a quarantined transfer (docs/reliability.md, *Quarantine*) whose P, alive, has not
  /// answered (CANCEL_ACK, TRANSFER_FAILED, KV_READY) this long after the quarantine began makes
  /// D treat P as broken: its connection is fenced (xfer::Agent::FencePeer) and the quarantines
  /// of that connection end once the transport confirmed that nothing of P can land any more.
  /// At least cancel_ack; kv_connector_extra_config `broken_peer_ms`, by default
  /// kBrokenPeerCancelAcks × cancel_ack_ms.
  std::chrono::milliseconds broken_peer{8000};
  FailurePolicy failure_policy = FailurePolicy::kRecompute;
  /// Pull consumer: the profile of a request that names none (pd::PullProfile).
  pd::PullProfile pull_profile = pd::PullProfile::kFast;
  /// Push: post each layer's WRITE as soon as that layer is computed (true) or everything after
  /// the prefill (false; for measurements).
  bool layerwise = true;
  /// Decode, push: a request whose blocks the pool cannot hold at once (other requests hold
  /// them) starts its transfer with what is free and announces the rest as blocks free
  /// (Scheduler, docs/pd_protocol.md §3 *A target in parts*); false: it waits in the queue until
  /// the pool holds its whole prompt.
  bool partial_targets = true;
  /// Decode: verify every received block against the XXH3 digest P sends (kv/block_checksum.h)
  /// before using it. P always computes the digest; `false` only skips D's check (measurements).
  bool verify_checksums = true;
  /// Push, layer by layer: during the prefill a layer's computed blocks are written once they
  /// amount to at least this many bytes (K and V), with a LAYER_READY notification so that D
  /// hashes them while P computes on. Below it a WRITE's fixed cost (a flush round trip on tcp,
  /// wake-ups of both progress threads on 2 cores) exceeds the overlap it buys: the blocks go
  /// with the rest in the one WRITE that carries KV_READY after the prefill. In the prompt's last
  /// chunk a layer is written as soon as it is complete when waiting would leave at least this
  /// much for after the prefill (its share times the layers still to come, plus what earlier
  /// layers left), so that WRITE carries one layer's share, not up to every layer's threshold
  /// (4.5 MiB at 131,000 tokens of Llama 3.1 8B at kv-scale 1/16 before). 256 KiB is 64 tokens
  /// of one Qwen3-32B layer (8 KV heads x 128 x bf16 x K,V). 0: every layer as soon as it is
  /// computed, whatever its size.
  uint64_t layerwise_min_bytes = 256 * 1024;
  /// A push WRITE (with its KV_READY or LAYER_READY notification) of at most this many bytes
  /// goes as one eager message carrying the KV, where the transport's WRITE would need a round
  /// trip before its notification (ucx:tcp; libfabric:tcp up to rxm's eager size): one message
  /// and two thread wake-ups fewer on the TTFT path (xfer::AgentOptions::eager_write_max_bytes,
  /// docs/xfer.md "Eager WRITEs"). 0: always RMA.
  uint64_t eager_write_max_bytes = 256 * 1024;
  /// Byte budget of one PUSH_TARGET or PINNED part's block list (block_list.h): a longer list
  /// goes in several messages. In [16, kMaxBlockListBytes]; smaller values only multiply the
  /// messages (tests and the chaos run use 16 to make every list come in parts).
  uint32_t block_list_part_bytes = kMaxBlockListBytes;

  /// Parses and validates `json` (an object). `role` is --role ("prefill" -> kv_producer,
  /// "decode" -> kv_consumer, "both" -> kv_both) or "" when it was not given: then the JSON's
  /// kv_role decides (kv_both when it has none); a kv_role that contradicts a given --role
  /// (other than "both") is refused. vLLM's names are accepted (NixlConnector, NixlPushConnector,
  /// NixlPullConnector; kv_load_failure_policy; kv_connector_extra_config.backends and
  /// .kv_lease_duration in seconds), each agreeing with kvpush's key for the same setting when
  /// both are given. Errors: kInvalidArgument naming the field.
  static Result<KvTransferConfig> Parse(std::string_view json, std::string_view role);

  /// One line with every field, for the start-up log.
  std::string ToString() const;
};

std::string_view KvRoleName(KvRole r);

}  // namespace kvpush::connector
