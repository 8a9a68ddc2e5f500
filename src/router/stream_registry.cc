#include "router/stream_registry.h"

#include <utility>

namespace kvpush::router {

std::optional<MoveOutcome> MoveSlot::Ask(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  if (closed_) return MoveOutcome{false, "", "", "the stream ended"};
  if (asked_) return MoveOutcome{false, "", "", "a move of this stream is already in progress"};
  asked_ = true;
  outcome_.reset();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!outcome_ && !closed_) {
    if (!cv_.WaitUntil(lock, deadline)) break;
  }
  asked_ = false;
  if (!outcome_ && closed_) return MoveOutcome{false, "", "", "the stream ended"};
  std::optional<MoveOutcome> out = std::move(outcome_);
  outcome_.reset();
  return out;
}

bool MoveSlot::Asked() {
  MutexLock lock(mu_);
  return asked_ && !outcome_;
}

void MoveSlot::Answer(MoveOutcome outcome) {
  {
    MutexLock lock(mu_);
    outcome_ = std::move(outcome);
  }
  cv_.NotifyAll();
}

void MoveSlot::Close(const std::string& why) {
  {
    MutexLock lock(mu_);
    closed_ = true;
    if (asked_ && !outcome_) outcome_ = MoveOutcome{false, "", "", why};
  }
  cv_.NotifyAll();
}

void StreamRegistry::Add(const std::string& request_id, const std::shared_ptr<MoveSlot>& slot) {
  MutexLock lock(mu_);
  slots_[request_id] = slot;
}

void StreamRegistry::Remove(const std::string& request_id, const MoveSlot* slot) {
  MutexLock lock(mu_);
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return;
  const std::shared_ptr<MoveSlot> held = it->second.lock();
  if (held == nullptr || held.get() == slot) slots_.erase(it);
}

std::shared_ptr<MoveSlot> StreamRegistry::Find(const std::string& request_id) {
  MutexLock lock(mu_);
  auto it = slots_.find(request_id);
  return it == slots_.end() ? nullptr : it->second.lock();
}

}  // namespace kvpush::router
