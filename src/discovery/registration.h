// Registration: an instance's entry in etcd discovery (docs/deployment.md). A background thread
// keeps the key `record.Key(prefix)` = record.ToJson() attached to an etcd lease of `ttl_s`
// seconds, renewing the lease every ttl/3 while the instance reports healthy; when it is not
// healthy the key is deleted and the lease revoked; when etcd is unreachable the instance keeps
// serving and registers again (new lease) once etcd answers. Leave() deletes the key and revokes
// the lease for good (the first step of a graceful shutdown).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "discovery/etcd_client.h"
#include "discovery/instance_record.h"

namespace kvpush::discovery {

struct RegistrationOptions {
  std::vector<EtcdEndpoint> endpoints;
  std::string prefix = kDefaultPrefix;
  int64_t ttl_s = 5;                             ///< lease TTL; >= 2 (keep-alive every ttl/3)
  std::chrono::milliseconds etcd_timeout{1000};  ///< connect/read bound of one etcd call
  InstanceRecord record;
  /// Whether the instance may be offered to routers now (engine up, not draining). Called on the
  /// registration thread before each renewal; must not block. Null: always healthy.
  std::function<bool()> healthy;
};

/// What a Registration did; for logs and tests. Value type.
struct RegistrationState {
  bool registered = false;  ///< the key is (believed) present under a live lease
  int64_t lease = 0;
  int64_t registrations = 0;  ///< times the key was put under a new lease
  bool left = false;
};

/// The registration thread shell around the lease state (owned by that thread while it runs,
/// by the caller of Leave after). Thread-safety: Start/Leave from one controlling thread;
/// state() from any thread.
class Registration {
 public:
  /// Errors (kInvalidArgument): no endpoint, bad prefix, ttl_s < 2.
  static Result<std::unique_ptr<Registration>> Create(RegistrationOptions options);
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  /// Starts the thread; the first registration attempt happens at once. Idempotent.
  void Start();
  /// Stops the thread, deletes the key and revokes the lease (each bounded by etcd_timeout;
  /// failures are logged: the lease then expires within ttl_s). Idempotent; Start() after
  /// Leave() does nothing.
  void Leave();

  RegistrationState state() const;
  const std::string& key() const { return key_; }

 private:
  explicit Registration(RegistrationOptions options);
  void Loop();
  /// One renewal round; returns the wait until the next one.
  std::chrono::milliseconds Step();
  bool Register();
  /// Puts the key again under the live lease when it is missing (deleted by hand, or lost with
  /// etcd's data while the lease survived).
  void EnsureKey();
  void Deregister(const char* why);
  void Publish();

  RegistrationOptions options_;
  std::string key_;
  std::string value_;
  EtcdClient client_;
  // Lease state: registration thread while it runs, then Leave's caller.
  int64_t lease_ = 0;
  int64_t registrations_ = 0;
  bool etcd_down_logged_ = false;

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ GUARDED_BY(mu_) = false;
  bool left_ GUARDED_BY(mu_) = false;
  RegistrationState published_ GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kvpush::discovery
