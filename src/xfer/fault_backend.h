// Fault backend: a decorator over any backend that injects failures and delays, so the Agent's
// error paths (post failures, failed completions, stalls, peer death) run in CPU-only tests.
//
// The plan lives in a FaultControls object shared with the test, which can change it at any time
// (e.g. "the peer dies now"). Randomness is seeded, so a failing run can be replayed.
// Thread-safety: as Backend; FaultControls is thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "xfer/backend.h"

namespace kvpush::xfer {

/// What to inject. Rates are probabilities in [0, 1] per post.
struct FaultPlan {
  double post_failure_rate = 0;        ///< Post() returns kUnavailable("injected post failure")
  double completion_failure_rate = 0;  ///< completion replaced by kInternal("injected ...")
  std::chrono::microseconds max_post_delay{0};        ///< uniform random delay before forwarding
  std::chrono::microseconds max_completion_delay{0};  ///< uniform random delay of completions
  bool swallow_completions = false;  ///< completions never reported: the transfer stalls
  bool peer_dead = false;            ///< posts complete with kPeerGone; OnPeerError is reported
  uint64_t seed = 1;
  /// One line on stderr per injected failure ("kvpush xfer fault: injected post failure"), so a
  /// test driving whole processes can count what was injected (the chaos test).
  bool log_injections = false;
};

/// Parses a plan from "key=value,key=value" (the `kvpush serve --xfer-fault-plan` flag):
/// post_failure_rate, completion_failure_rate (in [0, 1]), max_post_delay_us,
/// max_completion_delay_us (0..10,000,000), seed. Unknown keys and bad values are
/// kInvalidArgument naming the key. log_injections is set.
Result<FaultPlan> ParseFaultPlan(const std::string& spec);

/// The plan as ParseFaultPlan reads it (for the start-up line).
std::string FaultPlanToString(const FaultPlan& plan);

/// Shared, mutable fault plan plus counters of what was injected.
class FaultControls {
 public:
  void Set(const FaultPlan& plan) {
    std::lock_guard lock(mu_);
    plan_ = plan;
  }
  FaultPlan Get() {
    std::lock_guard lock(mu_);
    return plan_;
  }
  /// A broken but alive peer: while set, every post fails with kUnavailable("injected post
  /// failure (broken)") — one line "kvpush xfer fault: injected broken post failure" on stderr
  /// each when the plan logs injections — whatever the plan's rates; completions, messages
  /// received and the connection are untouched. Lock-free (async-signal-safe: `kvpush serve
  /// --xfer-fault-plan` sets it from SIGUSR1 and clears it from SIGUSR2).
  void SetBroken(bool broken) { broken_.store(broken, std::memory_order_relaxed); }
  bool broken() const { return broken_.load(std::memory_order_relaxed); }

 private:
  std::mutex mu_;
  FaultPlan plan_;
  std::atomic<bool> broken_{false};
  static_assert(std::atomic<bool>::is_always_lock_free);
};

/// Wraps `inner`. caps() are the inner backend's (including its name, so that metadata still
/// matches peers that run the plain inner backend).
std::unique_ptr<Backend> MakeFaultBackend(std::unique_ptr<Backend> inner,
                                          std::shared_ptr<FaultControls> controls);

}  // namespace kvpush::xfer
