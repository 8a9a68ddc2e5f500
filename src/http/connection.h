// Connection: one client connection of a front door (its socket, its TLS session, the bytes read
// ahead), and ConnectionStream, the cpp-httplib Stream a worker serves one request through.
// docs/architecture.md, "The front door (src/http/)".
#pragma once

#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvpush::http {

/// The numeric address and port of `addr` (IPv4 or IPv6; IPv4-mapped IPv6 shown as IPv4). Pure.
void NumericAddress(const sockaddr_storage& addr, std::string& ip, int& port);

/// One accepted connection. Its socket is non-blocking from accept to close. Owned by one thread
/// at a time: the connection loop while it is idle or sends its request, then the worker serving
/// that request, then the loop again (moved between them as a unique_ptr). Closes its socket
/// (and frees its TLS session) on destruction.
class Connection {
 public:
  using Clock = std::chrono::steady_clock;

  /// Takes `fd` (non-blocking); `ssl`, when not null, is a server-side session on `fd` not yet
  /// handshaken (taken too). `remote_addr`/`remote_port`: the peer, from accept.
  Connection(int fd, SSL* ssl, std::string remote_addr, int remote_port);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  /// What a non-blocking step came to.
  enum class Io {
    kDone,       ///< progress (bytes read, handshake finished)
    kWantRead,   ///< wait until the socket is readable, then retry
    kWantWrite,  ///< wait until the socket is writable, then retry (TLS)
    kClosed      ///< end of stream or an error: close the connection
  };

  /// Non-blocking: runs the TLS handshake one step further (kDone once it completed; at once
  /// without TLS).
  Io Handshake();
  /// Non-blocking: appends what the socket (or TLS session) has to `in`, up to `limit` bytes in
  /// all buffered; kDone when at least one byte came (then call again until kWantRead: a TLS
  /// session may hold decrypted bytes the socket no longer signals).
  Io ReadAvailable(size_t limit);
  /// Non-blocking, best effort: writes `bytes` once (an error answer before closing).
  void WriteOnce(std::string_view bytes);
  /// No TLS close_notify on close (the session failed: cpp-httplib's non-graceful close).
  void MarkBroken() { graceful_ = false; }

  int fd() const { return fd_; }
  SSL* ssl() const { return ssl_; }
  bool tls() const { return ssl_ != nullptr; }
  bool handshaken() const { return handshaken_; }
  const std::string& remote_addr() const { return remote_addr_; }
  int remote_port() const { return remote_port_; }
  /// This end's address and port (getsockname, cached on the first call).
  void LocalAddress(std::string& ip, int& port);

  /// The unread bytes: the next request first, from `in_off` on.
  std::string in;
  size_t in_off = 0;
  /// Drops the consumed prefix of `in` (keeps what a pipelining client sent ahead).
  void Compact();
  std::string_view unread() const { return std::string_view(in).substr(in_off); }

  // The connection loop's bookkeeping (only the thread owning the connection touches it).
  Clock::time_point deadline;  ///< when the loop closes it (idle, handshake, head, body)
  bool reading = false;        ///< a request (or the TLS handshake) has begun: expiry gets 408
  uint32_t watched = 0;        ///< the epoll events it is registered for (0: not registered)

 private:
  int fd_;
  SSL* ssl_;
  bool handshaken_ = false;
  bool graceful_ = true;  ///< send TLS close_notify on close (not after a TLS error)
  std::string remote_addr_;
  int remote_port_;
  std::string local_addr_;
  int local_port_ = -1;
};

/// cpp-httplib's Stream over a Connection, for the worker serving one request: reads take the
/// bytes the loop read ahead first, then the socket; reads and writes wait for the socket (poll)
/// at most their timeout (seconds) each, as cpp-httplib's SocketStream and SSLSocketStream do;
/// is_writable() also checks that the peer did not close (a streaming handler stops writing to a
/// client that left). Not thread-safe: one worker, one request.
class ConnectionStream final : public httplib::Stream {
 public:
  /// Reads from the socket must all end within `read_budget_s` of construction (a worker is never
  /// held longer by a client that sends its body slowly); each write waits at most
  /// `write_timeout_s` for the socket.
  ConnectionStream(Connection& conn, int read_budget_s, int write_timeout_s);

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return conn_.fd(); }

  /// Bytes of the request handed out by read() so far (read ahead by the loop, or from the
  /// socket): how far the HTTP library got into the connection's bytes.
  size_t consumed() const { return consumed_; }

 private:
  /// Waits up to `timeout_ms` for `events` (POLLIN/POLLOUT) on the socket.
  bool WaitFor(short events, int timeout_ms) const;
  ssize_t ReadSocket(char* ptr, size_t size);
  ssize_t WriteSome(const char* ptr, size_t size);

  /// Milliseconds left of the read budget (0 once spent).
  int ReadTimeoutMs() const;

  Connection& conn_;
  Connection::Clock::time_point read_deadline_;
  int write_timeout_ms_;
  size_t consumed_ = 0;
};

}  // namespace kvpush::http
