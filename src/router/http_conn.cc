#include "router/http_conn.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/clock.h"

namespace kvpush::router {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return s;
}

std::string Trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

int ToMs(double s) {
  return static_cast<int>(std::min(s * 1000.0, 2.0e9));
}

/// poll() for `events` on `fd`, at most `timeout_ms`: >0 ready, 0 timeout, <0 error.
int PollFor(int fd, short events, int timeout_ms) {
  pollfd p{};
  p.fd = fd;
  p.events = events;
  for (;;) {
    const int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r;
  }
}

}  // namespace

HttpConn::HttpConn(InstanceAddress address, std::shared_ptr<const TlsClientContext> tls)
    : address_(std::move(address)), tls_ctx_(std::move(tls)) {}

HttpConn::~HttpConn() {
  MutexLock lock(mu_);
  if (tls_ != nullptr && (shut_ || broken_)) tls_->Abandon();  // no close_notify then
  tls_.reset();  // before the socket closes: a clean session sends close_notify on it
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

bool HttpConn::Fail(const std::string& error) {
  error_ = error;
  broken_ = true;
  return false;
}

void HttpConn::Shutdown() {
  MutexLock lock(mu_);
  shut_ = true;
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool HttpConn::Connect(double timeout_s) {
  connect_failed_ = true;
  tls_failed_ = false;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(address_.port);
  if (::getaddrinfo(address_.host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    return Fail("cannot resolve " + address_.host);
  }
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ::freeaddrinfo(res);
    return Fail(std::string("socket: ") + std::strerror(errno));
  }
  {
    MutexLock lock(mu_);
    fd_ = fd;
    if (shut_) ::shutdown(fd_, SHUT_RDWR);
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  ::freeaddrinfo(res);
  if (rc != 0 && errno != EINPROGRESS) return Fail(std::string("connect: ") + std::strerror(errno));
  if (rc != 0) {
    const int ready = PollFor(fd, POLLOUT, ToMs(timeout_s));
    if (ready == 0) return Fail("connect: timed out");
    int err = 0;
    socklen_t len = sizeof(err);
    if (ready < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      return Fail(std::string("connect: ") + std::strerror(err != 0 ? err : errno));
    }
  }
  // https: the TLS handshake, the instance's certificate verified (a refusal is a failed
  // connect: nothing was sent, and nothing ever goes out in plain HTTP instead).
  const bool tls_ok = !address_.https || Handshake(timeout_s);
  {
    // shutdown(2) of a socket that is not connected yet does nothing (ENOTCONN): a Shutdown()
    // that came before or during the connect must still end this connection, or a cut leg would
    // go on waiting on a live one (PdLegs.StoppedPrefillFailsTheRequestWithinAHealthInterval
    // got P's answer from D's recompute after 12 s, 1 run in 5 under load).
    MutexLock lock(mu_);
    if (shut_) {
      ::shutdown(fd_, SHUT_RDWR);
      connect_failed_ = false;  // not the instance's fault: the leg was stopped
      tls_failed_ = false;
      return Fail("connection shut down while connecting");
    }
  }
  if (!tls_ok) return false;
  connect_failed_ = false;
  return true;
}

bool HttpConn::Handshake(double timeout_s) {
  if (tls_ctx_ == nullptr) return Fail("https instance " + address_.url + ": no TLS context");
  std::string error;
  tls_ = tls_ctx_->NewSession(fd_, address_.host, &error);
  if (tls_ == nullptr) return Fail(error);
  const int64_t deadline = NowNs() + static_cast<int64_t>(std::min(timeout_s, 2.0e6) * 1e9);
  for (;;) {
    const TlsStep step = tls_->Handshake(&error);
    if (step == TlsStep::kDone) return true;
    if (step != TlsStep::kWantRead && step != TlsStep::kWantWrite) {
      tls_failed_ = true;
      return Fail(error);
    }
    const int64_t left_ms = (deadline - NowNs()) / 1000000;
    const int ready = left_ms <= 0 ? 0
                                   : PollFor(fd_, step == TlsStep::kWantRead ? POLLIN : POLLOUT,
                                             static_cast<int>(left_ms));
    if (ready <= 0) {
      tls_failed_ = true;
      return Fail(ready == 0 ? "TLS handshake timed out" : "TLS handshake: poll failed");
    }
  }
}

int HttpConn::ReadSome(char* tmp, size_t cap, size_t* got, short* wait_for) {
  if (tls_ != nullptr) {
    std::string error;
    switch (tls_->Read(tmp, cap, got, &error)) {
      case TlsStep::kDone:
        return 1;
      case TlsStep::kClosed:
        return -1;
      case TlsStep::kWantRead:
        *wait_for = POLLIN;
        return 0;
      case TlsStep::kWantWrite:
        *wait_for = POLLOUT;
        return 0;
      case TlsStep::kFailed:
        break;
    }
    error_ = error;
    return -2;
  }
  for (;;) {
    const ssize_t n = ::recv(fd_, tmp, cap, 0);
    if (n > 0) {
      *got = static_cast<size_t>(n);
      return 1;
    }
    if (n == 0) return -1;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      *wait_for = POLLIN;
      return 0;
    }
    error_ = std::string("read: ") + std::strerror(errno);
    return -2;
  }
}

int HttpConn::WriteSome(const char* data, size_t n, size_t* put, short* wait_for) {
  if (tls_ != nullptr) {
    std::string error;
    switch (tls_->Write(data, n, put, &error)) {
      case TlsStep::kDone:
        return 1;
      case TlsStep::kWantRead:
        *wait_for = POLLIN;
        return 0;
      case TlsStep::kWantWrite:
        *wait_for = POLLOUT;
        return 0;
      case TlsStep::kClosed:
      case TlsStep::kFailed:
        break;
    }
    error_ = error;
    return -2;
  }
  for (;;) {
    const ssize_t sent = ::send(fd_, data, n, MSG_NOSIGNAL);
    if (sent > 0) {
      *put = static_cast<size_t>(sent);
      return 1;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      *wait_for = POLLOUT;
      return 0;
    }
    error_ = std::string("write: ") + std::strerror(errno);
    return -2;
  }
}

bool HttpConn::WriteRequest(const std::string& method, const std::string& path,
                            const std::string& headers, const std::string& body, double timeout_s) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + address_.host + ":" +
                    std::to_string(address_.port) + "\r\n" + headers;
  if (!body.empty() || method == "POST") {
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  req += "\r\n";
  req += body;
  // A new answer: reset the reader.
  buf_.clear();
  pos_ = 0;
  body_ = Body::kNone;
  keep_alive_ = true;
  size_t off = 0;
  while (off < req.size()) {
    size_t put = 0;
    short wait_for = POLLOUT;
    const int r = WriteSome(req.data() + off, req.size() - off, &put, &wait_for);
    if (r == 1) {
      off += put;
      continue;
    }
    if (r < 0) return Fail(error_);
    const int ready = PollFor(fd_, wait_for, ToMs(timeout_s));
    if (ready > 0) continue;
    return Fail(ready == 0 ? "write timed out" : "write: poll failed");
  }
  return true;
}

int HttpConn::Fill(int timeout_ms) {
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > 65536) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  char tmp[65536];
  // A deadline, not one wait: a readable TLS socket may hold only part of a record, and the
  // read after the wait then wants more.
  const int64_t deadline = NowNs() + int64_t{timeout_ms} * 1000000;
  for (;;) {
    size_t got = 0;
    short wait_for = POLLIN;
    const int r = ReadSome(tmp, sizeof(tmp), &got, &wait_for);
    if (r == 1) {
      buf_.append(tmp, got);
      return 1;
    }
    if (r < 0) return r;
    const int64_t left_ms = (deadline - NowNs()) / 1000000;
    if (timeout_ms == 0 || left_ms <= 0) return 0;
    const int ready = PollFor(fd_, wait_for, static_cast<int>(left_ms));
    if (ready == 0) return 0;
    if (ready < 0) {
      error_ = "read: poll failed";
      return -2;
    }
  }
}

bool HttpConn::ReadHead(double timeout_s, HttpHead* head) {
  size_t end = std::string::npos;
  while ((end = buf_.find("\r\n\r\n", pos_)) == std::string::npos) {
    if (buf_.size() - pos_ > (64u << 10)) return Fail("answer head larger than 64 KiB");
    const int r = Fill(ToMs(timeout_s));
    if (r == 0) return Fail("read timed out");
    if (r == -1) return Fail("connection closed before the answer");
    if (r < 0) return Fail(error_);
  }
  const std::string text = buf_.substr(pos_, end - pos_);
  pos_ = end + 4;
  size_t line_end = text.find("\r\n");
  const std::string status_line = text.substr(0, line_end);
  if (status_line.rfind("HTTP/1.", 0) != 0 || status_line.size() < 12) {
    return Fail("malformed status line: " + status_line.substr(0, 80));
  }
  head->status = std::atoi(status_line.c_str() + 9);
  keep_alive_ = status_line.rfind("HTTP/1.1", 0) == 0;
  bool chunked = false;
  long long length = -1;
  while (line_end != std::string::npos) {
    const size_t start = line_end + 2;
    line_end = text.find("\r\n", start);
    const std::string line =
        text.substr(start, line_end == std::string::npos ? std::string::npos : line_end - start);
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string name = Lower(Trim(line.substr(0, colon)));
    const std::string value = Trim(line.substr(colon + 1));
    if (name == "content-length") length = std::atoll(value.c_str());
    if (name == "transfer-encoding") chunked = Lower(value).find("chunked") != std::string::npos;
    if (name == "connection") keep_alive_ = Lower(value).find("close") == std::string::npos;
    if (name == "content-type") head->content_type = value;
  }
  if (head->status == 204 || head->status == 304 || head->status < 200) {
    body_ = Body::kDone;
  } else if (chunked) {
    body_ = Body::kChunked;
    chunk_ = Chunk::kSize;
  } else if (length >= 0) {
    body_ = length == 0 ? Body::kDone : Body::kLength;
    remaining_ = static_cast<size_t>(length);
  } else {
    body_ = Body::kUntilClose;
    keep_alive_ = false;
  }
  return true;
}

bool HttpConn::Decode(std::string* out) {
  for (;;) {
    const size_t avail = buf_.size() - pos_;
    switch (body_) {
      case Body::kDone:
        return true;
      case Body::kNone:
        return false;
      case Body::kUntilClose:
        out->append(buf_, pos_, avail);
        pos_ = buf_.size();
        return false;
      case Body::kLength: {
        const size_t n = std::min(avail, remaining_);
        out->append(buf_, pos_, n);
        pos_ += n;
        remaining_ -= n;
        if (remaining_ == 0) body_ = Body::kDone;
        return body_ == Body::kDone;
      }
      case Body::kChunked:
        break;
    }
    if (chunk_ == Chunk::kData) {
      const size_t n = std::min(avail, remaining_);
      out->append(buf_, pos_, n);
      pos_ += n;
      remaining_ -= n;
      if (remaining_ > 0) return false;
      chunk_ = Chunk::kCrlf;
      continue;
    }
    if (chunk_ == Chunk::kCrlf) {
      if (avail < 2) return false;
      pos_ += 2;
      chunk_ = Chunk::kSize;
      continue;
    }
    const size_t eol = buf_.find("\r\n", pos_);
    if (eol == std::string::npos) return false;
    const std::string line = buf_.substr(pos_, eol - pos_);
    pos_ = eol + 2;
    if (chunk_ == Chunk::kTrailers) {
      if (line.empty()) body_ = Body::kDone;
      continue;
    }
    remaining_ = std::strtoull(line.c_str(), nullptr, 16);  // "size[;ext]"
    chunk_ = remaining_ == 0 ? Chunk::kTrailers : Chunk::kData;
  }
}

BodyRead HttpConn::ReadBody(int timeout_ms, std::string* out, bool* ended) {
  *ended = false;
  const int64_t deadline = NowNs() + int64_t{timeout_ms} * 1000000;
  for (;;) {
    const size_t before = out->size();
    if (Decode(out)) {
      *ended = true;
      return BodyRead::kData;
    }
    if (out->size() > before) return BodyRead::kData;
    const int64_t left_ms = std::max<int64_t>(0, (deadline - NowNs()) / 1000000);
    const int r = Fill(static_cast<int>(left_ms));
    if (r == 1) continue;
    if (r == 0) return BodyRead::kTimeout;
    if (r == -1 && body_ == Body::kUntilClose) {
      // Over TLS the end of such a body is only known from close_notify: a bare TCP close may
      // have cut it.
      if (tls_ != nullptr && !tls_->clean_close()) {
        Fail("TLS connection closed without close_notify: the answer may be truncated");
        return BodyRead::kFailed;
      }
      body_ = Body::kDone;
      *ended = true;
      return BodyRead::kData;
    }
    Fail(r == -1 ? "connection closed mid-answer" : error_);
    return BodyRead::kFailed;
  }
}

bool HttpConn::reusable() const {
  return fd_ >= 0 && !broken_ && keep_alive_ && body_ == Body::kDone && pos_ == buf_.size();
}

bool HttpConn::IdleUsable() const {
  if (fd_ < 0 || broken_ || pos_ != buf_.size()) return false;
  if (tls_ != nullptr && tls_->HasPending()) return false;  // stray bytes inside OpenSSL
  return PollFor(fd_, POLLIN, 0) == 0;
}

}  // namespace kvpush::router
