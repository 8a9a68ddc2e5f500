// WorkerPool: a fixed set of threads that run one parallel-for at a time for the executor's GEMMs
// (fork-join: the caller takes part and returns when every part is done).
//
// Results never depend on the thread count: callers split work into parts whose outputs are
// disjoint and each computed in a fixed order (InvariantGemm splits by output columns), so which
// thread computes a part changes nothing.
// Hand-offs: a worker that finished a part spins for up to kSpinNs on the next Run before it
// blocks on a condition variable, and the caller spins as long for the workers' parts before it
// blocks: the executor issues one Run per GEMM (about 60 per decode step), and a sleep and wake-up
// on each cost more than a decode step's GEMMs gain from a second thread.
// CPU binding: with `cpus` (one per thread), worker i runs on cpus[i] only and the thread that
// calls Run() first on cpus[0]. Unbound, the kernel's wake-up placement sometimes stacked the
// caller and a worker on one CPU after an idle spell (kvpush serve, 2 threads on 2 CPUs: the first
// prefill after 0.3 s idle took 75-88 ms instead of 56 in 3 of 8 tries; bound, 55-71).
// Thread-safety: Run() may be called from one thread at a time (the executor's engine thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush {

/// The CPUs the executor's `threads` threads are bound to, from a --threads-bind spec (as vLLM's
/// VLLM_CPU_OMP_THREADS_BIND): "auto" = the first `threads` CPUs of this process's affinity mask
/// when threads >= 2 and the mask has that many, else none; "nobind" = none; or a list of
/// exactly `threads` distinct CPUs of the mask, e.g. "0-1" or "2,5". Empty result = no binding.
/// Errors: kInvalidArgument (malformed list, wrong count, a CPU outside the mask or repeated).
Result<std::vector<int>> ResolveThreadsBind(const std::string& spec, int threads);

class WorkerPool {
 public:
  /// `threads` >= 1 in all, the caller included (so threads - 1 workers are started; 1 = none).
  /// `cpus`: empty, or one CPU per thread (see the file comment); a failed bind is logged once and
  /// the thread runs unbound.
  explicit WorkerPool(int threads, std::vector<int> cpus = {});
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return threads_; }

  /// Calls fn(part) for part = 0 .. parts - 1, spread over the pool's threads (the caller runs
  /// part 0 and any left over), and returns when all have returned. `fn` must not throw.
  void Run(int parts, const std::function<void(int)>& fn);

 private:
  void WorkerLoop(int index);
  /// Waits (spinning, then on start_cv_) for a generation other than `seen` or stop; returns it,
  /// or 0 on stop.
  uint64_t AwaitWork(uint64_t seen);

  /// How long a worker or the caller spins before blocking (nanoseconds).
  static constexpr int64_t kSpinNs = 50'000;

  const int threads_;
  const std::vector<int> cpus_;
  bool caller_bound_ = false;  // Run()'s thread only
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  // fn_ and parts_ are written under mu_ before generation_ is bumped (release) and read after a
  // worker saw the new generation (acquire).
  const std::function<void(int)>* fn_ = nullptr;
  int parts_ = 0;
  std::atomic<uint64_t> generation_{0};  // bumped per Run, under mu_
  std::atomic<int> pending_{0};          // workers still busy with this generation
  std::atomic<bool> stop_{false};        // set under mu_
};

}  // namespace kvpush
