// AVX-512F kernel of the fixed-order GEMM (see gemm_kernels.h). Compiled with -mavx512f -mfma and
// only called after a CPUID check. No inline functions shared with other translation units.
#include <immintrin.h>

#include <cstring>

#include "model/gemm_kernels.h"

// GCC 12 reports the intrinsics' internal _mm512_undefined_* operands as maybe-uninitialized once
// the conversion intrinsics are inlined (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

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
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t k_main = k & ~int64_t{15};
  for (int64_t kk = 0; kk < k_main; kk += 16) {
    __m512 xv[R], wv[C];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) xv[r] = _mm512_loadu_ps(x + r * k + kk);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_ps(w + c * k + kk);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv[r], wv[c], acc[r][c]);
  }
  if (k_main < k) {
    const __mmask16 mask = static_cast<__mmask16>((1u << (k - k_main)) - 1u);
    __m512 xv[R], wv[C];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) xv[r] = _mm512_maskz_loadu_ps(mask, x + r * k + k_main);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) wv[c] = _mm512_maskz_loadu_ps(mask, w + c * k + k_main);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv[r], wv[c], acc[r][c]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
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

/// binary16 -> binary32, exact (same bits as quant.cc's conversion, NaN payloads included).
inline float HalfBits(const uint8_t* p) {
  const auto h = static_cast<uint32_t>(p[0] | (p[1] << 8));
  constexpr uint32_t kShiftedExp = 0x7c00u << 13;
  uint32_t u = (h & 0x7fffu) << 13;
  const uint32_t exp = u & kShiftedExp;
  u += (127u - 15u) << 23;
  float f;
  if (exp == kShiftedExp) {
    u += (128u - 16u) << 23;
    std::memcpy(&f, &u, 4);
  } else if (exp == 0) {
    u += 1u << 23;
    std::memcpy(&f, &u, 4);
    f -= 6.103515625e-05f;  // 2^-14
  } else {
    std::memcpy(&f, &u, 4);
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= (h & 0x8000u) << 16;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// 16 values of W starting at value `kk` of a row stored as `type`, dequantized exactly as
/// DequantizeRowUnchecked does (model/quant.h): Q8_0 d * q, F16 / BF16 widened.
inline __m512 LoadW(StoredType type, const uint8_t* row, int64_t kk) {
  switch (type) {
    case StoredType::kQ8_0: {
      const uint8_t* blk = row + (kk / 32) * 34;
      const __m512 d = _mm512_set1_ps(HalfBits(blk));
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 + kk % 32));
      return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    }
    case StoredType::kF16:
      return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * kk)));
    case StoredType::kBF16: {
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * kk));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
    }
  }
  return _mm512_setzero_ps();
}

/// One row of X against C rows of Q8_0 W (k a multiple of 32): one scale per block of 32.
template <int C>
inline void Q8Block(const float* x, int64_t k, const uint8_t* w, size_t row_bytes, float* y) {
  __m512 acc[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; kk += 32) {
    const __m512 x0 = _mm512_loadu_ps(x + kk), x1 = _mm512_loadu_ps(x + kk + 16);
#pragma GCC unroll 8  // keeps acc[] in registers
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w + c * row_bytes + (kk / 32) * 34;
      const __m512 d = _mm512_set1_ps(HalfBits(blk));
      const auto* q = reinterpret_cast<const __m128i*>(blk + 2);
      const __m512 w0 =
          _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))));
      const __m512 w1 =
          _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))));
      acc[c] = _mm512_fmadd_ps(x0, w0, acc[c]);
      acc[c] = _mm512_fmadd_ps(x1, w1, acc[c]);
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) y[c] = Reduce(acc[c]);
}

/// One row of X against C rows of an F16 / BF16 W (k a multiple of 16): the canonical order. The
/// type is a template argument (no switch per load); the next tile's rows are prefetched (decode
/// streams W).
template <int C, StoredType kType>
inline void HalfBlock(const float* x, int64_t k, const uint8_t* w, size_t row_bytes, float* y) {
  __m512 acc[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t kk = 0; kk < k; kk += 16) {
    if (C > 1 && kk % 32 == 0) {
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        _mm_prefetch(reinterpret_cast<const char*>(w + (c + C) * row_bytes + 2 * kk), _MM_HINT_T0);
      }
    }
    const __m512 xv = _mm512_loadu_ps(x + kk);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      acc[c] = _mm512_fmadd_ps(xv, LoadW(kType, w + c * row_bytes, kk), acc[c]);
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) y[c] = Reduce(acc[c]);
}

/// One row of X against C rows of a stored-type W (k a multiple of 16): the canonical order.
template <int C>
inline void StoredBlock(StoredType type, const float* x, int64_t k, const uint8_t* w,
                        size_t row_bytes, float* y) {
  switch (type) {
    case StoredType::kQ8_0:
      Q8Block<C>(x, k, w, row_bytes, y);
      return;
    case StoredType::kF16:
      HalfBlock<C, StoredType::kF16>(x, k, w, row_bytes, y);
      return;
    case StoredType::kBF16:
      HalfBlock<C, StoredType::kBF16>(x, k, w, row_bytes, y);
      return;
  }
}

}  // namespace

void GemmStoredAvx512(StoredType type, const float* x, int64_t m_rows, int64_t k, const uint8_t* w,
                      size_t row_bytes, int64_t n_rows, float* y, int64_t ldy) {
  for (int64_t m = 0; m < m_rows; ++m) {
    int64_t n = 0;
    // Four rows of W in flight (with the next four prefetched): eight streams read the F16
    // rows of a dim-2048 model 10 % slower (33.8 vs 37.4 tok/s decode, 1 thread).
    for (; n + 4 <= n_rows; n += 4) {
      StoredBlock<4>(type, x + m * k, k, w + n * row_bytes, row_bytes, y + m * ldy + n);
    }
    for (; n < n_rows; ++n) {
      StoredBlock<1>(type, x + m * k, k, w + n * row_bytes, row_bytes, y + m * ldy + n);
    }
  }
}

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
