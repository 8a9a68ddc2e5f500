// InstancePool: the prefill (P), decode (D) or colocated (role both) instances a router sends
// legs to, their health and their outstanding-leg counts; picks a P or D instance per leg by
// least outstanding requests (ties: round robin) and a colocated one by plain round robin. See
// docs/router.md.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"

namespace kvpush::router {

/// An instance's role as the router uses it: P, D, or a colocated instance (`--role both`) that
/// serves whole requests (the router's `--colocated` mode).
enum class Role { kPrefill, kDecode, kColocated };

/// "prefill" / "decode" / "colocated".
const char* RoleName(Role role);

/// 0 / 1 / 2 for kPrefill / kDecode / kColocated (index of per-role arrays).
inline int RoleIndex(Role role) {
  return static_cast<int>(role);
}

/// An instance's address, parsed from a URL like "http://127.0.0.1:8100". Value type.
struct InstanceAddress {
  std::string url;  ///< normalized "http://HOST:PORT"
  std::string host;
  int port = 0;
};

/// Parses "http://HOST:PORT" (an optional trailing "/" is accepted). Errors: kInvalidArgument
/// naming what is wrong (scheme other than http, missing host or port, port outside
/// [1, 65535], a path).
Result<InstanceAddress> ParseInstanceUrl(const std::string& url);

/// What /health and /metrics report about one instance. Value type.
struct InstanceSnapshot {
  Role role = Role::kPrefill;
  std::string url;
  bool healthy = false;
  int64_t outstanding = 0;  ///< legs in flight to this instance
};

class InstancePool;

/// A leg's hold on one instance: counts as one outstanding request until destroyed (or
/// Release()d). Movable, not copyable. Not thread-safe itself; the pool it points into is.
class InstanceLease {
 public:
  InstanceLease() = default;
  InstanceLease(InstancePool* pool, size_t index, InstanceAddress address, Role role)
      : pool_(pool), index_(index), address_(std::move(address)), role_(role) {}
  ~InstanceLease() { Release(); }
  InstanceLease(InstanceLease&& o) noexcept { *this = std::move(o); }
  InstanceLease& operator=(InstanceLease&& o) noexcept;
  InstanceLease(const InstanceLease&) = delete;
  InstanceLease& operator=(const InstanceLease&) = delete;

  /// Ends the hold early; idempotent.
  void Release();
  /// Marks the instance unhealthy (a connection to it failed) until its /health passes again.
  void MarkUnhealthy(const std::string& reason) const;

  bool valid() const { return pool_ != nullptr; }
  const InstanceAddress& address() const { return address_; }
  Role role() const { return role_; }

 private:
  InstancePool* pool_ = nullptr;
  size_t index_ = 0;
  InstanceAddress address_;
  Role role_ = Role::kPrefill;
};

/// Health-check settings.
struct HealthOptions {
  int interval_ms = 1000;  ///< time between two rounds of GET /health
  int timeout_ms = 1000;   ///< connect + read timeout of one check
};

/// Called when an instance turns unhealthy: its role, URL and the reason (e.g. "GET /health:
/// Read"). Runs on the thread that saw it (the health thread, or a leg's thread through
/// InstanceLease::MarkUnhealthy), with no pool lock held; it must not block for long.
using UnhealthyCallback =
    std::function<void(Role role, const std::string& url, const std::string& reason)>;

/// The instances given at construction (static --prefill/--decode/--colocated URLs), plus those
/// added and removed at run time (etcd discovery: AddInstance/RemoveInstance). Every member is
/// polled with GET /health by one background thread; a non-200 answer or a connection failure
/// excludes it from selection until a later check passes. A removed instance gets no new leg;
/// legs already holding it finish (its slot is reused once none is left). Thread-safety: every method may be called from any thread, except
/// Start/Stop/SetUnhealthyCallback (one controlling thread). Leases must not outlive the pool.
class InstancePool {
 public:
  /// `colocated`: role-both instances (the router's `--colocated` mode; then `prefill` and
  /// `decode` are empty).
  InstancePool(std::vector<InstanceAddress> prefill, std::vector<InstanceAddress> decode,
               HealthOptions health, std::vector<InstanceAddress> colocated = {});
  ~InstancePool();
  InstancePool(const InstancePool&) = delete;
  InstancePool& operator=(const InstancePool&) = delete;

  /// Sets the callback run on every healthy -> unhealthy transition (and on a first check that
  /// fails). Call before Start().
  void SetUnhealthyCallback(UnhealthyCallback cb) { on_unhealthy_ = std::move(cb); }
  /// Sets a callback run on the health thread after each background round (housekeeping that
  /// should run about once per `interval_ms`). Call before Start().
  void SetRoundCallback(std::function<void()> cb) { on_round_ = std::move(cb); }

  /// Runs one health round synchronously (so the first requests see real health), then starts
  /// the background health thread. Idempotent.
  void Start();
  /// Wakes and joins the health thread. Idempotent.
  void Stop();

  /// Picks the healthy instance of `role` with the fewest outstanding legs (ties: round robin;
  /// kColocated: plain round robin over the healthy ones, skipping unhealthy ones) and counts
  /// one more leg on it. nullopt when no instance of `role` is healthy.
  std::optional<InstanceLease> Acquire(Role role);

  /// Checks every instance once (blocking, sequential) and updates health.
  void CheckAllOnce();

  /// Whether the instance with this (normalized) URL is currently healthy; false if unknown.
  bool IsHealthy(const std::string& url) const;

  /// Current state of every member instance (removed ones are left out), prefill first, in the
  /// order given, then those added at run time.
  std::vector<InstanceSnapshot> Snapshot() const;

  /// Adds an instance at run time (membership change). It is selectable once its first health
  /// check passes; that check runs at once on the health thread (when started). Returns false
  /// (and changes nothing) when an instance of that role and URL is already a member.
  bool AddInstance(Role role, InstanceAddress address);
  /// Removes an instance at run time: it gets no new leg; legs holding it finish. Returns false
  /// when no member of that role has this (normalized) URL.
  bool RemoveInstance(Role role, const std::string& url);

 private:
  friend class InstanceLease;
  struct Instance {
    Role role;
    InstanceAddress address;
    bool healthy = false;
    bool checked = false;  ///< health known (the first result is always logged)
    int64_t outstanding = 0;
    bool member = true;  ///< false once removed: no new legs; slot reusable at outstanding 0
  };
  void Release(size_t index);
  /// `expect_url`: when not empty, the update is dropped unless slot `index` still holds a
  /// member with this URL (the health thread checks a copy made before the check).
  void SetHealth(size_t index, bool healthy, const std::string& reason,
                 const std::string& expect_url = "");
  void HealthLoop();

  HealthOptions health_;
  UnhealthyCallback on_unhealthy_;
  std::function<void()> on_round_;
  mutable std::mutex mu_;  ///< guards instances_, rr_, stop_, recheck_
  std::condition_variable cv_;
  std::vector<Instance> instances_;
  size_t rr_[3] = {0, 0, 0};  ///< round-robin cursor per role (RoleIndex)
  bool stop_ = false;
  bool recheck_ = false;  ///< an instance was added: check at once
  std::thread thread_;
};

}  // namespace kvpush::router
