// Mutex and MutexLock: std::mutex with Clang thread-safety annotations
// (common/thread_annotations.h) so that GUARDED_BY / REQUIRES can name it; MutexLock is the RAII
// holder, and CondVar waits on a MutexLock.
//
// Thread-safety: Mutex is a plain non-recursive mutex; MutexLock is used by one thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace kvpush {

/// A non-recursive mutex the thread-safety analysis knows. Same cost as std::mutex.
class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  /// Blocks until this thread holds the mutex. Must not already hold it.
  void Lock() ACQUIRE() { mu_.lock(); }
  /// Releases the mutex, which this thread holds.
  void Unlock() RELEASE() { mu_.unlock(); }
  /// Takes the mutex if it is free right now; true if it was taken. Never blocks.
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  /// States that the calling thread holds the mutex (the analysis cannot see it, e.g. in a job that
  /// a progress thread runs under this mutex). Not checked at run time.
  void AssertHeld() const ASSERT_CAPABILITY(this) {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

class CondVar;

/// Holds a Mutex for its scope (like std::lock_guard); can be released and re-taken early, and is
/// what CondVar waits on.
class SCOPED_CAPABILITY MutexLock {
 public:
  /// Takes `mu` (blocking).
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  /// Adopts `mu`, which this thread already holds (e.g. after `if (!mu.TryLock()) return;`).
  MutexLock(Mutex& mu, std::adopt_lock_t) REQUIRES(mu) : mu_(mu) {}
  ~MutexLock() RELEASE() {
    if (held_) mu_.Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  /// Releases the mutex before the end of the scope.
  void Unlock() RELEASE() {
    mu_.Unlock();
    held_ = false;
  }
  /// Takes the mutex again after Unlock().
  void Lock() ACQUIRE() {
    mu_.Lock();
    held_ = true;
  }

 private:
  friend class CondVar;
  Mutex& mu_;
  bool held_ = true;
};

/// A condition variable that waits on a MutexLock (a std::condition_variable on the Mutex's
/// std::mutex: no extra lock, unlike std::condition_variable_any). The analysis treats the mutex as
/// held across a wait (it is, on return), so write waits as loops over the guarded condition:
///   while (!ready_) cv_.Wait(lock);
/// Thread-safe as std::condition_variable.
class CondVar {
 public:
  /// Releases the lock, waits for a notification (or a spurious wakeup), re-takes the lock.
  void Wait(MutexLock& lock) {
    std::unique_lock<std::mutex> native(lock.mu_.mu_, std::adopt_lock);
    cv_.wait(native);
    native.release();
  }
  /// As Wait, but returns at `deadline` at the latest. Returns false on timeout.
  template <typename Clock, typename Duration>
  bool WaitUntil(MutexLock& lock, const std::chrono::time_point<Clock, Duration>& deadline) {
    std::unique_lock<std::mutex> native(lock.mu_.mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(native, deadline) == std::cv_status::no_timeout;
    native.release();
    return woken;
  }
  /// As Wait, for at most `timeout`. Returns false on timeout.
  template <typename Rep, typename Period>
  bool WaitFor(MutexLock& lock, const std::chrono::duration<Rep, Period>& timeout) {
    return WaitUntil(lock, std::chrono::steady_clock::now() + timeout);
  }
  /// Wakes one waiter (if any). Need not hold the mutex.
  void NotifyOne() { cv_.notify_one(); }
  /// Wakes every waiter. Need not hold the mutex.
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace kvpush
