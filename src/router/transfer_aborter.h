// TransferAborter: sends `POST /kv/abort {"transfer_id": T}` to instances from a small fixed pool
// of threads, so that when one leg of a P/D request fails the other instance ends its part and
// frees its KV blocks within one round trip (DESIGN.md §6 "legs fail together"), without the
// request's own thread waiting for it. See docs/router.md and docs/pd_protocol.md §1.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "router/instance_pool.h"
#include "router/tls_client.h"

namespace kvpush::router {

class Leg;

/// Settings of the abort calls.
struct AbortOptions {
  int threads = 4;                 ///< worker threads (fixed; not per request)
  double connect_timeout_s = 1.0;  ///< per call
  double read_timeout_s = 2.0;     ///< per call
  size_t max_queued = 4096;        ///< more waiting aborts are dropped (logged, counted)
  std::string api_key;             ///< the instances' --api-key ("" = none)
  /// The router's TLS settings, for https instances (null: none is https).
  std::shared_ptr<const TlsClientContext> tls;
};

/// What the aborter did, for /metrics. Value type.
struct AbortCounts {
  int64_t ok[2] = {0, 0};      ///< [prefill=0/decode=1] answered 200
  int64_t failed[2] = {0, 0};  ///< unreachable, timed out or non-200
  int64_t dropped = 0;         ///< queue full or stopping
};

/// Thread-safety: Abort() and counts() from any thread; Start/Stop from one controlling thread.
class TransferAborter {
 public:
  explicit TransferAborter(AbortOptions options);
  ~TransferAborter();
  TransferAborter(const TransferAborter&) = delete;
  TransferAborter& operator=(const TransferAborter&) = delete;

  /// Starts the worker threads. Idempotent.
  void Start();

  /// Drops the queued aborts, closes the calls in flight and joins the workers. Idempotent.
  void Stop();

  /// Queues an abort of `transfer_id` (32 lowercase hex) on `instance` (sent with
  /// `x-request-id: request_id`). Never blocks; dropped with a warning when `max_queued` aborts
  /// are waiting, or before Start / after Stop. The outcome is logged and counted only.
  void Abort(const InstanceAddress& instance, Role role, const std::string& transfer_id,
             const std::string& request_id);

  AbortCounts counts() const;

 private:
  struct Job {
    InstanceAddress instance;
    Role role = Role::kPrefill;
    std::string transfer_id;
    std::string request_id;
  };
  void Work();
  void Send(const Job& job);

  AbortOptions options_;
  mutable Mutex mu_;  ///< guards everything below
  CondVar cv_;
  std::deque<Job> queue_ GUARDED_BY(mu_);
  std::unordered_set<Leg*> in_flight_ GUARDED_BY(mu_);
  bool running_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  AbortCounts counts_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_;  ///< started by Start, joined by Stop (not under mu_)
};

}  // namespace kvpush::router
