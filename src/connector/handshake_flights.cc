#include "connector/handshake_flights.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "common/thread_name.h"

namespace kvpush::connector {
namespace {

/// How often a waiting caller asks `cancelled`.
constexpr std::chrono::milliseconds kCancelPoll{20};
/// Endpoints with an attempt or a probe under way at once (each holds one thread): a client
/// naming endless endpoints gets kUnavailable instead of a thread per name.
constexpr int kMaxRunningFlights = 64;

int64_t MsSince(HandshakeFlights::Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(HandshakeFlights::Clock::now() - t)
      .count();
}

}  // namespace

HandshakeFlights::HandshakeFlights(Attempt attempt)
    : HandshakeFlights(std::move(attempt), Options{}) {}

HandshakeFlights::HandshakeFlights(Attempt attempt, Options options)
    : attempt_(std::move(attempt)), options_(options) {}

HandshakeFlights::~HandshakeFlights() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(mu_);
    stopping_ = true;
    for (auto& [key, f] : flights_) {
      if (f->thread.joinable()) threads.push_back(std::move(f->thread));
    }
  }
  cv_.NotifyAll();
  for (std::thread& t : threads) t.join();
}

int64_t HandshakeFlights::attempts() const {
  MutexLock lock(mu_);
  return attempts_;
}

Result<std::string> HandshakeFlights::Answer(const std::string& key, const Flight& f,
                                             bool at_once) {
  if (f.failure.ok()) return f.engine_id;
  if (!at_once) {
    // The flight thread starts its probe under the lock it woke us with, so a waiter sees it.
    if (!f.probing) return f.failure;
    return Status(f.failure.code(), f.failure.message() + " (retried in the background)");
  }
  return Status(f.failure.code(), f.failure.message() + " (handshake with " + key + " failed " +
                                      std::to_string(MsSince(f.failed_at)) +
                                      " ms ago; retried in the background)");
}

Result<std::string> HandshakeFlights::Await(const std::string& key, Clock::time_point deadline,
                                            const std::function<bool()>& cancelled) {
  MutexLock lock(mu_);
  if (stopping_) return Unavailable("handshake with " + key + ": shutting down");
  std::unique_ptr<Flight>& slot = flights_[key];
  if (!slot) slot = std::make_unique<Flight>();
  Flight& f = *slot;  // entries are never erased: the reference outlives unlocking
  f.last_asked = Clock::now();
  // A failed endpoint is answered at once while its probe retries it: nobody queues behind a
  // dead peer.
  if (f.probing) return Answer(key, f, true);
  if (!f.running) {
    const auto running = std::count_if(flights_.begin(), flights_.end(),
                                       [](const auto& kv) { return kv.second->running; });
    if (running >= kMaxRunningFlights) {
      return Unavailable("handshake with " + key + ": " + std::to_string(running) +
                         " other handshakes are under way");
    }
    // The previous flight thread set running = false as its last act under the lock.
    if (f.thread.joinable()) f.thread.join();
    f.running = true;
    f.thread = std::thread([this, key] { Run(key); });
  }
  const uint64_t joined = f.generation;
  while (f.generation == joined) {
    if (stopping_) return Unavailable("handshake with " + key + ": shutting down");
    const auto now = Clock::now();
    if (now >= deadline) {
      return DeadlineExceeded("handshake with " + key +
                              " still under way when the request's deadline passed");
    }
    if (cancelled) {
      lock.Unlock();
      const bool stop = cancelled();
      lock.Lock();
      if (stop) return Aborted("handshake with " + key + ": the request was aborted meanwhile");
      if (f.generation != joined) break;
    }
    cv_.WaitUntil(lock, std::min(deadline, now + kCancelPoll));
  }
  return Answer(key, f, false);
}

void HandshakeFlights::Run(const std::string& key) {
  SetThreadName("kvp-handshake");
  auto backoff = options_.probe_min;
  for (;;) {
    {
      MutexLock lock(mu_);
      ++attempts_;
    }
    Result<std::string> r = attempt_(key);
    MutexLock lock(mu_);
    Flight& f = *flights_.at(key);
    ++f.generation;
    if (r.ok()) {
      f.failure = Status::Ok();
      f.engine_id = *r;
    } else {
      f.failure = r.status();
      f.failed_at = Clock::now();
    }
    cv_.NotifyAll();
    const bool wanted = Clock::now() - f.last_asked <= options_.interest;
    if (r.ok() || stopping_ || !wanted) {
      f.probing = false;
      f.running = false;
      return;
    }
    f.probing = true;
    const auto next = Clock::now() + backoff;
    while (!stopping_ && Clock::now() < next) cv_.WaitUntil(lock, next);
    if (stopping_) {
      f.probing = false;
      f.running = false;
      return;
    }
    backoff = std::min(backoff * 2, options_.probe_max);
  }
}

}  // namespace kvpush::connector
