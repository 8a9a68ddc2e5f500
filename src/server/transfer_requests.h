// TransferRequests: which engine requests serve which P/D transfer on this instance, and which
// transfers POST /kv/abort ended (docs/server.md, "POST /kv/abort").
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvpush::server {

/// The engine requests in flight per P/D transfer id (registered at Submit, removed when the
/// HTTP request ends), and the transfer ids POST /kv/abort ended, so that a leg arriving after
/// its abort is refused instead of run. Aborted ids are remembered for `kAbortedTtlNs` (at most
/// `kMaxAborted` of them, oldest forgotten first). Thread-safe (one mutex).
class TransferRequests {
 public:
  static constexpr int64_t kAbortedTtlNs = int64_t{600} * 1000000000;
  static constexpr size_t kMaxAborted = 16384;

  /// Records engine request `id` as serving transfer `tid`. Returns false (and records nothing)
  /// when `tid` was aborted: the caller must abort `id` itself.
  bool Add(const std::string& tid, int64_t id);
  /// Forgets request `id` of `tid` (it ended). Unknown pairs are ignored.
  void Remove(const std::string& tid, int64_t id);
  /// True when `tid` was aborted (within the last kAbortedTtlNs).
  bool IsAborted(const std::string& tid) const;
  /// Marks `tid` aborted and returns the engine ids in flight for it, forgetting them (a second
  /// call returns none).
  std::vector<int64_t> Abort(const std::string& tid);

 private:
  void ExpireLocked(int64_t now_ns) REQUIRES(mu_);

  mutable Mutex mu_;
  std::unordered_map<std::string, std::vector<int64_t>> inflight_ GUARDED_BY(mu_);
  std::unordered_set<std::string> aborted_ GUARDED_BY(mu_);
  /// (when, tid), oldest first.
  std::deque<std::pair<int64_t, std::string>> aborted_order_ GUARDED_BY(mu_);
};

}  // namespace kvpush::server
