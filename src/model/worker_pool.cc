#include "model/worker_pool.h"

#include <algorithm>

namespace kvpush {

WorkerPool::WorkerPool(int threads) : threads_(std::max(1, threads)) {
  const int workers = threads_ - 1;
  workers_.reserve(static_cast<size_t>(workers));
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { WorkerLoop(i + 1); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void WorkerPool::Run(int parts, const std::function<void(int)>& fn) {
  if (workers_.empty() || parts <= 1) {
    for (int p = 0; p < parts; ++p) fn(p);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    parts_ = parts;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_cv_.notify_all();
  // Thread t (0 = the caller) runs parts t, t + threads, ...: a fixed assignment, no queue.
  const int n = threads();
  for (int p = 0; p < parts; p += n) fn(p);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
}

void WorkerPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  const int n = threads();
  for (;;) {
    const std::function<void(int)>* fn = nullptr;
    int parts = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      parts = parts_;
    }
    for (int p = index; p < parts; p += n) (*fn)(p);
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      last = --pending_ == 0;
    }
    if (last) done_cv_.notify_one();
  }
}

}  // namespace kvpush
