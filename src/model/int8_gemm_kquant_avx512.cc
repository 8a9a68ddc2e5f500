// AVX-512 VNNI kernels of the Q4_K and Q6_K integer GEMMs (model/int8_gemm.h: the canonical lane
// updates). Compiled with the flags of int8_gemm_avx512.cc and only called after the same CPUID
// check. One 512-bit vector holds two blocks of 32 (lanes 0..7 block b, 8..15 block b + 1); a
// super-block of 256 is four such pairs, so there is never a tail. The codes are unsigned (Q4_K
// 0..15, Q6_K 0..63) and the activations signed, as vpdpbusd takes them; Q6_K's offset of 32 enters
// as a starting value of -32 * (sum of the lane's 4 activations), Q4_K's min as its own FMA.
#include <immintrin.h>

#include <cstring>

#include "model/int8_gemm.h"
#include "model/quant.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace kvpush::gemm_internal {

namespace {

inline float Reduce(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_extractf32x8_ps(v, 0), _mm512_extractf32x8_ps(v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

inline float Half(const uint8_t* p) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p[0] | (p[1] << 8))));
}

/// [p[0] x 8, p[1] x 8].
inline __m512 Pair(const float* p) {
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  const __m128 v = _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p)));
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v));
}

/// [p[0] x 4, p[1] x 4, p[2] x 4, p[3] x 4].
inline __m512 Quad(const float* p) {
  const __m512i idx = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_loadu_ps(p)));
}

/// Asks for the `bytes` bytes at `p` (a block of the next tile's rows: decode streams W, and its
/// rows are short, so the hardware prefetchers alone leave it latency-bound). Never faults.
inline void Prefetch(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
  }
}

inline __m512i Load64(const void* p) {
  return _mm512_loadu_si512(p);
}

/// A Q4_K super-block's d * sc_j and dmin * m_j (j = 0..7; 6-bit fields unpacked four at a time
/// from the 12 scale bytes, as model/quant.h describes them), each product rounded to f32.
inline void Q4KScales(const uint8_t* blk, float* ds, float* dm) {
  uint32_t u[3];
  std::memcpy(u, blk + 4, 12);
  const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  const __m256 sc = _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, static_cast<int>(sc_hi), static_cast<int>(sc_lo))));
  const __m256 mn = _mm256_cvtepi32_ps(
      _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, static_cast<int>(m_hi), static_cast<int>(m_lo))));
  _mm256_store_ps(ds, _mm256_mul_ps(_mm256_set1_ps(Half(blk)), sc));
  _mm256_store_ps(dm, _mm256_mul_ps(_mm256_set1_ps(Half(blk + 2)), mn));
}

/// Q4_K: R rows of X (from row m) against C rows of W.
template <int R, int C>
inline void Q4KTile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y,
                    int64_t ldy) {
  const int64_t nsb = x.k() / kQkK;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i ones = _mm512_set1_epi8(1);
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    alignas(32) float ds[C][8], dm[C][8];
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + sb * kQ4KBlockBytes;
      if constexpr (R == 1) Prefetch(blk + C * row_bytes, kQ4KBlockBytes);
      Q4KScales(blk, ds[c], dm[c]);
    }
    for (int i = 0; i < 4; ++i) {
      const int64_t b = sb * 8 + 2 * i;
      __m512i qx[R];
      __m512 dx[R], msum[R];
      for (int r = 0; r < R; ++r) {
        qx[r] = Load64(x.q(m + r) + b * 32);
        dx[r] = Pair(x.d(m + r) + b);
        msum[r] = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, qx[r]));
      }
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const uint8_t* qs =
            w + static_cast<size_t>(c) * row_bytes + sb * kQ4KBlockBytes + 16 + 32 * i;
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
        const __m512i code = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low4)),
                                                _mm256_and_si256(_mm256_srli_epi16(v, 4), low4), 1);
        const __m512 s1 = Pair(ds[c] + 2 * i), s2 = Pair(dm[c] + 2 * i);
        for (int r = 0; r < R; ++r) {
          const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), code, qx[r]);
          acc[r][c] = _mm512_fmadd_ps(_mm512_mul_ps(s1, dx[r]), _mm512_cvtepi32_ps(p), acc[r][c]);
          acc[r][c] = _mm512_fnmadd_ps(_mm512_mul_ps(s2, dx[r]), msum[r], acc[r][c]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = Reduce(acc[r][c]);
}

/// Q6_K: R rows of X (from row m) against C rows of W.
template <int R, int C>
inline void Q6KTile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y,
                    int64_t ldy) {
  const int64_t nsb = x.k() / kQkK;
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const __m512i k32 = _mm512_set1_epi8(32), low4 = _mm512_set1_epi8(15);
  const __m512i low2 = _mm512_set1_epi8(3);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    alignas(64) float dsc[C][16];
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + sb * kQ6KBlockBytes;
      if constexpr (R == 1) Prefetch(blk + C * row_bytes, kQ6KBlockBytes);
      const __m512i sc =
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
      _mm512_store_ps(dsc[c],
                      _mm512_mul_ps(_mm512_set1_ps(Half(blk + 208)), _mm512_cvtepi32_ps(sc)));
    }
    for (int h = 0; h < 2; ++h) {
      // Codes of blocks 4h, 4h + 1 (pair 0) and 4h + 2, 4h + 3 (pair 1) of each W row.
      __m512i code[2][C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + sb * kQ6KBlockBytes;
        const __m512i ql = Load64(blk + 64 * h);
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
        const __m512i qh2 =
            _mm512_inserti64x4(_mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
        code[0][c] = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                     _mm512_slli_epi16(_mm512_and_si512(qh2, low2), 4));
        code[1][c] = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
            _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh2, 4), low2), 4));
      }
      for (int p = 0; p < 2; ++p) {
        const int64_t b = sb * 8 + 4 * h + 2 * p;
        __m512i qx[R], neg[R];
        __m512 dx[R];
        for (int r = 0; r < R; ++r) {
          qx[r] = Load64(x.q(m + r) + b * 32);
          dx[r] = Pair(x.d(m + r) + b);
          neg[r] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                    _mm512_dpbusd_epi32(_mm512_setzero_si512(), k32, qx[r]));
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          const __m512 s = Quad(dsc[c] + 2 * (b % 8));
          for (int r = 0; r < R; ++r) {
            const __m512i dot = _mm512_dpbusd_epi32(neg[r], code[p][c], qx[r]);
            acc[r][c] =
                _mm512_fmadd_ps(_mm512_mul_ps(s, dx[r]), _mm512_cvtepi32_ps(dot), acc[r][c]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * ldy + c] = Reduce(acc[r][c]);
}

/// Column groups of 64 outer, rows inner (as Q8GemmAvx512Vnni); 4 x 4 tiles, single rows in 1 x 8.
template <bool kQ4K>
void Drive(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
           int64_t ldy) {
  const int64_t rows = x.rows();
  for (int64_t n0 = 0; n0 < n_rows; n0 += 64) {
    const int64_t n1 = n0 + 64 < n_rows ? n0 + 64 : n_rows;
    int64_t m = 0;
    auto at = [&](int64_t n) { return w + static_cast<size_t>(n) * row_bytes; };
    for (; m + 4 <= rows; m += 4) {
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) {
        if constexpr (kQ4K) {
          Q4KTile<4, 4>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
        } else {
          Q6KTile<4, 4>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
        }
      }
      for (; n < n1; ++n) {
        if constexpr (kQ4K) {
          Q4KTile<4, 1>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
        } else {
          Q6KTile<4, 1>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
        }
      }
    }
    for (; m < rows; ++m) {
      int64_t n = n0;
      for (; n + 8 <= n1; n += 8) {
        if constexpr (kQ4K) {
          Q4KTile<1, 8>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
        } else {
          Q6KTile<1, 8>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
        }
      }
      for (; n < n1; ++n) {
        if constexpr (kQ4K) {
          Q4KTile<1, 1>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
        } else {
          Q6KTile<1, 1>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
        }
      }
    }
  }
}

}  // namespace

void Q4KGemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows,
                       float* y, int64_t ldy) {
  Drive<true>(x, w, row_bytes, n_rows, y, ldy);
}

void Q6KGemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows,
                       float* y, int64_t ldy) {
  Drive<false>(x, w, row_bytes, n_rows, y, ldy);
}

}  // namespace kvpush::gemm_internal
