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
// Thread-safety: Run() may be called from one thread at a time (the executor's engine thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvpush {

class WorkerPool {
 public:
  /// `threads` >= 1 in all, the caller included (so threads - 1 workers are started; 1 = none).
  explicit WorkerPool(int threads);
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
