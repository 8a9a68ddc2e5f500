#include "router/instance_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/thread_name.h"
#include "router/health_check.h"

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
  InstanceAddress a;
  std::string rest;
  if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else if (url.rfind("https://", 0) == 0) {
    rest = url.substr(8);
    a.https = true;
  } else {
    return InvalidArgument("instance URL '" + url +
                           "': expected http://HOST:PORT or https://HOST:PORT");
  }
  const std::string scheme = a.https ? "https://" : "http://";
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos) {
    return InvalidArgument("instance URL '" + url + "': a path is not allowed (give " + scheme +
                           "HOST:PORT)");
  }
  const size_t colon = rest.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("instance URL '" + url + "': missing port (give " + scheme +
                           "HOST:PORT)");
  }
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
  a.url = scheme + a.host + ":" + std::to_string(a.port);
  return a;
}

bool IsDrainingAnswer(const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("error") || !j["error"].is_object()) return false;
  const auto it = j["error"].find("code");
  return it != j["error"].end() && it->is_string() && *it == "draining";
}

ReportedLoad ParseHealthBody(const std::string& body) {
  ReportedLoad r;
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return r;
  auto int_of = [](const nlohmann::json& o, const char* key) -> int64_t {
    const auto it = o.find(key);
    return it != o.end() && it->is_number_integer() ? it->get<int64_t>() : 0;
  };
  const int64_t bs = int_of(j, "block_size");
  if (bs > 0 && bs <= (1 << 20)) r.block_size = static_cast<int32_t>(bs);
  const auto load = j.find("load");
  if (load != j.end() && load->is_object()) {
    r.reported = true;
    r.outstanding_prefill_tokens =
        std::max<int64_t>(0, int_of(*load, "outstanding_prefill_tokens"));
    r.running = int_of(*load, "running");
    r.waiting = int_of(*load, "waiting");
  }
  return r;
}

InstanceLease& InstanceLease::operator=(InstanceLease&& o) noexcept {
  if (this != &o) {
    Release();
    pool_ = o.pool_;
    index_ = o.index_;
    address_ = std::move(o.address_);
    role_ = o.role_;
    prefill_tokens_ = o.prefill_tokens_;
    epoch_ = o.epoch_;
    o.pool_ = nullptr;
  }
  return *this;
}

void InstanceLease::Release() {
  if (pool_ != nullptr) pool_->Release(index_, prefill_tokens_, epoch_);
  pool_ = nullptr;
}

void InstanceLease::MarkUnhealthy(const std::string& reason) const {
  if (pool_ != nullptr) pool_->SetHealth(index_, false, reason);
}

InstancePool::InstancePool(std::vector<InstanceAddress> prefill,
                           std::vector<InstanceAddress> decode, HealthOptions health,
                           std::vector<InstanceAddress> colocated)
    : health_(std::move(health)) {
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
    MutexLock lock(mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] {
    SetThreadName("kvp-rt-health");
    HealthLoop();
  });
}

void InstancePool::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void InstancePool::HealthLoop() {
  MutexLock lock(mu_);
  while (!stop_) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(health_.interval_ms);
    while (!stop_ && !recheck_) {
      if (!cv_.WaitUntil(lock, deadline)) break;
    }
    if (stop_) break;
    recheck_ = false;
    lock.Unlock();
    CheckAllOnce();
    if (on_round_) on_round_();
    lock.Lock();
  }
}

void InstancePool::CheckAllOnce() {
  // Membership can change while a check runs: check a copy, and drop results for slots that
  // changed meanwhile (SetHealth's and SetLoad's expect_url).
  std::vector<std::pair<size_t, InstanceAddress>> members;
  {
    MutexLock lock(mu_);
    for (size_t i = 0; i < instances_.size(); ++i) {
      if (instances_[i].member) members.emplace_back(i, instances_[i].address);
    }
  }
  for (const auto& [i, a] : members) {
    const HealthAnswer res = CheckHealth(a, health_.tls, health_.timeout_ms);
    SetTlsError(i, res.tls_failed ? res.error : std::string(), a.url);
    if (!res.answered) {
      SetHealth(i, false, "GET /health: " + res.error, a.url);
    } else if (res.status == 503 && IsDrainingAnswer(res.body)) {
      SetDraining(i, "GET /health: HTTP 503 draining", a.url);
    } else if (res.status != 200) {
      SetHealth(i, false, "GET /health: HTTP " + std::to_string(res.status), a.url);
    } else {
      SetLoad(i, ParseHealthBody(res.body), a.url);
      SetHealth(i, true, "GET /health: HTTP 200", a.url);
    }
  }
}

void InstancePool::SetTlsError(size_t index, const std::string& error,
                               const std::string& expect_url) {
  MutexLock lock(mu_);
  Instance& inst = instances_[index];
  if (!inst.member || inst.address.url != expect_url) return;
  inst.tls_error = error;
}

std::string InstancePool::TlsFailure(Role role, const std::vector<std::string>& exclude) const {
  MutexLock lock(mu_);
  for (const Instance& inst : instances_) {
    if (inst.role != role || !inst.member || inst.healthy || inst.tls_error.empty()) continue;
    if (std::find(exclude.begin(), exclude.end(), inst.address.url) != exclude.end()) continue;
    return inst.address.url + ": " + inst.tls_error;
  }
  return "";
}

void InstancePool::SetDraining(size_t index, const std::string& reason,
                               const std::string& expect_url) {
  UpdateHealth(index, HealthState::kDraining, reason, expect_url);
}

void InstanceLease::MarkDraining() const {
  if (pool_ != nullptr) pool_->SetDraining(index_, "it answered a request 503 draining");
}

void InstancePool::SetHealth(size_t index, bool healthy, const std::string& reason,
                             const std::string& expect_url) {
  UpdateHealth(index, healthy ? HealthState::kHealthy : HealthState::kUnhealthy, reason,
               expect_url);
}

void InstancePool::UpdateHealth(size_t index, HealthState next, const std::string& reason,
                                const std::string& expect_url) {
  Role role = Role::kPrefill;
  std::string url;
  {
    MutexLock lock(mu_);
    Instance& inst = instances_[index];
    if (!expect_url.empty() && (!inst.member || inst.address.url != expect_url)) return;
    const HealthState was = !inst.checked   ? HealthState::kUnknown
                            : inst.draining ? HealthState::kDraining
                            : inst.healthy  ? HealthState::kHealthy
                                            : HealthState::kUnhealthy;
    // Only news is logged. A draining instance that now fails its check is news (it may have
    // died); one that recovers from draining is too.
    if (was == next) return;
    inst.checked = true;
    inst.healthy = next == HealthState::kHealthy;
    inst.draining = next == HealthState::kDraining;
    role = inst.role;
    url = inst.address.url;
  }
  switch (next) {
    case HealthState::kHealthy:
      spdlog::info("router: {} instance {} is healthy ({})", RoleName(role), url, reason);
      return;
    case HealthState::kDraining:
      spdlog::info(
          "router: {} instance {} is draining ({}); no new requests go there, those in "
          "flight are left to finish",
          RoleName(role), url, reason);
      return;
    case HealthState::kUnhealthy:
    case HealthState::kUnknown:
      break;
  }
  spdlog::warn("router: {} instance {} is unhealthy ({}); excluded until /health passes",
               RoleName(role), url, reason);
  if (on_unhealthy_) on_unhealthy_(role, url, reason);
}

bool InstancePool::IsHealthy(const std::string& url) const {
  MutexLock lock(mu_);
  for (const Instance& inst : instances_) {
    if (inst.address.url == url) return inst.healthy || inst.draining;
  }
  return false;
}

std::optional<InstanceLease> InstancePool::Acquire(Role role) {
  return Acquire(role, {});
}

std::optional<InstanceLease> InstancePool::Acquire(Role role,
                                                   const std::vector<std::string>& exclude) {
  MutexLock lock(mu_);
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
    if (std::find(exclude.begin(), exclude.end(), inst.address.url) != exclude.end()) continue;
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

bool InstancePool::AnyHealthy(Role role, const std::vector<std::string>& exclude) const {
  MutexLock lock(mu_);
  for (const Instance& inst : instances_) {
    if (inst.role == role && inst.member && inst.healthy &&
        std::find(exclude.begin(), exclude.end(), inst.address.url) == exclude.end()) {
      return true;
    }
  }
  return false;
}

void InstancePool::Release(size_t index, int64_t prefill_tokens, uint64_t epoch) {
  MutexLock lock(mu_);
  Instance& inst = instances_[index];
  --inst.outstanding;
  inst.tokens_inflight -= prefill_tokens;
  if (epoch == inst.epoch) inst.tokens_since_poll -= prefill_tokens;
}

void InstancePool::SetLoad(size_t index, const ReportedLoad& load, const std::string& expect_url) {
  MutexLock lock(mu_);
  Instance& inst = instances_[index];
  if (!expect_url.empty() && (!inst.member || inst.address.url != expect_url)) return;
  inst.load = load;
  ++inst.epoch;  // legs acquired before this report are in its count (or done)
  inst.tokens_since_poll = 0;
}

int64_t InstancePool::PrefillTokens(const Instance& inst) {
  if (!inst.load.reported) return inst.tokens_inflight;
  return inst.load.outstanding_prefill_tokens + inst.tokens_since_poll;
}

InstancePool::Rotation InstancePool::HealthyFromCursor(
    Role role, const std::vector<std::string>& exclude) const {
  Rotation r;
  std::vector<size_t> of_role;
  for (size_t i = 0; i < instances_.size(); ++i) {
    if (instances_[i].role == role && instances_[i].member) of_role.push_back(i);
  }
  r.of_role = of_role.size();
  const size_t cursor = rr_[RoleIndex(role)];
  for (size_t k = 0; k < of_role.size(); ++k) {
    const size_t pos = (cursor + k) % of_role.size();
    const Instance& inst = instances_[of_role[pos]];
    if (!inst.healthy) continue;
    if (std::find(exclude.begin(), exclude.end(), inst.address.url) != exclude.end()) continue;
    r.instances.push_back(of_role[pos]);
    r.positions.push_back(pos);
  }
  return r;
}

int32_t InstancePool::ReportedBlockSize() const {
  MutexLock lock(mu_);
  for (const Instance& inst : instances_) {
    if (inst.role == Role::kDecode && inst.member && inst.healthy && inst.load.block_size > 0) {
      return inst.load.block_size;
    }
  }
  return 0;
}

void InstancePool::ClearPrefixIndexes() {
  MutexLock lock(mu_);
  for (Instance& inst : instances_) inst.index.reset();
}

std::optional<InstanceLease> InstancePool::AcquireDecode(std::span<const uint64_t> hashes,
                                                         RoutingPolicy policy,
                                                         const CacheAwareOptions& options,
                                                         DecodeChoice* choice,
                                                         const std::vector<std::string>& exclude) {
  MutexLock lock(mu_);
  const Rotation rot = HealthyFromCursor(Role::kDecode, exclude);
  const std::vector<size_t>& healthy = rot.instances;
  if (healthy.empty()) return std::nullopt;
  std::vector<DecodeCandidate> cands;
  cands.reserve(healthy.size());
  for (size_t i : healthy) {
    Instance& inst = instances_[i];
    if (!inst.index) inst.index = std::make_shared<PrefixIndex>(index_capacity_);
    cands.push_back(
        DecodeCandidate{inst.address.url, inst.outstanding, inst.index->MatchedBlocks(hashes)});
  }
  // Candidates start at the round-robin cursor: ties go to the first (as Acquire).
  DecodeChoice c;
  if (policy == RoutingPolicy::kCacheAware) {
    c = *ChooseDecodeCacheAware(cands, hashes, options, 0);
  } else {
    c.index = *ChooseLeastOutstanding(cands, 0);
    c.cached_blocks = cands[c.index].cached_blocks;
  }
  rr_[RoleIndex(Role::kDecode)] = (rot.positions[c.index] + 1) % rot.of_role;
  Instance& inst = instances_[healthy[c.index]];
  inst.index->Insert(hashes);
  ++inst.outstanding;
  if (choice != nullptr) *choice = c;
  return InstanceLease(this, healthy[c.index], inst.address, Role::kDecode);
}

std::optional<InstanceLease> InstancePool::AcquirePrefill(int64_t prompt_tokens,
                                                          RoutingPolicy policy,
                                                          const std::vector<std::string>& exclude) {
  MutexLock lock(mu_);
  const Rotation rot = HealthyFromCursor(Role::kPrefill, exclude);
  const std::vector<size_t>& healthy = rot.instances;
  if (healthy.empty()) return std::nullopt;
  std::vector<DecodeCandidate> by_legs;
  std::vector<PrefillCandidate> by_tokens;
  for (size_t i : healthy) {
    const Instance& inst = instances_[i];
    by_legs.push_back(DecodeCandidate{inst.address.url, inst.outstanding, 0});
    by_tokens.push_back(PrefillCandidate{PrefillTokens(inst), inst.outstanding});
  }
  const size_t k = policy == RoutingPolicy::kCacheAware && prompt_tokens > 0
                       ? *ChoosePrefillByTokens(by_tokens, 0)
                       : *ChooseLeastOutstanding(by_legs, 0);
  rr_[RoleIndex(Role::kPrefill)] = (rot.positions[k] + 1) % rot.of_role;
  Instance& inst = instances_[healthy[k]];
  const int64_t tokens = std::max<int64_t>(0, prompt_tokens);
  ++inst.outstanding;
  inst.tokens_inflight += tokens;
  inst.tokens_since_poll += tokens;
  return InstanceLease(this, healthy[k], inst.address, Role::kPrefill, tokens, inst.epoch);
}

std::vector<InstanceSnapshot> InstancePool::Snapshot() const {
  MutexLock lock(mu_);
  std::vector<InstanceSnapshot> out;
  out.reserve(instances_.size());
  for (const Instance& inst : instances_) {
    if (!inst.member) continue;
    out.push_back(InstanceSnapshot{inst.role, inst.address.url, inst.healthy, inst.draining,
                                   inst.outstanding,
                                   inst.role == Role::kPrefill ? PrefillTokens(inst) : 0});
  }
  return out;
}

bool InstancePool::AddInstance(Role role, InstanceAddress address) {
  {
    MutexLock lock(mu_);
    std::optional<size_t> free_slot;
    for (size_t i = 0; i < instances_.size(); ++i) {
      Instance& inst = instances_[i];
      if (inst.role == role && inst.address.url == address.url) {
        if (inst.member) return false;
        // The same instance back: its legs in flight keep counting here; health anew.
        inst.member = true;
        inst.checked = false;
        inst.healthy = false;
        inst.draining = false;
        recheck_ = true;
        cv_.NotifyAll();
        return true;
      }
      if (!free_slot && !inst.member && inst.outstanding == 0) free_slot = i;
    }
    Instance fresh{role, std::move(address)};
    if (free_slot) {
      instances_[*free_slot] = std::move(fresh);
    } else {
      instances_.push_back(std::move(fresh));
    }
    recheck_ = true;
  }
  cv_.NotifyAll();
  return true;
}

bool InstancePool::RemoveInstance(Role role, const std::string& url) {
  MutexLock lock(mu_);
  for (Instance& inst : instances_) {
    if (inst.member && inst.role == role && inst.address.url == url) {
      inst.member = false;  // health is no longer checked; legs being set up still see it
      return true;
    }
  }
  return false;
}

}  // namespace kvpush::router
