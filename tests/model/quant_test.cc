// Stored weight types (F16, BF16, Q8_0, Q4_K, Q6_K):
//  * kvpush's dequantization is bit-identical to the NumPy reference's (tests/model/reference/
//    gguf_reference.py --dequant, written separately from ggml's published block formats), on
//    values quantized by kvpush and on random block bytes (every scale packing, negative Q6_K
//    scales, subnormal halves);
//  * the round-to-nearest quantizers' error per type (printed; bounded by the figures documented
//    in docs/model.md);
//  * WeightMatrix borrows a mapped file's bytes in place and keeps the mapping alive.
// The NumPy comparison skips when /usr/bin/python3 or numpy is missing (Debian: python3-numpy).
#include "model/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "model/dtype.h"
#include "model/gemm.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/llama_weights.h"
#include "model/random_model.h"
#include "model/weight_matrix.h"

namespace kvpush {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

struct TypeCase {
  GgmlType type;
  const char* name;
  double max_rel_rms;  ///< bound on ||dequant(quant(x)) - x|| / ||x|| (docs/model.md)
};

// Bounds are about 2x the errors measured on uniform values in [-1, 1] (QuantizationErrorPerType).
const TypeCase kTypes[] = {
    {GgmlType::kF16, "f16", 5e-4},   {GgmlType::kBF16, "bf16", 3.5e-3},
    {GgmlType::kQ8_0, "q8_0", 7e-3}, {GgmlType::kQ6_K, "q6_k", 2.5e-2},
    {GgmlType::kQ4_K, "q4_k", 1e-1},
};

bool NumpyAvailable() {
  return std::filesystem::exists(kPython) &&
         std::system((std::string(kPython) + " -c 'import numpy' >/dev/null 2>&1").c_str()) == 0;
}

std::string TempDir() {
  std::string dir = (std::filesystem::temp_directory_path() / "kvpush-quant-XXXXXX").string();
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

/// The reference's dequantization of tensor `name` of `gguf`, or empty on failure.
std::vector<float> ReferenceDequant(const std::string& gguf, const std::string& name,
                                    const std::string& dir) {
  const std::string out = dir + "/" + name + ".f32";
  const std::string cmd = std::string(kPython) + " " + KVPUSH_REFERENCE_PY + " --dequant " + gguf +
                          " " + name + " " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream f(out, std::ios::binary | std::ios::ate);
  if (!f) return {};
  std::vector<float> v(static_cast<size_t>(f.tellg()) / sizeof(float));
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  return v;
}

/// Values with a different magnitude per 256-value run (1e-6 .. 10: exercises subnormal halves).
std::vector<float> TestValues(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float scales[] = {1.0f, 1e-3f, 10.0f, 1e-6f, 0.05f};
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = normal(rng) * scales[(i / 256) % 5];
  return v;
}

/// Random block bytes of a quantized `type` with finite fp16 scales (`rows` x 512 values).
std::vector<uint8_t> RandomBlocks(GgmlType type, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  const size_t bytes = *GgmlRowBytes(type, 512) * static_cast<size_t>(rows);
  std::vector<uint8_t> b(bytes);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  const int64_t block = type == GgmlType::kQ8_0   ? kQ8BlockBytes
                        : type == GgmlType::kQ4_K ? kQ4KBlockBytes
                                                  : kQ6KBlockBytes;
  // fp16 fields: Q8_0 d at 0; Q4_K d, dmin at 0, 2; Q6_K d at 208. Exponent kept below 31.
  std::vector<int64_t> fields = type == GgmlType::kQ8_0   ? std::vector<int64_t>{0}
                                : type == GgmlType::kQ4_K ? std::vector<int64_t>{0, 2}
                                                          : std::vector<int64_t>{208};
  for (size_t off = 0; off < b.size(); off += static_cast<size_t>(block)) {
    for (int64_t f : fields) b[off + static_cast<size_t>(f) + 1] &= 0xbb;  // exponent <= 0b01110
  }
  return b;
}

TEST(QuantTest, DequantizationMatchesNumpyReferenceBitwise) {
  if (!NumpyAvailable()) GTEST_SKIP() << "python3-numpy unavailable";
  const std::string dir = TempDir();
  const std::string path = dir + "/tensors.gguf";
  GgufWriter w;
  w.SetString("general.architecture", "test");
  const std::vector<float> values = TestValues(512 * 8, 3);
  for (const TypeCase& t : kTypes) {
    ASSERT_TRUE(w.AddTensor(std::string("quantized_") + t.name, {512, 8}, t.type, values).ok());
    if (t.type == GgmlType::kQ8_0 || t.type == GgmlType::kQ4_K || t.type == GgmlType::kQ6_K) {
      w.AddRawTensor(std::string("random_") + t.name, {512, 16}, static_cast<uint32_t>(t.type),
                     RandomBlocks(t.type, 16, 17));
    }
  }
  ASSERT_TRUE(w.WriteFile(path).ok());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  int compared = 0;
  for (const GgufTensorInfo& t : file->tensors()) {
    const std::vector<float> ref = ReferenceDequant(path, t.name, dir);
    ASSERT_EQ(ref.size(), static_cast<size_t>(t.num_elements())) << t.name;
    auto got = file->ReadTensorF32(t);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(std::memcmp(got->data(), ref.data(), ref.size() * sizeof(float)), 0) << t.name;
    // The per-tile path of the GEMM (WeightMatrix rows) gives the same bits.
    auto m = WeightMatrix::FromStored(t.type, t.ne[1], t.ne[0], t.data, file->mapping());
    ASSERT_TRUE(m.ok());
    std::vector<float> rows(ref.size());
    m->DequantizeRows(0, m->rows(), rows.data());
    EXPECT_EQ(std::memcmp(rows.data(), ref.data(), ref.size() * sizeof(float)), 0) << t.name;
    ++compared;
  }
  EXPECT_EQ(compared, 8);
  std::filesystem::remove_all(dir);
}

TEST(QuantTest, QuantizationErrorPerType) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> x(256 * 1024);
  for (float& v : x) v = uni(rng);
  std::printf("%-6s %12s %14s\n", "type", "rel RMS", "max abs err");
  for (const TypeCase& t : kTypes) {
    std::vector<uint8_t> q(*GgmlRowBytes(t.type, static_cast<int64_t>(x.size())));
    ASSERT_TRUE(QuantizeFromF32(t.type, x, q).ok());
    std::vector<float> y(x.size());
    ASSERT_TRUE(DequantizeToF32(t.type, q, y).ok());
    double err2 = 0, ref2 = 0, max_err = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double e = static_cast<double>(y[i]) - x[i];
      err2 += e * e;
      ref2 += static_cast<double>(x[i]) * x[i];
      max_err = std::max(max_err, std::fabs(e));
    }
    const double rel_rms = std::sqrt(err2 / ref2);
    std::printf("%-6s %12.3e %14.3e\n", t.name, rel_rms, max_err);
    EXPECT_LT(rel_rms, t.max_rel_rms) << t.name;
  }
}

// InvariantGemm's float path (QuantMath::kDequantF32) on a stored-type matrix (fused AVX-512
// kernel for < 4 rows of Q8_0 / F16 / BF16, dequantized tiles otherwise) equals the scalar
// reference kernel on the dequantized f32 matrix, bit for bit, for every row count 1..9. (The
// integer path of Q8_0 / Q4_K / Q6_K quantizes the activations too: int8_gemm_test checks it.)
TEST(QuantTest, StoredTypeGemmEqualsScalarGemmOnDequantizedMatrix) {
  const int64_t n = 37, k = 512;
  const std::vector<float> values = TestValues(static_cast<size_t>(n * k), 8);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(9 * k));
  for (float& v : x) v = normal(rng);
  for (const TypeCase& t : kTypes) {
    std::vector<uint8_t> bytes(*GgmlRowBytes(t.type, k) * static_cast<size_t>(n));
    ASSERT_TRUE(QuantizeFromF32(t.type, values, bytes).ok());
    auto stored = WeightMatrix::FromStored(t.type, n, k, bytes, nullptr);
    ASSERT_TRUE(stored.ok());
    std::vector<float> dense(static_cast<size_t>(n * k));
    stored->DequantizeRows(0, n, dense.data());
    InvariantGemm fast(GemmBackend::kFixedOrder, QuantMath::kDequantF32),
        scalar(GemmBackend::kFixedOrderScalar, QuantMath::kDequantF32);
    for (int64_t rows = 1; rows <= 9; ++rows) {
      std::vector<float> got(static_cast<size_t>(rows * n)), want(got.size());
      fast.Run(x.data(), rows, *stored, got.data());
      scalar.Run(x.data(), rows, k, dense.data(), n, want.data());
      EXPECT_EQ(got, want) << t.name << " rows " << rows << " (" << fast.name() << ")";
    }
  }
}

TEST(QuantTest, KQuantRowsMustBeMultiplesOf256) {
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ4_K, 512).value(), size_t{2 * 144});
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ6_K, 256).value(), size_t{210});
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ4_K, 100).status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(GgmlTypeName(12), "q4_k");
  EXPECT_EQ(GgmlTypeName(14), "q6_k");
  RandomLlamaOptions o;
  o.dtype = GgmlType::kQ4_K;  // default dim 512 ok, hidden 1408 is not a multiple of 256
  EXPECT_EQ(o.Validate().code(), StatusCode::kInvalidArgument);
}

TEST(QuantTest, WeightsBorrowTheMappingAndKeepItAlive) {
  RandomLlamaOptions o;
  o.dim = 256;
  o.hidden_dim = 512;
  o.layers = 1;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 400;
  o.dtype = GgmlType::kQ8_0;
  auto w = BuildRandomLlamaGguf(o);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const std::string dir = TempDir();
  ASSERT_TRUE(w->WriteFile(dir + "/m.gguf").ok());
  LlamaWeights weights;
  std::vector<float> expected(256);
  {
    auto file = GgufFile::Open(dir + "/m.gguf");
    ASSERT_TRUE(file.ok());
    auto loaded = LoadLlamaWeightsFromGguf(*file);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
    weights = std::move(*loaded);
    const GgufTensorInfo* t = file->FindTensor("blk.0.attn_q.weight");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(weights.layers[0].wq.row_data(0), t->data.data());  // in place, no copy
    EXPECT_EQ(weights.layers[0].wq.type(), GgmlType::kQ8_0);
    ASSERT_TRUE(
        DequantizeToF32(t->type, t->data.subspan(0, weights.layers[0].wq.row_bytes()), expected)
            .ok());
  }
  std::filesystem::remove_all(dir);  // the mapping outlives the file's name and the GgufFile
  std::vector<float> row(256);
  weights.layers[0].wq.DequantizeRows(0, 1, row.data());
  EXPECT_EQ(row, expected);
  // Stored bytes, not f32: Q8_0 is 34 bytes per 32 values.
  EXPECT_EQ(weights.layers[0].wq.bytes(), size_t{256} * 256 / 32 * 34);
}

}  // namespace
}  // namespace kvpush
