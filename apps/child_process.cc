#include "apps/child_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "client/openai_client.h"
#include "common/clock.h"

extern char** environ;

namespace kvpush::apps {

ChildProcess::~ChildProcess() {
  Stop();
}

Status ChildProcess::Start(const std::vector<std::string>& args, const std::string& log_path,
                          const std::string& exe) {
  if (pid_ > 0) return FailedPrecondition("child already started");
  std::vector<std::string> argv_s;
  argv_s.emplace_back(exe);
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  argv.reserve(argv_s.size() + 1);
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!log_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  pid_t pid = -1;
  int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return IoError(std::string("posix_spawn: ") + std::strerror(rc));
  pid_ = pid;
  exit_status_ = -1;
  return Status::Ok();
}

bool ChildProcess::Running() {
  if (pid_ <= 0) return false;
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    exit_status_ = st;
    pid_ = -1;
    return false;
  }
  return true;
}

int ChildProcess::Stop(int grace_ms) {
  if (!Running()) return exit_status_;
  kill(pid_, SIGTERM);
  const int64_t deadline = NowNs() + static_cast<int64_t>(grace_ms) * 1'000'000;
  while (NowNs() < deadline) {
    if (!Running()) return exit_status_;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(pid_, SIGKILL);
  int st = 0;
  waitpid(pid_, &st, 0);
  pid_ = -1;
  exit_status_ = st;
  return st;
}

namespace {

/// Binds a TCP socket to 127.0.0.1:`port` (0: the kernel picks), closes it and returns the port,
/// or -1 when it is taken. Errors: kIoError (no socket, or port 0 refused).
Result<int> TryBind(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return IoError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    close(fd);
    if (port != 0) return -1;
    return IoError(std::string("bind: ") + std::strerror(err));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

}  // namespace

Result<int> PickFreePort() {
  static std::mutex mu;
  static std::mt19937 rng(std::random_device{}() ^ static_cast<uint32_t>(getpid()));
  for (int attempt = 0; attempt < 64; ++attempt) {
    int port = 0;
    {
      std::lock_guard lock(mu);
      port = std::uniform_int_distribution<int>(20000, 32767)(rng);
    }
    KVP_ASSIGN_OR_RETURN(int got, TryBind(port));
    if (got > 0) return got;
  }
  return TryBind(0);
}

Status WaitHealthy(const std::string& host, int port, ChildProcess& child, int timeout_ms) {
  OpenAiClient client(host, port, 1.0);
  const int64_t deadline = NowNs() + static_cast<int64_t>(timeout_ms) * 1'000'000;
  while (NowNs() < deadline) {
    if (!child.Running()) {
      return Aborted("process on port " + std::to_string(port) + " exited before it was healthy");
    }
    if (client.Get("/health").ok()) return Status::Ok();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return DeadlineExceeded("no healthy answer on " + host + ":" + std::to_string(port) + " within " +
                          std::to_string(timeout_ms) + " ms");
}

}  // namespace kvpush::apps
