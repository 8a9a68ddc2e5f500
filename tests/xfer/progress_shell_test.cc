// ProgressShell (src/xfer/progress_shell.h) with a fake backend: jobs, wake-up, linger/stop,
// retired regions and the peer-process watch, without UCX or libfabric.
#include "xfer/progress_shell.h"

#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "test_util.h"

namespace kvpush::xfer {
namespace {

using ::kvpush::testing::WaitUntil;

// Counts what the shell asks of a backend; knobs decide its answers.
class FakeHooks : public ProgressHooks {
 public:
  bool Progress() override {
    rounds.fetch_add(1);
    if (wait_fd >= 0) {  // like a backend polling its CQ: consume the event its fd reported
      uint64_t v = 0;
      if (read(wait_fd, &v, sizeof(v)) == sizeof(v)) fd_events.fetch_add(1);
    }
    return false;
  }
  bool Busy() override { return busy.load(); }
  int Arm() override {
    arms.fetch_add(1);
    return arm_ms.load();
  }
  void BeginStop() override { begin_stops.fetch_add(1); }
  bool Drained() override {
    const int n = drained_calls.fetch_add(1) + 1;
    if (n == 1 && on_first_drain) on_first_drain();
    return n >= drain_after.load();
  }
  void OnStopped() override { stopped.fetch_add(1); }
  void OnProcessExit(void* tag) override { exited.store(tag); }

  int wait_fd = -1;
  std::atomic<bool> busy{false};
  std::atomic<int> arm_ms{60'000};  // a sleep the tests never wait out
  std::atomic<int> drain_after{1};
  std::function<void()> on_first_drain;
  std::atomic<int64_t> rounds{0}, arms{0}, fd_events{0};
  std::atomic<int> begin_stops{0}, drained_calls{0}, stopped{0};
  std::atomic<void*> exited{nullptr};
};

ProgressShellOptions TestOptions() {
  return {
      .name = "test", .linger_ns = 0, .yield_when_idle = false, .stop_timeout_ns = 5'000'000'000};
}

TEST(ProgressShell, RunsJobsOnItsThreadInOrder) {
  ProgressShell shell(TestOptions());
  FakeHooks hooks;
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  std::vector<int> order;  // touched only by jobs (progress thread), read after RunSync
  std::vector<std::thread::id> threads;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(shell.Enqueue([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    }));
  }
  std::thread::id sync_thread;
  ASSERT_TRUE(shell
                  .RunSync([&] {
                    sync_thread = std::this_thread::get_id();
                    return Status::Ok();
                  })
                  .ok());
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  for (const auto& id : threads) EXPECT_EQ(id, sync_thread);
  EXPECT_NE(sync_thread, std::this_thread::get_id());
}

TEST(ProgressShell, RunSyncInsideAJobRunsInline) {
  ProgressShell shell(TestOptions());
  FakeHooks hooks;
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  bool ran_inline = false;
  ASSERT_TRUE(shell
                  .RunSync([&] {
                    bool inner = false;
                    Status s = shell.RunSync([&] {
                      inner = true;
                      return Status::Ok();
                    });
                    ran_inline = inner && s.ok();  // no deadlock, and it ran before returning
                    return Status::Ok();
                  })
                  .ok());
  EXPECT_TRUE(ran_inline);
}

TEST(ProgressShell, RunSyncBeforeStartRunsOnTheCaller) {
  ProgressShell shell(TestOptions());
  std::thread::id ran_on;
  ASSERT_TRUE(shell
                  .RunSync([&] {
                    ran_on = std::this_thread::get_id();
                    return InvalidArgument("passed through");
                  })
                  .code() == StatusCode::kInvalidArgument);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
}

TEST(ProgressShell, AJobWakesTheSleepingThread) {
  ProgressShell shell(TestOptions());
  FakeHooks hooks;  // Arm asks for a 60 s sleep
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  ASSERT_TRUE(WaitUntil([&] { return shell.sleeping() && hooks.arms.load() > 0; }))
      << "the idle shell never went to sleep";
  std::atomic<bool> ran{false};
  ASSERT_TRUE(shell.Enqueue([&] { ran = true; }));
  EXPECT_TRUE(WaitUntil([&] { return ran.load(); }, std::chrono::seconds(10)))
      << "the job waited for the 60 s sleep to end";
}

TEST(ProgressShell, TheBackendsWaitFdWakesTheSleepingThread) {
  const int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  {
    ProgressShell shell(TestOptions());
    FakeHooks hooks;
    hooks.wait_fd = efd;
    ASSERT_TRUE(shell.Start(&hooks, {efd}).ok());
    ASSERT_TRUE(WaitUntil([&] { return shell.sleeping() && hooks.arms.load() > 0; }));
    uint64_t one = 1;
    ASSERT_EQ(write(efd, &one, sizeof(one)), static_cast<ssize_t>(sizeof(one)));
    EXPECT_TRUE(WaitUntil([&] { return hooks.fd_events.load() == 1; }, std::chrono::seconds(10)))
        << "an event on the backend's wait fd did not end the 60 s sleep";
  }
  close(efd);
}

TEST(ProgressShell, BusyPollsWithoutSleepingWhileTheBackendIsBusy) {
  ProgressShell shell(TestOptions());
  FakeHooks hooks;
  hooks.busy = true;
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  ASSERT_TRUE(WaitUntil([&] { return hooks.rounds.load() > 1000; }));
  EXPECT_EQ(hooks.arms.load(), 0) << "armed (went to sleep) while busy";
  hooks.busy = false;
  EXPECT_TRUE(WaitUntil([&] { return shell.sleeping() && hooks.arms.load() > 0; }));
}

TEST(ProgressShell, LingersAfterActivityBeforeSleeping) {
  ProgressShellOptions options = TestOptions();
  options.linger_ns = 3'600'000'000'000;  // an hour: every round after a job is a linger round
  ProgressShell shell(options);
  FakeHooks hooks;
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  ASSERT_TRUE(shell.RunSync([] { return Status::Ok(); }).ok());  // activity now
  // The idle thread may have gone to sleep once before the job came: count arms from here.
  const int64_t after_job = hooks.rounds.load();
  const auto arms_before = hooks.arms.load();
  ASSERT_TRUE(WaitUntil([&] { return hooks.rounds.load() > after_job + 1000; }));
  EXPECT_EQ(hooks.arms.load(), arms_before) << "slept within the linger time";
}

// A region whose destruction is observable.
struct TrackedRegion : BackendRegion {
  explicit TrackedRegion(std::atomic<int>* counter) : freed(counter) {}
  ~TrackedRegion() override { freed->fetch_add(1); }
  std::atomic<int>* freed;
};

TEST(ProgressShell, KeepsRetiredRegionsUntilTheThreadIsJoined) {
  ProgressShell shell(TestOptions());
  FakeHooks hooks;
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  std::atomic<int> freed{0};
  std::vector<int> at_exit_order;
  int stopped_at_exit = -1;
  shell.Retire(std::make_unique<TrackedRegion>(&freed), [&] {
    at_exit_order.push_back(1);
    stopped_at_exit = hooks.stopped.load();
  });
  shell.Retire(std::make_unique<TrackedRegion>(&freed), [&] { at_exit_order.push_back(2); });
  shell.Retire(std::make_unique<TrackedRegion>(&freed));  // nothing to do at exit
  // The thread still runs (a post being issued on it may read the regions): all kept.
  ASSERT_TRUE(shell.RunSync([] { return Status::Ok(); }).ok());
  EXPECT_EQ(freed.load(), 0);
  EXPECT_TRUE(at_exit_order.empty());
  shell.ReleaseRetired();
  EXPECT_EQ(stopped_at_exit, 1) << "at_exit ran before the progress thread had stopped";
  EXPECT_EQ(at_exit_order, (std::vector<int>{1, 2}));
  EXPECT_EQ(freed.load(), 3);
}

TEST(ProgressShell, StopDrainsThenRefusesJobs) {
  ProgressShell shell(TestOptions());
  FakeHooks hooks;
  hooks.drain_after = 3;
  std::atomic<bool> late_job_ran{false};
  int stopped_when_late_job_ran = -1;
  // A job queued while the backend drains still runs (before OnStopped).
  hooks.on_first_drain = [&] {
    EXPECT_TRUE(shell.Enqueue([&] {
      late_job_ran = true;
      stopped_when_late_job_ran = hooks.stopped.load();
    }));
  };
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  std::atomic<int> early_jobs{0};
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(shell.Enqueue([&] { early_jobs.fetch_add(1); }));
  EXPECT_FALSE(shell.stop_requested());
  shell.Stop();
  EXPECT_TRUE(shell.stop_requested());
  EXPECT_EQ(early_jobs.load(), 10);
  EXPECT_EQ(hooks.begin_stops.load(), 1);
  EXPECT_GE(hooks.drained_calls.load(), 3);
  EXPECT_EQ(hooks.stopped.load(), 1);
  EXPECT_TRUE(late_job_ran.load());
  EXPECT_EQ(stopped_when_late_job_ran, 0);
  // Stopped: jobs are refused, RunSync says so, a second Stop is a no-op.
  bool ran = false;
  EXPECT_FALSE(shell.Enqueue([&] { ran = true; }));
  EXPECT_EQ(shell
                .RunSync([&] {
                  ran = true;
                  return Status::Ok();
                })
                .code(),
            StatusCode::kUnavailable);
  shell.Stop();
  EXPECT_FALSE(ran);
  EXPECT_EQ(hooks.stopped.load(), 1);
}

TEST(ProgressShell, StopGivesUpOnDrainingAfterTheStopTimeout) {
  ProgressShellOptions options = TestOptions();
  options.stop_timeout_ns = 20'000'000;  // 20 ms
  ProgressShell shell(options);
  FakeHooks hooks;
  hooks.drain_after = 1 << 30;  // never drained
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  shell.Stop();  // returns: the timeout ended the drain
  EXPECT_EQ(hooks.stopped.load(), 1);
}

// A child process that exits when `release` is closed on the parent side.
struct Child {
  pid_t pid = -1;
  int release = -1;
  static Child Spawn() {
    int fds[2];
    if (pipe(fds) != 0) return {};
    const pid_t pid = fork();
    if (pid == 0) {
      close(fds[1]);
      char c;
      ssize_t n = read(fds[0], &c, 1);  // returns 0 once the parent closes its end
      _exit(n == 0 ? 0 : 1);
    }
    close(fds[0]);
    return {pid, fds[1]};
  }
  void Release() {
    close(release);
    int status = 0;
    waitpid(pid, &status, 0);
  }
};

void ExpectExitReported(bool busy) {
  ProgressShell shell(TestOptions());
  FakeHooks hooks;
  hooks.busy = busy;  // busy: found by the once-per-ms check; idle: wakes the sleep
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  Child child = Child::Spawn();
  ASSERT_GT(child.pid, 0);
  int tag = 0;
  {
    MutexLock lock(shell.mu());
    ASSERT_TRUE(shell.WatchProcess(static_cast<uint64_t>(child.pid),
                                   ProcessStartTime(static_cast<uint64_t>(child.pid)), &tag));
    EXPECT_FALSE(shell.WatchProcess(static_cast<uint64_t>(child.pid),
                                    ProcessStartTime(static_cast<uint64_t>(child.pid)), &tag))
        << "a second watch for the same tag";
  }
  EXPECT_EQ(hooks.exited.load(), nullptr);
  child.Release();
  EXPECT_TRUE(WaitUntil([&] { return hooks.exited.load() == &tag; }))
      << "the child's exit was not reported";
}

TEST(ProgressShell, ReportsAWatchedProcessThatExitsWhileIdle) {
  ExpectExitReported(/*busy=*/false);
}

TEST(ProgressShell, ReportsAWatchedProcessThatExitsWhileBusy) {
  ExpectExitReported(/*busy=*/true);
}

TEST(ProgressShell, DoesNotWatchTheWrongProcess) {
  ProgressShell shell(TestOptions());
  FakeHooks hooks;
  ASSERT_TRUE(shell.Start(&hooks, {}).ok());
  Child child = Child::Spawn();
  ASSERT_GT(child.pid, 0);
  const auto pid = static_cast<uint64_t>(child.pid);
  int tag = 0;
  {
    MutexLock lock(shell.mu());
    EXPECT_FALSE(shell.WatchProcess(pid, ProcessStartTime(pid) + 1, &tag)) << "a reused pid";
    EXPECT_FALSE(shell.WatchProcess(pid, 0, &tag)) << "unknown start time";
    const auto self = static_cast<uint64_t>(getpid());
    EXPECT_FALSE(shell.WatchProcess(self, ProcessStartTime(self), &tag)) << "the own process";
    // A watch that is removed reports nothing.
    ASSERT_TRUE(shell.WatchProcess(pid, ProcessStartTime(pid), &tag));
    shell.UnwatchProcess(&tag);
  }
  child.Release();
  ASSERT_TRUE(shell.RunSync([] { return Status::Ok(); }).ok());
  EXPECT_EQ(hooks.exited.load(), nullptr);
}

TEST(ProgressShell, ProcessStartTimeNamesLiveProcessesOnly) {
  EXPECT_GT(ProcessStartTime(static_cast<uint64_t>(getpid())), 0u);
  EXPECT_EQ(ProcessStartTime(0x3fffffff), 0u);  // above any pid_max
}

}  // namespace
}  // namespace kvpush::xfer
