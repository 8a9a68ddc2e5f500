#include "model/worker_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <set>

#include <spdlog/spdlog.h>

namespace kvpush {

namespace {

/// The CPUs of this process's affinity mask, in increasing order.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

void BindCurrentThread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set); rc != 0) {
    spdlog::warn("executor thread not bound to CPU {}: error {}", cpu, rc);
  }
}

}  // namespace

Result<std::vector<int>> ResolveThreadsBind(const std::string& spec, int threads) {
  const std::vector<int> allowed = AllowedCpus();
  if (spec == "nobind") return std::vector<int>{};
  if (spec == "auto") {
    if (threads < 2 || static_cast<int>(allowed.size()) < threads) return std::vector<int>{};
    return std::vector<int>(allowed.begin(), allowed.begin() + threads);
  }
  auto bad = [&](const std::string& why) {
    return InvalidArgument("--threads-bind '" + spec + "': " + why);
  };
  std::vector<int> cpus;
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, comma - at);
    const size_t dash = item.find('-');
    int lo = 0, hi = 0;
    try {
      size_t used = 0;
      lo = std::stoi(item.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? item.size() : dash)) return bad("not a CPU list");
      hi = lo;
      if (dash != std::string::npos) {
        hi = std::stoi(item.substr(dash + 1), &used);
        if (used != item.size() - dash - 1) return bad("not a CPU list");
      }
    } catch (const std::exception&) {
      return bad("not 'auto', 'nobind' or a CPU list such as 0-1 or 2,5");
    }
    if (lo < 0 || hi < lo || hi - lo > 4096) return bad("not a CPU list");
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
    at = comma + 1;
  }
  if (static_cast<int>(cpus.size()) != threads) {
    return bad("names " + std::to_string(cpus.size()) + (cpus.size() == 1 ? " CPU" : " CPUs") +
               " for " + std::to_string(threads) + (threads == 1 ? " thread" : " threads"));
  }
  if (std::set<int>(cpus.begin(), cpus.end()).size() != cpus.size()) return bad("a CPU repeats");
  for (int c : cpus) {
    if (!std::binary_search(allowed.begin(), allowed.end(), c)) {
      return bad("CPU " + std::to_string(c) + " is not in this process's affinity mask");
    }
  }
  return cpus;
}

WorkerPool::WorkerPool(int threads, std::vector<int> cpus)
    : threads_(std::max(1, threads)), cpus_(std::move(cpus)) {
  const int workers = threads_ - 1;
  workers_.reserve(static_cast<size_t>(workers));
  for (int i = 0; i < workers; ++i) {
    workers_.emplace_back([this, i] {
      if (static_cast<int>(cpus_.size()) == threads_) BindCurrentThread(cpus_[i + 1]);
      WorkerLoop(i + 1);
    });
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {

/// Spins until `done()` or `ns` nanoseconds passed; true when done.
template <typename Done>
bool SpinFor(int64_t ns, Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(ns);
  for (int i = 0;; ++i) {
    if (done()) return true;
    __builtin_ia32_pause();
    if ((i & 63) == 63 && std::chrono::steady_clock::now() >= until) return false;
  }
}

}  // namespace

void WorkerPool::Run(int parts, const std::function<void(int)>& fn) {
  if (!caller_bound_ && static_cast<int>(cpus_.size()) == threads_) {
    BindCurrentThread(cpus_[0]);
    caller_bound_ = true;
  }
  if (workers_.empty() || parts <= 1) {
    for (int p = 0; p < parts; ++p) fn(p);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    parts_ = parts;
    pending_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  // Thread t (0 = the caller) runs parts t, t + threads, ...: a fixed assignment, no queue.
  const int n = threads();
  for (int p = 0; p < parts; p += n) fn(p);
  if (!SpinFor(kSpinNs, [this] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
  }
}

uint64_t WorkerPool::AwaitWork(uint64_t seen) {
  auto ready = [&] {
    return stop_.load(std::memory_order_acquire) ||
           generation_.load(std::memory_order_acquire) != seen;
  };
  if (!SpinFor(kSpinNs, ready)) {
    std::unique_lock<std::mutex> lock(mu_);
    start_cv_.wait(lock, ready);
  }
  return stop_.load(std::memory_order_acquire) ? 0 : generation_.load(std::memory_order_acquire);
}

void WorkerPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  const int n = threads();
  for (;;) {
    seen = AwaitWork(seen);
    if (seen == 0) return;
    const std::function<void(int)>* fn = fn_;
    const int parts = parts_;
    for (int p = index; p < parts; p += n) (*fn)(p);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under the lock: the caller checks pending_ and blocks atomically with respect to it.
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace kvpush
