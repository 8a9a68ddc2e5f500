// Metadata and notification-frame encoding: round trips, and every malformed blob is refused with
// the right code.
#include "xfer/metadata.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstddef>
#include <string>
#include <vector>

#include "xfer/notification_frame.h"

namespace kvpush::xfer {
namespace {

AgentMetadata Sample() {
  AgentMetadata md;
  md.name = "decode-0";
  md.incarnation = 0x1122334455667788ull;
  md.backend = "ucx";
  md.address = {1, 2, 3, 4, 5};
  for (uint32_t i = 0; i < 3; ++i) {
    RegionInfo r;
    r.id.index = i;
    r.id.generation = 7 + i;
    r.length = 4096 * (i + 1);
    r.base = 0x7f0000000000ull + i * 0x100000;
    r.key = std::vector<uint8_t>(10 + i, static_cast<uint8_t>(i));
    md.regions.push_back(r);
  }
  return md;
}

TEST(MetadataTest, RoundTripKeepsEveryField) {
  auto blob = EncodeMetadata(Sample());
  ASSERT_TRUE(blob.ok()) << blob.status().ToString();
  auto md = DecodeMetadata(*blob);
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_EQ(md->name, "decode-0");
  EXPECT_EQ(md->incarnation, 0x1122334455667788ull);
  EXPECT_EQ(md->backend, "ucx");
  EXPECT_EQ(md->address, (std::vector<uint8_t>{1, 2, 3, 4, 5}));
  ASSERT_EQ(md->regions.size(), 3u);
  EXPECT_EQ(md->regions[2].id.generation, 9u);
  EXPECT_EQ(md->regions[2].length, 3u * 4096);
  EXPECT_EQ(md->regions[1].base, 0x7f0000100000ull);
  EXPECT_EQ(md->regions[2].key.size(), 12u);
}

TEST(MetadataTest, EveryTruncationIsRefusedAsDataLoss) {
  auto blob = EncodeMetadata(Sample()).value();
  for (size_t n = 0; n < blob.size(); ++n) {
    auto md = DecodeMetadata(std::span(blob.data(), n));
    ASSERT_FALSE(md.ok()) << n;
    EXPECT_EQ(md.status().code(), StatusCode::kDataLoss) << n << " " << md.status().ToString();
  }
}

TEST(MetadataTest, PaddingAndOversizeAreRefused) {
  auto blob = EncodeMetadata(Sample()).value();
  blob.push_back(0);
  EXPECT_EQ(DecodeMetadata(blob).status().code(), StatusCode::kDataLoss);
  std::vector<uint8_t> huge(kMaxMetadataBytes + 1, 0);
  auto r = DecodeMetadata(huge);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("oversized"), std::string::npos);
}

TEST(MetadataTest, EverySingleBitFlipIsRefused) {
  auto blob = EncodeMetadata(Sample()).value();
  for (size_t i = 0; i < blob.size(); ++i) {
    auto copy = blob;
    copy[i] ^= 0x10;
    EXPECT_FALSE(DecodeMetadata(copy).ok()) << "byte " << i;
  }
}

TEST(MetadataTest, InconsistentTablesAreRefusedWithReason) {
  auto md = Sample();
  md.regions[1].id.index = md.regions[0].id.index;
  auto r = DecodeMetadata(EncodeMetadata(md).value());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("duplicate region"), std::string::npos);

  md = Sample();
  md.regions[0].length = 0;
  r = DecodeMetadata(EncodeMetadata(md).value());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("zero length"), std::string::npos);

  md = Sample();
  md.regions[0].base = ~0ull - 10;
  r = DecodeMetadata(EncodeMetadata(md).value());
  EXPECT_NE(r.status().message().find("overflows"), std::string::npos);

  md = Sample();
  md.regions[0].memory_type = static_cast<MemoryType>(9);
  r = DecodeMetadata(EncodeMetadata(md).value());
  EXPECT_NE(r.status().message().find("memory type"), std::string::npos);
}

// Found by fuzz/xfer_metadata_fuzz.cc: the u16 name lengths let a blob carry a 256..65535-byte
// agent or backend name, which the encoder (and the notification frame) never allow.
TEST(MetadataTest, NamesOver255BytesAreRefused) {
  for (const bool backend : {false, true}) {
    auto md = Sample();
    (backend ? md.backend : md.name) = std::string(255, 'x');
    std::vector<uint8_t> blob = EncodeMetadata(md).value();
    // Lengthen the name to 300 bytes by hand: its u16 length, the total length, the checksum.
    const size_t len_at = 24 + (backend ? 2 + md.name.size() : 0);
    blob[len_at] = 300 & 0xff;
    blob[len_at + 1] = 300 >> 8;
    blob.insert(blob.begin() + static_cast<std::ptrdiff_t>(len_at + 2), 45, 'x');
    blob.resize(blob.size() - 8);
    const size_t total = blob.size() + 8;
    for (int i = 0; i < 4; ++i) blob[12 + i] = static_cast<uint8_t>(total >> (8 * i));
    const uint64_t sum = XXH64(blob.data(), blob.size(), 0);
    for (int i = 0; i < 8; ++i) blob.push_back(static_cast<uint8_t>(sum >> (8 * i)));
    auto r = DecodeMetadata(blob);
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << backend;
    EXPECT_NE(r.status().message().find("1..255 bytes"), std::string::npos) << r.status().ToString();
  }
}

TEST(MetadataTest, UnknownVersionIsUnimplemented) {
  auto blob = EncodeMetadata(Sample()).value();
  blob[8] = 2;  // version field; checksum is checked after the version
  EXPECT_EQ(DecodeMetadata(blob).status().code(), StatusCode::kUnimplemented);
}

TEST(MetadataTest, EncodeRefusesOutOfLimitFields) {
  auto md = Sample();
  md.name = std::string(300, 'x');
  EXPECT_EQ(EncodeMetadata(md).status().code(), StatusCode::kInvalidArgument);
  md = Sample();
  md.incarnation = 0;
  EXPECT_EQ(EncodeMetadata(md).status().code(), StatusCode::kInvalidArgument);
}

TEST(NotificationFrameTest, RoundTripAndRefusals) {
  std::vector<uint8_t> payload = {9, 8, 7};
  auto f = EncodeNotificationFrame("prefill-0", 42, payload);
  auto n = DecodeNotificationFrame(f, 4096);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(n->peer, "prefill-0");
  EXPECT_EQ(n->peer_incarnation, 42u);
  EXPECT_EQ(n->payload, payload);
  EXPECT_EQ(DecodeNotificationFrame(std::span(f.data(), f.size() - 1), 4096).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(DecodeNotificationFrame(f, 2).status().code(), StatusCode::kDataLoss);
  f.push_back(1);
  EXPECT_EQ(DecodeNotificationFrame(f, 4096).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace kvpush::xfer
