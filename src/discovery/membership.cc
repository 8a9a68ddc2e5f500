#include "discovery/membership.h"

#include <spdlog/spdlog.h>

#include "common/encoding.h"
#include "common/thread_name.h"

namespace kvpush::discovery {

std::vector<MembershipChange> MembershipCore::Reset(const std::vector<KeyValue>& kvs) {
  records_.clear();
  std::set<std::string> present;
  for (const KeyValue& kv : kvs) {
    present.insert(kv.key);
    Store(kv);
  }
  std::erase_if(logged_, [&](const std::string& k) { return !present.contains(k); });
  return Recompute();
}

std::vector<MembershipChange> MembershipCore::Put(const KeyValue& kv) {
  records_.erase(kv.key);
  Store(kv);
  return Recompute();
}

std::vector<MembershipChange> MembershipCore::Delete(const std::string& key) {
  records_.erase(key);
  logged_.erase(key);
  return Recompute();
}

void MembershipCore::Store(const KeyValue& kv) {
  auto r = InstanceRecord::Parse(prefix_, kv.key, kv.value);
  if (!r.ok()) {
    if (logged_.insert(kv.key).second) {
      spdlog::warn("discovery: ignoring key {}: {}", kv.key, r.status().message());
    }
    return;
  }
  if (r->role == "both") {
    if (logged_.insert(kv.key).second) {
      spdlog::warn("discovery: ignoring {} ({}): a colocated instance (role both) is not a P or D",
                   kv.key, r->url);
    }
    return;
  }
  records_[kv.key] = std::move(r).value();
}

std::vector<MembershipChange> MembershipCore::Recompute() {
  bool any_admitted = false;
  for (const auto& [key, r] : records_) {
    if (has_reference_ && r.compat_hash == reference_) any_admitted = true;
  }
  if (!any_admitted) {
    // Choose the reference anew: the hash most records carry (ties: the smallest).
    std::map<uint64_t, int> votes;
    for (const auto& [key, r] : records_) ++votes[r.compat_hash];
    has_reference_ = false;
    int best = 0;
    for (const auto& [hash, n] : votes) {
      if (n > best) {
        best = n;
        reference_ = hash;
        has_reference_ = true;
      }
    }
    if (has_reference_) {
      spdlog::info("discovery: pool compat hash is {} ({} of {} instances)", Hex64(reference_),
                   best, records_.size());
    }
  }
  std::vector<MembershipChange> changes;
  for (auto it = admitted_.begin(); it != admitted_.end();) {
    auto r = records_.find(it->first);
    if (r == records_.end() || !(r->second == it->second) || r->second.compat_hash != reference_) {
      changes.push_back({MembershipChange::Type::kRemove, it->second});
      it = admitted_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [key, r] : records_) {
    if (admitted_.contains(key)) continue;
    if (!has_reference_ || r.compat_hash != reference_) {
      if (logged_.insert(key).second) {
        spdlog::warn(
            "discovery: never pairing {} ({} {}): compat hash {} differs from the pool's "
            "{} (model, KV layout, connector version or transfer backend differ)",
            key, r.role, r.url, Hex64(r.compat_hash), Hex64(reference_));
      }
      continue;
    }
    logged_.erase(key);
    admitted_[key] = r;
    changes.push_back({MembershipChange::Type::kAdd, r});
  }
  return changes;
}

Result<std::unique_ptr<MembershipWatcher>> MembershipWatcher::Create(MembershipOptions options,
                                                                     MembershipCallback on_change) {
  if (options.endpoints.empty()) return InvalidArgument("discovery: no etcd endpoint");
  KVP_RETURN_IF_ERROR(ValidatePrefix(options.prefix));
  return std::unique_ptr<MembershipWatcher>(
      new MembershipWatcher(std::move(options), std::move(on_change)));
}

MembershipWatcher::MembershipWatcher(MembershipOptions options, MembershipCallback on_change)
    : options_(std::move(options)),
      watch_prefix_(options_.model.empty() ? options_.prefix
                                           : options_.prefix + EscapeSegment(options_.model) + "/"),
      on_change_(std::move(on_change)),
      client_(options_.endpoints, options_.etcd_timeout),
      core_(options_.prefix) {}

MembershipWatcher::~MembershipWatcher() {
  Stop();
}

void MembershipWatcher::Start() {
  if (thread_.joinable()) return;
  const int64_t revision = List();
  thread_ = std::thread([this, revision] {
    SetThreadName("kvp-etcd-watch");
    Loop(revision);
  });
}

void MembershipWatcher::Stop() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  canceller_.Cancel();
  if (thread_.joinable()) thread_.join();
}

bool MembershipWatcher::WaitStop(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + d;
  while (!stop_ && cv_.WaitUntil(lock, deadline)) {
  }
  return stop_;
}

void MembershipWatcher::Apply(const std::vector<MembershipChange>& changes) {
  for (const MembershipChange& c : changes) {
    spdlog::info("discovery: {} {} instance {} ({})",
                 c.type == MembershipChange::Type::kAdd ? "adding" : "removing", c.record.role,
                 c.record.url, c.record.Key(options_.prefix));
    if (on_change_) on_change_(c);
  }
  admitted_count_.store(core_.admitted().size());
}

int64_t MembershipWatcher::List() {
  auto r = client_.RangePrefix(watch_prefix_);
  if (!r.ok()) {
    if (!etcd_down_logged_) {
      spdlog::warn(
          "discovery: cannot list {} ({}); keeping the last known {} instance(s) and "
          "retrying",
          watch_prefix_, r.status().message(), core_.admitted().size());
      etcd_down_logged_ = true;
    }
    return 0;
  }
  if (etcd_down_logged_) spdlog::info("discovery: etcd answers again; membership re-listed");
  etcd_down_logged_ = false;
  lists_.fetch_add(1);
  Apply(core_.Reset(r->kvs));
  return r->revision;
}

void MembershipWatcher::Loop(int64_t revision) {
  while (true) {
    if (revision == 0) {
      if (WaitStop(options_.retry)) return;
      revision = List();
      continue;
    }
    const auto began = std::chrono::steady_clock::now();
    const Status s = client_.Watch(
        watch_prefix_, revision + 1,
        [this](const WatchMessage& m) {
          for (const WatchEvent& e : m.events) {
            Apply(e.type == WatchEvent::Type::kDelete ? core_.Delete(e.kv.key) : core_.Put(e.kv));
          }
        },
        canceller_, options_.watch_idle);
    if (s.code() == StatusCode::kCancelled) return;
    spdlog::debug("discovery: watch of {} ended ({}); listing again", watch_prefix_, s.message());
    if (std::chrono::steady_clock::now() - began < options_.retry) {
      // A watch that ends at once (etcd refused it) must not turn into a busy loop.
      if (WaitStop(options_.retry)) return;
    }
    revision = List();
  }
}

}  // namespace kvpush::discovery
