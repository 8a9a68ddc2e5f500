#include "model/worker_pool.h"

#include <algorithm>
#include <chrono>

namespace kvpush {

WorkerPool::WorkerPool(int threads) : threads_(std::max(1, threads)) {
  const int workers = threads_ - 1;
  workers_.reserve(static_cast<size_t>(workers));
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { WorkerLoop(i + 1); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {

/// Spins until `done()` or `ns` nanoseconds passed; true when done.
template <typename Done>
bool SpinFor(int64_t ns, Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  for (int i = 0;; ++i) {
    if (done()) return true;
    __builtin_ia32_pause();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= until) return false;
  }
}

}  // namespace

void WorkerPool::Run(int parts, const std::function<void(int)>& fn) {
  if (workers_.empty() || parts <= 1) {
    for (int p = 0; p < parts; ++p) fn(p);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    parts_ = parts;
    pending_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  // Thread t (0 = the caller) runs parts t, t + threads, ...: a fixed assignment, no queue.
  const int n = threads();
  for (int p = 0; p < parts; p += n) fn(p);
  if (!SpinFor(kSpinNs, [this] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

uint64_t WorkerPool::AwaitWork(uint64_t seen) {
  auto ready = [&] {
    return stop_.load(std::memory_order_acquire) ||
           generation_.load(std::memory_order_acquire) != seen;
  };
  if (!SpinFor(kSpinNs, ready)) {
    std::unique_lock<std::mutex> lock(mu_);
    start_cv_.wait(lock, ready);
  }
  return stop_.load(std::memory_order_acquire) ? 0 : generation_.load(std::memory_order_acquire);
}

void WorkerPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  const int n = threads();
  for (;;) {
    seen = AwaitWork(seen);
    if (seen == 0) return;
    const std::function<void(int)>* fn = fn_;
    const int parts = parts_;
    for (int p = index; p < parts; p += n) (*fn)(p);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under the lock: the caller checks pending_ and blocks atomically with respect to it.
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace kvpush
