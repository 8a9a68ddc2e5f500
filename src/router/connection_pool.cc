#include "router/connection_pool.h"

#include <httplib.h>
#include <poll.h>

#include <vector>

#include "common/clock.h"

namespace kvpush::router {
namespace {

void SplitSeconds(double s, time_t* sec, time_t* usec) {
  *sec = static_cast<time_t>(s);
  *usec = static_cast<time_t>((s - static_cast<double>(*sec)) * 1e6);
}

/// True when an idle keep-alive socket can carry a new request: open, and nothing to read (an
/// idle HTTP/1.1 connection has no pending bytes; EOF, an error or stray data mean it is dead or
/// out of step).
bool IdleSocketIsUsable(const httplib::Client& client) {
  if (!client.is_socket_open()) return false;
  pollfd p{};
  p.fd = client.socket();
  p.events = POLLIN;
  return ::poll(&p, 1, 0) == 0;
}

}  // namespace

ConnectionPool::ConnectionPool(ConnectionPoolOptions options) : options_(options) {}

ConnectionPool::~ConnectionPool() {
  Close();
}

std::unique_ptr<httplib::Client> ConnectionPool::NewClient(const InstanceAddress& address) const {
  auto cli = std::make_unique<httplib::Client>(address.host, address.port);
  time_t sec = 0, usec = 0;
  SplitSeconds(options_.connect_timeout_s, &sec, &usec);
  cli->set_connection_timeout(sec, usec);
  SplitSeconds(options_.io_timeout_s, &sec, &usec);
  cli->set_read_timeout(sec, usec);
  cli->set_write_timeout(sec, usec);
  cli->set_keep_alive(true);
  cli->set_tcp_nodelay(true);  // small legs and SSE chunks: no Nagle delay
  return cli;
}

std::unique_ptr<httplib::Client> ConnectionPool::Take(const InstanceAddress& address) {
  std::vector<std::unique_ptr<httplib::Client>> dead;  // closed outside the lock
  std::unique_ptr<httplib::Client> found;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.find(address.url);
    const int64_t oldest_ns = NowNs() - static_cast<int64_t>(options_.max_idle_s * 1e9);
    while (it != idle_.end() && !it->second.empty()) {
      Idle i = std::move(it->second.back());  // the most recently used one: least likely stale
      it->second.pop_back();
      if (i.since_ns >= oldest_ns && IdleSocketIsUsable(*i.client)) {
        found = std::move(i.client);
        break;
      }
      ++counts_.discarded;
      dead.push_back(std::move(i.client));
    }
    // Older idle connections beyond the age limit are dropped as well.
    if (it != idle_.end()) {
      auto& q = it->second;
      while (!q.empty() && q.front().since_ns < oldest_ns) {
        ++counts_.discarded;
        dead.push_back(std::move(q.front().client));
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
  return found ? std::move(found) : NewClient(address);
}

void ConnectionPool::Put(const InstanceAddress& address, std::unique_ptr<httplib::Client> client) {
  if (!client || !client->is_socket_open()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto& q = idle_[address.url];
  if (closed_ || q.size() >= options_.max_idle_per_instance) return;  // `client` closes
  q.push_back(Idle{std::move(client), NowNs()});
}

void ConnectionPool::Clear(const std::string& url) {
  std::deque<Idle> dead;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = idle_.find(url);
  if (it == idle_.end()) return;
  counts_.discarded += static_cast<int64_t>(it->second.size());
  dead.swap(it->second);
}

void ConnectionPool::CloseExpired() {
  std::vector<std::unique_ptr<httplib::Client>> dead;  // closed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t oldest_ns = NowNs() - static_cast<int64_t>(options_.max_idle_s * 1e9);
  for (auto& [url, q] : idle_) {
    while (!q.empty() && q.front().since_ns < oldest_ns) {
      ++counts_.discarded;
      dead.push_back(std::move(q.front().client));
      q.pop_front();
    }
  }
}

void ConnectionPool::Close() {
  std::unordered_map<std::string, std::deque<Idle>> dead;
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  dead.swap(idle_);
}

ConnectionPoolCounts ConnectionPool::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

size_t ConnectionPool::idle(const std::string& url) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = idle_.find(url);
  return it == idle_.end() ? 0 : it->second.size();
}

}  // namespace kvpush::router
