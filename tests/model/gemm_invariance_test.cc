// InvariantGemm: each output row is bitwise a function of its input row only, for every row
// count 1..64 and every position, with 1 and 2 OpenBLAS threads. Plain sgemm need not be (the
// reason InvariantGemm exists); it is checked to differ by rounding only.
#include <cblas.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>

#include "model/gemm.h"

namespace kvpush {
namespace {

struct Shape {
  int64_t k, n;
};

class GemmInvarianceTest : public ::testing::TestWithParam<std::tuple<GemmBackend, int>> {};

TEST_P(GemmInvarianceTest, RowResultIndependentOfRowCountAndPosition) {
  const auto [backend, threads] = GetParam();
  const bool scalar = backend == GemmBackend::kFixedOrderScalar;
  if (scalar && threads != 1) GTEST_SKIP() << "the scalar kernel does not use BLAS threads";
  SetBlasThreads(threads);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (Shape s : {Shape{64, 64}, Shape{64, 172}, Shape{172, 64}, Shape{64, 512}, Shape{333, 1000},
                  Shape{1024, 256}}) {
    if (scalar && s.k * s.n > 20000) continue;  // software fmaf is slow; small shapes suffice
    std::vector<float> w(static_cast<size_t>(s.n * s.k)), x(static_cast<size_t>(64 * s.k));
    for (float& v : w) v = nd(rng);
    for (float& v : x) v = nd(rng);
    InvariantGemm gemm(backend);
    // Reference: each row computed alone.
    std::vector<float> ref(static_cast<size_t>(64 * s.n));
    for (int64_t r = 0; r < 64; ++r)
      gemm.Run(x.data() + r * s.k, 1, s.k, w.data(), s.n, ref.data() + r * s.n);
    std::vector<float> y(static_cast<size_t>(64 * s.n));
    for (int64_t m = 1; m <= 64; ++m) {
      for (int64_t off = 0; off + m <= 64; off += (m > 16 ? 64 : 5)) {
        gemm.Run(x.data() + off * s.k, m, s.k, w.data(), s.n, y.data());
        for (int64_t r = 0; r < m; ++r) {
          ASSERT_EQ(0, std::memcmp(y.data() + r * s.n, ref.data() + (off + r) * s.n,
                                   static_cast<size_t>(s.n) * sizeof(float)))
              << "k=" << s.k << " n=" << s.n << " rows=" << m << " offset=" << off << " row=" << r;
        }
      }
    }
  }
  SetBlasThreads(1);
}

INSTANTIATE_TEST_SUITE_P(Backends, GemmInvarianceTest,
                         ::testing::Combine(::testing::Values(GemmBackend::kFixedOrder,
                                                              GemmBackend::kFixedOrderScalar,
                                                              GemmBackend::kOpenBlasTiles),
                                            ::testing::Values(1, 2)));

TEST(GemmInvarianceTest, FixedOrderKernelsAgreeBitwiseAcrossIsas) {
  InvariantGemm best(GemmBackend::kFixedOrder), scalar(GemmBackend::kFixedOrderScalar);
  std::printf("fixed-order kernel in use: %s\n", best.name().c_str());
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  for (Shape s :
       {Shape{1, 3}, Shape{15, 7}, Shape{16, 16}, Shape{17, 65}, Shape{100, 9}, Shape{333, 130}}) {
    const int64_t m = 13;
    std::vector<float> w(static_cast<size_t>(s.n * s.k)), x(static_cast<size_t>(m * s.k));
    for (float& v : w) v = nd(rng);
    for (float& v : x) v = nd(rng);
    std::vector<float> a(static_cast<size_t>(m * s.n)), b(a.size());
    best.Run(x.data(), m, s.k, w.data(), s.n, a.data());
    scalar.Run(x.data(), m, s.k, w.data(), s.n, b.data());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
        << "k=" << s.k << " n=" << s.n;
    // And close to a double-precision reference.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < s.n; ++j) {
        double ref = 0;
        for (int64_t t = 0; t < s.k; ++t) ref += double(x[i * s.k + t]) * w[j * s.k + t];
        EXPECT_NEAR(a[i * s.n + j], ref, 1e-4 * (1 + std::fabs(ref)));
      }
  }
}

// Plain sgemm may change row 0's result with the row count (why InvariantGemm exists), but only
// by rounding: every row count must agree with the M=1 result to float accuracy. How many row
// counts differ bitwise is OpenBLAS's business; it is recorded as a test property, not asserted.
TEST(GemmInvarianceTest, PlainSgemmRowCountChangesOnlyRounding) {
  SetBlasThreads(1);
  const int64_t k = 256, n = 256;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<float> w(static_cast<size_t>(n * k)), x(static_cast<size_t>(64 * k));
  for (float& v : w) v = nd(rng);
  for (float& v : x) v = nd(rng);
  std::vector<float> one(static_cast<size_t>(n)), many(static_cast<size_t>(64 * n));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, n, k, 1, x.data(), k, w.data(), k, 0,
              one.data(), n);
  int differing = 0;
  for (int m = 2; m <= 64; ++m) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1, x.data(), k, w.data(), k, 0,
                many.data(), n);
    bool bitwise_equal = true;
    for (int64_t j = 0; j < n; ++j) {
      bitwise_equal = bitwise_equal && std::bit_cast<uint32_t>(many[static_cast<size_t>(j)]) ==
                                           std::bit_cast<uint32_t>(one[static_cast<size_t>(j)]);
      // |row . col| <= ~sqrt(k) * 4 here; float accumulation over k = 256 terms stays < 1e-3.
      ASSERT_NEAR(many[static_cast<size_t>(j)], one[static_cast<size_t>(j)],
                  1e-4 * (1 + std::fabs(one[static_cast<size_t>(j)])))
          << "rows=" << m << " col=" << j;
    }
    differing += bitwise_equal ? 0 : 1;
  }
  ::testing::Test::RecordProperty("openblas_core", BlasCoreName());
  ::testing::Test::RecordProperty("row_counts_differing_bitwise", differing);
}

}  // namespace
}  // namespace kvpush
