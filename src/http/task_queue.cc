#include "http/task_queue.h"

#include <utility>

#include "common/thread_name.h"

namespace kvpush::http {

ElasticTaskQueue::ElasticTaskQueue(size_t core, size_t max_extra) : max_extra_(max_extra) {
  for (size_t i = 0; i < core; ++i) {
    core_.emplace_back([this] {
      SetThreadName("kvp-http");
      Work();
    });
  }
}

ElasticTaskQueue::~ElasticTaskQueue() {
  ElasticTaskQueue::shutdown();
}

void ElasticTaskQueue::enqueue(std::function<void()> fn) {
  MutexLock lock(mu_);
  ReapLocked();
  if (idle_ > jobs_.size() || running_extra_ >= max_extra_ || shutdown_) {
    jobs_.push_back(std::move(fn));
    lock.Unlock();
    cv_.NotifyOne();
    return;
  }
  ++running_extra_;
  Extra& e = extras_.emplace_back();
  e.thread = std::thread([this, &e, fn = std::move(fn)] {
    SetThreadName("kvp-http+");
    fn();
    MutexLock done(mu_);
    e.done = true;
    --running_extra_;
    cv_.NotifyAll();
  });
}

void ElasticTaskQueue::shutdown() {
  {
    MutexLock lock(mu_);
    if (shut_) return;
    shut_ = shutdown_ = true;
  }
  cv_.NotifyAll();
  for (auto& t : core_) t.join();
  MutexLock lock(mu_);
  while (running_extra_ != 0) cv_.Wait(lock);
  ReapLocked();
}

void ElasticTaskQueue::Work() {
  MutexLock lock(mu_);
  for (;;) {
    ++idle_;
    while (jobs_.empty() && !shutdown_) cv_.Wait(lock);
    --idle_;
    if (jobs_.empty()) return;  // shutting down, nothing left
    std::function<void()> fn = std::move(jobs_.front());
    jobs_.pop_front();
    lock.Unlock();
    fn();
    lock.Lock();
  }
}

void ElasticTaskQueue::ReapLocked() {
  for (auto it = extras_.begin(); it != extras_.end();) {
    if (!it->done) {
      ++it;
      continue;
    }
    it->thread.join();
    it = extras_.erase(it);
  }
}

}  // namespace kvpush::http
