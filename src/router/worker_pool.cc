#include "router/worker_pool.h"

#include <algorithm>
#include <string>

#include "common/log.h"
#include "common/thread_name.h"

namespace kvpush::router {

WorkerPool::WorkerPool(size_t initial_threads, size_t max_threads)
    : max_threads_(std::max<size_t>(1, max_threads)) {
  MutexLock lock(mu_);
  const size_t n = std::min(initial_threads, max_threads_);
  for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { Work(); });
}

WorkerPool::~WorkerPool() {
  Stop();
}

bool WorkerPool::Submit(std::function<void()> task) {
  {
    MutexLock lock(mu_);
    if (stopping_) return false;
    // The task's log lines are about the submitter's request (common/log.h).
    queue_.push_back([id = std::string(CurrentLogRequestId()), task = std::move(task)] {
      LogRequestScope scope(id);
      task();
    });
    // Every idle worker is about to take one queued task; grow when they are not enough.
    if (idle_ < queue_.size() && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    }
  }
  cv_.NotifyOne();
  return true;
}

void WorkerPool::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  cv_.NotifyAll();
  for (auto& t : threads) t.join();
}

size_t WorkerPool::threads() const {
  MutexLock lock(mu_);
  return threads_.size();
}

size_t WorkerPool::idle_threads() const {
  MutexLock lock(mu_);
  return idle_;
}

void WorkerPool::Work() {
  SetThreadName("kvp-rt-worker");
  MutexLock lock(mu_);
  for (;;) {
    ++idle_;
    while (!stopping_ && queue_.empty()) cv_.Wait(lock);
    --idle_;
    if (queue_.empty()) return;  // stopping, nothing left to run
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.Unlock();
    task();
    task = nullptr;  // the task's captures go before the next wait
    lock.Lock();
  }
}

}  // namespace kvpush::router
