// AVX-512 version of the attention inner loops (model/attention_kernels.h): the same lanes and
// order as the scalar reference, so the same bits. Compiled with -mavx512f -mfma and only called
// after a CPUID check.
#include <immintrin.h>

#include "model/attention_kernels.h"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's masked-load intrinsics read an undefined source vector (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kvpush::gemm_internal {

namespace {

/// The canonical tree in registers: lanes i + (i + 8), then + 4, + 2, + 1.
inline float Reduce(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/// Mask of the first `n` (< 16) lanes.
inline __mmask16 Head(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
}

/// Scores of R consecutive positions (independent accumulators: the FMAs of one position form a
/// chain, R of them hide its latency).
template <int R>
inline void ScoresAvx512(const float* q, const float* k, int64_t stride, int64_t hd, float scale,
                         float* scores) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t main = hd & ~int64_t{15};
  for (int64_t i = 0; i < main; i += 16) {
    const __m512 qv = _mm512_loadu_ps(q + i);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + r * stride + i), acc[r]);
  }
  if (main < hd) {
    const __mmask16 m = Head(hd - main);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + main);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k + r * stride + main), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) scores[r] = Reduce(acc[r]) * scale;
}

/// out[c0 .. c0 + 16 C) over all n positions, C vectors in registers.
template <int C>
inline void ValuesAvx512(const float* a, const float* v, int64_t stride, int64_t n, float* out) {
  __m512 o[C];
  for (int c = 0; c < C; ++c) o[c] = _mm512_loadu_ps(out + 16 * c);
  for (int64_t s = 0; s < n; ++s) {
    const __m512 as = _mm512_set1_ps(a[s]);
    for (int c = 0; c < C; ++c)
      o[c] = _mm512_fmadd_ps(as, _mm512_loadu_ps(v + s * stride + 16 * c), o[c]);
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + 16 * c, o[c]);
}

}  // namespace

void AttnScoresAvx512(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                      float scale, float* scores) {
  int64_t s = 0;
  for (; s + 4 <= n; s += 4) ScoresAvx512<4>(q, k + s * stride, stride, hd, scale, scores + s);
  for (; s < n; ++s) ScoresAvx512<1>(q, k + s * stride, stride, hd, scale, scores + s);
}

void AttnValuesAvx512(const float* a, const float* v, int64_t stride, int64_t n, int64_t hd,
                      float* out) {
  int64_t d = 0;
  for (; d + 64 <= hd; d += 64) ValuesAvx512<4>(a, v + d, stride, n, out + d);
  for (; d + 16 <= hd; d += 16) ValuesAvx512<1>(a, v + d, stride, n, out + d);
  if (d < hd) {
    const __mmask16 m = Head(hd - d);
    __m512 o = _mm512_maskz_loadu_ps(m, out + d);
    for (int64_t s = 0; s < n; ++s) {
      o = _mm512_fmadd_ps(_mm512_set1_ps(a[s]), _mm512_maskz_loadu_ps(m, v + s * stride + d), o);
    }
    _mm512_mask_storeu_ps(out + d, m, o);
  }
}

}  // namespace kvpush::gemm_internal
