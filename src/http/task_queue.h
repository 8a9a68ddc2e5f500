// ElasticTaskQueue: the front door's request threads (one task per complete request, streamed
// answer included; the connection loop holds idle connections). docs/architecture.md, "The front
// door (src/http/)".
#pragma once

#include <httplib.h>

#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvpush::http {

/// A task queue in cpp-httplib's shape (one task = one request, given by the front door's
/// connection loop): `core` worker threads, plus a short-lived thread for each task that arrives
/// while no worker is idle, at most `max_extra` at once (beyond that, tasks wait for a worker, as
/// in httplib's ThreadPool; `max_extra` 0 is exactly a ThreadPool of `core`). Thread-safe.
class ElasticTaskQueue final : public httplib::TaskQueue {
 public:
  ElasticTaskQueue(size_t core, size_t max_extra);
  ~ElasticTaskQueue() override;
  ElasticTaskQueue(const ElasticTaskQueue&) = delete;
  ElasticTaskQueue& operator=(const ElasticTaskQueue&) = delete;

  /// Runs `fn` on an idle worker, else on a new extra thread, else when a worker frees up.
  void enqueue(std::function<void()> fn) override;

  /// Lets the workers finish the queued tasks, waits for the extra threads, joins all.
  /// Idempotent.
  void shutdown() override;

 private:
  struct Extra {
    std::thread thread;
    bool done = false;
  };

  void Work();
  /// Joins the extra threads that ended (they are past their last use of mu_).
  void ReapLocked() REQUIRES(mu_);

  const size_t max_extra_;
  Mutex mu_;  ///< guards everything below but core_
  CondVar cv_;
  std::deque<std::function<void()>> jobs_ GUARDED_BY(mu_);
  std::vector<std::thread> core_;  ///< started by the constructor, joined by shutdown()
  std::list<Extra> extras_ GUARDED_BY(mu_);
  size_t idle_ GUARDED_BY(mu_) = 0;
  size_t running_extra_ GUARDED_BY(mu_) = 0;
  bool shutdown_ GUARDED_BY(mu_) = false;
  bool shut_ GUARDED_BY(mu_) = false;
};

}  // namespace kvpush::http
