// AVX-512F kernel of the fixed-order GEMM (see gemm_kernels.h), and attention's inner loops with
// the same dot product (attention_kernels.h). Compiled with -mavx512f -mavx512dq -mfma and only
// called after a CPUID check. No inline functions shared with other translation units.
#include <immintrin.h>

#include <cstring>

#include "model/attention_kernels.h"
#include "model/gemm_kernels.h"

// GCC 12 reports the intrinsics' internal _mm512_undefined_* operands as maybe-uninitialized once
// the conversion intrinsics are inlined (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
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
inline void Block(const float* x, int64_t k, const float* w, int64_t ldw, float* y, int64_t ldy) {
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
    for (int c = 0; c < C; ++c) wv[c] = _mm512_loadu_ps(w + c * ldw + kk);
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
    for (int c = 0; c < C; ++c) wv[c] = _mm512_maskz_loadu_ps(mask, w + c * ldw + k_main);
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
inline void Row(const float* x, int64_t k, const float* w, int64_t ldw, int64_t n_rows, float* y,
                int64_t ldy) {
  int64_t n = 0;
  // A single row (decode) streams W: eight rows of W in flight per step.
  if constexpr (R == 1) {
    for (; n + 8 <= n_rows; n += 8) Block<1, 8>(x, k, w + n * ldw, ldw, y + n, ldy);
  }
  for (; n + 4 <= n_rows; n += 4) Block<R, 4>(x, k, w + n * ldw, ldw, y + n, ldy);
  for (; n < n_rows; ++n) Block<R, 1>(x, k, w + n * ldw, ldw, y + n, ldy);
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

/// Mask of the first `n` (< 16) lanes.
inline __mmask16 Head(int64_t n) {
  return static_cast<__mmask16>((1u << n) - 1u);
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

/// Four heads' out[c0 .. c0 + 16 C) over all n positions: each V vector loaded once, 4 C chains.
template <int C>
inline void Values4Avx512(const float* const* a, const float* v, int64_t stride, int64_t n,
                          float* const* out, int64_t d) {
  __m512 o[4][C];
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) o[g][c] = _mm512_loadu_ps(out[g] + d + 16 * c);
  for (int64_t s = 0; s < n; ++s) {
    __m512 vv[C];
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) vv[c] = _mm512_loadu_ps(v + s * stride + d + 16 * c);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const __m512 as = _mm512_set1_ps(a[g][s]);
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) o[g][c] = _mm512_fmadd_ps(as, vv[c], o[g][c]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g)
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out[g] + d + 16 * c, o[g][c]);
}

/// Sixteen positions at once: the same accumulators as Block, then the canonical tree of
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

/// CanonicalExp (attention_kernels.h) in 16 lanes, step for step.
inline __m512 Exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(kExpMin), x);  // kExpMin > x ? kExpMin : x, a NaN kept
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kExpLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kExpLn2Hi), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kExpLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpP[5]);
  for (int i = 4; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP[i]));
  const __m512 y =
      _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}

}  // namespace

void AttnSoftmaxAvx512(float* w, int64_t n) {
  // max(x, m) keeps m when x is a NaN, as std::max(m, x) does in the scalar reference.
  __m512 mv = _mm512_set1_ps(w[0]);
  int64_t s = 0;
  for (; s + 16 <= n; s += 16) mv = _mm512_max_ps(_mm512_loadu_ps(w + s), mv);
  if (s < n) mv = _mm512_mask_max_ps(mv, Head(n - s), _mm512_maskz_loadu_ps(Head(n - s), w + s), mv);
  const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 acc = _mm512_setzero_ps();
  for (s = 0; s + 16 <= n; s += 16) {
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_loadu_ps(w + s), max));
    _mm512_storeu_ps(w + s, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (s < n) {
    const __mmask16 m = Head(n - s);
    const __m512 e = Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, w + s), max));
    _mm512_mask_storeu_ps(w + s, m, e);
    acc = _mm512_mask_add_ps(acc, m, acc, e);
  }
  const __m512 inv_sum = _mm512_set1_ps(1.0f / Reduce(acc));
  for (s = 0; s + 16 <= n; s += 16) {
    _mm512_storeu_ps(w + s, _mm512_mul_ps(_mm512_loadu_ps(w + s), inv_sum));
  }
  if (s < n) {
    const __mmask16 m = Head(n - s);
    _mm512_mask_storeu_ps(w + s, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, w + s), inv_sum));
  }
}

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
      for (; m + 4 <= m1; m += 4) Row<4>(x + m * k, k, w + n0 * k, k, nn, y + m * ldy + n0, ldy);
      for (; m < m1; ++m) Row<1>(x + m * k, k, w + n0 * k, k, nn, y + m * ldy + n0, ldy);
    }
  }
}

void AttnScoresAvx512(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                      float scale, float* scores) {
  int64_t s = 0;
  for (; s + 16 <= n; s += 16) Scores16Avx512(q, k + s * stride, stride, hd, scale, scores + s);
  // The rest: the GEMM's dot products (one row of X against the key rows), then the scale.
  Row<1>(q, hd, k + s * stride, stride, n - s, scores + s, n - s);
  for (; s < n; ++s) scores[s] *= scale;
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

void AttnValuesGroupAvx512(const float* const* a, int64_t heads, const float* v, int64_t stride,
                           int64_t n, int64_t hd, float* const* out) {
  int64_t g = 0;
  for (; g + 4 <= heads && hd % 16 == 0; g += 4) {
    int64_t d = 0;
    for (; d + 64 <= hd; d += 64) Values4Avx512<4>(a + g, v, stride, n, out + g, d);
    for (; d < hd; d += 16) Values4Avx512<1>(a + g, v, stride, n, out + g, d);
  }
  for (; g < heads; ++g) AttnValuesAvx512(a[g], v, stride, n, hd, out[g]);
}

}  // namespace kvpush::gemm_internal
