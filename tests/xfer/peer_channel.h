// Test plumbing for multi-process xfer tests: length-prefixed frames over pipes with deadlines,
// spawning the xfer_test_peer helper, and the deterministic byte pattern both sides compute.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush::xfer::testing {

/// Writes all bytes; false on error.
inline bool WriteAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

/// Reads exactly n bytes before `timeout_ms` elapses. Errors: kDeadlineExceeded, kUnavailable
/// (EOF).
inline Status ReadAll(int fd, void* p, size_t n, int timeout_ms) {
  auto* b = static_cast<uint8_t*>(p);
  auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (n > 0) {
    int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                    end - std::chrono::steady_clock::now())
                                    .count());
    if (left <= 0) return DeadlineExceeded("pipe read timed out");
    pollfd pfd{fd, POLLIN, 0};
    int r = poll(&pfd, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return DeadlineExceeded("pipe read timed out");
    ssize_t got = read(fd, b, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return Unavailable("pipe closed");
    b += got;
    n -= static_cast<size_t>(got);
  }
  return Status::Ok();
}

inline bool SendFrame(int fd, const std::vector<uint8_t>& data) {
  uint32_t n = static_cast<uint32_t>(data.size());
  return WriteAll(fd, &n, 4) && WriteAll(fd, data.data(), data.size());
}

inline Result<std::vector<uint8_t>> RecvFrame(int fd, int timeout_ms = 20000) {
  uint32_t n = 0;
  KVP_RETURN_IF_ERROR(ReadAll(fd, &n, 4, timeout_ms));
  if (n > (64u << 20)) return DataLoss("frame too large");
  std::vector<uint8_t> data(n);
  KVP_RETURN_IF_ERROR(ReadAll(fd, data.data(), n, timeout_ms));
  return data;
}

/// Deterministic pseudo-random bytes for (seed, byte offset): both processes compute the same.
inline void FillPattern(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, std::min<size_t>(8, n - i));
  }
}

/// A spawned helper process with a command pipe (to it) and a reply pipe (from it).
struct PeerProcess {
  pid_t pid = -1;
  int to = -1;
  int from = -1;

  PeerProcess() = default;
  PeerProcess(pid_t p, int t, int f) : pid(p), to(t), from(f) {}
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;
  PeerProcess(PeerProcess&& o) noexcept : pid(o.pid), to(o.to), from(o.from) {
    o.pid = -1;
    o.to = o.from = -1;
  }
  PeerProcess& operator=(PeerProcess&& o) noexcept {
    if (this != &o) {
      Kill();
      pid = o.pid;
      to = o.to;
      from = o.from;
      o.pid = -1;
      o.to = o.from = -1;
    }
    return *this;
  }

  static PeerProcess Spawn(const std::vector<std::string>& args) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return PeerProcess();
    pid_t pid = fork();
    if (pid == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    return PeerProcess(pid, in[1], out[0]);
  }
  /// Kills (SIGKILL) if still running and reaps. Returns the wait status.
  int Kill() {
    int st = 0;
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      RemoveShmLeftovers(pid);
      pid = -1;
    }
    CloseFds();
    return st;
  }
  /// libfabric's shm provider names its shared memory /dev/shm/<pid>:<n>:<n> and a killed
  /// process never unlinks it; a later process that gets the same pid then fails fi_enable with
  /// EBUSY. Removes the leftovers of a reaped child.
  static void RemoveShmLeftovers(pid_t dead) {
    const std::string prefix = std::to_string(dead) + ":";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) std::filesystem::remove(e.path(), ec);
    }
  }
  /// Waits up to timeout_ms for a clean exit; kills otherwise. Returns exit code or -1.
  int Join(int timeout_ms) {
    for (int waited = 0; pid > 0 && waited < timeout_ms; waited += 10) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        RemoveShmLeftovers(pid);
        pid = -1;
        CloseFds();
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      usleep(10000);
    }
    Kill();
    return -1;
  }
  void CloseFds() {
    if (to >= 0) close(to);
    if (from >= 0) close(from);
    to = from = -1;
  }
  ~PeerProcess() { Kill(); }
};

}  // namespace kvpush::xfer::testing
