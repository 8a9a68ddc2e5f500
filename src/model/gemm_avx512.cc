// AVX-512F kernel of the fixed-order GEMM (see gemm_kernels.h). Compiled with -mavx512f -mfma and
// only called after a CPUID check. No inline functions shared with other translation units.
#include <immintrin.h>

#include "model/gemm_kernels.h"

namespace kvpush::gemm_internal {

namespace {

constexpr int64_t kRowBlock = 64;

/// The canonical tree in registers: lanes i + (i + 8), then + 4, + 2, + 1 (gemm_kernels.h).
inline float Reduce(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/// R rows x C columns block; `k_main` = k rounded down to 16, tails from padded buffers.
template <int R, int C>
inline void Block(const float* x, int64_t k, const float* w, float* y, int64_t ldy) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t k_main = k & ~int64_t{15};
  for (int64_t kk = 0; kk < k_main; kk += 16) {
    __m512 xv[R], wv[C];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_loadu_ps(x + r * k + kk);
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_ps(w + c * k + kk);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv[r], wv[c], acc[r][c]);
  }
  if (k_main < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - k_main)) - 1u);
    __m512 xv[R], wv[C];
    for (int r = 0; r < R; ++r) xv[r] = _mm512_maskz_loadu_ps(mask, x + r * k + k_main);
    for (int c = 0; c < C; ++c) wv[c] = _mm512_maskz_loadu_ps(mask, w + c * k + k_main);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv[r], wv[c], acc[r][c]);
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = Reduce(acc[r][c]);
}

template <int R>
inline void Row(const float* x, int64_t k, const float* w, int64_t n_rows, float* y, int64_t ldy) {
  int64_t n = 0;
  // A single row (decode) streams W: eight rows of W in flight per step.
  if constexpr (R == 1) {
    for (; n + 8 <= n_rows; n += 8) Block<1, 8>(x, k, w + n * k, y + n, ldy);
  }
  for (; n + 4 <= n_rows; n += 4) Block<R, 4>(x, k, w + n * k, y + n, ldy);
  for (; n < n_rows; ++n) Block<R, 1>(x, k, w + n * k, y + n, ldy);
}

}  // namespace

void GemmAvx512(const float* x, int64_t m_rows, int64_t k, const float* w, int64_t n_rows, float* y,
                int64_t ldy) {
  for (int64_t m0 = 0; m0 < m_rows; m0 += kRowBlock) {
    const int64_t m1 = m0 + kRowBlock < m_rows ? m0 + kRowBlock : m_rows;
    // Column groups of 64 outer, rows inner: a group of W rows stays in L1/L2 across the row block.
    for (int64_t n0 = 0; n0 < n_rows; n0 += 64) {
      const int64_t nn = n0 + 64 < n_rows ? 64 : n_rows - n0;
      int64_t m = m0;
      for (; m + 4 <= m1; m += 4) Row<4>(x + m * k, k, w + n0 * k, nn, y + m * ldy + n0, ldy);
      for (; m < m1; ++m) Row<1>(x + m * k, k, w + n0 * k, nn, y + m * ldy + n0, ldy);
    }
  }
}

}  // namespace kvpush::gemm_internal
