// Membership: the router side of etcd discovery (docs/deployment.md, docs/router.md). A watcher
// thread lists the instance keys under a prefix, then watches them from the next revision, and
// feeds each change to MembershipCore, the single-threaded state that decides which instances
// are admitted (compatible) and reports additions and removals. When etcd is unreachable the last
// known membership is kept and the watcher keeps retrying; after a failed watch it lists again.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "discovery/etcd_client.h"
#include "discovery/instance_record.h"

namespace kvpush::discovery {

/// An instance entering or leaving the admitted set. Value type.
struct MembershipChange {
  enum class Type { kAdd, kRemove };
  Type type = Type::kAdd;
  InstanceRecord record;
};

/// The admitted set, from the records under the prefix. Admission rule (compat): the pool has a
/// reference compat hash; a record is admitted when its compat_hash equals it. The reference is
/// chosen when no admitted instance remains: the compat hash most of the current records carry
/// (ties: the smallest hash), so a fully replaced fleet (rolling upgrade) is adopted once the
/// last old instance left. Records whose hash differs are logged once per key and never
/// admitted; records that do not parse are logged once per key and ignored; role "both" records
/// are ignored by a P/D router (logged once). Pure (no I/O, no clock), single-threaded.
class MembershipCore {
 public:
  /// `prefix`: the discovery prefix the keys were written under (to check keys).
  explicit MembershipCore(std::string prefix) : prefix_(std::move(prefix)) {}

  /// Replaces every record by a fresh listing. Returns the changes to the admitted set.
  std::vector<MembershipChange> Reset(const std::vector<KeyValue>& kvs);
  /// A key was put.
  std::vector<MembershipChange> Put(const KeyValue& kv);
  /// A key was deleted (lease expired, revoked, or deleted by Leave()).
  std::vector<MembershipChange> Delete(const std::string& key);

  /// Admitted records by key.
  const std::map<std::string, InstanceRecord>& admitted() const { return admitted_; }
  /// The reference compat hash (0 when none is chosen).
  uint64_t reference_compat_hash() const { return reference_; }
  /// Keys refused so far (incompatible, malformed or role both) that are still present.
  size_t refused() const { return logged_.size(); }

 private:
  void Store(const KeyValue& kv);
  /// Recomputes the admitted set from records_ and returns the difference.
  std::vector<MembershipChange> Recompute();

  std::string prefix_;
  std::map<std::string, InstanceRecord> records_;   ///< parsed P/D records by key
  std::map<std::string, InstanceRecord> admitted_;  ///< subset of records_ with the reference hash
  std::set<std::string> logged_;                    ///< keys whose refusal was logged
  uint64_t reference_ = 0;
  bool has_reference_ = false;
};

struct MembershipOptions {
  std::vector<EtcdEndpoint> endpoints;
  std::string prefix = kDefaultPrefix;
  std::string model;  ///< only this served model's keys ("": every model under the prefix)
  std::chrono::milliseconds etcd_timeout{1000};
  std::chrono::milliseconds retry{500};  ///< wait before listing again after a failure
  std::chrono::seconds watch_idle{30};   ///< a silent watch is re-established after this
};

/// Called (on the watcher thread) for each change to the admitted set. Must not block for long.
using MembershipCallback = std::function<void(const MembershipChange&)>;

/// The watcher thread shell around MembershipCore. Thread-safety: Start/Stop from one
/// controlling thread; admitted_count()/revision() from any.
class MembershipWatcher {
 public:
  /// Errors (kInvalidArgument): no endpoint, bad prefix.
  static Result<std::unique_ptr<MembershipWatcher>> Create(MembershipOptions options,
                                                           MembershipCallback on_change);
  ~MembershipWatcher();
  MembershipWatcher(const MembershipWatcher&) = delete;
  MembershipWatcher& operator=(const MembershipWatcher&) = delete;

  /// Lists once synchronously (so the first requests see the members etcd has; an unreachable
  /// etcd is logged, not an error), then starts the thread. Idempotent.
  void Start();
  /// Cancels the watch and joins the thread. Idempotent.
  void Stop();

  /// Instances admitted now.
  size_t admitted_count() const { return admitted_count_.load(); }
  /// Lists done so far (1 after Start; more after failures).
  int64_t lists() const { return lists_.load(); }

 private:
  MembershipWatcher(MembershipOptions options, MembershipCallback on_change);
  /// Lists and applies; returns the revision read, or 0 on failure.
  int64_t List();
  void Loop(int64_t revision);
  void Apply(const std::vector<MembershipChange>& changes);
  bool WaitStop(std::chrono::milliseconds d);

  MembershipOptions options_;
  std::string watch_prefix_;
  MembershipCallback on_change_;
  EtcdClient client_;
  MembershipCore core_;  ///< watcher thread only (Start's caller before the thread exists)
  bool etcd_down_logged_ = false;
  std::atomic<size_t> admitted_count_{0};
  std::atomic<int64_t> lists_{0};

  WatchCanceller canceller_;
  Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace kvpush::discovery
