// AVX2+FMA kernel of the fixed-order GEMM (see gemm_kernels.h), and attention's inner loops with
// the same dot product (attention_kernels.h): the 16 lanes are two __m256 (lanes 0-7 and 8-15).
// Compiled with -mavx2 -mfma and only called after a CPUID check.
#include <immintrin.h>

#include <algorithm>

#include "model/attention_kernels.h"
#include "model/gemm_kernels.h"

namespace kvpush::gemm_internal {

namespace {

constexpr int64_t kRowBlock = 64;

/// The canonical tree in registers: lanes i + (i + 8), then + 4, + 2, + 1 (gemm_kernels.h).
inline float Reduce(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/// R rows of X against C rows of W (row stride `ldw`: k for a matrix, larger for attention's keys).
template <int R, int C>
inline void Block(const float* x, int64_t k, const float* w, int64_t ldw, float* y, int64_t ldy) {
  __m256 lo[R][C], hi[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  const int64_t k_main = k & ~int64_t{15};
  auto step = [&](const float* const* xs, const float* const* ws) {
    __m256 xl[R], xh[R], wl[C], wh[C];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      xl[r] = _mm256_loadu_ps(xs[r]);
      xh[r] = _mm256_loadu_ps(xs[r] + 8);
    }
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      wl[c] = _mm256_loadu_ps(ws[c]);
      wh[c] = _mm256_loadu_ps(ws[c] + 8);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        lo[r][c] = _mm256_fmadd_ps(xl[r], wl[c], lo[r][c]);
        hi[r][c] = _mm256_fmadd_ps(xh[r], wh[c], hi[r][c]);
      }
  };
  const float* xs[R];
  const float* ws[C];
  for (int64_t kk = 0; kk < k_main; kk += 16) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) xs[r] = x + r * k + kk;
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) ws[c] = w + c * ldw + kk;
    step(xs, ws);
  }
  if (k_main < k) {  // zero-padded tail, same as masked loads
    alignas(32) float xt[R][16], wt[C][16];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < 16; ++j) xt[r][j] = k_main + j < k ? x[r * k + k_main + j] : 0.0f;
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c)
      for (int j = 0; j < 16; ++j) wt[c][j] = k_main + j < k ? w[c * ldw + k_main + j] : 0.0f;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) xs[r] = xt[r];
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) ws[c] = wt[c];
    step(xs, ws);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) y[r * ldy + c] = Reduce(lo[r][c], hi[r][c]);
}

template <int R>
inline void Row(const float* x, int64_t k, const float* w, int64_t ldw, int64_t n_rows, float* y,
                int64_t ldy) {
  int64_t n = 0;
  for (; n + 2 <= n_rows; n += 2) Block<R, 2>(x, k, w + n * ldw, ldw, y + n, ldy);
  for (; n < n_rows; ++n) Block<R, 1>(x, k, w + n * ldw, ldw, y + n, ldy);
}

/// CanonicalExp (attention_kernels.h) in 8 lanes, step for step.
inline __m256 Exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(kExpMin), x);  // kExpMin > x ? kExpMin : x, a NaN kept
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kExpLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kExpLn2Hi), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kExpLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpP[5]);
  for (int i = 4; i >= 0; --i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP[i]));
  const __m256 y =
      _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i bits =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

}  // namespace

void AttnSoftmaxAvx2(float* w, int64_t n) {
  float max = w[0];
  for (int64_t s = 1; s < n; ++s) max = std::max(max, w[s]);
  const __m256 mv = _mm256_set1_ps(max);
  // Lanes 0..7 and 8..15 of the canonical sum; whole groups of 16, then the tail one by one.
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  int64_t s = 0;
  for (; s + 16 <= n; s += 16) {
    const __m256 e0 = Exp8(_mm256_sub_ps(_mm256_loadu_ps(w + s), mv));
    const __m256 e1 = Exp8(_mm256_sub_ps(_mm256_loadu_ps(w + s + 8), mv));
    _mm256_storeu_ps(w + s, e0);
    _mm256_storeu_ps(w + s + 8, e1);
    lo = _mm256_add_ps(lo, e0);
    hi = _mm256_add_ps(hi, e1);
  }
  alignas(32) float acc[16];
  _mm256_store_ps(acc, lo);
  _mm256_store_ps(acc + 8, hi);
  for (int64_t t = s; t < n; ++t) {
    w[t] = CanonicalExp(w[t] - max);
    acc[t - s] += w[t];
  }
  const __m256 inv_sum = _mm256_set1_ps(1.0f / Reduce(_mm256_load_ps(acc), _mm256_load_ps(acc + 8)));
  for (s = 0; s + 8 <= n; s += 8) {
    _mm256_storeu_ps(w + s, _mm256_mul_ps(_mm256_loadu_ps(w + s), inv_sum));
  }
  for (; s < n; ++s) w[s] *= _mm256_cvtss_f32(inv_sum);
}

void GemmAvx2(const float* x, int64_t m_rows, int64_t k, const float* w, int64_t n_rows, float* y,
              int64_t ldy) {
  for (int64_t m0 = 0; m0 < m_rows; m0 += kRowBlock) {
    const int64_t m1 = m0 + kRowBlock < m_rows ? m0 + kRowBlock : m_rows;
    for (int64_t n0 = 0; n0 < n_rows; n0 += 64) {
      const int64_t nn = n0 + 64 < n_rows ? 64 : n_rows - n0;
      int64_t m = m0;
      for (; m + 2 <= m1; m += 2) Row<2>(x + m * k, k, w + n0 * k, k, nn, y + m * ldy + n0, ldy);
      for (; m < m1; ++m) Row<1>(x + m * k, k, w + n0 * k, k, nn, y + m * ldy + n0, ldy);
    }
  }
}

void AttnScoresAvx2(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                    float scale, float* scores) {
  // The GEMM's dot products (one row of X against n key rows), then the scale.
  Row<1>(q, hd, k, stride, n, scores, n);
  for (int64_t s = 0; s < n; ++s) scores[s] *= scale;
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
