// FrontDoor's connection loop (http/connection_loop.h) on a loopback port: idle and slow clients
// hold no request thread, the keep-alive and request-head timeouts, the connection cap's 503,
// pipelining, Stop with idle connections and a request in flight, and TLS.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "http/front_door.h"
#include "http/prometheus.h"
#include "tls_test_certs.h"

namespace kvpush::http {
namespace {

using Clock = std::chrono::steady_clock;

/// A plain TCP connection to 127.0.0.1:`port` (-1 on failure).
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void Send(int fd, const std::string& s) {
  ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), static_cast<ssize_t>(s.size()));
}

/// What `fd` receives until the peer closes, `want` bytes came, or `timeout_ms` passes.
std::string Receive(int fd, int timeout_ms, size_t want = SIZE_MAX, bool* closed = nullptr) {
  std::string got;
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (got.size() < want) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) break;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      if (closed != nullptr) *closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

FrontDoorOptions Small() {
  FrontDoorOptions o;
  o.worker_threads = 2;
  o.max_extra_threads = 0;
  o.max_body_bytes = 64;
  return o;
}

void AddRoutes(FrontDoor& door) {
  door.Get("/a", [](const Request&, Response& res) { res.set_content("A", "text/plain"); });
  door.Post("/b", [](const Request& req, Response& res) {
    res.set_content("got " + req.body, "text/plain");
  });
}

// Idle connections (nothing sent) hold no thread: with 2 workers and 300 idle connections, a
// request is answered at once (cpp-httplib's own loop parked a worker per idle connection).
TEST(FrontDoorConnections, IdleConnectionsHoldNoThread) {
  FrontDoor door(Small());
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  std::vector<int> idle;
  idle.reserve(300);
  for (int i = 0; i < 300; ++i) idle.push_back(Connect(door.port()));
  httplib::Client c("127.0.0.1", door.port());
  const auto start = Clock::now();
  auto r = c.Get("/a");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "A");
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(1));
  EXPECT_GE(door.counts().open, 300u);
  for (int fd : idle) ::close(fd);
}

// A head that trickles in gets 408 request_timeout once the head timeout passed, and the
// connection closes; meanwhile other clients are served.
TEST(FrontDoorConnections, ASlowHeadGets408AfterTheHeadTimeout) {
  FrontDoorOptions o = Small();
  o.connections.header_timeout_s = 1;
  FrontDoor door(o);
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  std::vector<int> slow;
  for (int i = 0; i < 10; ++i) {
    slow.push_back(Connect(door.port()));
    Send(slow.back(), "GET /a HTTP/1.1\r\nHost: x\r\n");
  }
  httplib::Client c("127.0.0.1", door.port());
  auto r = c.Get("/a");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "A");
  const auto start = Clock::now();
  bool closed = false;
  const std::string answer = Receive(slow[0], 5000, SIZE_MAX, &closed);
  EXPECT_TRUE(closed);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(2500));
  EXPECT_EQ(answer.rfind("HTTP/1.1 408 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("\"request_timeout\""), std::string::npos) << answer;
  for (int fd : slow) ::close(fd);
  EXPECT_GE(door.counts().timed_out, 1u);
}

// An idle keep-alive connection is closed (silently) after the keep-alive timeout.
TEST(FrontDoorConnections, AnIdleConnectionIsClosedAfterTheKeepAliveTimeout) {
  FrontDoorOptions o = Small();
  o.connections.keep_alive_timeout_s = 1;
  FrontDoor door(o);
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  const int fd = Connect(door.port());
  Send(fd, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n");
  const std::string first = Receive(fd, 2000, 1);
  EXPECT_EQ(first.rfind("HTTP/1.1 200", 0), 0u) << first;
  const auto start = Clock::now();
  bool closed = false;
  const std::string rest = Receive(fd, 5000, SIZE_MAX, &closed);
  EXPECT_TRUE(closed);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(500));
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(2500));
  EXPECT_EQ(rest.find("HTTP/1.1 408"), std::string::npos) << rest;
  ::close(fd);
}

// One connection over max_connections gets a 503 too_many_connections at once and is closed;
// once a connection closes, a new one is served.
TEST(FrontDoorConnections, OneConnectionOverTheCapGets503) {
  FrontDoorOptions o = Small();
  o.connections.max_connections = 3;
  FrontDoor door(o);
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  std::vector<int> held;
  held.reserve(3);
  for (int i = 0; i < 3; ++i) held.push_back(Connect(door.port()));
  const int over = Connect(door.port());
  bool closed = false;
  const std::string answer = Receive(over, 2000, SIZE_MAX, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(answer.rfind("HTTP/1.1 503 ", 0), 0u) << answer;
  EXPECT_NE(answer.find("\"too_many_connections\""), std::string::npos) << answer;
  ::close(over);
  EXPECT_EQ(door.counts().refused, 1u);
  PrometheusWriter w;
  WriteConnectionCounts(w, door.counts());
  EXPECT_NE(w.str().find("kvpush_http_connections_refused_total 1\n"), std::string::npos)
      << w.str();
  EXPECT_NE(w.str().find("kvpush_http_connections_max 3\n"), std::string::npos) << w.str();
  ::close(held[0]);
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (door.counts().open > 2 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const int again = Connect(door.port());
  Send(again, "GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string ok = Receive(again, 2000);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
  ::close(again);
  for (size_t i = 1; i < held.size(); ++i) ::close(held[i]);
}

// Requests sent back to back on one connection (pipelined), one with a body that arrives in
// pieces, are answered in order on that connection.
TEST(FrontDoorConnections, PipelinedAndPiecemealRequestsAreAnsweredInOrder) {
  FrontDoor door(Small());
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  const int fd = Connect(door.port());
  Send(fd,
       "GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"
       "he");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Send(fd, "llo");
  Send(fd, "GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string all = Receive(fd, 3000);
  const size_t a1 = all.find("\r\n\r\nA");
  const size_t b = all.find("got hello");
  const size_t a2 = all.find("\r\n\r\nA", b == std::string::npos ? 0 : b);
  EXPECT_NE(a1, std::string::npos) << all;
  EXPECT_NE(b, std::string::npos) << all;
  EXPECT_NE(a2, std::string::npos) << all;
  EXPECT_LT(a1, b);
  ::close(fd);
}

// A streamed (chunked) answer arrives whole, and the connection then serves the next request.
TEST(FrontDoorConnections, AStreamedAnswerArrivesWholeOnAKeptConnection) {
  FrontDoor door(Small());
  AddRoutes(door);
  door.Get("/stream", [](const Request&, Response& res) {
    res.set_chunked_content_provider(
        "text/event-stream", [](size_t offset, httplib::DataSink& sink) {
          const std::string part = "data: " + std::to_string(offset) + "\n\n";
          if (offset >= 30) {
            sink.done();
            return true;
          }
          return sink.write(part.data(), part.size());
        });
  });
  ASSERT_TRUE(door.Start().ok());
  httplib::Client c("127.0.0.1", door.port());
  c.set_keep_alive(true);
  auto r = c.Get("/stream");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "data: 0\n\ndata: 9\n\ndata: 18\n\ndata: 28\n\n");
  auto a = c.Get("/a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->body, "A");
}

TEST(FrontDoorConnections, AHeadOverTheLimitGets431) {
  FrontDoor door(Small());
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  const int fd = Connect(door.port());
  Send(fd, "GET /a HTTP/1.1\r\n" + std::string(70 << 10, 'x'));
  const std::string answer = Receive(fd, 3000);
  EXPECT_EQ(answer.rfind("HTTP/1.1 431 ", 0), 0u) << answer.substr(0, 200);
  ::close(fd);
}

// Answers the loop gives, holding no request thread: a Content-Length body that stops coming
// gets 408 after the head timeout (it was closed silently when the head and part of the body
// came in one read).
TEST(FrontDoorConnections, BodyAnswersComeFromTheLoop) {
  FrontDoorOptions o = Small();
  o.connections.header_timeout_s = 1;
  FrontDoor door(o);
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  const struct {
    std::string request;
    const char* status;
    const char* body_part;
  } cases[] = {
      {"POST /b HTTP/1.1\r\nContent-Length: 5\r\n\r\n{\"a\"", "HTTP/1.1 408 ",
       "\"request_timeout\""},
  };
  for (const auto& c : cases) {
    const auto start = Clock::now();
    const int fd = Connect(door.port());
    Send(fd, c.request);
    bool closed = false;
    const std::string answer = Receive(fd, 5000, SIZE_MAX, &closed);
    EXPECT_TRUE(closed) << c.request;
    EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(2500)) << c.request;
    EXPECT_EQ(answer.rfind(c.status, 0), 0u) << answer;
    EXPECT_NE(answer.find(c.body_part), std::string::npos) << answer;
    ::close(fd);
  }
}

// Bytes after a request the door could not frame are never read as a next request: framing
// RFC 9112 §6 refuses gets 400 from the loop, and after the library's own 400 the connection
// closes (both used to answer the body's bytes as requests, with keep-alive).
TEST(FrontDoorConnections, NoRequestIsReadFromAnUnframedBody) {
  FrontDoor door(Small());
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  const std::string next = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
  const struct {
    std::string request;
    const char* status;
  } cases[] = {
      {"GET /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello" + next, "HTTP/1.1 400 "},
      {"POST /b HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 9\r\n\r\nhello" + next,
       "HTTP/1.1 400 "},
      {"POST /b HTTP/1.1\r\nContent-Length: 12abc\r\n\r\nhello" + next, "HTTP/1.1 400 "},
      {"GARBAGE\r\n\r\n" + next, "HTTP/1.1 400 "},
  };
  for (const auto& c : cases) {
    const int fd = Connect(door.port());
    Send(fd, c.request);
    bool closed = false;
    const std::string answer = Receive(fd, 3000, SIZE_MAX, &closed);
    EXPECT_TRUE(closed) << c.request;
    EXPECT_EQ(answer.rfind(c.status, 0), 0u) << answer;
    EXPECT_NE(answer.find("Connection: close\r\n"), std::string::npos) << "announced: " << answer;
    EXPECT_EQ(answer.find("HTTP/1.1", 1), std::string::npos) << "one answer only: " << answer;
    ::close(fd);
  }
}

// A handler's own 400 (an API error, well framed) keeps the connection: the next request on it
// is answered. It used to close unannounced, and a client that reused the connection at once
// (the router's pool) lost its next request ("connection closed before the answer").
TEST(FrontDoorConnections, AnApiErrorKeepsTheConnection) {
  FrontDoor door(Small());
  AddRoutes(door);
  door.Post("/bad", [](const Request&, Response& res) {
    res.status = 400;
    res.set_content(R"({"error":{"message":"no"}})", "application/json");
  });
  ASSERT_TRUE(door.Start().ok());
  const int fd = Connect(door.port());
  Send(fd, "POST /bad HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}");
  // Read until the first answer's body is in, then ask again on the same connection.
  std::string answer;
  const auto deadline = Clock::now() + std::chrono::seconds(3);
  while (answer.find("{\"error\"") == std::string::npos && Clock::now() < deadline) {
    answer += Receive(fd, 100);
  }
  EXPECT_EQ(answer.rfind("HTTP/1.1 400 ", 0), 0u) << answer;
  EXPECT_EQ(answer.find("Connection: close"), std::string::npos) << answer;
  Send(fd, "GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  bool closed = false;
  const std::string next = Receive(fd, 3000, SIZE_MAX, &closed);
  EXPECT_EQ(next.rfind("HTTP/1.1 200 ", 0), 0u) << next;
  EXPECT_NE(next.find("\r\n\r\nA"), std::string::npos) << next;
  ::close(fd);
}

// Stop closes idle connections at once and lets a request in flight finish.
TEST(FrontDoorConnections, StopClosesIdleConnectionsAndFinishesRequestsInFlight) {
  auto door = std::make_unique<FrontDoor>(Small());
  std::promise<void> entered;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  door->Get("/hold", [&](const Request&, Response& res) {
    entered.set_value();
    released.wait();
    res.set_content("held", "text/plain");
  });
  ASSERT_TRUE(door->Start().ok());
  const int port = door->port();
  const int idle = Connect(port);
  auto held = std::async(std::launch::async, [port] {
    httplib::Client c("127.0.0.1", port);
    return c.Get("/hold");
  });
  entered.get_future().wait();
  auto stopped = std::async(std::launch::async, [&] { door->Stop(); });
  bool closed = false;
  Receive(idle, 2000, SIZE_MAX, &closed);
  EXPECT_TRUE(closed);
  EXPECT_EQ(stopped.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  release.set_value();
  stopped.get();
  auto h = held.get();
  ASSERT_TRUE(h);
  EXPECT_EQ(h->body, "held");
  EXPECT_EQ(Connect(port), -1);
  ::close(idle);
}

size_t Entries(const char* dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

// A door that served keep-alive, idle and mid-head connections leaves no descriptor and no
// thread behind once destroyed.
TEST(FrontDoorConnections, AStoppedDoorLeavesNoDescriptorOrThread) {
  const size_t fds = Entries("/proc/self/fd");
  const size_t threads = Entries("/proc/self/task");
  {
    FrontDoor door(Small());
    AddRoutes(door);
    ASSERT_TRUE(door.Start().ok());
    httplib::Client c("127.0.0.1", door.port());
    c.set_keep_alive(true);
    ASSERT_TRUE(c.Get("/a"));
    const int idle = Connect(door.port());
    const int slow = Connect(door.port());
    Send(slow, "GET /a HTTP/1.1\r\n");
    door.Stop();
    ::close(idle);
    ::close(slow);
  }
  EXPECT_EQ(Entries("/proc/self/fd"), fds);
  EXPECT_EQ(Entries("/proc/self/task"), threads);
}

// Over TLS: idle TCP connections (no handshake) hold no thread, and a client's keep-alive
// connection serves several requests.
TEST(FrontDoorConnections, TlsServesKeepAliveRequestsPastIdleHandshakes) {
  static const ::kvpush::testing::TempTlsTestFiles pki;
  FrontDoorOptions o = Small();
  o.tls_cert_file = pki.files().server_cert;
  o.tls_key_file = pki.files().server_key;
  FrontDoor door(o);
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  std::vector<int> idle;
  idle.reserve(50);
  for (int i = 0; i < 50; ++i) idle.push_back(Connect(door.port()));
  httplib::SSLClient c("127.0.0.1", door.port());
  c.set_ca_cert_path(pki.files().ca_cert.c_str());
  c.enable_server_certificate_verification(true);
  c.set_keep_alive(true);
  for (int i = 0; i < 3; ++i) {
    auto r = i == 1 ? c.Post("/b", "tls", "text/plain") : c.Get("/a");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->body, i == 1 ? "got tls" : "A");
  }
  for (int fd : idle) ::close(fd);
}

// Every answer given to a request with a body — 401 (no key), 404, 405, 413, with
// Content-Length, chunked, or after Expect: 100-continue — either has read and discarded the
// body or closes the connection: a body that is itself a request is never executed, and the
// honest request after it gets its own answer. Exactly one response per request sent.
TEST(FrontDoorConnections, EarlyAnswersNeverReadABodyAsARequest) {
  FrontDoorOptions o = Small();
  o.api_key = "k";
  FrontDoor door(o);
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  const std::string key = "Authorization: Bearer k\r\n";
  // Executed, it would answer "A" (it carries the key).
  const std::string smuggled = "GET /a HTTP/1.1\r\nHost: x\r\n" + key + "\r\n";
  const std::string honest = "GET /a HTTP/1.1\r\nHost: x\r\n" + key + "Connection: close\r\n\r\n";
  const std::string cl = "Content-Length: " + std::to_string(smuggled.size()) + "\r\n";
  char size_hex[16];
  std::snprintf(size_hex, sizeof size_hex, "%zx", smuggled.size());
  const std::string chunked_body = std::string(size_hex) + "\r\n" + smuggled + "\r\n0\r\n\r\n";
  struct Case {
    const char* what;
    std::string request;  // head and body
    int status;
    bool closes;  // the answer closes the connection (the honest request gets none)
  } cases[] = {
      {"401, Content-Length", "POST /b HTTP/1.1\r\nHost: x\r\n" + cl + "\r\n" + smuggled, 401,
       false},
      {"401 on an unknown path", "POST /nowhere HTTP/1.1\r\nHost: x\r\n" + cl + "\r\n" + smuggled,
       401, false},
      {"401, chunked",
       "POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked_body, 401,
       false},
      {"401, Expect: 100-continue",
       "POST /b HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n" + cl + "\r\n" + smuggled, 401,
       false},
      {"404", "POST /nowhere HTTP/1.1\r\nHost: x\r\n" + key + cl + "\r\n" + smuggled, 404, false},
      {"405", "PUT /b HTTP/1.1\r\nHost: x\r\n" + key + cl + "\r\n" + smuggled, 405, false},
      {"413",
       "POST /b HTTP/1.1\r\nHost: x\r\n" + key + "Content-Length: 80\r\n\r\n" + smuggled +
           std::string(80 - smuggled.size(), ' '),
       413, true},
      {"200 (control)", "POST /b HTTP/1.1\r\nHost: x\r\n" + key + cl + "\r\n" + smuggled, 200,
       false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int fd = Connect(door.port());
    ASSERT_GE(fd, 0);
    // After an answer that closes, an honest request sent along could meet the close as a
    // reset before its answer was read: only the body's own smuggled request is sent then.
    Send(fd, c.closes ? c.request : c.request + honest);
    bool closed = false;
    const std::string got = Receive(fd, 5000, SIZE_MAX, &closed);
    ::close(fd);
    EXPECT_TRUE(closed) << got;  // the honest request asks to close, or the answer closed
    std::vector<int> statuses;
    for (size_t at = got.find("HTTP/1.1 "); at != std::string::npos;
         at = got.find("HTTP/1.1 ", at + 1)) {
      const int st = std::atoi(got.c_str() + at + 9);
      if (st != 100) statuses.push_back(st);  // an interim answer is not a response
    }
    const std::vector<int> want =
        c.closes ? std::vector<int>{c.status} : std::vector<int>{c.status, 200};
    EXPECT_EQ(statuses, want) << got;
    // "A" is the answer of GET /a: only the honest request may get it.
    size_t as = 0;
    for (size_t at = got.find("\r\n\r\nA"); at != std::string::npos;
         at = got.find("\r\n\r\nA", at + 1)) {
      ++as;
    }
    EXPECT_EQ(as, c.closes ? 0u : 1u) << got;
  }
}

// A POST without a length (`curl -X POST` without `-d`, e.g. POST /reset_prefix_cache) has an
// empty body (RFC 9112 §6.3): answered at once by its handler, the connection kept for the next
// request (it was 411 and closed).
TEST(FrontDoorConnections, APostWithoutALengthHasAnEmptyBody) {
  FrontDoor door(Small());
  AddRoutes(door);
  ASSERT_TRUE(door.Start().ok());
  const int fd = Connect(door.port());
  const auto start = Clock::now();
  Send(fd, "POST /b HTTP/1.1\r\nHost: x\r\n\r\nGET /a HTTP/1.1\r\nConnection: close\r\n\r\n");
  bool closed = false;
  const std::string got = Receive(fd, 5000, SIZE_MAX, &closed);
  ::close(fd);
  EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(2500));
  EXPECT_EQ(got.rfind("HTTP/1.1 200 ", 0), 0u) << got;
  const size_t empty = got.find("\r\n\r\ngot ");
  EXPECT_NE(empty, std::string::npos) << got;  // the handler saw an empty body
  EXPECT_NE(got.find("HTTP/1.1 200 ", 1), std::string::npos) << got;
  EXPECT_NE(got.find("\r\n\r\nA"), std::string::npos) << got;  // the next request answered
}

}  // namespace
}  // namespace kvpush::http
