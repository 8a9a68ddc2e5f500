// AVX-512F kernel of the fixed-order GEMM (see gemm_kernels.h). Compiled with -mavx512f -mfma and
// only called after a CPUID check. No inline functions shared with other translation units.
#include <immintrin.h>

#include "model/gemm_kernels.h"

namespace kvpush::gemm_internal {

namespace {

constexpr int64_t kRowBlock = 64;

inline float Reduce(__m512 v) {
  alignas(64) float a[16];
  _mm512_store_ps(a, v);
  for (int i = 0; i < 8; ++i) a[i] += a[i + 8];
  for (int i = 0; i < 4; ++i) a[i] += a[i + 4];
  for (int i = 0; i < 2; ++i) a[i] += a[i + 2];
  return a[0] + a[1];
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
