// WorkerPool: a fixed set of threads that run one parallel-for at a time for the executor's GEMMs
// (fork-join: the caller takes part and returns when every part is done).
//
// Results never depend on the thread count: callers split work into parts whose outputs are
// disjoint and each computed in a fixed order (InvariantGemm splits by output columns), so which
// thread computes a part changes nothing.
// Thread-safety: Run() may be called from one thread at a time (the executor's engine thread).
#pragma once

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

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* fn_ = nullptr;  // guarded by mu_
  int parts_ = 0;                                 // guarded by mu_
  uint64_t generation_ = 0;                       // guarded by mu_; bumped per Run
  int pending_ = 0;                               // workers still busy with this generation
  bool stop_ = false;                             // guarded by mu_
};

}  // namespace kvpush
