#include "http/connection.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

namespace kvpush::http {

void NumericAddress(const sockaddr_storage& addr, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], text, sizeof text);
    } else {
      inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    }
    port = ntohs(a->sin6_port);
  } else {
    port = 0;
  }
  ip = text;
}

Connection::Connection(int fd, SSL* ssl, std::string remote_addr, int remote_port)
    : fd_(fd), ssl_(ssl), remote_addr_(std::move(remote_addr)), remote_port_(remote_port) {
  handshaken_ = ssl_ == nullptr;
}

Connection::~Connection() {
  if (ssl_ != nullptr) {
    if (handshaken_ && graceful_) SSL_shutdown(ssl_);  // close_notify, best effort
    SSL_free(ssl_);
  }
  ::shutdown(fd_, SHUT_RDWR);
  ::close(fd_);
}

Connection::Io Connection::Handshake() {
  if (handshaken_) return Io::kDone;
  const int rc = SSL_do_handshake(ssl_);
  if (rc == 1) {
    handshaken_ = true;
    return Io::kDone;
  }
  switch (SSL_get_error(ssl_, rc)) {
    case SSL_ERROR_WANT_READ:
      return Io::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return Io::kWantWrite;
    default:
      graceful_ = false;
      ERR_clear_error();
      return Io::kClosed;
  }
}

Connection::Io Connection::ReadAvailable(size_t limit) {
  const size_t have = in.size() - in_off;
  if (have >= limit) return Io::kWantRead;
  char buf[16384];
  const size_t want = std::min(sizeof buf, limit - have);
  if (ssl_ != nullptr) {
    const int n = SSL_read(ssl_, buf, static_cast<int>(want));
    if (n > 0) {
      in.append(buf, static_cast<size_t>(n));
      return Io::kDone;
    }
    const int err = SSL_get_error(ssl_, n);
    if (err == SSL_ERROR_WANT_READ) return Io::kWantRead;
    if (err == SSL_ERROR_WANT_WRITE) return Io::kWantWrite;
    if (err != SSL_ERROR_ZERO_RETURN) graceful_ = false;
    ERR_clear_error();
    return Io::kClosed;
  }
  for (;;) {
    const ssize_t n = ::recv(fd_, buf, want, 0);
    if (n > 0) {
      in.append(buf, static_cast<size_t>(n));
      return Io::kDone;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Io::kWantRead;
    return Io::kClosed;
  }
}

void Connection::WriteOnce(std::string_view bytes) {
  if (ssl_ != nullptr) {
    if (handshaken_) SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size()));
    ERR_clear_error();
    return;
  }
  (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void Connection::LocalAddress(std::string& ip, int& port) {
  if (local_port_ < 0) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      NumericAddress(addr, local_addr_, local_port_);
    } else {
      local_port_ = 0;
    }
  }
  ip = local_addr_;
  port = local_port_;
}

void Connection::Compact() {
  if (in_off == 0) return;
  in.erase(0, in_off);
  in_off = 0;
  if (in.empty()) std::string().swap(in);  // an idle connection keeps no buffer
}

ConnectionStream::ConnectionStream(Connection& conn, int read_budget_s, int write_timeout_s)
    : conn_(conn),
      read_deadline_(Connection::Clock::now() + std::chrono::seconds(read_budget_s)),
      write_timeout_ms_(write_timeout_s * 1000) {}

int ConnectionStream::ReadTimeoutMs() const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(read_deadline_ -
                                                                          Connection::Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

bool ConnectionStream::WaitFor(short events, int timeout_ms) const {
  pollfd p{conn_.fd(), events, 0};
  for (;;) {
    const int rc = ::poll(&p, 1, timeout_ms);
    if (rc < 0 && errno == EINTR) continue;
    return rc > 0;
  }
}

bool ConnectionStream::is_readable() const {
  if (conn_.in_off < conn_.in.size()) return true;
  if (conn_.tls() && SSL_pending(conn_.ssl()) > 0) return true;
  return WaitFor(POLLIN, ReadTimeoutMs());
}

bool ConnectionStream::is_writable() const {
  if (!WaitFor(POLLOUT, write_timeout_ms_)) return false;
  // cpp-httplib's is_socket_alive: readable with nothing to peek at means the peer closed.
  if (!WaitFor(POLLIN, 0)) return true;
  char byte;
  return ::recv(conn_.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  const size_t buffered = conn_.in.size() - conn_.in_off;
  if (buffered > 0) {
    const size_t n = std::min(size, buffered);
    std::memcpy(ptr, conn_.in.data() + conn_.in_off, n);
    conn_.in_off += n;
    consumed_ += n;
    return static_cast<ssize_t>(n);
  }
  const ssize_t n = ReadSocket(ptr, std::min<size_t>(size, INT_MAX));
  if (n > 0) consumed_ += static_cast<size_t>(n);
  return n;
}

ssize_t ConnectionStream::ReadSocket(char* ptr, size_t size) {
  for (;;) {
    short wait = POLLIN;
    if (conn_.tls()) {
      const int n = SSL_read(conn_.ssl(), ptr, static_cast<int>(size));
      if (n > 0) return n;
      const int err = SSL_get_error(conn_.ssl(), n);
      if (err == SSL_ERROR_ZERO_RETURN) return 0;
      if (err == SSL_ERROR_WANT_WRITE) {
        wait = POLLOUT;
      } else if (err != SSL_ERROR_WANT_READ) {
        conn_.MarkBroken();
        ERR_clear_error();
        return -1;
      }
    } else {
      const ssize_t n = ::recv(conn_.fd(), ptr, size, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    }
    if (!WaitFor(wait, wait == POLLIN ? ReadTimeoutMs() : write_timeout_ms_)) return -1;
  }
}

ssize_t ConnectionStream::WriteSome(const char* ptr, size_t size) {
  for (;;) {
    short wait = POLLOUT;
    if (conn_.tls()) {
      const int n = SSL_write(conn_.ssl(), ptr, static_cast<int>(std::min<size_t>(size, INT_MAX)));
      if (n > 0) return n;
      const int err = SSL_get_error(conn_.ssl(), n);
      if (err == SSL_ERROR_WANT_READ) {
        wait = POLLIN;
      } else if (err != SSL_ERROR_WANT_WRITE) {
        conn_.MarkBroken();
        ERR_clear_error();
        return -1;
      }
    } else {
      const ssize_t n = ::send(conn_.fd(), ptr, size, MSG_NOSIGNAL);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    }
    if (!WaitFor(wait, write_timeout_ms_)) return -1;
  }
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  if (!is_writable()) return -1;
  size_t done = 0;
  while (done < size) {
    const ssize_t n = WriteSome(ptr + done, size - done);
    if (n <= 0) return -1;
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(size);
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  ip = conn_.remote_addr();
  port = conn_.remote_port();
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  conn_.LocalAddress(ip, port);
}

}  // namespace kvpush::http
