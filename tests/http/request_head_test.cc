// ScanRequest (http/request_head.h): when a connection's bytes make a request a worker can serve.
#include "http/request_head.h"

#include <gtest/gtest.h>

#include <string>

namespace kvpush::http {
namespace {

constexpr size_t kHead = 1024;
constexpr size_t kBody = 16;

RequestProgress ProgressOf(const std::string& bytes) {
  return ScanRequest(bytes, kHead, kBody).progress;
}

TEST(ScanRequest, TellsWhereTheBytesStand) {
  struct Case {
    std::string bytes;
    RequestProgress want;
  };
  const Case cases[] = {
      {"", RequestProgress::kIdle},
      {"GET /health HTTP/1.1\r\n", RequestProgress::kReadingHead},
      {"GET /health HTTP/1.1\r\nHost: x\r\n", RequestProgress::kReadingHead},
      {"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", RequestProgress::kReady},
      {"GET /health HTTP/1.1\nHost: x\n\n", RequestProgress::kReady},  // LF only, as httplib
      {"POST /b HTTP/1.1\r\nContent-Length: 5\r\n\r\nabc", RequestProgress::kReadingBody},
      {"POST /b HTTP/1.1\r\ncontent-length:5\r\n\r\nabcde", RequestProgress::kReady},
      // Over max_body_bytes: the worker reads (discards) it and answers 413; not buffered here.
      {"POST /b HTTP/1.1\r\nContent-Length: 17\r\n\r\n", RequestProgress::kReady},
      {"POST /b HTTP/1.1\r\nContent-Length: 16\r\n\r\n", RequestProgress::kReadingBody},
      // Bodies the worker reads itself.
      {"POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", RequestProgress::kReady},
      {"POST /b HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
       RequestProgress::kReady},
      // Framing refused at once (RFC 9112 §6): it would desynchronise the connection.
      {"POST /b HTTP/1.1\r\nContent-Length: five\r\n\r\n", RequestProgress::kBadFraming},
      {"POST /b HTTP/1.1\r\nContent-Length: -1\r\n\r\n", RequestProgress::kBadFraming},
      {"POST /b HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
       RequestProgress::kBadFraming},
      {"POST /b HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n",
       RequestProgress::kBadFraming},
      {"POST /b HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}",
       RequestProgress::kReady},
      {"POST /b HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
       RequestProgress::kBadFraming},
      {"POST /b HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", RequestProgress::kBadFraming},
      {"GET /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", RequestProgress::kBadFraming},
      {"GET /a HTTP/1.1\r\nContent-Length: 0\r\n\r\n", RequestProgress::kReady},
      // A whole head over the limit in one read.
      {"GET /a HTTP/1.1\r\nX: " + std::string(kHead, 'b') + "\r\n\r\n",
       RequestProgress::kHeadTooLarge},
      // A body-carrying method without a length has an empty body (RFC 9112 §6.3): ready, with
      // needs_zero_length (NextRequestStart's test checks the flag); what follows is the next
      // request.
      {"POST /b HTTP/1.1\r\nHost: x\r\n\r\n", RequestProgress::kReady},
      {"PUT /b HTTP/1.1\n\n", RequestProgress::kReady},
      {"PATCH /b HTTP/1.1\r\n\r\n{}", RequestProgress::kReady},
      {"POST /b HTTP/1.1\r\nContent-Length: 0\r\n\r\n", RequestProgress::kReady},
      {"DELETE /b HTTP/1.1\r\n\r\n", RequestProgress::kReady},
      {"POSTX /b HTTP/1.1\r\n\r\n", RequestProgress::kReady},
      {std::string(kHead, 'a'), RequestProgress::kHeadTooLarge},
      {std::string(kHead - 1, 'a'), RequestProgress::kReadingHead},
  };
  for (const Case& c : cases) EXPECT_EQ(ProgressOf(c.bytes), c.want) << c.bytes;
}

TEST(ScanRequest, LeavesPipelinedBytesAfterTheHead) {
  const std::string first = "GET /a HTTP/1.1\r\nHost: x\r\n\r\n";
  const RequestScan scan = ScanRequest(first + "GET /b HTTP/1.1\r\n", kHead, kBody);
  EXPECT_EQ(scan.progress, RequestProgress::kReady);
  EXPECT_EQ(scan.head_bytes, first.size());
}

// After an answer, the next request starts past the whole of this one: a buffered body the
// answer did not read is skipped, never read as a request; a body the worker reads itself that
// the answer did not touch closes the connection (docs/server.md, "Early answers").
TEST(NextRequestStart, NeverReadsABodyAsTheNextRequest) {
  constexpr size_t kMaxHead = 64, kMaxBody = 64;
  const std::string smuggled = "GET /a HTTP/1.1\r\n\r\n";
  const std::string head =
      "POST /b HTTP/1.1\r\nContent-Length: " + std::to_string(smuggled.size()) + "\r\n\r\n";
  const RequestScan buffered = ScanRequest(head + smuggled, kMaxHead, kMaxBody);
  ASSERT_EQ(buffered.progress, RequestProgress::kReady);
  EXPECT_FALSE(buffered.worker_reads_body);
  EXPECT_TRUE(buffered.has_body);
  EXPECT_EQ(buffered.body_bytes, smuggled.size());
  const size_t end = head.size() + smuggled.size();
  struct Case {
    const char* what;
    size_t consumed;
    bool close;
    size_t start;
  } cases[] = {
      {"answered after reading the head only", head.size(), false, end},
      {"answered after reading the body", end, false, end},
      {"nothing consumed (a scan of the same bytes)", 0, false, end},
      {"more than the request (never happens; not undone)", end + 3, false, end + 3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const NextRequest next = NextRequestStart(buffered, c.consumed);
    EXPECT_EQ(next.close, c.close);
    EXPECT_EQ(next.start, c.start);
  }
  // Chunked, after Expect: 100-continue, over the limit: the worker reads the body.
  for (const std::string& h :
       {std::string("POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
        std::string("POST /b HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"),
        std::string("POST /b HTTP/1.1\r\nContent-Length: 999\r\n\r\n")}) {
    SCOPED_TRACE(h);
    const RequestScan s = ScanRequest(h, kMaxHead, kMaxBody);
    ASSERT_EQ(s.progress, RequestProgress::kReady);
    EXPECT_TRUE(s.worker_reads_body);
    EXPECT_TRUE(s.has_body);
    EXPECT_TRUE(NextRequestStart(s, h.size()).close);  // the body was not read
    const NextRequest read = NextRequestStart(s, h.size() + 10);
    EXPECT_FALSE(read.close);
    EXPECT_EQ(read.start, h.size() + 10);
  }
  // No body at all: the head is the request.
  const std::string get = "GET /a HTTP/1.1\r\n\r\n";
  const RequestScan g = ScanRequest(get + "GET /a", kMaxHead, kMaxBody);
  EXPECT_FALSE(g.has_body);
  EXPECT_EQ(NextRequestStart(g, get.size()).start, get.size());
  // Not a request a worker was given: close.
  EXPECT_TRUE(NextRequestStart(ScanRequest("GET /a HT", kMaxHead, kMaxBody), 0).close);
}

// A POST, PUT or PATCH without Content-Length or Transfer-Encoding: its body is empty, and the
// loop writes Content-Length: 0 into its head, before the blank line, whatever the line ends.
TEST(ScanRequest, ABodyCarryingMethodWithoutALengthHasAnEmptyBody) {
  for (const std::string& head :
       {std::string("POST /reset_prefix_cache HTTP/1.1\r\nHost: x\r\n\r\n"),
        std::string("PUT /b HTTP/1.1\n\n"), std::string("PATCH /b HTTP/1.1\r\n\r\n")}) {
    SCOPED_TRACE(head);
    std::string bytes = "XX" + head + "GET /a HTTP/1.1\r\n\r\n";  // 2 bytes consumed before
    const RequestScan scan = ScanRequest(std::string_view(bytes).substr(2), kHead, kBody);
    ASSERT_EQ(scan.progress, RequestProgress::kReady);
    EXPECT_TRUE(scan.needs_zero_length);
    EXPECT_FALSE(scan.has_body);
    EXPECT_EQ(scan.head_bytes, head.size());
    const size_t n = AddZeroContentLength(&bytes, 2, scan.head_bytes);
    const std::string_view now = std::string_view(bytes).substr(2);
    const RequestScan again = ScanRequest(now, kHead, kBody);
    ASSERT_EQ(again.progress, RequestProgress::kReady);
    EXPECT_FALSE(again.needs_zero_length);
    EXPECT_EQ(again.head_bytes, n);
    EXPECT_EQ(again.body_bytes, 0u);
    EXPECT_NE(now.substr(0, n).find("Content-Length: 0\r\n"), std::string_view::npos);
    EXPECT_EQ(now.substr(n), "GET /a HTTP/1.1\r\n\r\n");  // the next request untouched
  }
}

}  // namespace
}  // namespace kvpush::http
