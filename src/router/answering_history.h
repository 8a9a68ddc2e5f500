// AnsweringHistory: the instances that answered one request before the one answering it now,
// and how each stopped answering it — it failed the request, or the request moved away from it
// (docs/router.md, "Moves and failures"). A continuation never goes back to an instance that
// failed the request; one the request merely moved away from may take it again.
#pragma once

#include <string>
#include <vector>

namespace kvpush::router {

/// The record a request's continuations are chosen from (RequestFlow::Transfer::history).
///
/// - Failed on: the instance broke, stalled, was cut by the health checker, its drain timeout cut
///   the request, or it answered a whole request with a continuable failure. A continuation never
///   goes back to it, not even once it is healthy again (a restarted instance may fail the same
///   way).
/// - Moved away from: the request left a healthy instance on purpose — its drain offered the
///   stream, an operator asked (POST /admin/migrate), or a draining instance handed a whole
///   answer back. That is no failure: the instance may answer the request again later (a drained
///   one only once it is healthy, which the instance pool decides).
///
/// `--migration-limit` counts both kinds: every switch of the answering instance is one
/// continuation (each costs a prefill or a KV push on the new instance).
///
/// Pure and owned by one thread at a time (the thread that relays or awaits the request's answer).
class AnsweringHistory {
 public:
  /// `url` failed the request. Idempotent per url.
  void NoteFailed(const std::string& url);
  /// The request moved away from `url`, which did not fail it.
  void NoteMovedFrom(const std::string& url);

  /// True when `url` failed the request at least once.
  bool FailedOn(const std::string& url) const;

  /// The instances a continuation of the request may not go to, in this order: `refused` (those
  /// that refused an earlier attempt of it unstarted: RequestFlow::Transfer::exclude), every
  /// instance that failed it, and `answering` (the one it leaves now; "" for none). Duplicates
  /// are left out.
  std::vector<std::string> Excluded(const std::vector<std::string>& refused,
                                    const std::string& answering) const;

  /// How many times the request failed on an instance, and how many times it moved away from one.
  int failures() const { return failures_; }
  int moves() const { return moves_; }

 private:
  std::vector<std::string> failed_;  ///< distinct urls, in the order they first failed
  int failures_ = 0;
  int moves_ = 0;
};

}  // namespace kvpush::router
