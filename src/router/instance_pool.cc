#include "router/instance_pool.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <limits>

namespace kvpush::router {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kPrefill:
      return "prefill";
    case Role::kDecode:
      return "decode";
    case Role::kColocated:
      return "colocated";
  }
  return "unknown";
}

Result<InstanceAddress> ParseInstanceUrl(const std::string& url) {
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) != 0) {
    return InvalidArgument("instance URL '" + url +
                           "': expected http://HOST:PORT (only the http scheme is supported)");
  }
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    return InvalidArgument("instance URL '" + url +
                           "': a path is not allowed (give http://HOST:PORT)");
  }
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("instance URL '" + url + "': missing port (give http://HOST:PORT)");
  }
  InstanceAddress a;
  a.host = rest.substr(0, colon);
  const std::string port = rest.substr(colon + 1);
  if (a.host.empty()) return InvalidArgument("instance URL '" + url + "': missing host");
  if (a.host.find_first_of("@?#[] ") != std::string::npos) {
    return InvalidArgument("instance URL '" + url + "': unsupported characters in host");
  }
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return InvalidArgument("instance URL '" + url + "': port must be a number in [1, 65535]");
  }
  a.port = std::stoi(port);
  if (a.port < 1 || a.port > 65535) {
    return InvalidArgument("instance URL '" + url + "': port must be a number in [1, 65535]");
  }
  a.url = "http://" + a.host + ":" + std::to_string(a.port);
  return a;
}

InstanceLease& InstanceLease::operator=(InstanceLease&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = o.pool_;
    index_ = o.index_;
    address_ = std::move(o.address_);
    role_ = o.role_;
    o.pool_ = nullptr;
  }
  return *this;
}

void InstanceLease::Release() {
  if (pool_ != nullptr) pool_->Release(index_);
  pool_ = nullptr;
}

void InstanceLease::MarkUnhealthy(const std::string& reason) const {
  if (pool_ != nullptr) pool_->SetHealth(index_, false, reason);
}

InstancePool::InstancePool(std::vector<InstanceAddress> prefill,
                           std::vector<InstanceAddress> decode, HealthOptions health,
                           std::vector<InstanceAddress> colocated)
    : health_(health) {
  for (auto& a : prefill) instances_.push_back(Instance{Role::kPrefill, std::move(a)});
  for (auto& a : decode) instances_.push_back(Instance{Role::kDecode, std::move(a)});
  for (auto& a : colocated) instances_.push_back(Instance{Role::kColocated, std::move(a)});
}

InstancePool::~InstancePool() {
  Stop();
}

void InstancePool::Start() {
  if (thread_.joinable()) return;
  CheckAllOnce();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { HealthLoop(); });
}

void InstancePool::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void InstancePool::HealthLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(health_.interval_ms),
                 [this] { return stop_ || recheck_; });
    if (stop_) break;
    recheck_ = false;
    lock.unlock();
    CheckAllOnce();
    if (on_round_) on_round_();
    lock.lock();
  }
}

void InstancePool::CheckAllOnce() {
  // Membership can change while a check runs: check a copy, and drop results for slots that
  // changed meanwhile (SetHealth's expect_url).
  std::vector<std::pair<size_t, InstanceAddress>> members;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < instances_.size(); ++i) {
      if (instances_[i].member) members.emplace_back(i, instances_[i].address);
    }
  }
  for (const auto& [i, a] : members) {
    httplib::Client cli(a.host, a.port);
    const time_t sec = health_.timeout_ms / 1000;
    const time_t usec = static_cast<time_t>(health_.timeout_ms % 1000) * 1000;
    cli.set_connection_timeout(sec, usec);
    cli.set_read_timeout(sec, usec);
    cli.set_write_timeout(sec, usec);
    auto res = cli.Get("/health");
    if (!res) {
      SetHealth(i, false, "GET /health: " + httplib::to_string(res.error()), a.url);
    } else if (res->status != 200) {
      SetHealth(i, false, "GET /health: HTTP " + std::to_string(res->status), a.url);
    } else {
      SetHealth(i, true, "GET /health: HTTP 200", a.url);
    }
  }
}

void InstancePool::SetHealth(size_t index, bool healthy, const std::string& reason,
                             const std::string& expect_url) {
  Role role = Role::kPrefill;
  std::string url;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Instance& inst = instances_[index];
    if (!expect_url.empty() && (!inst.member || inst.address.url != expect_url)) return;
    if (inst.checked && inst.healthy == healthy) return;
    inst.checked = true;
    inst.healthy = healthy;
    role = inst.role;
    url = inst.address.url;
  }
  if (healthy) {
    spdlog::info("router: {} instance {} is healthy ({})", RoleName(role), url, reason);
    return;
  }
  spdlog::warn("router: {} instance {} is unhealthy ({}); excluded until /health passes",
               RoleName(role), url, reason);
  if (on_unhealthy_) on_unhealthy_(role, url, reason);
}

bool InstancePool::IsHealthy(const std::string& url) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Instance& inst : instances_) {
    if (inst.address.url == url) return inst.healthy;
  }
  return false;
}

std::optional<InstanceLease> InstancePool::Acquire(Role role) {
  std::lock_guard<std::mutex> lock(mu_);
  // Scan the role's instances starting at the round-robin cursor; the first with the minimum
  // outstanding count wins, so ties rotate.
  std::vector<size_t> of_role;
  for (size_t i = 0; i < instances_.size(); ++i) {
    if (instances_[i].role == role && instances_[i].member) of_role.push_back(i);
  }
  if (of_role.empty()) return std::nullopt;
  size_t& cursor = rr_[RoleIndex(role)];
  // Colocated: plain round robin (the first healthy one from the cursor); P/D: least outstanding.
  const bool round_robin = role == Role::kColocated;
  std::optional<size_t> best;
  int64_t best_outstanding = std::numeric_limits<int64_t>::max();
  size_t best_k = 0;
  for (size_t k = 0; k < of_role.size(); ++k) {
    const size_t pos = (cursor + k) % of_role.size();
    const Instance& inst = instances_[of_role[pos]];
    if (!inst.healthy) continue;
    if (inst.outstanding < best_outstanding) {
      best_outstanding = inst.outstanding;
      best = of_role[pos];
      best_k = pos;
      if (round_robin) break;
    }
  }
  if (!best) return std::nullopt;
  cursor = (best_k + 1) % of_role.size();
  ++instances_[*best].outstanding;
  return InstanceLease(this, *best, instances_[*best].address, role);
}

void InstancePool::Release(size_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  --instances_[index].outstanding;
}

std::vector<InstanceSnapshot> InstancePool::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<InstanceSnapshot> out;
  out.reserve(instances_.size());
  for (const Instance& inst : instances_) {
    if (!inst.member) continue;
    out.push_back(InstanceSnapshot{inst.role, inst.address.url, inst.healthy, inst.outstanding});
  }
  return out;
}

bool InstancePool::AddInstance(Role role, InstanceAddress address) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<size_t> slot;
    for (size_t i = 0; i < instances_.size(); ++i) {
      Instance& inst = instances_[i];
      if (inst.role == role && inst.address.url == address.url) {
        if (inst.member) return false;
        slot = i;  // the same instance back: its legs in flight keep counting here
        break;
      }
      if (!slot && !inst.member && inst.outstanding == 0) slot = i;
    }
    Instance fresh{role, std::move(address)};
    if (slot) {
      fresh.outstanding = instances_[*slot].outstanding;
      instances_[*slot] = std::move(fresh);
    } else {
      instances_.push_back(std::move(fresh));
    }
    recheck_ = true;
  }
  cv_.notify_all();
  return true;
}

bool InstancePool::RemoveInstance(Role role, const std::string& url) {
  std::lock_guard<std::mutex> lock(mu_);
  for (Instance& inst : instances_) {
    if (inst.member && inst.role == role && inst.address.url == url) {
      inst.member = false;  // health is no longer checked; legs being set up still see it
      return true;
    }
  }
  return false;
}

}  // namespace kvpush::router
