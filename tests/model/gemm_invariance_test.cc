// InvariantGemm: each output row is bitwise a function of its input row only, for every row
// count 1..64 and every position, with 1 and 2 OpenBLAS threads. Also documents that plain sgemm
// is not (the reason InvariantGemm exists) without asserting it, since that is OpenBLAS's business.
#include <cblas.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "model/gemm.h"

namespace kvpush {
namespace {

struct Shape {
  int64_t k, n;
};

class GemmInvarianceTest : public ::testing::TestWithParam<int> {};

TEST_P(GemmInvarianceTest, RowResultIndependentOfRowCountAndPosition) {
  SetBlasThreads(GetParam());
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (Shape s : {Shape{64, 64}, Shape{64, 172}, Shape{172, 64}, Shape{64, 512}, Shape{333, 1000},
                  Shape{1024, 256}}) {
    std::vector<float> w(static_cast<size_t>(s.n * s.k)), x(static_cast<size_t>(64 * s.k));
    for (float& v : w) v = nd(rng);
    for (float& v : x) v = nd(rng);
    InvariantGemm gemm;
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

INSTANTIATE_TEST_SUITE_P(BlasThreads, GemmInvarianceTest, ::testing::Values(1, 2));

TEST(GemmInvarianceTest, ReportsWhetherPlainSgemmIsInvariant) {
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
    differing += std::memcmp(one.data(), many.data(), static_cast<size_t>(n) * sizeof(float)) != 0;
  }
  std::printf(
      "OpenBLAS core %s: plain sgemm row 0 differs from the M=1 result for %d of 63 row counts\n",
      BlasCoreName(), differing);
  SUCCEED();
}

}  // namespace
}  // namespace kvpush
