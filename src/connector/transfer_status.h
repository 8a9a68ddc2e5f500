// POST /kv/transfer_status (docs/pd_protocol.md §2b): a decode instance (D) asks the prefill
// instance (P) of its quarantined push transfers, over P's HTTP port, to cancel them and to say
// for each whether any WRITE of it can still land in D's blocks. It is the liveness query of the
// quarantine (docs/reliability.md, *Quarantine*): a P whose transfer engine cannot post any more
// (its CANCEL_ACKs never leave) still answers it while it lives. The request and the answer,
// their JSON and their validation; no I/O. Pure, thread-safe.
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush::connector {

/// At most this many transfer ids in one query (a D asks in several beyond it).
inline constexpr size_t kMaxStatusTransfers = 256;

/// D's question: `{"engine_id": "<D's agent name>", "transfer_ids": ["<32 hex>", ...]}`.
struct TransferStatusQuery {
  std::string engine_id;                  ///< 1..255 bytes
  std::vector<std::string> transfer_ids;  ///< 1..kMaxStatusTransfers valid ids, none twice

  nlohmann::json ToJson() const;
  /// Validates everything: an object with exactly these two fields, engine_id 1..255 bytes,
  /// transfer_ids an array of 1..kMaxStatusTransfers distinct valid transfer ids (pd/ids.h).
  /// Errors: kInvalidArgument naming the field.
  static Result<TransferStatusQuery> FromJson(const nlohmann::json& j);
};

/// P's answer: `{"transfers": {"<id>": "settled" | "pending", ...}}`, one entry per id asked.
/// "settled": P holds nothing of that transfer that could still write (it never had it, it
/// ended, or it was cancelled now and every WRITE of it settled) and never will (the id is
/// tombstoned): the meaning of a CANCEL_ACK. "pending": a WRITE of it has not settled yet.
struct TransferStatusAnswer {
  std::map<std::string, bool> settled;  ///< transfer id -> settled (true) or pending (false)

  nlohmann::json ToJson() const;
  /// Validates an answer to `asked`: an object whose "transfers" object names only ids asked,
  /// each "settled" or "pending"; ids asked and not named count as pending.
  /// Errors: kInvalidArgument naming what is wrong.
  static Result<TransferStatusAnswer> FromJson(const nlohmann::json& j,
                                               const TransferStatusQuery& asked);
};

}  // namespace kvpush::connector
