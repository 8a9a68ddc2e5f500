// PushedMove: the P/D legs that move a stream's context by push from the instance that holds it
// (the source) to a new decode instance (docs/reliability.md, *Migration*; pd_protocol.md,
// *Moving a stream by push*). Pure: builds JSON bodies from the client's body and the stream's
// ResumeLedger; continuation_flow.cc sends them.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "router/client_body.h"
#include "router/instance_pool.h"
#include "router/resume_ledger.h"

namespace kvpush::router {

/// Makes `leg` a stream's continuation: `kvpush_resume` = what the client got (ledger.ToJson()),
/// and the seed the failed (or offering) instance sampled with when the body names none
/// (--colocated forwards the client's body without one).
void AddResume(nlohmann::json& leg, const ResumeLedger& ledger);
/// The same from parts: `kvpush_resume` = `resume`, and `seed` when the body names none.
void AddResume(nlohmann::json& leg, const nlohmann::json& resume, std::optional<int64_t> seed);

/// One sequence's context moved by push: the continuation of one choice (prompt + its resumed
/// output, `resumed` tokens) as a push P/D pair whose P leg goes to `source` (it finds the
/// context in its prefix cache and computes only the unfinished block) and whose D leg names
/// `source` as the prefill instance. A value type.
struct PushedMove {
  InstanceAddress source;
  nlohmann::json leg;  ///< the continuation's body, n = 1 (the client's shell, kvpush_resume)
  int64_t resumed = 0;

  /// P's leg for transfer id `tid`: push producer, not streamed, max_tokens = resumed + 1 (it
  /// counts the resumed output: one token more).
  std::string PrefillBody(const ClientBody& client, const std::string& tid) const;
  /// D's leg for `tid`: streamed as the client asked (the switch), or — `first_round` — one
  /// token answered whole (max_tokens = resumed + 1, min_tokens clamped to it), which only fills
  /// the target's prefix cache (P's token ends it at once; the router does not relay it). Both legs carry the same sampling parameters, so the
  /// target's first-token binding matches the source's.
  std::string DecodeBody(const ClientBody& client, const std::string& tid,
                         bool first_round = false) const;
};

/// The move that pushes the whole context at the switch (the first round failed): a stream of
/// one choice (`n` absent or 1) with at least one resumed token. nullopt otherwise (n > 1: each
/// choice's context is another sequence; the switch then computes them on the target).
std::optional<PushedMove> PlanWholePush(const ClientBody& client, const ResumeLedger& ledger,
                                        const InstanceAddress& source);

/// A move's first round: one one-token pair per choice that is not finished and has resumed
/// output (in index order), each the continuation of that choice alone (n = 1, its tokens as
/// choice 0). The seed is left as it is: the round's sampled token is never relayed, only its
/// KV (the context's, whatever the seed) is kept by the target's prefix cache, where the
/// switch's continuation of all n choices finds each choice's blocks. Empty when no choice
/// qualifies or `n` is not a positive integer.
std::vector<PushedMove> PlanFirstRounds(const ClientBody& client, const ResumeLedger& ledger,
                                        const InstanceAddress& source);

}  // namespace kvpush::router
