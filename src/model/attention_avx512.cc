// AVX-512 version of the attention inner loops (model/attention_kernels.h): the same lanes and
// order as the scalar reference, so the same bits. Compiled with -mavx512f -mfma and only called
// after a CPUID check.
#include <immintrin.h>

#include "model/attention_kernels.h"

#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's masked-load and shuffle intrinsics read an undefined source vector (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
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

/// Sixteen positions at once: the same accumulators as ScoresAvx512, then the canonical tree of
/// all sixteen done together (each stage adds exactly the lanes the tree adds, two positions per
/// instruction: lanes i + (i + 8), + 4, + 2, + 1), the result back in position order.
inline void Scores16Avx512(const float* q, const float* k, int64_t stride, int64_t hd, float scale,
                           float* scores) {
  __m512 acc[16];
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t main = hd & ~int64_t{15};
  for (int64_t i = 0; i < main; i += 16) {
    const __m512 qv = _mm512_loadu_ps(q + i);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      acc[r] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(k + r * stride + i), acc[r]);
    }
  }
  if (main < hd) {
    const __mmask16 m = Head(hd - main);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + main);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      acc[r] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, k + r * stride + main), acc[r]);
    }
  }
  // + 8: a_j = [position 2j's 8 sums, position 2j + 1's].
  __m512 a[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    a[j] = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2 * j], acc[2 * j + 1], 0x44),
                         _mm512_shuffle_f32x4(acc[2 * j], acc[2 * j + 1], 0xee));
  }
  // + 4: b_j = one position per 128-bit lane (positions 4j .. 4j + 3).
  __m512 b[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * j], a[2 * j + 1], 0xdd));
  }
  // + 2: in 128-bit lane L, c_j = [position L + 8j's 2 sums, position L + 8j + 4's].
  __m512 c[2];
#pragma GCC unroll 2
  for (int j = 0; j < 2; ++j) {
    c[j] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * j], b[2 * j + 1], 0x44),
                         _mm512_shuffle_ps(b[2 * j], b[2 * j + 1], 0xee));
  }
  // + 1: lane 4L + j holds position L + 4j.
  const __m512 d =
      _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xdd));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(scores, _mm512_mul_ps(_mm512_permutexvar_ps(order, d), _mm512_set1_ps(scale)));
}

}  // namespace

void AttnScoresAvx512(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                      float scale, float* scores) {
  int64_t s = 0;
  for (; s + 16 <= n; s += 16) Scores16Avx512(q, k + s * stride, stride, hd, scale, scores + s);
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
