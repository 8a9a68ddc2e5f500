#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvpush {
namespace {

KvLayout SmallLayout() {
  KvLayout l;
  l.num_layers = 3;
  l.num_kv_heads = 2;
  l.head_dim = 4;
  l.block_size = 16;
  l.num_blocks = 10;
  return l;
}

TEST(KvLayoutTest, OffsetsFollowLayerKindBlockOrder) {
  KvLayout l = SmallLayout();
  EXPECT_EQ(l.token_bytes(), 2u * 4 * 4);
  EXPECT_EQ(l.chunk_bytes(), 16u * 32);
  EXPECT_EQ(l.offset(0, KvKind::kKey, 0), 0u);
  EXPECT_EQ(l.offset(0, KvKind::kKey, 1), l.chunk_bytes());
  EXPECT_EQ(l.offset(0, KvKind::kValue, 0), 10 * l.chunk_bytes());
  EXPECT_EQ(l.offset(1, KvKind::kKey, 0), 20 * l.chunk_bytes());
  EXPECT_EQ(l.offset(2, KvKind::kValue, 9) + l.chunk_bytes(), l.total_bytes());
}

TEST(KvLayoutTest, ValidateRejectsNonPositiveFields) {
  KvLayout l = SmallLayout();
  l.head_dim = 0;
  Status s = l.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("head_dim"), std::string::npos);
}

TEST(KvCacheTest, CreateZeroesAndChunksDoNotOverlap) {
  auto kv = KvCache::Create(SmallLayout());
  ASSERT_TRUE(kv.ok()) << kv.status().ToString();
  KvCache& c = **kv;
  const size_t floats = c.layout().chunk_bytes() / sizeof(float);
  for (int layer = 0; layer < 3; ++layer) {
    for (int b = 0; b < 10; ++b) {
      for (KvKind k : {KvKind::kKey, KvKind::kValue}) {
        float* p = c.chunk_f32(layer, k, b);
        for (size_t i = 0; i < floats; ++i) ASSERT_EQ(p[i], 0.0f);
        for (size_t i = 0; i < floats; ++i)
          p[i] = static_cast<float>(layer * 1000 + b * 10 + static_cast<int>(k));
      }
    }
  }
  EXPECT_EQ(c.chunk_f32(1, KvKind::kValue, 7)[floats - 1], 1071.0f);
  EXPECT_EQ(c.chunk_f32(2, KvKind::kKey, 0)[0], 2000.0f);
}

TEST(KvCacheTest, WrapRefusesTooSmallMemory) {
  std::vector<std::byte> mem(100);
  auto kv = KvCache::Wrap(SmallLayout(), mem);
  EXPECT_EQ(kv.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvpush
