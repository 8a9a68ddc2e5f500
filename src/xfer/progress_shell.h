// ProgressShell: the progress thread that the network backends (UCX, libfabric) share.
//
// It owns what is the same in every backend: the thread, the job queue that hands work from
// caller threads to it, the wake-up (an eventfd in one epoll set with the backend's wait fds), the
// linger / busy-poll / sleep policy, the regions a backend deregistered while its own thread may
// still read them (kept until that thread is joined), and the peer-process watch (a pidfd per
// watched peer process; its exit is reported to the backend). The backend supplies only what is
// its own through ProgressHooks: one round of progress, whether it is busy, arming its wait fd,
// and what to do when stopping and when a peer process exits.
//
// One round of the loop, all under the progress lock mu() (held by the progress thread while it
// runs jobs and hooks; a backend may also take it from a caller thread, e.g. to issue a post on
// the caller's thread, UCX's serialized worker):
//   report exited peer processes -> run queued jobs -> hooks.Progress() ->
//   stopping? (hooks.BeginStop() once; leave when hooks.Drained() or after stop_timeout_ns) ->
//   busy-poll while hooks.Busy() (peer processes checked every millisecond meanwhile) ->
//   busy-poll while the last activity is less than linger_ns ago ->
//   otherwise mark sleeping and, unless a job is queued, sleep in epoll for hooks.Arm() ms
//   (outside the lock) on the wake eventfd, the backend's wait fds and the peers' pidfds.
// When the loop ends, jobs still queued are run once more (so a RunSync caller returns), then
// hooks.OnStopped() reports what is left; from then on Enqueue refuses jobs.
//
// Thread-safety: every public method may be called from any thread unless it says otherwise.
// Lock order: mu() before the job-queue lock (a leaf); mu() before any lock the backend's sink
// takes (hooks report completions with mu() held).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "xfer/backend.h"

struct epoll_event;

namespace kvpush::xfer {

/// Start time of process `pid` in clock ticks since boot (/proc/<pid>/stat field 22); 0 if it
/// cannot be read. With the pid it names one process: a reused pid has another start time.
/// Thread-safe (reads /proc).
uint64_t ProcessStartTime(uint64_t pid);

/// What a backend plugs into the ProgressShell. Every hook is called on the progress thread with
/// ProgressShell::mu() held (an implementation states that with `shell.mu().AssertHeld()`), except
/// where noted. Hooks must not call ProgressShell::RunSync (it would run inline) and must not
/// block.
class ProgressHooks {
 public:
  virtual ~ProgressHooks() = default;
  /// One round of the backend's own progress: poll completions, issue queued ops. Returns whether
  /// anything moved (on a busy round that moved nothing the shell may yield the core). Call
  /// ProgressShell::NoteActivity() for what should keep the thread lingering.
  virtual bool Progress() = 0;
  /// Whether the thread must keep polling (work outstanding that completes only through polling).
  virtual bool Busy() = 0;
  /// About to sleep: arm the backend's wait fd. Returns how long to sleep in epoll at most, ms
  /// (>= 0), or -1 to skip sleeping this round (e.g. an event is already pending).
  virtual int Arm() = 0;
  /// The shell is stopping: called once, on the first round after Stop() was asked for.
  virtual void BeginStop() {}
  /// While stopping, after each round: true once the backend has nothing left to drain.
  virtual bool Drained() { return true; }
  /// The loop ended: report everything still outstanding (e.g. fail it with kCancelled).
  virtual void OnStopped() {}
  /// A watched peer process exited (ProgressShell::WatchProcess); its watch is already removed.
  virtual void OnProcessExit(void* tag) { (void)tag; }
};

/// Fixed settings of a ProgressShell.
struct ProgressShellOptions {
  std::string name = "xfer";  ///< prefixes error messages ("ucx", "libfabric")
  /// Busy-poll this long after the last activity (a job, NoteActivity) before sleeping, ns.
  int64_t linger_ns = 50'000;
  /// On a busy or lingering round in which Progress() moved nothing, sched_yield() so a peer or
  /// application thread sharing the core runs first.
  bool yield_when_idle = false;
  /// Longest a stop waits for Drained(), ns; then OnStopped() reports what is left.
  int64_t stop_timeout_ns = 2'000'000'000;
};

/// The shared progress thread of a backend. See the file comment.
class ProgressShell {
 public:
  explicit ProgressShell(ProgressShellOptions options);
  /// Stops the thread (as Stop) and then releases the retired regions (as ReleaseRetired).
  ~ProgressShell();
  ProgressShell(const ProgressShell&) = delete;
  ProgressShell& operator=(const ProgressShell&) = delete;

  /// Creates the wake eventfd and the epoll set with `wait_fds` (entries < 0 are skipped) and
  /// starts the thread, which calls `hooks` (which must outlive Stop()). Call once. Errors:
  /// kIoError (eventfd, epoll). Not thread-safe against other calls on this shell.
  Status Start(ProgressHooks* hooks, const std::vector<int>& wait_fds);
  /// Asks the thread to stop and joins it (runs BeginStop / Drained / OnStopped on it). Jobs queued
  /// before the call run; later ones are refused. Idempotent; must not be called from a hook.
  void Stop() EXCLUDES(mu_);

  /// The progress lock (see the file comment). Backend state the progress thread touches is
  /// GUARDED_BY(shell_.mu()).
  Mutex& mu() RETURN_CAPABILITY(mu_) { return mu_; }

  /// Queues `job` to run on the progress thread, in order, with mu() held, and wakes the thread.
  /// Returns false (dropping the job) once the thread has stopped. Never blocks on mu().
  bool Enqueue(std::function<void()> job) EXCLUDES(queue_mu_);
  /// Runs `fn` on the progress thread and returns its status: directly when called on that thread
  /// (inside a job or hook) or before Start() (then under mu()), otherwise through Enqueue,
  /// blocking until it ran. Returns kUnavailable when the thread has stopped. Must not be called
  /// with mu() held from another thread (deadlock).
  Status RunSync(const std::function<Status()>& fn);
  /// Whether jobs are queued that the thread has not taken yet (a caller's fast path must not
  /// overtake them). Lock-free.
  bool HasPendingJobs() const { return pending_.load(std::memory_order_seq_cst) != 0; }
  /// Wakes the thread if it is sleeping (e.g. a caller issued work it must poll for). Lock-free.
  void Wake();
  /// Whether the thread has decided to sleep this round (set under mu(), cleared after the sleep).
  bool sleeping() const { return sleeping_.load(std::memory_order_seq_cst); }
  /// Whether Stop() has been asked for; any thread, lock-free (e.g. to stop issuing at once).
  bool stop_requested() const { return stop_requested_.load(std::memory_order_acquire); }
  /// Whether the progress thread is in its stopping rounds (a caller's fast path must then leave
  /// the work to it).
  bool stopping() const REQUIRES(mu_) { return stopping_; }
  /// Records activity now: the thread lingers (busy-polls) linger_ns from here before sleeping.
  void NoteActivity() REQUIRES(mu_);

  /// Keeps a deregistered region's backend data until the progress thread can no longer read it
  /// (it has been joined), then runs `at_exit` (e.g. unmap or free memory a late remote write may
  /// still target), in the order retired, and frees the data. Any thread.
  void Retire(std::unique_ptr<BackendRegion> region, std::function<void()> at_exit = {})
      EXCLUDES(queue_mu_);
  /// Stops the thread if needed, then runs the retired regions' at_exit actions and frees them.
  /// Call where the backend's teardown needs it (e.g. before its context is destroyed); the
  /// destructor does it otherwise. Not thread-safe against other calls on this shell.
  void ReleaseRetired() EXCLUDES(queue_mu_, mu_);

  /// Watches the process `pid` (same host and pid namespace): when it exits, OnProcessExit(tag) is
  /// called on the progress thread. Only if `start_time` (ProcessStartTime) still matches, so a
  /// reused pid or another namespace's process is not taken for it; the own process is never
  /// watched. Returns whether a watch was set up (no pidfd support, a gone process: false, and
  /// the caller relies on its other failure detection). One watch per tag.
  bool WatchProcess(uint64_t pid, uint64_t start_time, void* tag) REQUIRES(mu_);
  /// Removes the watch of `tag`, if any.
  void UnwatchProcess(void* tag) REQUIRES(mu_);

 private:
  void Loop() EXCLUDES(mu_);
  /// One round under mu(): returns false to leave the loop; *sleep_ms >= 0 asks for a sleep.
  bool Round(int64_t* stop_deadline, int* sleep_ms) REQUIRES(mu_);
  void RunJobs() REQUIRES(mu_) EXCLUDES(queue_mu_);
  void ReportExited() REQUIRES(mu_);
  void CheckProcesses() REQUIRES(mu_);
  /// Drains the wake-up eventfd if it fired; returns the readable pidfds (watched processes
  /// that exited) among the n events. Touches no guarded state.
  std::vector<int> TakeEvents(const ::epoll_event* ev, int n);
  /// Handles the events of one epoll_wait: drains the wake fd, collects exited pidfds.
  void HandleEvents(const ::epoll_event* ev, int n) EXCLUDES(mu_);

  const ProgressShellOptions options_;
  ProgressHooks* hooks_ = nullptr;
  std::vector<int> wait_fds_;  // set in Start
  int wake_fd_ = -1;
  int epoll_fd_ = -1;
  std::thread thread_;
  std::atomic<size_t> pending_{0};
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> stop_requested_{false};

  Mutex mu_;  // the progress lock
  bool stopping_ GUARDED_BY(mu_) = false;
  int64_t last_activity_ns_ GUARDED_BY(mu_) = 0;
  std::unordered_map<int, void*> watched_ GUARDED_BY(mu_);   // pidfd -> tag
  std::unordered_map<void*, int> watch_of_ GUARDED_BY(mu_);  // tag -> pidfd
  std::vector<int> exited_fds_ GUARDED_BY(mu_);              // readable pidfds, not handled
  int64_t last_process_check_ns_ GUARDED_BY(mu_) = 0;

  Mutex queue_mu_ ACQUIRED_AFTER(mu_);  // leaf
  std::deque<std::function<void()>> jobs_ GUARDED_BY(queue_mu_);
  bool closed_ GUARDED_BY(queue_mu_) = false;  // the thread stopped: Enqueue refuses
  struct Retired {
    std::unique_ptr<BackendRegion> region;
    std::function<void()> at_exit;
  };
  std::vector<Retired> retired_ GUARDED_BY(queue_mu_);
};

}  // namespace kvpush::xfer
