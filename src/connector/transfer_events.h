// The inputs of TransferCore (transfer_core.h): the events the engine thread and the HTTP threads
// queue for it, in order, as one std::variant (EngineEvent). Plain data.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "common/status.h"
#include "connector/transfer_status.h"
#include "engine/kv_connector.h"
#include "pd/kv_transfer_params.h"
#include "xfer/types.h"

namespace kvpush::connector {

/// Names one posted transfer (WRITE, READ or notification) between the core and the shell; the
/// shell picks it (PdConnector uses the xfer handle, packed) and reports its end with it.
using TransferToken = uint64_t;

/// A layer's chunk of one request in the step being computed (push producers, layer-wise).
struct StepChunk {
  int64_t seq_id = 0;
  int32_t end_pos = 0;  ///< tokens computed once this step's layer is done
  std::vector<BlockId> blocks;
};

// Inputs from the engine thread or an HTTP thread, queued by the shell in order: one type per
// kind, in one std::variant (EngineEvent).

/// P: a P/D request got its blocks.
struct ProducerStartEvent {
  int64_t seq_id = 0;
  std::string request_id;  ///< the engine request's id: the transfer's log lines carry it
  pd::KvTransferParams params;
  int32_t num_prompt_tokens = 0;
  uint64_t prompt_hash = 0;
  std::vector<BlockId> blocks;
  /// The prefill's own answer is needed (prompt logprobs, echo with logprobs): when D needs no
  /// KV (NOT_NEEDED) the transfer is dropped but the prefill runs to its end.
  bool answer_needed = false;
  /// FirstTokenBinding of the request: sent with the first token (KV_READY, PINNED).
  uint64_t first_token_binding = 0;
};
/// P: a step starts; `chunks` are the push producers in it.
struct StepEvent {
  std::vector<StepChunk> chunks;
};
/// P: layer `layer` of the current step is computed.
struct LayerEvent {
  int32_t layer = 0;
};
/// P: the engine finished the request (`ok`: its prefill ran; else `error`, ok for an abort).
struct ProducerDoneEvent {
  int64_t seq_id = 0;
  bool ok = false;
  TokenOutput token;
  Status error;
  std::vector<BlockId> blocks;
};
/// D: a request waits for remote KV in `blocks` (`local_tokens` cached here, `external_tokens`
/// to come from P).
struct ConsumerStartEvent {
  int64_t seq_id = 0;
  std::string request_id;  ///< the engine request's id: the transfer's log lines carry it
  pd::KvTransferParams params;
  int32_t num_prompt_tokens = 0;
  uint64_t prompt_hash = 0;
  std::vector<BlockId> blocks;
  int32_t local_tokens = 0;
  int32_t external_tokens = 0;
  int64_t arrival_ns = 0;  ///< the request's arrival at the engine, on the core clock's scale
  /// FirstTokenBinding of the request: P's first token is taken only when P's is the same.
  uint64_t first_token_binding = 0;
};
/// D, push: the engine reserved `blocks` more for a load that started with part of its blocks
/// (KvConnector::OnBlocksExtended): the next entries of its block table, in order.
struct ConsumerBlocksEvent {
  int64_t seq_id = 0;
  std::string transfer_id;
  std::vector<BlockId> blocks;
};
/// D: a full prefix hit, nothing to load.
struct ConsumerNotNeededEvent {
  pd::KvTransferParams params;
};
/// D: the engine refused a P/D request at admission.
struct ConsumerRejectedEvent {
  pd::KvTransferParams params;
};
/// D: the engine finished request `seq_id` while it still waited for its KV.
struct ConsumerAbortEvent {
  int64_t seq_id = 0;
  std::string transfer_id;
};
/// D, vllm pull: the engine thread posted a READ (`transfer`, when `error` is ok).
struct ReadPostedEvent {
  std::string transfer_id;
  Status error;
  TransferToken transfer = 0;
  int64_t descriptors = 0;  ///< of the posted READ
  int64_t post_ns = 0;      ///< time inside the post call (engine thread)
};
/// POST /kv/abort of `transfer_id`.
struct AbortTransferEvent {
  std::string transfer_id;
};
/// D: the answer to CoreActions::QueryTransferStatus(`peer`, ..., `query`), or why there is
/// none (`answer` not ok).
struct TransferStatusEvent {
  std::string peer;
  TransferStatusQuery query;
  Result<TransferStatusAnswer> answer = Unavailable("no answer");
};
using EngineEvent =
    std::variant<ProducerStartEvent, StepEvent, LayerEvent, ProducerDoneEvent, ConsumerStartEvent,
                 ConsumerBlocksEvent, ConsumerNotNeededEvent, ConsumerRejectedEvent,
                 ConsumerAbortEvent, ReadPostedEvent, AbortTransferEvent, TransferStatusEvent>;

}  // namespace kvpush::connector
