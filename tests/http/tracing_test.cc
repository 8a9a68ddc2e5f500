#include "http/tracing.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <string>
#include <thread>

#include "http/trace_context.h"

namespace kvpush::http {
namespace {

constexpr const char* kExample = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(Traceparent, ParsesTheSpecsExampleAndFormatsItBack) {
  const auto c = ParseTraceparent(kExample);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(Hex(c->trace_id.data(), 16), "4bf92f3577b34da6a3ce929d0e0e4736");
  EXPECT_EQ(Hex(c->span_id.data(), 8), "00f067aa0ba902b7");
  EXPECT_TRUE(c->sampled());
  EXPECT_EQ(FormatTraceparent(*c), kExample);
}

TEST(Traceparent, RefusesWhatTheSpecCallsInvalid) {
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",      // no flags
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // upper case
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero parent id
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // version ff
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", // data after version 00
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // separator
           "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",   // not hex
       }) {
    EXPECT_FALSE(ParseTraceparent(bad).has_value()) << bad;
  }
  // A later version is read by its first four fields (forward compatibility).
  EXPECT_TRUE(ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-abc"));
  EXPECT_FALSE(ParseTraceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00abc"));
}

TEST(OtlpEncoding, OneSpanHasTheBytesOfTheProtoFields) {
  Span s;
  s.trace_id.fill(0x11);
  s.span_id.fill(0x22);
  s.name = "n";
  s.kind = SpanKind::kServer;
  s.start_unix_ns = 1;
  s.end_unix_ns = 2;
  const std::string b = EncodeOtlpTraces({}, "k", "v", std::span<const Span>(&s, 1));
  // ExportTraceServiceRequest.resource_spans (1, bytes) ...
  ASSERT_GE(b.size(), 2u);
  EXPECT_EQ(static_cast<uint8_t>(b[0]), 0x0a);
  // ... whose Span holds trace_id (field 1, 16 bytes), span_id (2, 8 bytes), name (5), kind (6
  // = varint 2) and the two fixed64 times (7, 8): tags 0x0a 0x10, 0x12 0x08, 0x2a 0x01 'n',
  // 0x30 0x02, 0x39 <8 bytes>, 0x41 <8 bytes>.
  const std::string span_tail = std::string("\x2a\x01n\x30\x02\x39", 6) +
                                std::string("\x01\0\0\0\0\0\0\0", 8) + "\x41" +
                                std::string("\x02\0\0\0\0\0\0\0", 8);
  EXPECT_NE(b.find(span_tail), std::string::npos);
  EXPECT_NE(b.find(std::string("\x0a\x10") + std::string(16, '\x11')), std::string::npos);
  EXPECT_NE(b.find(std::string("\x12\x08") + std::string(8, '\x22')), std::string::npos);
  // No parent: no field 4.
  EXPECT_EQ(b.find(std::string("\x22\x08")), std::string::npos);
}

TEST(Tracer, RefusesEndpointsItCannotExportTo) {
  for (const char* bad : {"https://h:4318", "grpc://h:4317", "http://h", "http://h:0/v1/traces",
                          "http://h:99999", "h:4318"}) {
    Tracer::Options o;
    o.endpoint = bad;
    EXPECT_FALSE(Tracer::Create(o).ok()) << bad;
  }
}

TEST(Tracer, ExportsBatchesToTheEndpointAndCountsWhatFailed) {
  httplib::Server collector;
  std::atomic<int> posts{0};
  std::string content_type;
  collector.Post("/v1/traces", [&](const httplib::Request& req, httplib::Response& res) {
    content_type = req.get_header_value("Content-Type");
    ++posts;
    res.status = 200;
  });
  const int port = collector.bind_to_any_port("127.0.0.1");
  std::thread t([&] { collector.listen_after_bind(); });
  while (!collector.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  {
    Tracer::Options o;
    o.endpoint = "http://127.0.0.1:" + std::to_string(port);  // default path /v1/traces
    auto tracer = Tracer::Create(o);
    ASSERT_TRUE(tracer.ok());
    const TraceContext root = (*tracer)->NewSpan(std::nullopt);
    const TraceContext child = (*tracer)->NewSpan(root);
    EXPECT_EQ(child.trace_id, root.trace_id);
    EXPECT_NE(child.span_id, root.span_id);
    for (int i = 0; i < 3; ++i) (*tracer)->Record(Span{});
    tracer->reset();  // flushes
  }
  EXPECT_GE(posts.load(), 1);
  EXPECT_EQ(content_type, "application/x-protobuf");
  collector.stop();
  t.join();
  // Nobody listens now: the export fails and its spans are counted as dropped.
  Tracer::Options o;
  o.endpoint = "http://127.0.0.1:" + std::to_string(port) + "/v1/traces";
  o.timeout_s = 1.0;
  auto tracer = Tracer::Create(o);
  ASSERT_TRUE(tracer.ok());
  (*tracer)->Record(Span{});
  for (int i = 0; i < 100 && (*tracer)->dropped() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ((*tracer)->dropped(), 1u);
  EXPECT_EQ((*tracer)->exported(), 0u);
}

}  // namespace
}  // namespace kvpush::http
