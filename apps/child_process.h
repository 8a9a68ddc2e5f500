// ChildProcess: starts another kvpush subcommand as a child process and stops it cleanly.
// Used by `kvpush demo` (and, later, by tests that need separate P, D and router processes).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush::apps {

/// A child process running this binary (/proc/self/exe) with the given arguments. The child's
/// stdout/stderr go to `log_path` (appended) when non-empty, else are inherited.
/// Thread-compatible. The destructor stops the child (Stop with a 5 s grace period).
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  /// Spawns `exe args...` (default: this binary; tests pass the kvpush binary, or "/usr/bin/ip"
  /// with "netns exec NS kvpush ..." to run it in a network namespace; a path without '/' is not
  /// searched). Errors: kIoError when spawning fails.
  Status Start(const std::vector<std::string>& args, const std::string& log_path,
               const std::string& exe = "/proc/self/exe");

  /// True while the child has not exited (reaps it if it has).
  bool Running();

  /// Sends SIGTERM, waits up to `grace_ms`, then SIGKILL. Returns the exit status (as from
  /// waitpid), or -1 if the child was not running.
  int Stop(int grace_ms = 5000);

  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int exit_status_ = -1;
};

/// A TCP port on 127.0.0.1 that is free now, for a child to bind a moment later. It is drawn at
/// random from [20000, 32768), below Linux's ephemeral range (32768-60999 by default): a port the
/// kernel hands out for an outgoing connection or a listener on port 0 (a UCX tcp listener,
/// another test's server) can then never take it between the pick and the child's bind. Falls
/// back to the kernel's choice (bind to port 0) after 64 occupied draws. Thread-safe.
/// Errors: kIoError.
Result<int> PickFreePort();

/// Polls GET http://host:port/health until it answers 200, the child exits, or `timeout_ms` pass.
/// Errors: kDeadlineExceeded, kAborted (child exited).
Status WaitHealthy(const std::string& host, int port, ChildProcess& child, int timeout_ms);

}  // namespace kvpush::apps
