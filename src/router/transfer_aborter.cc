#include "router/transfer_aborter.h"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/thread_name.h"
#include "router/leg.h"

namespace kvpush::router {

TransferAborter::TransferAborter(AbortOptions options) : options_(std::move(options)) {}

TransferAborter::~TransferAborter() {
  Stop();
}

void TransferAborter::Start() {
  MutexLock lock(mu_);
  if (running_ || stopping_) return;
  running_ = true;
  for (int i = 0; i < options_.threads; ++i)
    threads_.emplace_back([this] {
      SetThreadName("kvp-rt-abort");
      Work();
    });
}

void TransferAborter::Stop() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    counts_.dropped += static_cast<int64_t>(queue_.size());
    queue_.clear();
    for (Leg* l : in_flight_) l->Stop();
  }
  cv_.NotifyAll();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
}

void TransferAborter::Abort(const InstanceAddress& instance, Role role,
                            const std::string& transfer_id, const std::string& request_id) {
  {
    MutexLock lock(mu_);
    if (!running_ || stopping_ || queue_.size() >= options_.max_queued) {
      ++counts_.dropped;
      if (!stopping_) {
        spdlog::warn("request {}: abort of transfer {} on {} dropped ({} aborts queued)",
                     request_id, transfer_id, instance.url, queue_.size());
      }
      return;
    }
    queue_.push_back(Job{instance, role, transfer_id, request_id});
  }
  cv_.NotifyOne();
}

AbortCounts TransferAborter::counts() const {
  MutexLock lock(mu_);
  return counts_;
}

void TransferAborter::Work() {
  MutexLock lock(mu_);
  for (;;) {
    while (!stopping_ && queue_.empty()) cv_.Wait(lock);
    if (stopping_) return;
    Job job = std::move(queue_.front());
    queue_.pop_front();
    lock.Unlock();
    Send(job);
    lock.Lock();
  }
}

void TransferAborter::Send(const Job& job) {
  LogRequestScope scope(job.request_id);
  Leg leg(job.instance, /*pool=*/nullptr, options_.connect_timeout_s, options_.read_timeout_s,
          options_.api_key, options_.tls);
  {
    MutexLock lock(mu_);
    if (stopping_) return;
    in_flight_.insert(&leg);
  }
  const std::string body = nlohmann::json{{"transfer_id", job.transfer_id}}.dump();
  const LegResult r = leg.Post("/kv/abort", job.request_id, body);
  const bool ok = r.answered && r.status == 200;
  const size_t k = job.role == Role::kPrefill ? 0 : 1;
  {
    MutexLock lock(mu_);
    in_flight_.erase(&leg);
    ++(ok ? counts_.ok : counts_.failed)[k];
  }
  if (ok) {
    spdlog::debug("request {}: {} instance {} aborted transfer {}: {}", job.request_id,
                  RoleName(job.role), job.instance.url, job.transfer_id, r.body);
  } else if (!r.stopped) {
    spdlog::warn("request {}: POST /kv/abort of transfer {} to {} instance {} failed: {}",
                 job.request_id, job.transfer_id, RoleName(job.role), job.instance.url,
                 r.answered ? "HTTP " + std::to_string(r.status) + " " + r.body : r.error);
  }
}

}  // namespace kvpush::router
