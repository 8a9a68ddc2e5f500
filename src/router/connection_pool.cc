#include "router/connection_pool.h"

#include <vector>

#include "common/clock.h"

namespace kvpush::router {

ConnectionPool::ConnectionPool(ConnectionPoolOptions options) : options_(std::move(options)) {}

ConnectionPool::~ConnectionPool() {
  Close();
}

std::unique_ptr<HttpConn> ConnectionPool::Take(const InstanceAddress& address) {
  std::vector<std::unique_ptr<HttpConn>> dead;  // closed outside the lock
  std::unique_ptr<HttpConn> found;
  {
    MutexLock lock(mu_);
    auto it = idle_.find(address.url);
    const int64_t oldest_ns = NowNs() - static_cast<int64_t>(options_.max_idle_s * 1e9);
    while (it != idle_.end() && !it->second.empty()) {
      Idle i = std::move(it->second.back());  // the most recently used one: least likely stale
      it->second.pop_back();
      if (i.since_ns >= oldest_ns && i.conn->IdleUsable()) {
        found = std::move(i.conn);
        break;
      }
      ++counts_.discarded;
      dead.push_back(std::move(i.conn));
    }
    // Older idle connections beyond the age limit are dropped as well.
    if (it != idle_.end()) {
      auto& q = it->second;
      while (!q.empty() && q.front().since_ns < oldest_ns) {
        ++counts_.discarded;
        dead.push_back(std::move(q.front().conn));
        q.pop_front();
      }
    }
    if (found) {
      ++counts_.reused;
    } else {
      ++counts_.opened;
    }
  }
  dead.clear();
  return found ? std::move(found) : std::make_unique<HttpConn>(address, options_.tls);
}

void ConnectionPool::Put(const InstanceAddress& address, std::unique_ptr<HttpConn> conn) {
  if (!conn || !conn->reusable()) return;
  MutexLock lock(mu_);
  auto& q = idle_[address.url];
  if (closed_ || q.size() >= options_.max_idle_per_instance) return;  // `conn` closes
  q.push_back(Idle{std::move(conn), NowNs()});
}

void ConnectionPool::Clear(const std::string& url) {
  std::deque<Idle> dead;
  MutexLock lock(mu_);
  auto it = idle_.find(url);
  if (it == idle_.end()) return;
  counts_.discarded += static_cast<int64_t>(it->second.size());
  dead.swap(it->second);
}

void ConnectionPool::CloseExpired() {
  std::vector<std::unique_ptr<HttpConn>> dead;  // closed outside the lock
  MutexLock lock(mu_);
  const int64_t oldest_ns = NowNs() - static_cast<int64_t>(options_.max_idle_s * 1e9);
  for (auto& [url, q] : idle_) {
    while (!q.empty() && q.front().since_ns < oldest_ns) {
      ++counts_.discarded;
      dead.push_back(std::move(q.front().conn));
      q.pop_front();
    }
  }
}

void ConnectionPool::Close() {
  std::unordered_map<std::string, std::deque<Idle>> dead;
  MutexLock lock(mu_);
  closed_ = true;
  dead.swap(idle_);
}

ConnectionPoolCounts ConnectionPool::counts() const {
  MutexLock lock(mu_);
  return counts_;
}

size_t ConnectionPool::idle(const std::string& url) const {
  MutexLock lock(mu_);
  auto it = idle_.find(url);
  return it == idle_.end() ? 0 : it->second.size();
}

}  // namespace kvpush::router
