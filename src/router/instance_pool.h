// InstancePool: the prefill (P), decode (D) or colocated (role both) instances a router sends
// legs to, their health and their outstanding-leg counts; picks a P or D instance per leg by
// least outstanding requests (ties: round robin) and a colocated one by plain round robin. See
// docs/router.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "router/prefix_index.h"
#include "router/routing_policy.h"
#include "router/tls_client.h"

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

/// True for an OpenAI error body whose code is `draining` (an instance shutting down
/// gracefully answers new requests and /health with it, docs/server.md).
bool IsDrainingAnswer(const std::string& body);

/// An instance's address, parsed from a URL like "http://127.0.0.1:8100" or
/// "https://p0.example:8100". Value type.
struct InstanceAddress {
  std::string url;  ///< normalized "http://HOST:PORT" or "https://HOST:PORT"
  std::string host;
  int port = 0;
  bool https = false;  ///< spoken to over TLS, its certificate verified (tls_client.h)
};

/// Parses "http://HOST:PORT" or "https://HOST:PORT" (an optional trailing "/" is accepted).
/// Errors: kInvalidArgument naming what is wrong (another scheme, missing host or port, port
/// outside [1, 65535], a path).
Result<InstanceAddress> ParseInstanceUrl(const std::string& url);

/// What /health and /metrics report about one instance. Value type.
struct InstanceSnapshot {
  Role role = Role::kPrefill;
  std::string url;
  bool healthy = false;
  bool draining = false;    ///< /health answered 503 `draining`: no new legs, none cut
  int64_t outstanding = 0;  ///< legs in flight to this instance
  /// Estimated prompt tokens queued or being prefilled there (prefill instances): the count its
  /// last /health reported plus the router's legs sent since, or, for an instance that reports
  /// none, the router's legs in flight. See InstancePool::AcquirePrefill.
  int64_t prefill_tokens = 0;
};

/// What an instance's /health JSON reports (docs/server.md, "/health"); absent fields stay 0.
struct ReportedLoad {
  bool reported = false;  ///< the body had a "load" object
  int64_t outstanding_prefill_tokens = 0;
  int64_t running = 0;
  int64_t waiting = 0;
  int32_t block_size = 0;  ///< KV block size (tokens), 0 = not reported
};

/// Parses a /health body ({"status":"ok","block_size":16,"load":{...}}); an empty or non-JSON
/// body (an older instance) gives a default ReportedLoad. Pure.
ReportedLoad ParseHealthBody(const std::string& body);

class InstancePool;

/// A leg's hold on one instance: counts as one outstanding request until destroyed (or
/// Release()d). Movable, not copyable. Not thread-safe itself; the pool it points into is.
class InstanceLease {
 public:
  InstanceLease() = default;
  InstanceLease(InstancePool* pool, size_t index, InstanceAddress address, Role role,
                int64_t prefill_tokens = 0, uint64_t epoch = 0)
      : pool_(pool),
        index_(index),
        address_(std::move(address)),
        role_(role),
        prefill_tokens_(prefill_tokens),
        epoch_(epoch) {}
  ~InstanceLease() { Release(); }
  InstanceLease(InstanceLease&& o) noexcept { *this = std::move(o); }
  InstanceLease& operator=(InstanceLease&& o) noexcept;
  InstanceLease(const InstanceLease&) = delete;
  InstanceLease& operator=(const InstanceLease&) = delete;

  /// Ends the hold early; idempotent.
  void Release();
  /// Marks the instance unhealthy (a connection to it failed) until its /health passes again.
  void MarkUnhealthy(const std::string& reason) const;
  /// Marks the instance draining (it answered 503 `draining`): excluded from selection until a
  /// health check passes; legs in flight to it are not cut.
  void MarkDraining() const;

  bool valid() const { return pool_ != nullptr; }
  const InstanceAddress& address() const { return address_; }
  Role role() const { return role_; }

 private:
  InstancePool* pool_ = nullptr;
  size_t index_ = 0;
  InstanceAddress address_;
  Role role_ = Role::kPrefill;
  int64_t prefill_tokens_ = 0;  ///< prompt tokens this P leg counts in the pool's estimate
  uint64_t epoch_ = 0;          ///< the instance's health-report epoch at acquisition
};

/// Health-check settings.
struct HealthOptions {
  int interval_ms = 1000;  ///< time between two rounds of GET /health
  int timeout_ms = 1000;   ///< connect + read timeout of one check
  /// The router's TLS settings, for https instances (null: an https instance fails its checks).
  std::shared_ptr<const TlsClientContext> tls;
};

/// Called when an instance turns unhealthy: its role, URL and the reason (e.g. "GET /health:
/// Read"). Runs on the thread that saw it (the health thread, or a leg's thread through
/// InstanceLease::MarkUnhealthy), with no pool lock held; it must not block for long.
using UnhealthyCallback =
    std::function<void(Role role, const std::string& url, const std::string& reason)>;

/// The instances given at construction (static --prefill/--decode/--colocated URLs), plus those
/// added and removed at run time (etcd discovery: AddInstance/RemoveInstance). Every member is
/// polled with GET /health by one background thread; a non-200 answer or a connection failure
/// excludes it from selection until a later check passes. A 503 whose error code is `draining`
/// (the instance is shutting down gracefully, docs/server.md) excludes it too, but is not
/// "unhealthy": the unhealthy callback is not run, so legs in flight to it are left to finish.
/// A removed instance gets no new leg; legs already holding it finish (its slot is reused once
/// none is left). Thread-safety: every method may be called from any thread, except
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
  /// The same, never choosing an instance whose URL is in `exclude` (a retry after that one
  /// refused the request, docs/router.md "Retries").
  std::optional<InstanceLease> Acquire(Role role, const std::vector<std::string>& exclude);

  /// Whether some healthy instance of `role` has a URL outside `exclude` (Acquire would find
  /// one now).
  bool AnyHealthy(Role role, const std::vector<std::string>& exclude) const;

  /// Sets the capacity (blocks) of each decode instance's PrefixIndex. Call before Start().
  void SetPrefixIndexCapacity(size_t blocks) { index_capacity_ = blocks; }

  /// Picks a healthy decode instance for a prompt with chained block hashes `hashes` (empty:
  /// unknown or shorter than a block) and counts one more leg on it. kLeastOutstanding: as
  /// Acquire(kDecode); kCacheAware: ChooseDecodeCacheAware over the healthy Ds, with each D's
  /// cached_blocks from its PrefixIndex. Either way the chosen D's index then records `hashes`.
  /// `choice` (optional) gets what was decided (cached_blocks: the chosen D's predicted hit).
  /// nullopt when no decode instance is healthy. Instances whose URL is in `exclude` are never
  /// chosen (a retry, docs/router.md "Retries").
  std::optional<InstanceLease> AcquireDecode(std::span<const uint64_t> hashes, RoutingPolicy policy,
                                             const CacheAwareOptions& options, DecodeChoice* choice,
                                             const std::vector<std::string>& exclude = {});

  /// Picks a healthy prefill instance for a prompt of `prompt_tokens` tokens (<= 0: unknown) and
  /// counts one more leg on it. kLeastOutstanding (or unknown tokens): as Acquire(kPrefill);
  /// kCacheAware: ChoosePrefillByTokens over the estimated outstanding prefill tokens (what each
  /// P's /health reported, plus the tokens of legs the router sent it since that report). The
  /// lease counts `prompt_tokens` in the estimate until released. Never one in `exclude`.
  std::optional<InstanceLease> AcquirePrefill(int64_t prompt_tokens, RoutingPolicy policy,
                                              const std::vector<std::string>& exclude = {});

  /// The KV block size the first healthy decode instance reported in /health; 0 when none has.
  int32_t ReportedBlockSize() const;

  /// Checks every instance once (blocking, sequential) and updates health.
  void CheckAllOnce();

  /// Whether the instance with this (normalized) URL is currently healthy or draining (not
  /// marked unhealthy: its legs must not be cut); false if unknown.
  bool IsHealthy(const std::string& url) const;

  /// "URL: reason" of the first member of `role` that is unhealthy because its last health
  /// check failed in the TLS handshake (its certificate refused: "TLS certificate verification
  /// failed: ..."), not in `exclude`; "" when none is. Lets a request that finds no healthy
  /// instance say why (502 rather than 503, docs/router.md "TLS to instances").
  std::string TlsFailure(Role role, const std::vector<std::string>& exclude = {}) const;

  /// Current state of every member instance (removed ones are left out), prefill first, in the
  /// order given, then those added at run time.
  std::vector<InstanceSnapshot> Snapshot() const;

  /// Forgets what every decode instance's PrefixIndex recorded (their prefix caches were reset).
  void ClearPrefixIndexes();

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
    bool draining = false;  ///< /health said 503 `draining` (implies !healthy)
    bool checked = false;   ///< health known (the first result is always logged)
    int64_t outstanding = 0;
    ReportedLoad load;                   ///< from the last /health that passed
    uint64_t epoch = 0;                  ///< bumped by each /health report
    int64_t tokens_since_poll = 0;       ///< prompt tokens of P legs acquired in this epoch, open
    int64_t tokens_inflight = 0;         ///< prompt tokens of every open P leg
    std::shared_ptr<PrefixIndex> index;  ///< decode instances: what the router sent there
    bool member = true;     ///< false once removed: no new legs; slot reusable at outstanding 0
    std::string tls_error;  ///< the last health check failed in the TLS handshake: why
  };
  void Release(size_t index, int64_t prefill_tokens = 0, uint64_t epoch = 0);
  /// `expect_url` (SetLoad, SetHealth): when not empty, the update is dropped unless slot `index`
  /// still holds a member with this URL (the health thread checks a copy made before the check).
  void SetLoad(size_t index, const ReportedLoad& load, const std::string& expect_url = "");
  /// Records the TLS failure of slot `index`'s last check ("" = none; dropped per expect_url).
  void SetTlsError(size_t index, const std::string& error, const std::string& expect_url);
  /// Estimated outstanding prefill tokens of `inst` (see AcquirePrefill). Needs mu_.
  static int64_t PrefillTokens(const Instance& inst);
  /// The healthy instances of `role` not in `exclude`, starting at its round-robin cursor:
  /// `instances` (indices into instances_), `positions` (their place among the role's
  /// instances), `of_role` (how many the role has). Needs mu_.
  struct Rotation {
    std::vector<size_t> instances;
    std::vector<size_t> positions;
    size_t of_role = 0;
  };
  Rotation HealthyFromCursor(Role role, const std::vector<std::string>& exclude = {}) const
      REQUIRES(mu_);
  void SetHealth(size_t index, bool healthy, const std::string& reason,
                 const std::string& expect_url = "");
  /// Excludes the instance from selection without running the unhealthy callback.
  void SetDraining(size_t index, const std::string& reason, const std::string& expect_url = "");
  /// What a health report says of an instance (kUnknown: no report yet).
  enum class HealthState { kUnknown, kHealthy, kUnhealthy, kDraining };
  /// The one step behind SetHealth and SetDraining: applies `next` to slot `index` (dropped per
  /// `expect_url`, see SetLoad), logs only a change, and runs the unhealthy callback when the
  /// instance becomes unhealthy. Takes mu_ itself; the callback runs without it.
  void UpdateHealth(size_t index, HealthState next, const std::string& reason,
                    const std::string& expect_url);
  void HealthLoop();

  HealthOptions health_;
  UnhealthyCallback on_unhealthy_;
  std::function<void()> on_round_;
  mutable Mutex mu_;  ///< guards instances_, rr_, stop_, recheck_
  CondVar cv_;
  std::vector<Instance> instances_ GUARDED_BY(mu_);
  size_t rr_[3] GUARDED_BY(mu_) = {0, 0, 0};  ///< round-robin cursor per role (RoleIndex)
  size_t index_capacity_ = 65536;             ///< PrefixIndex capacity per decode instance
  bool stop_ GUARDED_BY(mu_) = false;
  bool recheck_ GUARDED_BY(mu_) = false;  ///< an instance was added: check at once
  std::thread thread_;
};

}  // namespace kvpush::router
