// GGUF reader and writer: round trips, dtype conversions, and refusal of malformed files.
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "model/dtype.h"
#include "model/gguf_writer.h"

namespace kvpush {
namespace {

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

GgufWriter SmallFile() {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetU32("llama.block_count", 5);
  w.SetF32("llama.rope.freq_base", 500000.0f);
  w.SetBool("flag", true);
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "b",
                                             "\xE2\x96\x81"
                                             "c"});
  w.SetF32Array("tokenizer.ggml.scores", {0.5f, -1.0f, 2.0f});
  w.SetI32Array("tokenizer.ggml.token_type", {1, 1, 6});
  EXPECT_TRUE(w.AddTensor("t0", {64, 3}, GgmlType::kF32, Values(192, 1)).ok());
  EXPECT_TRUE(w.AddTensor("t1", {5}, GgmlType::kF32, Values(5, 2)).ok());
  return w;
}

TEST(GgufTest, RoundTripsMetadataAndTensors) {
  const auto bytes = SmallFile().Serialize();
  auto f = GgufFile::Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetInt("llama.block_count"), 5);
  EXPECT_EQ(*f->GetFloat("llama.rope.freq_base"), 500000.0);
  EXPECT_EQ(*f->GetInt("flag"), 1);
  EXPECT_EQ(f->Find("tokenizer.ggml.tokens")->strings[2],
            "\xE2\x96\x81"
            "c");
  EXPECT_EQ(f->Find("tokenizer.ggml.scores")->floats[0], 0.5);
  EXPECT_EQ(f->Find("tokenizer.ggml.token_type")->ints[2], 6);
  EXPECT_EQ(f->GetString("missing").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(f->GetString("llama.block_count").status().code(), StatusCode::kDataLoss);
  ASSERT_EQ(f->tensors().size(), 2u);
  const GgufTensorInfo* t0 = f->FindTensor("t0");
  ASSERT_NE(t0, nullptr);
  EXPECT_EQ(t0->ne, (std::vector<int64_t>{64, 3}));
  EXPECT_EQ(*f->ReadTensorF32(*t0), Values(192, 1));
  EXPECT_EQ(*f->ReadTensorF32(*f->FindTensor("t1")), Values(5, 2));
  EXPECT_EQ(static_cast<size_t>(f->FindTensor("t1")->data.data() - bytes.data()) % 32, 0u);
}

TEST(GgufTest, CustomAlignmentAndVersion2) {
  GgufWriter w = SmallFile();
  w.set_alignment(64);
  w.set_version(2);
  const auto bytes = w.Serialize();
  auto f = GgufFile::Parse(bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(static_cast<size_t>(f->FindTensor("t1")->data.data() - bytes.data()) % 64, 0u);
  EXPECT_EQ(*f->ReadTensorF32(*f->FindTensor("t1")), Values(5, 2));
}

TEST(GgufTest, DtypesRoundTripWithinTheirPrecision) {
  const auto v = Values(32 * 8, 3);
  for (GgmlType type : {GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0}) {
    GgufWriter w;
    ASSERT_TRUE(w.AddTensor("t", {64, 4}, type, v).ok());
    const auto bytes = w.Serialize();
    auto f = GgufFile::Parse(bytes);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    auto back = f->ReadTensorF32(f->tensors()[0]);
    ASSERT_TRUE(back.ok());
    // Relative error bounds: f16 2^-11, bf16 2^-8; q8_0 half a step of max|x| / 127 per block.
    for (size_t i = 0; i < v.size(); ++i) {
      float tol = type == GgmlType::kF16    ? std::fabs(v[i]) * 0x1p-11f
                  : type == GgmlType::kBF16 ? std::fabs(v[i]) * 0x1p-8f
                                            : 0.5f * 4.5f / 127.0f + 1e-3f;
      EXPECT_NEAR((*back)[i], v[i], tol) << GgmlTypeName(static_cast<uint32_t>(type)) << " " << i;
    }
  }
}

TEST(GgufTest, HalfConversionsAreExact) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToHalf(f), h) << h;
  }
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(1.0f)), 1.0f);
  EXPECT_EQ(FloatToBf16(1.00390625f), 0x3f80);  // tie rounds to even
}

TEST(GgufTest, Q8RowsMustBeBlockMultiples) {
  GgufWriter w;
  EXPECT_EQ(w.AddTensor("t", {48}, GgmlType::kQ8_0, Values(48, 1)).code(),
            StatusCode::kInvalidArgument);
  w.AddRawTensor("t", {48}, 8, std::vector<uint8_t>(34 * 2));
  auto f = GgufFile::Parse(w.Serialize());
  EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
}

/// Patches bytes [at, at + sizeof(T)) of a copy of `bytes`.
template <typename T>
std::vector<uint8_t> Patch(std::vector<uint8_t> bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof(T));
  return bytes;
}

TEST(GgufTest, RefusesMalformedHeaders) {
  const auto good = SmallFile().Serialize();
  auto code = [](const std::vector<uint8_t>& b) { return GgufFile::Parse(b).status().code(); };
  EXPECT_EQ(code({}), StatusCode::kDataLoss);
  EXPECT_EQ(code(Patch<char>(good, 0, 'X')), StatusCode::kDataLoss);
  EXPECT_EQ(code(Patch<uint32_t>(good, 4, 1)), StatusCode::kUnimplemented);
  EXPECT_EQ(code(Patch<uint32_t>(good, 4, 4)), StatusCode::kUnimplemented);
  EXPECT_EQ(code(Patch<uint64_t>(good, 8, uint64_t{1} << 60)), StatusCode::kDataLoss);   // tensors
  EXPECT_EQ(code(Patch<uint64_t>(good, 16, uint64_t{1} << 60)), StatusCode::kDataLoss);  // kvs
  EXPECT_EQ(code(Patch<uint64_t>(good, 24, uint64_t{1} << 62)), StatusCode::kDataLoss);  // key len
  EXPECT_EQ(code(Patch<uint64_t>(good, 16, 100)), StatusCode::kDataLoss);
  // Every truncation is refused cleanly (the last 12 bytes are padding after t1's 20 bytes).
  for (size_t n = 0; n < good.size() - 12; n += 7) {
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_NE(code(cut), StatusCode::kOk) << n;
  }
}

TEST(GgufTest, RefusesBadTensorInfos) {
  auto parse = [](GgufWriter& w) { return GgufFile::Parse(w.Serialize()).status(); };
  {
    GgufWriter w;
    w.AddRawTensor("big", {1 << 20, 1 << 20}, 0, std::vector<uint8_t>(16));
    EXPECT_EQ(parse(w).code(), StatusCode::kDataLoss);
  }
  {
    GgufWriter w;
    w.AddRawTensor("q4", {32}, 2, std::vector<uint8_t>(18));
    Status s = parse(w);
    EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
    EXPECT_NE(s.message().find("ggml type 2"), std::string::npos) << s.message();
  }
  {
    GgufWriter w;
    w.AddRawTensor("zero", {0}, 0, {});
    EXPECT_EQ(parse(w).code(), StatusCode::kDataLoss);
  }
  {
    GgufWriter w;
    w.AddRawTensor("dup", {1}, 0, std::vector<uint8_t>(4));
    w.AddRawTensor("dup", {1}, 0, std::vector<uint8_t>(4));
    EXPECT_EQ(parse(w).code(), StatusCode::kDataLoss);
  }
  {
    GgufWriter w;
    w.SetU32("general.alignment", 3);
    EXPECT_EQ(parse(w).code(), StatusCode::kDataLoss);
  }
  {
    GgufWriter w;
    w.SetU32("k", 1);
    w.SetU32("k", 2);
    EXPECT_EQ(parse(w).code(), StatusCode::kDataLoss);
  }
}

TEST(GgufTest, RefusesMisalignedTensorOffset) {
  GgufWriter w;
  ASSERT_TRUE(w.AddTensor("a", {8}, GgmlType::kF32, Values(8, 1)).ok());
  auto bytes = w.Serialize();
  // Header 24 bytes; tensor info: name (8 + 1), n_dims 4, ne 8, type 4, offset 8.
  const size_t offset_at = 24 + 9 + 4 + 8 + 4;
  EXPECT_EQ(GgufFile::Parse(Patch<uint64_t>(bytes, offset_at, 4)).status().code(),
            StatusCode::kDataLoss);
  EXPECT_EQ(GgufFile::Parse(Patch<uint64_t>(bytes, offset_at, 1 << 20)).status().code(),
            StatusCode::kDataLoss);
}

TEST(GgufTest, OpenMissingFileIsNotFound) {
  EXPECT_EQ(GgufFile::Open("/nonexistent/model.gguf").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace kvpush
