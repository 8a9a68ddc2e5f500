// The eager WRITE and ack frames (eager_frame.h): round trips and every way a frame can be
// malformed, refused before any byte of it is used.
#include "xfer/eager_frame.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

namespace kvpush::xfer {
namespace {

std::vector<uint8_t> WriteFrame(const std::vector<EagerRange>& ranges,
                                const std::vector<uint8_t>& data,
                                const std::vector<uint8_t>& notification,
                                std::string_view sender = "prefill-0") {
  std::vector<uint8_t> f;
  BeginEagerWrite(sender, 11, 22, 0x123456789abcull, ranges,
                  static_cast<uint32_t>(notification.size()), &f);
  f.insert(f.end(), data.begin(), data.end());
  f.insert(f.end(), notification.begin(), notification.end());
  return f;
}

std::vector<uint8_t> Bytes(size_t n, uint8_t from) {
  std::vector<uint8_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

TEST(EagerFrame, WriteRoundTripsWithItsRangesDataAndNotification) {
  const std::vector<EagerRange> ranges = {{0, 1, 4096, 100}, {2, 7, 0, 28}};
  const auto data = Bytes(128, 3);
  const auto notif = Bytes(40, 200);
  const auto f = WriteFrame(ranges, data, notif);
  EXPECT_EQ(f.size(), EagerWriteHeaderBytes(9, 2) + 128 + 40);
  EXPECT_EQ(PeekFrameKind(f), FrameKind::kEagerWrite);
  auto w = DecodeEagerWrite(f, 1 << 20, 4096);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->sender, "prefill-0");
  EXPECT_EQ(w->sender_incarnation, 11u);
  EXPECT_EQ(w->target_incarnation, 22u);
  EXPECT_EQ(w->token, 0x123456789abcull);
  ASSERT_EQ(w->ranges.size(), 2u);
  EXPECT_EQ(w->ranges[0].region_index, 0u);
  EXPECT_EQ(w->ranges[0].region_generation, 1u);
  EXPECT_EQ(w->ranges[0].offset, 4096u);
  EXPECT_EQ(w->ranges[0].length, 100u);
  EXPECT_EQ(w->ranges[1].region_index, 2u);
  EXPECT_EQ(w->ranges[1].length, 28u);
  EXPECT_EQ(std::vector<uint8_t>(w->data.begin(), w->data.end()), data);
  EXPECT_EQ(std::vector<uint8_t>(w->notification.begin(), w->notification.end()), notif);
}

TEST(EagerFrame, EveryTruncationAndAnyTrailingByteIsRefused) {
  const auto f = WriteFrame({{0, 1, 0, 64}}, Bytes(64, 0), Bytes(8, 0));
  for (size_t n = 0; n < f.size(); ++n) {
    EXPECT_FALSE(DecodeEagerWrite(std::span(f.data(), n), 1 << 20, 4096).ok()) << n;
  }
  auto longer = f;
  longer.push_back(0);
  EXPECT_EQ(DecodeEagerWrite(longer, 1 << 20, 4096).status().code(), StatusCode::kDataLoss);
}

TEST(EagerFrame, RangesThatDoNotAddUpToTheDataAreRefused) {
  // Ranges of 64 + 64 bytes but 100 bytes of data (and the rest declared as notification).
  auto f = WriteFrame({{0, 1, 0, 64}, {0, 1, 128, 64}}, Bytes(100, 0), {});
  EXPECT_EQ(DecodeEagerWrite(f, 1 << 20, 4096).status().code(), StatusCode::kDataLoss);
  // A zero-length range.
  f = WriteFrame({{0, 1, 0, 0}, {0, 1, 0, 16}}, Bytes(16, 0), {});
  EXPECT_EQ(DecodeEagerWrite(f, 1 << 20, 4096).status().code(), StatusCode::kDataLoss);
  // A range longer than all the data (its sum would wrap past data_len).
  f = WriteFrame({{0, 1, 0, ~0ull}}, Bytes(16, 0), {});
  EXPECT_EQ(DecodeEagerWrite(f, 1 << 20, 4096).status().code(), StatusCode::kDataLoss);
}

TEST(EagerFrame, LimitsMagicVersionNameAndRangeCountAreChecked) {
  const auto f = WriteFrame({{0, 1, 0, 64}}, Bytes(64, 0), Bytes(8, 0));
  EXPECT_FALSE(DecodeEagerWrite(f, 63, 4096).ok());    // more data than this side takes
  EXPECT_FALSE(DecodeEagerWrite(f, 1 << 20, 7).ok());  // a larger notification
  auto bad = f;
  bad[0] ^= 1;
  EXPECT_EQ(PeekFrameKind(bad), FrameKind::kUnknown);
  EXPECT_FALSE(DecodeEagerWrite(bad, 1 << 20, 4096).ok());
  bad = f;
  bad[4] = 2;  // version 2
  EXPECT_EQ(DecodeEagerWrite(bad, 1 << 20, 4096).status().code(), StatusCode::kUnimplemented);
  bad = f;
  bad[6] = bad[7] = 0;  // empty sender name
  EXPECT_FALSE(DecodeEagerWrite(bad, 1 << 20, 4096).ok());
  // No range: a header that says nranges = 0 (offset 32), with the data declared as 0 bytes.
  std::vector<uint8_t> none;
  BeginEagerWrite("p", 1, 2, 3, std::vector<EagerRange>{{0, 1, 0, 8}}, 0, &none);
  none.resize(EagerWriteHeaderBytes(1, 0));
  std::memset(none.data() + 32, 0, 4);  // nranges
  std::memset(none.data() + 40, 0, 8);  // data_len
  EXPECT_FALSE(DecodeEagerWrite(none, 1 << 20, 4096).ok());
  // A range count far beyond the frame's bytes is refused before anything is allocated.
  auto huge = f;
  const uint32_t many = 0xffffffffu;
  std::memcpy(huge.data() + 32, &many, 4);
  EXPECT_EQ(DecodeEagerWrite(huge, 1 << 20, 4096).status().code(), StatusCode::kDataLoss);
}

TEST(EagerFrame, AckRoundTripsAndIsCheckedWhole) {
  const auto a = EncodeEagerAck("decode-1", 77, 0xfeedull, StatusCode::kOutOfRange);
  EXPECT_EQ(PeekFrameKind(a), FrameKind::kEagerAck);
  auto d = DecodeEagerAck(a);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->sender, "decode-1");
  EXPECT_EQ(d->sender_incarnation, 77u);
  EXPECT_EQ(d->token, 0xfeedull);
  EXPECT_EQ(d->code, StatusCode::kOutOfRange);
  for (size_t n = 0; n < a.size(); ++n) EXPECT_FALSE(DecodeEagerAck(std::span(a.data(), n)).ok());
  auto longer = a;
  longer.push_back('x');
  EXPECT_FALSE(DecodeEagerAck(longer).ok());
  auto bad_code = a;
  bad_code[24] = 200;  // no such StatusCode
  EXPECT_FALSE(DecodeEagerAck(bad_code).ok());
}

}  // namespace
}  // namespace kvpush::xfer
