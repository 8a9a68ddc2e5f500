// AVX2+FMA version of the attention inner loops (model/attention_kernels.h): the 16 lanes are two
// __m256, with the scalar reference's order, so the same bits. Compiled with -mavx2 -mfma and
// only called after a CPUID check.
#include <immintrin.h>

#include "model/attention_kernels.h"

namespace kvpush::gemm_internal {

namespace {

/// The canonical tree: lanes i + (i + 8) (lo + hi), then + 4, + 2, + 1.
inline float Reduce2(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

}  // namespace

void AttnScoresAvx2(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                    float scale, float* scores) {
  const int64_t main = hd & ~int64_t{15};
  alignas(32) float qt[16] = {}, kt[16] = {};
  for (int64_t i = main; i < hd; ++i) qt[i - main] = q[i];
  for (int64_t s = 0; s < n; ++s) {
    const float* ks = k + s * stride;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t i = 0; i < main; i += 16) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(ks + i), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), _mm256_loadu_ps(ks + i + 8), hi);
    }
    if (main < hd) {
      for (int64_t i = main; i < hd; ++i) kt[i - main] = ks[i];
      lo = _mm256_fmadd_ps(_mm256_load_ps(qt), _mm256_load_ps(kt), lo);
      hi = _mm256_fmadd_ps(_mm256_load_ps(qt + 8), _mm256_load_ps(kt + 8), hi);
    }
    scores[s] = Reduce2(lo, hi) * scale;
  }
}

void AttnValuesAvx2(const float* a, const float* v, int64_t stride, int64_t n, int64_t hd,
                    float* out) {
  int64_t d = 0;
  for (; d + 32 <= hd; d += 32) {
    __m256 o[4];
    for (int c = 0; c < 4; ++c) o[c] = _mm256_loadu_ps(out + d + 8 * c);
    for (int64_t s = 0; s < n; ++s) {
      const __m256 as = _mm256_set1_ps(a[s]);
      for (int c = 0; c < 4; ++c) {
        o[c] = _mm256_fmadd_ps(as, _mm256_loadu_ps(v + s * stride + d + 8 * c), o[c]);
      }
    }
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(out + d + 8 * c, o[c]);
  }
  for (; d + 8 <= hd; d += 8) {
    __m256 o = _mm256_loadu_ps(out + d);
    for (int64_t s = 0; s < n; ++s) {
      o = _mm256_fmadd_ps(_mm256_set1_ps(a[s]), _mm256_loadu_ps(v + s * stride + d), o);
    }
    _mm256_storeu_ps(out + d, o);
  }
  AttnValuesScalar(a, v + d, stride, n, hd - d, out + d);
}

}  // namespace kvpush::gemm_internal
