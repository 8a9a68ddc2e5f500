#include "router/leg_registry.h"

#include <utility>

namespace kvpush::router {

LegRegistry::LegRegistry(ConnectionPool* connections, double connect_timeout_s,
                         double request_timeout_s,
                         std::function<bool(const std::string& url)> is_healthy,
                         std::string api_key)
    : connections_(connections),
      connect_timeout_s_(connect_timeout_s),
      request_timeout_s_(request_timeout_s),
      api_key_(std::move(api_key)),
      is_healthy_(std::move(is_healthy)) {}

std::shared_ptr<Leg> LegRegistry::NewLeg(const InstanceAddress& address, Role role) {
  std::shared_ptr<Leg> leg(new Leg(address, connections_, connect_timeout_s_, request_timeout_s_, api_key_),
                           [this](Leg* l) {
                             Forget(l);
                             delete l;
                           });
  MutexLock lock(mu_);
  if (stopping_) leg->Stop();
  legs_.emplace(leg.get(), role);
  // Marked unhealthy between selection and now: CutTo ran before this leg was registered.
  if (is_healthy_ && !is_healthy_(address.url)) {
    leg->Cut(std::string(RoleName(role)) + " instance " + address.url + " is unhealthy");
  }
  return leg;
}

int LegRegistry::CutTo(const std::string& url, const std::string& reason) {
  int cut = 0;
  MutexLock lock(mu_);
  for (const auto& [leg, role] : legs_) {
    if (leg->address().url != url || leg->stopped() || leg->finished()) continue;
    leg->Cut(reason);
    ++cut;
  }
  return cut;
}

void LegRegistry::Forget(Leg* leg) {
  MutexLock lock(mu_);
  legs_.erase(leg);
}

bool LegRegistry::BeginBackground() {
  MutexLock lock(mu_);
  if (stopping_) return false;
  ++background_;
  return true;
}

void LegRegistry::EndBackground() {
  MutexLock lock(mu_);
  --background_;
  cv_.NotifyAll();
}

void LegRegistry::StopAll() {
  MutexLock lock(mu_);
  stopping_ = true;
  for (const auto& [leg, role] : legs_) leg->Stop();
}

void LegRegistry::WaitBackground() {
  MutexLock lock(mu_);
  while (background_ != 0) cv_.Wait(lock);
}

size_t LegRegistry::inflight() const {
  MutexLock lock(mu_);
  return legs_.size() + static_cast<size_t>(background_);
}

}  // namespace kvpush::router
