#include "xfer/progress_shell.h"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <utility>

#include "common/clock.h"
#include "common/thread_name.h"

namespace kvpush::xfer {

uint64_t ProcessStartTime(uint64_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[1024];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  const char* p = std::strrchr(buf, ')');  // the command name may contain spaces and ')'
  if (p == nullptr) return 0;
  // Each space after the ')' of field 2 starts the next field; stop at the start of field 22.
  int field = 2;
  for (++p; *p != '\0' && field < 22; ++p)
    if (*p == ' ') ++field;
  return std::strtoull(p, nullptr, 10);
}

ProgressShell::ProgressShell(ProgressShellOptions options) : options_(std::move(options)) {}

ProgressShell::~ProgressShell() {
  ReleaseRetired();  // stops the thread first
  {
    MutexLock lock(mu_);
    for (auto& [fd, tag] : watched_) close(fd);
    watched_.clear();
    watch_of_.clear();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  if (epoll_fd_ >= 0) close(epoll_fd_);
}

Status ProgressShell::Start(ProgressHooks* hooks, const std::vector<int>& wait_fds) {
  hooks_ = hooks;
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ < 0 || epoll_fd_ < 0)
    return IoError(options_.name + ": eventfd/epoll_create1 failed");
  for (int fd : wait_fds) {
    if (fd >= 0) wait_fds_.push_back(fd);
  }
  wait_fds_.push_back(wake_fd_);
  for (int fd : wait_fds_) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0)
      return IoError(options_.name + ": epoll_ctl failed");
  }
  thread_ = std::thread([this] {
    SetThreadName(("kvp-" + options_.name).c_str());
    Loop();
  });
  return Status::Ok();
}

void ProgressShell::Stop() {
  if (!thread_.joinable()) return;
  stop_requested_.store(true, std::memory_order_release);
  Enqueue([this] {
    mu_.AssertHeld();  // jobs run under the progress lock
    stopping_ = true;
  });
  thread_.join();
}

bool ProgressShell::Enqueue(std::function<void()> job) {
  {
    MutexLock lock(queue_mu_);
    if (closed_) return false;
    jobs_.push_back(std::move(job));
    pending_.fetch_add(1, std::memory_order_seq_cst);
  }
  Wake();
  return true;
}

Status ProgressShell::RunSync(const std::function<Status()>& fn) {
  if (thread_.get_id() == std::this_thread::get_id()) return fn();
  if (!thread_.joinable()) {
    {
      MutexLock lock(queue_mu_);
      if (closed_) return Unavailable(options_.name + ": progress thread stopped");
    }
    MutexLock lock(mu_);  // not started yet: this thread is the only one
    return fn();
  }
  std::promise<Status> done;
  if (!Enqueue([&] { done.set_value(fn()); }))
    return Unavailable(options_.name + ": progress thread stopped");
  return done.get_future().get();
}

void ProgressShell::Wake() {
  if (sleeping_.load(std::memory_order_seq_cst)) {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }
}

void ProgressShell::NoteActivity() {
  last_activity_ns_ = NowNs();
}

void ProgressShell::Retire(std::unique_ptr<BackendRegion> region, std::function<void()> at_exit) {
  MutexLock lock(queue_mu_);
  retired_.push_back({std::move(region), std::move(at_exit)});
}

void ProgressShell::ReleaseRetired() {
  Stop();
  std::vector<Retired> retired;
  {
    MutexLock lock(queue_mu_);
    retired.swap(retired_);
  }
  for (Retired& r : retired) {
    if (r.at_exit) r.at_exit();
  }
}

bool ProgressShell::WatchProcess(uint64_t pid, uint64_t start_time, void* tag) {
  if (pid == static_cast<uint64_t>(getpid()) || watch_of_.count(tag) != 0) return false;
  // glibc 2.36's <sys/pidfd.h> lacks C linkage for C++; call the syscall (Linux >= 5.3).
  int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0u));
  if (fd < 0) return false;  // already gone or not visible here
  // The pid must name the peer itself (not another pid namespace's process, not a reuse).
  if (start_time == 0 || ProcessStartTime(pid) != start_time) {
    close(fd);
    return false;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = fd;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    close(fd);
    return false;
  }
  watched_[fd] = tag;
  watch_of_[tag] = fd;
  return true;
}

void ProgressShell::UnwatchProcess(void* tag) {
  auto it = watch_of_.find(tag);
  if (it == watch_of_.end()) return;
  const int fd = it->second;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  watched_.erase(fd);
  watch_of_.erase(it);
  close(fd);
}

std::vector<int> ProgressShell::TakeEvents(const epoll_event* ev, int n) {
  std::vector<int> exited;
  for (int i = 0; i < n; ++i) {
    const int fd = ev[i].data.fd;
    if (fd == wake_fd_) {
      uint64_t v;
      ssize_t r = read(wake_fd_, &v, sizeof(v));
      (void)r;
    } else if (std::find(wait_fds_.begin(), wait_fds_.end(), fd) == wait_fds_.end()) {
      exited.push_back(fd);
    }
  }
  return exited;
}

void ProgressShell::HandleEvents(const epoll_event* ev, int n) {
  std::vector<int> exited = TakeEvents(ev, n);
  if (exited.empty()) return;
  MutexLock lock(mu_);  // exited_fds_ is guarded by it
  exited_fds_.insert(exited_fds_.end(), exited.begin(), exited.end());
}

void ProgressShell::ReportExited() {
  for (int fd : exited_fds_) {
    auto it = watched_.find(fd);
    if (it == watched_.end()) continue;
    void* tag = it->second;
    UnwatchProcess(tag);
    hooks_->OnProcessExit(tag);
  }
  exited_fds_.clear();
}

void ProgressShell::CheckProcesses() {
  if (watched_.empty() || NowNs() - last_process_check_ns_ < 1'000'000) return;
  last_process_check_ns_ = NowNs();
  epoll_event ev[8];
  const int n = epoll_wait(epoll_fd_, ev, 8, 0);
  std::vector<int> exited = TakeEvents(ev, n);
  exited_fds_.insert(exited_fds_.end(), exited.begin(), exited.end());
  ReportExited();
}

void ProgressShell::RunJobs() {
  std::deque<std::function<void()>> jobs;
  {
    MutexLock lock(queue_mu_);
    jobs.swap(jobs_);
    pending_.store(0, std::memory_order_seq_cst);
  }
  for (auto& job : jobs) job();
  if (!jobs.empty()) NoteActivity();
}

bool ProgressShell::Round(int64_t* stop_deadline, int* sleep_ms) {
  ReportExited();
  RunJobs();
  const bool progressed = hooks_->Progress();
  if (stopping_) {
    if (*stop_deadline == 0) {
      *stop_deadline = NowNs() + options_.stop_timeout_ns;
      hooks_->BeginStop();
    }
    return !hooks_->Drained() && NowNs() <= *stop_deadline;
  }
  if (hooks_->Busy()) {  // busy-poll while work is outstanding
    CheckProcesses();
    if (options_.yield_when_idle && !progressed) sched_yield();
    return true;
  }
  if (NowNs() - last_activity_ns_ < options_.linger_ns) {
    if (options_.yield_when_idle && !progressed) sched_yield();
    return true;
  }
  // Decided under the progress lock: a caller's work under it either ran before (Busy() saw it)
  // or runs after and sees sleeping() (and wakes the thread).
  sleeping_.store(true, std::memory_order_seq_cst);
  if (pending_.load(std::memory_order_seq_cst) == 0) *sleep_ms = hooks_->Arm();
  return true;
}

void ProgressShell::Loop() {
  int64_t stop_deadline = 0;
  while (true) {
    int sleep_ms = -1;
    {
      MutexLock lock(mu_);
      if (!Round(&stop_deadline, &sleep_ms)) break;
    }
    if (sleep_ms >= 0) {
      epoll_event ev[8];
      const int n = epoll_wait(epoll_fd_, ev, 8, sleep_ms);
      HandleEvents(ev, n);
    }
    sleeping_.store(false, std::memory_order_seq_cst);
  }
  MutexLock lock(mu_);
  // Jobs queued until now still run (a RunSync caller gets its answer); later ones are refused.
  std::deque<std::function<void()>> jobs;
  {
    MutexLock queue_lock(queue_mu_);
    closed_ = true;
    jobs.swap(jobs_);
    pending_.store(0, std::memory_order_seq_cst);
  }
  for (auto& job : jobs) job();
  hooks_->OnStopped();
}

}  // namespace kvpush::xfer
