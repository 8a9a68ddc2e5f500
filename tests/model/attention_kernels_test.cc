// The attention inner loops (model/attention_kernels.h): the AVX-512, AVX2 and scalar versions give
// identical bits (whichever the CPU has) for head sizes with and without a 16-value tail, strided
// rows and any count of positions; and the scalar version is the documented canonical sequence.
#include "model/attention_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace kvpush::gemm_internal {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> v(n);
  for (float& f : v) f = nd(rng);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Isa {
  const char* name;
  bool available;
  AttnScoresFn scores;
  AttnValuesFn values;
  AttnValuesGroupFn group;
  AttnSoftmaxFn softmax;
};

std::vector<Isa> Isas() {
  __builtin_cpu_init();
  return {
      {"avx512", __builtin_cpu_supports("avx512f") != 0 && __builtin_cpu_supports("avx512dq") != 0,
       AttnScoresAvx512, AttnValuesAvx512, AttnValuesGroupAvx512, AttnSoftmaxAvx512},
      {"avx2", __builtin_cpu_supports("avx2") != 0 && __builtin_cpu_supports("fma") != 0,
       AttnScoresAvx2, AttnValuesAvx2, AttnValuesGroupAvx2, AttnSoftmaxAvx2},
  };
}

TEST(AttentionKernelsTest, ScalarScoresAreTheCanonicalSixteenLaneDot) {
  const int64_t hd = 40;  // two full chunks of 16 and a tail of 8
  const auto q = Random(hd, 1), k = Random(hd, 2);
  float acc[16] = {};
  for (int64_t i = 0; i < hd; ++i) acc[i % 16] = std::fma(q[i], k[i], acc[i % 16]);
  for (int i = 0; i < 8; ++i) acc[i] += acc[i + 8];
  for (int i = 0; i < 4; ++i) acc[i] += acc[i + 4];
  for (int i = 0; i < 2; ++i) acc[i] += acc[i + 2];
  const float want = (acc[0] + acc[1]) * 0.125f;
  float got = 0.0f;
  AttnScoresScalar(q.data(), k.data(), hd, 1, hd, 0.125f, &got);
  EXPECT_TRUE(SameBits({got}, {want})) << got << " vs " << want;
}

TEST(AttentionKernelsTest, ScalarValuesAccumulatePositionsInOrder) {
  const int64_t hd = 5, n = 3, stride = 7;
  const auto a = Random(n, 3), v = Random(n * stride, 4);
  std::vector<float> out(hd, 0.25f), want(hd, 0.25f);
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t d = 0; d < hd; ++d) want[d] = std::fma(a[s], v[s * stride + d], want[d]);
  }
  AttnValuesScalar(a.data(), v.data(), stride, n, hd, out.data());
  EXPECT_TRUE(SameBits(out, want));
}

TEST(AttentionKernelsTest, EveryIsaGivesTheScalarBits) {
  int checked = 0;
  for (const Isa& isa : Isas()) {
    if (!isa.available) continue;
    for (int64_t hd : {8, 12, 16, 40, 64, 80, 96, 128, 136, 256}) {
      for (int64_t n : {1, 3, 4, 7, 16, 33}) {
        const int64_t stride = hd * 3 + 5;  // KV heads interleaved in a cache block
        const auto q = Random(hd, static_cast<uint32_t>(hd * 100 + n));
        const auto k = Random(n * stride, static_cast<uint32_t>(hd * 7 + n));
        const auto a = Random(n, static_cast<uint32_t>(n * 13 + hd));
        std::vector<float> s_ref(n), s_got(n);
        AttnScoresScalar(q.data(), k.data(), stride, n, hd, 0.125f, s_ref.data());
        isa.scores(q.data(), k.data(), stride, n, hd, 0.125f, s_got.data());
        EXPECT_TRUE(SameBits(s_ref, s_got)) << isa.name << " scores, hd " << hd << " n " << n;
        std::vector<float> o_ref = Random(hd, 9), o_got = o_ref;
        AttnValuesScalar(a.data(), k.data(), stride, n, hd, o_ref.data());
        isa.values(a.data(), k.data(), stride, n, hd, o_got.data());
        EXPECT_TRUE(SameBits(o_ref, o_got)) << isa.name << " values, hd " << hd << " n " << n;
        ++checked;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2+FMA";
}

// A GQA group's heads run side by side, each with exactly AttnValuesScalar's bits (1..8 heads:
// the 4-head blocks and the rest one by one).
TEST(AttentionKernelsTest, GroupedValuesGiveEachHeadsScalarBits) {
  int checked = 0;
  for (const Isa& isa : Isas()) {
    if (!isa.available) continue;
    for (int64_t hd : {8, 64, 80, 128}) {
      for (int64_t heads = 1; heads <= 8; ++heads) {
        const int64_t n = 21, stride = hd * 2 + 3;
        const auto v = Random(n * stride, static_cast<uint32_t>(hd + heads));
        std::vector<std::vector<float>> a(heads), ref(heads), got(heads);
        std::vector<const float*> ap(heads);
        std::vector<float*> gp(heads);
        for (int64_t g = 0; g < heads; ++g) {
          a[g] = Random(n, static_cast<uint32_t>(100 * g + hd));
          ref[g] = got[g] = Random(hd, static_cast<uint32_t>(7 * g + 1));
          AttnValuesScalar(a[g].data(), v.data(), stride, n, hd, ref[g].data());
          ap[g] = a[g].data();
          gp[g] = got[g].data();
        }
        isa.group(ap.data(), heads, v.data(), stride, n, hd, gp.data());
        for (int64_t g = 0; g < heads; ++g) {
          EXPECT_TRUE(SameBits(got[g], ref[g]))
              << isa.name << " hd " << hd << " heads " << heads << " head " << g;
        }
        ++checked;
      }
    }
  }
  if (checked == 0) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2+FMA";
}

// CanonicalExp is within 2 ulp of e^x (double) over [-87, 0], exact at 0, and clamps below.
TEST(AttentionKernelsTest, CanonicalExpIsCloseToExp) {
  int max_ulp = 0;
  for (int i = 0; i <= 200000; ++i) {
    const float x = -87.0f * static_cast<float>(i) / 200000.0f;
    const float got = CanonicalExp(x);
    const auto want = static_cast<float>(std::exp(static_cast<double>(x)));
    int32_t a = 0, b = 0;
    std::memcpy(&a, &got, 4);
    std::memcpy(&b, &want, 4);
    max_ulp = std::max(max_ulp, std::abs(a - b));
  }
  EXPECT_LE(max_ulp, 2);
  EXPECT_EQ(CanonicalExp(0.0f), 1.0f);
  EXPECT_EQ(CanonicalExp(-1000.0f), CanonicalExp(-87.0f));
  EXPECT_TRUE(std::isnan(CanonicalExp(NAN)));
}

// The scalar softmax is the canonical order: 16 lane sums of CanonicalExp, the tree, one
// reciprocal; every ISA gives its bits for every length (whole and partial groups of 16).
TEST(AttentionKernelsTest, SoftmaxIsCanonicalOnEveryIsa) {
  for (int64_t n : {1, 2, 7, 15, 16, 17, 31, 32, 33, 100, 513}) {
    auto w = Random(static_cast<size_t>(n), static_cast<uint32_t>(n));
    for (float& f : w) f *= 4.0f;
    std::vector<float> ref = w;
    AttnSoftmaxScalar(ref.data(), n);
    float max = w[0];
    for (float f : w) max = std::max(max, f);
    float acc[16] = {};
    std::vector<float> e(w.size());
    for (int64_t s = 0; s < n; ++s) {
      e[static_cast<size_t>(s)] = CanonicalExp(w[static_cast<size_t>(s)] - max);
      acc[s % 16] += e[static_cast<size_t>(s)];
    }
    for (int i = 0; i < 8; ++i) acc[i] += acc[i + 8];
    for (int i = 0; i < 4; ++i) acc[i] += acc[i + 4];
    for (int i = 0; i < 2; ++i) acc[i] += acc[i + 2];
    const float inv = 1.0f / (acc[0] + acc[1]);
    double total = 0;
    for (int64_t s = 0; s < n; ++s) {
      ASSERT_EQ(ref[static_cast<size_t>(s)], e[static_cast<size_t>(s)] * inv) << "n " << n;
      total += ref[static_cast<size_t>(s)];
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
    for (const Isa& isa : Isas()) {
      if (!isa.available) continue;
      std::vector<float> got = w;
      isa.softmax(got.data(), n);
      EXPECT_TRUE(SameBits(ref, got)) << isa.name << " softmax, n " << n;
    }
  }
}

}  // namespace
}  // namespace kvpush::gemm_internal
