#include "http/connection_loop.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "common/thread_name.h"
#include "http/api_error.h"
#include "http/request_head.h"

namespace kvpush::http {
namespace {

/// A complete HTTP/1.1 answer that closes the connection, with an OpenAI error body.
std::string ClosingAnswer(int status, std::string_view reason, const ApiError& e) {
  const std::string body = e.ToJson();
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n" + (status == 503 ? "Retry-After: 1\r\n" : "") + "\r\n" + body;
}

const std::string& OverCapAnswer() {
  static const std::string a = ClosingAnswer(
      503, "Service Unavailable",
      ApiError{503, "too many open connections: the server is at its connection limit, retry",
               "server_error", "", "too_many_connections"});
  return a;
}

const std::string& TimeoutAnswer() {
  static const std::string a =
      ClosingAnswer(408, "Request Timeout",
                    ApiError{408, "the request (head or body) did not arrive in time",
                             "invalid_request_error", "", "request_timeout"});
  return a;
}

const std::string& HeadTooLargeAnswer() {
  static const std::string a =
      ClosingAnswer(431, "Request Header Fields Too Large",
                    ApiError{431, "request head (request line and headers) too large",
                             "invalid_request_error", "", "headers_too_large"});
  return a;
}

constexpr int kMaxEvents = 256;
constexpr int kAcceptsPerWake = 256;
constexpr auto kMinSweepGap = std::chrono::milliseconds(50);

}  // namespace

ConnectionLoop::ConnectionLoop(ConnectionLoopOptions options, Dispatch dispatch)
    : options_(options), dispatch_(std::move(dispatch)) {}

ConnectionLoop::~ConnectionLoop() {
  Stop();
}

Status ConnectionLoop::Start() {
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    return Unavailable("epoll/eventfd: " + std::string(std::strerror(errno)));
  }
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = options_.listen_fd;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, options_.listen_fd, &ev) != 0) {
    return Unavailable("epoll_ctl(listen): " + std::string(std::strerror(errno)));
  }
  ev.data.fd = wake_fd_;
  epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] {
    SetThreadName("kvp-listen");
    Run();
  });
  return Status::Ok();
}

void ConnectionLoop::Stop() {
  {
    MutexLock lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)::write(wake_fd_, &one, sizeof one);
    thread_.join();  // the loop closed the listening socket and its connections
  } else if (options_.listen_fd >= 0) {
    ::close(options_.listen_fd);  // never ran
  }
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  if (spare_fd_ >= 0) ::close(spare_fd_);
}

void ConnectionLoop::Return(std::unique_ptr<Connection> conn, bool keep_alive) {
  MutexLock lock(mu_);
  if (!keep_alive || stopped_) {
    lock.Unlock();
    Discard(std::move(conn));
    return;
  }
  returned_.push_back(std::move(conn));
  lock.Unlock();
  const uint64_t one = 1;
  (void)::write(wake_fd_, &one, sizeof one);
}

void ConnectionLoop::Discard(std::unique_ptr<Connection> conn) {
  conn.reset();
  open_.fetch_sub(1, std::memory_order_relaxed);
}

void ConnectionLoop::Run() {
  epoll_event events[kMaxEvents];
  for (;;) {
    int timeout_ms = -1;
    if (next_sweep_ != Clock::time_point::max()) {
      const auto gap = std::max<Clock::duration>(next_sweep_ - Clock::now(), kMinSweepGap);
      timeout_ms =
          static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(gap).count() + 1);
    }
    const int n = epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
    bool woken = false;
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == options_.listen_fd) {
        AcceptAll();
      } else if (fd == wake_fd_) {
        uint64_t count = 0;
        (void)::read(wake_fd_, &count, sizeof count);
        woken = true;
      } else {
        Advance(fd);
      }
    }
    if (woken) {
      bool stopped = false;
      {
        MutexLock lock(mu_);
        stopped = stopped_;
      }
      if (stopped) break;
      TakeReturned();
    }
    if (Clock::now() >= next_sweep_) Sweep();
  }
  ::close(options_.listen_fd);
  for (auto& [fd, conn] : conns_) Discard(std::move(conn));
  conns_.clear();
  std::vector<std::unique_ptr<Connection>> returned;
  {
    MutexLock lock(mu_);
    returned.swap(returned_);
  }
  for (auto& conn : returned) Discard(std::move(conn));
}

void ConnectionLoop::AcceptAll() {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    const int fd = accept4(options_.listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                           SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && spare_fd_ >= 0) {
        // No descriptor left: free the spare one to take the connection off the queue and close
        // it (else the listening socket stays readable and the loop spins).
        ::close(spare_fd_);
        const int extra = accept4(options_.listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (extra >= 0) Refuse(extra);
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        continue;
      }
      return;  // EAGAIN: the queue is empty
    }
    if (open_.load(std::memory_order_relaxed) >= options_.max_connections) {
      Refuse(fd);
      continue;
    }
    const int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);  // SSE chunks go out at once
    SSL* ssl = nullptr;
    if (options_.ssl_ctx != nullptr) {
      ssl = SSL_new(options_.ssl_ctx);
      if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
        SSL_free(ssl);
        ::close(fd);
        continue;
      }
      SSL_set_accept_state(ssl);
    }
    std::string ip;
    int port = 0;
    NumericAddress(addr, ip, port);
    auto conn = std::make_unique<Connection>(fd, ssl, std::move(ip), port);
    open_.fetch_add(1, std::memory_order_relaxed);
    Connection& c = *conn;
    conns_.emplace(fd, std::move(conn));
    c.reading = c.tls();  // a handshake is a request's start: it gets the head's deadline
    SetDeadline(c, Clock::now() + std::chrono::seconds(c.tls() ? options_.header_timeout_s
                                                               : options_.keep_alive_timeout_s));
    Watch(c, EPOLLIN);
  }
}

void ConnectionLoop::Refuse(int fd) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  // A plain-HTTP client reads a 503 it can act on; a TLS client could not read it before a
  // handshake, so it only sees the close.
  if (options_.ssl_ctx == nullptr) {
    (void)::send(fd, OverCapAnswer().data(), OverCapAnswer().size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  const auto now = Clock::now();
  if (now >= next_refusal_log_) {
    next_refusal_log_ = now + std::chrono::seconds(10);
    spdlog::warn(
        "HTTP front door: refusing connections: {} open, limit {} (max connections or open "
        "files); {} refused so far",
        open_.load(std::memory_order_relaxed), options_.max_connections,
        refused_.load(std::memory_order_relaxed));
  }
}

void ConnectionLoop::Advance(int fd) {
  const auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  Connection& c = *it->second;
  Connection::Io io = c.Handshake();
  if (io == Connection::Io::kDone) {
    if (c.reading && c.unread().empty() && c.tls()) {
      // Handshake done: now the connection waits for its first request.
      c.reading = false;
      SetDeadline(c, Clock::now() + std::chrono::seconds(options_.keep_alive_timeout_s));
    }
    const size_t limit = options_.max_head_bytes + options_.max_body_bytes;
    const size_t before = c.unread().size();
    do {
      io = c.ReadAvailable(limit);
    } while (io == Connection::Io::kDone);
    const bool progressed = c.unread().size() > before;
    const RequestScan scan =
        ScanRequest(c.unread(), options_.max_head_bytes, options_.max_body_bytes);
    switch (scan.progress) {
      case RequestProgress::kReady: {
        // A POST without a length has an empty body: say so, or the HTTP library would read
        // one until the client closes.
        if (scan.needs_zero_length) AddZeroContentLength(&c.in, c.in_off, scan.head_bytes);
        Watch(c, 0);
        std::unique_ptr<Connection> conn = std::move(it->second);
        conns_.erase(it);
        dispatch_(std::move(conn));
        return;
      }
      case RequestProgress::kHeadTooLarge:
        Close(fd, HeadTooLargeAnswer());
        return;
      case RequestProgress::kBadFraming:
        Close(fd, ClosingAnswer(400, "Bad Request",
                                ApiError{400, std::string("malformed request: ") + scan.why,
                                         "invalid_request_error", "", "malformed_request"}));
        return;

      case RequestProgress::kReadingHead:
        if (!c.reading) {
          c.reading = true;
          SetDeadline(c, Clock::now() + std::chrono::seconds(options_.header_timeout_s));
        }
        break;
      case RequestProgress::kReadingBody:
        // The body must keep coming: no gap longer than the header timeout (then 408).
        c.reading = true;
        if (progressed) {
          SetDeadline(c, Clock::now() + std::chrono::seconds(options_.header_timeout_s));
        }
        break;
      case RequestProgress::kIdle:
        break;
    }
  }
  if (io == Connection::Io::kClosed) {
    Close(fd, {});
    return;
  }
  Watch(c, io == Connection::Io::kWantWrite ? EPOLLOUT : EPOLLIN);
}

void ConnectionLoop::Watch(Connection& c, uint32_t events) {
  if (c.watched == events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = c.fd();
  const int op = events == 0 ? EPOLL_CTL_DEL : c.watched == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD;
  epoll_ctl(epoll_fd_, op, c.fd(), &ev);
  c.watched = events;
}

void ConnectionLoop::Close(int fd, std::string_view answer) {
  const auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  if (!answer.empty()) it->second->WriteOnce(answer);
  std::unique_ptr<Connection> conn = std::move(it->second);
  conns_.erase(it);
  Discard(std::move(conn));  // closing the socket drops it from the epoll set
}

void ConnectionLoop::TakeReturned() {
  std::vector<std::unique_ptr<Connection>> returned;
  {
    MutexLock lock(mu_);
    returned.swap(returned_);
  }
  const auto idle_until = Clock::now() + std::chrono::seconds(options_.keep_alive_timeout_s);
  for (auto& conn : returned) {
    const int fd = conn->fd();
    Connection& c = *conn;
    c.reading = false;
    c.watched = 0;
    conns_.emplace(fd, std::move(conn));
    SetDeadline(c, idle_until);
    Advance(fd);  // bytes sent ahead (pipelining, or held by the TLS session) go first
  }
}

void ConnectionLoop::SetDeadline(Connection& c, Clock::time_point t) {
  c.deadline = t;
  next_sweep_ = std::min(next_sweep_, t);
}

void ConnectionLoop::Sweep() {
  const auto now = Clock::now();
  next_sweep_ = Clock::time_point::max();
  std::vector<std::pair<int, bool>> expired;  // fd, was mid-request
  for (const auto& [fd, conn] : conns_) {
    if (conn->deadline <= now) {
      expired.emplace_back(fd, conn->reading);
    } else {
      next_sweep_ = std::min(next_sweep_, conn->deadline);
    }
  }
  for (const auto& [fd, reading] : expired) {
    if (reading) timed_out_.fetch_add(1, std::memory_order_relaxed);
    Close(fd, reading ? std::string_view(TimeoutAnswer()) : std::string_view());
  }
}

}  // namespace kvpush::http
