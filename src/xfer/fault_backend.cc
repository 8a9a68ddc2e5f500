#include "xfer/fault_backend.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "common/clock.h"

namespace kvpush::xfer {
namespace {

class FaultBackend final : public Backend, private BackendSink {
 public:
  FaultBackend(std::unique_ptr<Backend> inner, std::shared_ptr<FaultControls> controls)
      : inner_(std::move(inner)), controls_(std::move(controls)) {
    rng_.seed(controls_->Get().seed);
    timer_ = std::thread([this] { TimerLoop(); });
  }
  ~FaultBackend() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    timer_.join();   // delayed work still queued is dropped
    inner_.reset();  // joins the inner backend's threads; late completions only hit timers_
  }

  const BackendCaps& caps() const override { return inner_->caps(); }
  void SetSink(BackendSink* sink) override {
    sink_ = sink;
    inner_->SetSink(this);
  }
  std::vector<uint8_t> LocalAddress() const override { return inner_->LocalAddress(); }
  Result<std::unique_ptr<BackendRegion>> RegisterMemory(void* a, uint64_t n,
                                                        MemoryType t) override {
    return inner_->RegisterMemory(a, n, t);
  }
  Result<std::unique_ptr<BackendRegion>> AllocateMemory(uint64_t n, MemoryType t,
                                                        void** a) override {
    return inner_->AllocateMemory(n, t, a);
  }
  void ReleaseMemory(std::unique_ptr<BackendRegion> r) override {
    inner_->ReleaseMemory(std::move(r));
  }
  Result<std::shared_ptr<BackendPeer>> Connect(std::span<const uint8_t> address) override {
    return inner_->Connect(address);
  }
  Result<std::shared_ptr<BackendRemoteRegion>> ImportRegion(BackendPeer* p,
                                                            std::span<const uint8_t> k, uint64_t b,
                                                            uint64_t n) override {
    return inner_->ImportRegion(p, k, b, n);
  }
  void Disconnect(std::shared_ptr<BackendPeer> p,
                  std::vector<std::shared_ptr<BackendRemoteRegion>> r) override {
    inner_->Disconnect(std::move(p), std::move(r));
  }
  void Fence(std::shared_ptr<BackendPeer> p,
             std::vector<std::shared_ptr<BackendRemoteRegion>> r) override {
    inner_->Fence(std::move(p), std::move(r));
  }

  Status Post(PostRequest req) override {
    FaultPlan plan = controls_->Get();
    if (controls_->broken()) {
      if (plan.log_injections) {
        std::fputs("kvpush xfer fault: injected broken post failure\n", stderr);
      }
      return Unavailable("injected post failure (broken)");
    }
    std::lock_guard lock(mu_);
    if (Chance(plan.post_failure_rate)) {
      if (plan.log_injections) std::fputs("kvpush xfer fault: injected post failure\n", stderr);
      return Unavailable("injected post failure");
    }
    if (plan.peer_dead) {
      const BackendPeer* peer = req.peer.get();
      uint64_t token = req.token;
      Schedule(SteadyClock::now(), [this, peer, token] {
        sink_->OnPeerError(peer, PeerGone("injected peer death"));
        sink_->OnPostDone(token, PeerGone("injected peer death"));
      });
      return Status::Ok();
    }
    auto delay = Uniform(plan.max_post_delay);
    if (delay.count() == 0) return inner_->Post(std::move(req));
    auto shared = std::make_shared<PostRequest>(std::move(req));
    Schedule(SteadyClock::now() + delay, [this, shared] {
      uint64_t token = shared->token;
      Status s = inner_->Post(std::move(*shared));
      if (!s.ok()) sink_->OnPostDone(token, std::move(s));
    });
    return Status::Ok();
  }
  void Abort(uint64_t token) override { inner_->Abort(token); }
  BackendStats stats() const override { return inner_->stats(); }

 private:
  // BackendSink (from inner)
  void OnPostDone(uint64_t token, Status status) override {
    FaultPlan plan = controls_->Get();
    {
      std::lock_guard lock(mu_);
      if (plan.swallow_completions) return;
      if (status.ok() && Chance(plan.completion_failure_rate)) {
        if (plan.log_injections) {
          std::fputs("kvpush xfer fault: injected completion failure\n", stderr);
        }
        status = Internal("injected completion failure");
      }
      auto delay = Uniform(plan.max_completion_delay);
      if (delay.count() != 0) {
        Schedule(SteadyClock::now() + delay,
                 [this, token, status] { sink_->OnPostDone(token, status); });
        return;
      }
    }
    sink_->OnPostDone(token, std::move(status));
  }
  void OnMessage(std::span<const uint8_t> frame) override { sink_->OnMessage(frame); }
  void OnPeerError(const BackendPeer* peer, Status status) override {
    sink_->OnPeerError(peer, std::move(status));
  }
  void OnPeerFenced(const BackendPeer* peer) override { sink_->OnPeerFenced(peer); }

  bool Chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  std::chrono::microseconds Uniform(std::chrono::microseconds max) {
    if (max.count() <= 0) return max.zero();
    return std::chrono::microseconds(std::uniform_int_distribution<int64_t>(0, max.count())(rng_));
  }
  void Schedule(TimePoint when, std::function<void()> fn) {  // requires mu_
    timers_.emplace(when, std::move(fn));
    cv_.notify_one();
  }
  void TimerLoop() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      if (timers_.empty()) {
        cv_.wait(lock);
        continue;
      }
      auto it = timers_.begin();
      if (it->first > SteadyClock::now()) {
        cv_.wait_until(lock, it->first);
        continue;
      }
      auto fn = std::move(it->second);
      timers_.erase(it);
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  std::unique_ptr<Backend> inner_;
  std::shared_ptr<FaultControls> controls_;
  BackendSink* sink_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::mt19937_64 rng_;
  std::multimap<TimePoint, std::function<void()>> timers_;
  bool stopping_ = false;
  std::thread timer_;
};

}  // namespace

Result<FaultPlan> ParseFaultPlan(const std::string& spec) {
  FaultPlan plan;
  plan.log_injections = true;
  size_t pos = 0;
  while (pos < spec.size()) {
    size_t end = spec.find(',', pos);
    if (end == std::string::npos) end = spec.size();
    const std::string item = spec.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos)
      return InvalidArgument("fault plan: '" + item + "' is not key=value");
    const std::string key = item.substr(0, eq);
    const std::string value = item.substr(eq + 1);
    char* rest = nullptr;
    if (key == "post_failure_rate" || key == "completion_failure_rate") {
      const double v = std::strtod(value.c_str(), &rest);
      if (value.empty() || *rest != '\0' || !(v >= 0 && v <= 1)) {
        return InvalidArgument("fault plan: " + key + " must be a number in [0, 1]");
      }
      (key == "post_failure_rate" ? plan.post_failure_rate : plan.completion_failure_rate) = v;
    } else if (key == "max_post_delay_us" || key == "max_completion_delay_us" || key == "seed") {
      const unsigned long long v = std::strtoull(value.c_str(), &rest, 10);
      if (value.empty() || *rest != '\0' || value[0] == '-' || (key != "seed" && v > 10000000ULL)) {
        return InvalidArgument("fault plan: " + key + " must be an integer" +
                               (key == "seed" ? "" : " in [0, 10000000]"));
      }
      if (key == "seed") {
        plan.seed = v;
      } else {
        (key == "max_post_delay_us" ? plan.max_post_delay : plan.max_completion_delay) =
            std::chrono::microseconds(static_cast<int64_t>(v));
      }
    } else {
      return InvalidArgument("fault plan: unknown key '" + key +
                             "' (post_failure_rate, completion_failure_rate, max_post_delay_us, "
                             "max_completion_delay_us, seed)");
    }
  }
  return plan;
}

std::string FaultPlanToString(const FaultPlan& plan) {
  return "post_failure_rate=" + std::to_string(plan.post_failure_rate) +
         ",completion_failure_rate=" + std::to_string(plan.completion_failure_rate) +
         ",max_post_delay_us=" + std::to_string(plan.max_post_delay.count()) +
         ",max_completion_delay_us=" + std::to_string(plan.max_completion_delay.count()) +
         ",seed=" + std::to_string(plan.seed);
}

std::unique_ptr<Backend> MakeFaultBackend(std::unique_ptr<Backend> inner,
                                          std::shared_ptr<FaultControls> controls) {
  return std::make_unique<FaultBackend>(std::move(inner), std::move(controls));
}

}  // namespace kvpush::xfer
