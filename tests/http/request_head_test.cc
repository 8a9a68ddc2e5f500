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
      // A body-carrying method without a length: 411 from the loop (the library would wait for
      // the client to close); methods without a body need none.
      {"POST /b HTTP/1.1\r\nHost: x\r\n\r\n", RequestProgress::kLengthRequired},
      {"PUT /b HTTP/1.1\n\n", RequestProgress::kLengthRequired},
      {"PATCH /b HTTP/1.1\r\n\r\n{}", RequestProgress::kLengthRequired},
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

}  // namespace
}  // namespace kvpush::http
