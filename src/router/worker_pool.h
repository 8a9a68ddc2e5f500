// WorkerPool: the router's threads for leg work that must run beside an HTTP handler (a push
// request's P leg, a streamed leg's reader). Threads are kept for the router's lifetime, so no
// thread is created per request or per leg (docs/router.md, "Connections and threads").
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"

namespace kvpush::router {

/// A bounded pool of worker threads running submitted tasks in FIFO order. It starts with
/// `initial_threads` and adds one thread when a task is submitted while no worker is idle, up to
/// `max_threads`; threads never exit before Stop(). Once it has grown to the peak number of tasks
/// in flight, no more threads are created. A task submitted while `max_threads` tasks run waits
/// in the queue (size the pool so this does not happen: a task may block for a whole leg).
/// Thread-safety: Submit() and threads() from any thread; Stop() from one controlling thread,
/// never from a task.
class WorkerPool {
 public:
  WorkerPool(size_t initial_threads, size_t max_threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Queues `task`. Returns false (and drops it) once Stop() began. The task's log lines carry the
  /// request id that was current on the submitting thread (common/log.h, LogRequestScope).
  bool Submit(std::function<void()> task);

  /// Refuses new tasks, lets the queued and running ones finish, joins every thread. Idempotent.
  void Stop();

  /// Threads created so far.
  size_t threads() const;
  /// Threads waiting for a task now.
  size_t idle_threads() const;

 private:
  void Work();

  const size_t max_threads_;
  mutable Mutex mu_;  ///< guards everything below
  CondVar cv_;
  std::deque<std::function<void()>> queue_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_ GUARDED_BY(mu_);
  size_t idle_ GUARDED_BY(mu_) = 0;
  bool stopping_ GUARDED_BY(mu_) = false;
};

}  // namespace kvpush::router
