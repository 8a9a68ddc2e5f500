// The integer GEMMs for Q8_0, Q4_K and Q6_K (model/int8_gemm.h, QuantMath::kInt8):
//  * activation quantization gives the documented values;
//  * the AVX-512 VNNI, AVX2 and scalar kernels give identical bits (whichever the CPU has);
//  * each output row is bitwise a function of its input row only, for 1..40 rows at any position;
//  * the result stays within a small relative error of the f32 path (QuantMath::kDequantF32).
#include "model/int8_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/dtype.h"
#include "model/gemm.h"
#include "model/weight_matrix.h"

namespace kvpush {
namespace {

WeightMatrix RandomW(GgmlType type, int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n * k));
  for (float& f : v) f = u(rng);
  const size_t row = *GgmlRowBytes(type, k);
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * row);
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_TRUE(QuantizeFromF32(type, std::span<const float>(v).subspan(r * k, k),
                                std::span<uint8_t>(bytes).subspan(r * row, row))
                    .ok());
  }
  auto w = WeightMatrix::FromStored(type, n, k, bytes, nullptr);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return std::move(*w);
}

WeightMatrix RandomQ8(int64_t n, int64_t k, uint32_t seed) {
  return RandomW(GgmlType::kQ8_0, n, k, seed);
}

std::vector<float> RandomX(int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(static_cast<size_t>(rows * k));
  for (float& f : x) f = nd(rng);
  // A block of zeros and one with a single value exercise d = 0 and amax at one position.
  for (int t = 0; t < 32 && k >= 64; ++t) x[static_cast<size_t>(t)] = 0.0f;
  return x;
}

TEST(Int8GemmTest, QuantizeRoundsToNearestEvenWithAbsmaxScale) {
  std::vector<float> x(64, 0.0f);
  x[0] = 127.0f;  // block 0: d = 1
  x[1] = 2.5f;    // ties to even: 2
  x[2] = -3.5f;   // -4
  x[3] = 0.49f;   // 0
  // block 1 stays zero: d = 0, q = 0
  gemm_internal::Q8Rows q;
  q.Quantize(x.data(), 1, 64);
  EXPECT_EQ(q.d(0)[0], 1.0f);
  EXPECT_EQ(q.d(0)[1], 0.0f);
  EXPECT_EQ(q.q(0)[0], 127);
  EXPECT_EQ(q.q(0)[1], 2);
  EXPECT_EQ(q.q(0)[2], -4);
  EXPECT_EQ(q.q(0)[3], 0);
  for (int t = 32; t < 64; ++t) EXPECT_EQ(q.q(0)[t], 0);
}

TEST(Int8GemmTest, NonFiniteActivationsGiveCodesInRange) {
  std::vector<float> x(64, 1.0f);
  x[3] = std::nanf("");
  x[40] = INFINITY;
  gemm_internal::Q8Rows q;
  q.Quantize(x.data(), 1, 64);  // no undefined behaviour (UBSan builds check the conversions)
  for (int t = 0; t < 64; ++t) {
    EXPECT_GE(q.q(0)[t], -127) << t;
    EXPECT_LE(q.q(0)[t], 127) << t;
  }
}

// The activation quantizers: the AVX-512 and AVX2 versions give the scalar reference's bytes for
// blocks of 32 and 256, with ties, zero blocks, values at the clamp and a NaN among them.
TEST(Int8GemmTest, QuantizersAgreeBytewiseWithTheScalarReference) {
  const bool avx2 = gemm_internal::CpuHasAvx2FmaF16c();
  const bool vnni = gemm_internal::CpuHasAvx512Vnni();
  for (int64_t block : {32, 256}) {
    const int64_t blocks = 6;
    std::vector<float> x = RandomX(1, blocks * block, static_cast<uint32_t>(block));
    x[static_cast<size_t>(block) + 1] = 127.0f;  // block 1: d = 1, so the next ones are ties
    x[static_cast<size_t>(block) + 2] = 2.5f;
    x[static_cast<size_t>(block) + 3] = -3.5f;
    x[static_cast<size_t>(2 * block) + 5] = std::nanf("");  // block 2: garbage, but the same
    using Out = std::tuple<std::vector<int8_t>, std::vector<float>, std::vector<int16_t>>;
    auto run = [&](gemm_internal::QuantizeBlocksFn fn) {
      Out o{std::vector<int8_t>(static_cast<size_t>(blocks * block)),
            std::vector<float>(static_cast<size_t>(blocks)),
            std::vector<int16_t>(static_cast<size_t>(blocks * block / 16))};
      fn(x.data(), blocks, block, std::get<0>(o).data(), std::get<1>(o).data(),
         std::get<2>(o).data());
      return o;
    };
    const Out ref = run(gemm_internal::QuantizeBlocksScalar);
    EXPECT_EQ(std::get<0>(ref)[static_cast<size_t>(block) + 2], 2);  // ties to even
    EXPECT_EQ(std::get<0>(ref)[static_cast<size_t>(block) + 3], -4);
    if (avx2) {
      EXPECT_EQ(run(gemm_internal::QuantizeBlocksAvx2), ref) << "avx2, block " << block;
    }
    if (vnni) {
      EXPECT_EQ(run(gemm_internal::QuantizeBlocksAvx512), ref) << "avx512, block " << block;
    }
  }
}

TEST(Int8GemmTest, KernelsAgreeBitwiseWithScalarReference) {
  __builtin_cpu_init();
  const bool avx2 = gemm_internal::CpuHasAvx2FmaF16c();
  const bool vnni = gemm_internal::CpuHasAvx512Vnni();
  std::printf("CPU: avx2 %d, avx512 vnni %d\n", avx2, vnni);
  for (int64_t k : {32, 64, 96, 1024}) {
    for (int64_t rows : {1, 3, 4, 9}) {
      const int64_t n = 37;
      const WeightMatrix w = RandomQ8(n, k, static_cast<uint32_t>(k + rows));
      const std::vector<float> x = RandomX(rows, k, static_cast<uint32_t>(k * rows));
      gemm_internal::Q8Rows q;
      q.Quantize(x.data(), rows, k);
      std::vector<float> ref(static_cast<size_t>(rows * n)), got(ref.size());
      gemm_internal::Q8GemmScalar(q, w.row_data(0), w.row_bytes(), n, ref.data(), n);
      if (avx2) {
        gemm_internal::Q8GemmAvx2(q, w.row_data(0), w.row_bytes(), n, got.data(), n);
        EXPECT_EQ(got, ref) << "avx2, k " << k << ", rows " << rows;
      }
      if (vnni) {
        gemm_internal::Q8GemmAvx512Vnni(q, w.row_data(0), w.row_bytes(), n, got.data(), n);
        EXPECT_EQ(got, ref) << "avx512 vnni, k " << k << ", rows " << rows;
      }
      // Through InvariantGemm: the best kernel == the scalar backend's kernel.
      InvariantGemm best, scalar(GemmBackend::kFixedOrderScalar);
      best.Run(x.data(), rows, w, got.data());
      EXPECT_EQ(got, ref) << best.name();
      scalar.Run(x.data(), rows, w, got.data());
      EXPECT_EQ(got, ref) << scalar.name();
    }
  }
}

TEST(Int8GemmTest, RowResultIndependentOfRowCountAndPosition) {
  const int64_t k = 256, n = 70, max_rows = 40;
  const WeightMatrix w = RandomQ8(n, k, 3);
  const std::vector<float> x = RandomX(max_rows, k, 4);
  InvariantGemm gemm;
  std::vector<float> alone(static_cast<size_t>(max_rows * n));
  for (int64_t m = 0; m < max_rows; ++m) {
    gemm.Run(x.data() + m * k, 1, w, alone.data() + m * n);
  }
  std::vector<float> y(static_cast<size_t>(max_rows * n));
  for (int64_t rows = 1; rows <= max_rows; ++rows) {
    for (int64_t first : {int64_t{0}, max_rows - rows}) {
      gemm.Run(x.data() + first * k, rows, w, y.data());
      for (int64_t m = 0; m < rows; ++m) {
        for (int64_t j = 0; j < n; ++j) {
          ASSERT_EQ(y[static_cast<size_t>(m * n + j)],
                    alone[static_cast<size_t>((first + m) * n + j)])
              << "rows " << rows << ", first " << first << ", row " << m << ", col " << j;
        }
      }
    }
  }
}

TEST(Int8GemmTest, CloseToTheFloatPath) {
  const int64_t k = 1024, n = 256, rows = 8;
  const WeightMatrix w = RandomQ8(n, k, 7);
  const std::vector<float> x = RandomX(rows, k, 8);
  InvariantGemm int8, f32(GemmBackend::kFixedOrder, QuantMath::kDequantF32);
  std::vector<float> a(static_cast<size_t>(rows * n)), b(a.size());
  int8.Run(x.data(), rows, w, a.data());
  f32.Run(x.data(), rows, w, b.data());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  std::printf("int8 vs f32 path: max |diff| / max |y| = %.2e (k %lld)\n", diff / scale,
              static_cast<long long>(k));
  EXPECT_LT(diff / scale, 1e-2);
  EXPECT_GT(diff, 0.0);  // the int8 path is really taken
}

struct KQuantCase {
  GgmlType type;
  gemm_internal::Q8GemmFn scalar, avx512, avx2;
  double max_rel_err;  ///< vs the f32 path (which has the same weights)
};

/// Scalar, AVX2 and AVX-512 kernels, row invariance and the distance to the float path, for one
/// shape.
void CheckKQuantKernel(const KQuantCase& c, int64_t k, int64_t n);

class Int8KQuantTest : public ::testing::TestWithParam<KQuantCase> {};

TEST_P(Int8KQuantTest, KernelAgreesBitwiseRowInvariantAndCloseToFloatPath) {
  const KQuantCase& c = GetParam();
  __builtin_cpu_init();
  // k = 2816 and n = 150: the prefill kernels' W groups (40 rows of 11 super-blocks on AVX-512)
  // split the columns, with a last partial quad.
  for (const auto& [k, n] : {std::pair<int64_t, int64_t>{512, 45}, {2816, 150}}) {
    SCOPED_TRACE("k " + std::to_string(k) + ", n " + std::to_string(n));
    CheckKQuantKernel(c, k, n);
  }
}

void CheckKQuantKernel(const KQuantCase& c, int64_t k, int64_t n) {
  const bool vnni = gemm_internal::CpuHasAvx512Vnni();
  const bool avx2 = gemm_internal::CpuHasAvx2FmaF16c();
  const int64_t max_rows = 11;
  const WeightMatrix w = RandomW(c.type, n, k, 11);
  const std::vector<float> x = RandomX(max_rows, k, 12);
  gemm_internal::Q8Rows q;
  q.Quantize(x.data(), max_rows, k, 256);
  std::vector<float> ref(static_cast<size_t>(max_rows * n)), got(ref.size());
  c.scalar(q, w.row_data(0), w.row_bytes(), n, ref.data(), n);
  if (vnni) {
    c.avx512(q, w.row_data(0), w.row_bytes(), n, got.data(), n);
    EXPECT_EQ(got, ref) << "avx512 vnni vs scalar";
  }
  if (avx2) {
    c.avx2(q, w.row_data(0), w.row_bytes(), n, got.data(), n);
    EXPECT_EQ(got, ref) << "avx2 vs scalar";
  }
  InvariantGemm scalar_backend(GemmBackend::kFixedOrderScalar);
  scalar_backend.Run(x.data(), max_rows, w, got.data());
  EXPECT_EQ(got, ref) << "InvariantGemm's scalar backend vs the scalar kernel";
  InvariantGemm gemm;
  for (int64_t rows = 1; rows <= max_rows; ++rows) {
    for (int64_t first : {int64_t{0}, max_rows - rows}) {
      gemm.Run(x.data() + first * k, rows, w, got.data());
      for (int64_t i = 0; i < rows * n; ++i) {
        ASSERT_EQ(got[static_cast<size_t>(i)], ref[static_cast<size_t>(first * n + i)])
            << "rows " << rows << ", first " << first << ", element " << i;
      }
    }
  }
  InvariantGemm f32(GemmBackend::kFixedOrder, QuantMath::kDequantF32);
  f32.Run(x.data(), max_rows, w, got.data());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::fabs(static_cast<double>(ref[i]) - got[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(got[i])));
  }
  std::printf("%s int8 vs f32 path: max |diff| / max |y| = %.2e\n",
              GgmlTypeName(static_cast<uint32_t>(c.type)).c_str(), diff / scale);
  EXPECT_LT(diff / scale, c.max_rel_err);
  EXPECT_GT(diff, 0.0);
}

// Q4_K's prefill and decode kernels over shapes at their edges: W rows around the 4-row quads,
// the 8-row decode tiles and the per-thread W groups (k 4096: 6 quads of 16 super-blocks, 24 W
// rows, a group), 1..9 X rows (the 4-row groups and their remainders).
TEST(Int8GemmTest, Q4KKernelsAgreeBitwiseOverEdgeShapes) {
  const bool vnni = gemm_internal::CpuHasAvx512Vnni();
  const bool avx2 = gemm_internal::CpuHasAvx2FmaF16c();
  if (!vnni && !avx2) GTEST_SKIP() << "this CPU has neither AVX-512 VNNI nor AVX2+FMA+F16C";
  for (const int64_t k : {256, 4096}) {
    for (const int64_t n : {1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33}) {
      const WeightMatrix w = RandomW(GgmlType::kQ4_K, n, k, static_cast<uint32_t>(n * 31 + k));
      for (int64_t rows = 1; rows <= 9; ++rows) {
        const std::vector<float> x = RandomX(rows, k, static_cast<uint32_t>(rows * 7 + n));
        gemm_internal::Q8Rows q;
        q.Quantize(x.data(), rows, k, 256);
        std::vector<float> ref(static_cast<size_t>(rows * n)), got(ref.size());
        gemm_internal::Q4KGemmScalar(q, w.row_data(0), w.row_bytes(), n, ref.data(), n);
        if (vnni) {
          gemm_internal::Q4KGemmAvx512Vnni(q, w.row_data(0), w.row_bytes(), n, got.data(), n);
          ASSERT_EQ(got, ref) << "avx512, k " << k << ", n " << n << ", rows " << rows;
        }
        if (avx2) {
          gemm_internal::Q4KGemmAvx2(q, w.row_data(0), w.row_bytes(), n, got.data(), n);
          ASSERT_EQ(got, ref) << "avx2, k " << k << ", n " << n << ", rows " << rows;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Int8KQuantTest,
                         ::testing::Values(KQuantCase{GgmlType::kQ4_K, gemm_internal::Q4KGemmScalar,
                                                      gemm_internal::Q4KGemmAvx512Vnni,
                                                      gemm_internal::Q4KGemmAvx2, 1e-2},
                                           KQuantCase{GgmlType::kQ6_K, gemm_internal::Q6KGemmScalar,
                                                      gemm_internal::Q6KGemmAvx512Vnni,
                                                      gemm_internal::Q6KGemmAvx2, 1e-2}),
                         [](const auto& p) {
                           return GgmlTypeName(static_cast<uint32_t>(p.param.type));
                         });

}  // namespace
}  // namespace kvpush
