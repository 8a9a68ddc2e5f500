// AVX-512 VNNI kernel of the Q8_0 integer GEMM (model/int8_gemm.h). Compiled with -mavx512f
// -mavx512bw -mavx512dq -mavx512vnni -mfma and only called after a CPUID check.
//
// One 512-bit vector holds two blocks: lanes 0..7 block b, lanes 8..15 block b + 1, which is the
// canonical lane assignment. vpdpbusd multiplies unsigned by signed bytes, so X enters as
// ux = qx + 128 (qx xor 0x80) and each lane starts from -128 * (sum of its 4 weights), making the
// lane exactly sum qx * qw.
#include <immintrin.h>

#include "model/int8_gemm.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kvpush::gemm_internal {

namespace {

constexpr int64_t kBlockBytes = 34;  // fp16 scale + 32 int8

/// The canonical tree: lanes i + (i + 8), then + 4, + 2, + 1.
inline float Reduce(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

/// Two fp16 values (bits lo, hi) as f32 lanes 0..7 = lo, 8..15 = hi (exact conversion).
inline __m512 PairScale(uint16_t lo, uint16_t hi) {
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(lo | (uint32_t{hi} << 16))));
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(f));
}

inline uint16_t HalfAt(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

/// [p[0] x 8, p[1] x 8].
inline __m512 Pair(const float* p) {
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  // p is 4-byte aligned only: an unaligned 8-byte load (movq).
  const __m128 v = _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i_u*>(p)));
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

/// Blocks b and b + 1 (kPair) or block b alone (the odd last block: lanes 0..7 only, as the
/// canonical order leaves lanes 8..15 alone) of R rows of X (from row m) against C rows of W.
template <int R, int C, bool kPair>
inline void Step(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, int64_t b,
                 __m512 (&acc)[R][C]) {
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512i ux[R];
  __m512 dx[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const int8_t* q = x.q(m + r) + b * 32;
    if constexpr (kPair) {
      ux[r] = _mm512_xor_si512(_mm512_loadu_si512(q), bias);
      dx[r] = Pair(x.d(m + r) + b);
    } else {
      ux[r] = _mm512_xor_si512(
          _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q))), bias);
      dx[r] = _mm512_set1_ps(x.d(m + r)[b]);
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) {
    const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + b * kBlockBytes;
    if constexpr (R == 1) {  // decode streams W: ask for the next tile's blocks now
      _mm_prefetch(reinterpret_cast<const char*>(blk + C * row_bytes), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(blk + C * row_bytes + 64), _MM_HINT_T0);
    }
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    __m512i wq;
    __m512 dw;
    if constexpr (kPair) {
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 36));
      wq = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      dw = PairScale(HalfAt(blk), HalfAt(blk + kBlockBytes));
    } else {
      wq = _mm512_zextsi256_si512(lo);
      dw = PairScale(HalfAt(blk), HalfAt(blk));
    }
    const __m512i neg = _mm512_sub_epi32(_mm512_setzero_si512(),
                                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), bias, wq));
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 p = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(neg, ux[r], wq));
      const __m512 s = _mm512_mul_ps(dw, dx[r]);
      if constexpr (kPair) {
        acc[r][c] = _mm512_fmadd_ps(s, p, acc[r][c]);
      } else {
        acc[r][c] = _mm512_mask3_fmadd_ps(s, p, acc[r][c], 0x00ff);
      }
    }
  }
}

/// R rows of X (from row m) against C rows of W: the canonical order, two blocks per step.
template <int R, int C>
inline void Tile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y,
                 int64_t ldy) {
  const int64_t nb = x.k() / 32;
  __m512 acc[R][C];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 1 < nb; b += 2) Step<R, C, true>(x, m, w, row_bytes, b, acc);
  if (b < nb) Step<R, C, false>(x, m, w, row_bytes, b, acc);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) y[r * ldy + c] = Reduce(acc[r][c]);
}

}  // namespace

void Q8GemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                      int64_t ldy) {
  const int64_t rows = x.rows();
  // Column groups of 64 outer, rows inner: a group of W rows (~70 KiB at k = 1024) stays in L2
  // while every row of X passes it.
  for (int64_t n0 = 0; n0 < n_rows; n0 += 64) {
    const int64_t n1 = n0 + 64 < n_rows ? n0 + 64 : n_rows;
    const uint8_t* wg = w + static_cast<size_t>(n0) * row_bytes;
    int64_t m = 0;
    for (; m + 4 <= rows; m += 4) {
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) {
        Tile<4, 4>(x, m, wg + static_cast<size_t>(n - n0) * row_bytes, row_bytes, y + m * ldy + n,
                   ldy);
      }
      for (; n < n1; ++n) {
        Tile<4, 1>(x, m, wg + static_cast<size_t>(n - n0) * row_bytes, row_bytes, y + m * ldy + n,
                   ldy);
      }
    }
    for (; m < rows; ++m) {
      int64_t n = n0;
      for (; n + 8 <= n1; n += 8) {
        Tile<1, 8>(x, m, wg + static_cast<size_t>(n - n0) * row_bytes, row_bytes, y + m * ldy + n,
                   ldy);
      }
      for (; n < n1; ++n) {
        Tile<1, 1>(x, m, wg + static_cast<size_t>(n - n0) * row_bytes, row_bytes, y + m * ldy + n,
                   ldy);
      }
    }
  }
}

void QuantizeBlocksAvx512(const float* x, int64_t blocks, int64_t block, int8_t* q, float* d,
                          int16_t* sums) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int64_t i = 0; i < blocks; ++i) {
    const float* xb = x + i * block;
    __m512 m = _mm512_setzero_ps();
    for (int64_t t = 0; t < block; t += 16) {
      // |x| first: maxps returns its second operand for a NaN, so a NaN is skipped as std::max
      // skips it in the scalar reference.
      m = _mm512_max_ps(_mm512_and_ps(_mm512_loadu_ps(xb + t), abs_mask), m);
    }
    // The largest |x| (max is exact in any order; a NaN makes this block garbage on every path).
    const float amax = _mm512_reduce_max_ps(m);
    const float di = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(di != 0.0f ? 1.0f / di : 0.0f);
    for (int64_t t = 0; t < block; t += 16) {
      // cvtps2dq rounds to nearest even (the default MXCSR mode), as lrint; then the clamp.
      __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xb + t), id));
      v = _mm512_min_epi32(_mm512_max_epi32(v, lo), hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i * block + t), _mm512_cvtepi32_epi8(v));
      sums[(i * block + t) / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(v));
    }
    d[i] = di;
  }
}

}  // namespace kvpush::gemm_internal
