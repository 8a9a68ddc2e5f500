// LegRegistry: every leg the router has in flight, so that Stop() can close them all and an
// instance marked unhealthy has its legs cut at once; and the router's background tasks (a push
// request's wait for P's answer), which Stop() waits for. docs/router.md, "Connections and
// threads".
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "router/connection_pool.h"
#include "router/instance_pool.h"
#include "router/leg.h"

namespace kvpush::router {

/// Thread-safe: every call from any thread (a leg's deleter runs on whichever thread drops it).
class LegRegistry {
 public:
  /// `connections`: not owned, outlives the registry and every leg. `is_healthy(url)`: whether
  /// the instance at url is healthy now (InstancePool::IsHealthy; null: always). `api_key`: what
  /// every leg sends as its Bearer token ("" = none).
  LegRegistry(ConnectionPool* connections, double connect_timeout_s, double request_timeout_s,
              std::function<bool(const std::string& url)> is_healthy, std::string api_key = {});
  LegRegistry(const LegRegistry&) = delete;
  LegRegistry& operator=(const LegRegistry&) = delete;

  /// A new leg to `address` (an instance in `role`), registered until its last reference goes.
  /// One made after StopAll() began is stopped at once; one to an instance that is unhealthy by
  /// the time it is registered is cut at once (the unhealthy callback ran before it existed).
  std::shared_ptr<Leg> NewLeg(const InstanceAddress& address, Role role);
  /// Cuts (Leg::Cut with `reason`) every leg in flight to `url` that is neither stopped nor
  /// finished; returns how many.
  int CutTo(const std::string& url, const std::string& reason);

  /// A background task begins: false (the task must not run) once StopAll() began.
  bool BeginBackground();
  void EndBackground();

  /// Stopping, step 1: every leg in flight is stopped, and so is every leg made from now on.
  void StopAll();
  /// Stopping, step 2 (after StopAll): waits until no background task is left (each ends once
  /// its legs are closed).
  void WaitBackground();
  /// Legs in flight plus background tasks running.
  size_t inflight() const;

 private:
  void Forget(Leg* leg);

  ConnectionPool* const connections_;
  const double connect_timeout_s_;
  const double request_timeout_s_;
  const std::string api_key_;
  const std::function<bool(const std::string&)> is_healthy_;
  mutable Mutex mu_;
  CondVar cv_;                                           ///< notified when a background task ends
  std::unordered_map<Leg*, Role> legs_ GUARDED_BY(mu_);  ///< with their instance's role
  int background_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace kvpush::router
