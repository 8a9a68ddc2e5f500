// AVX2 kernels of the integer GEMMs (model/int8_gemm.h) and the activation quantizer. Compiled with
// -mavx2 -mfma -mf16c and only called after a CPUID check.
//
// Q4_K / Q6_K (the canonical super-block sums): vpmaddubsw multiplies the unsigned codes by the
// signed activations into int16 pair sums (Q4_K at most 2 * 15 * 127, Q6_K 2 * 63 * 127: no
// saturation) and vpmaddwd multiplies them by the scale of their values, adding pairs into int32
// lanes, exactly. Q6_K's 16 canonical lanes are two __m256i / __m256 (lanes 0..7 = the first 32
// values of a 64-value part, 8..15 the last 32); Q4_K needs only their totals I and M.
//
// Q8_0: one 256-bit vector holds one block. maddubs multiplies unsigned by signed bytes, so it gets
// |qw| and qx with qw's sign (sign_epi8); its int16 pair sums (<= 2 * 127 * 128) cannot saturate,
// and madd with ones gives lane j = sum of values 4j .. 4j + 3, exactly. Even blocks accumulate in
// one vector (canonical lanes 0..7), odd blocks in another (lanes 8..15).
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "model/int8_gemm.h"
#include "model/quant.h"

namespace kvpush::gemm_internal {

namespace {

constexpr int64_t kBlockBytes = 34;

/// The canonical tree over lanes (lo = 0..7, hi = 8..15).
inline float Reduce(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

inline float Half(const uint8_t* p) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p[0] | (p[1] << 8))));
}

/// One row of X (row m) against C rows of W.
template <int C>
inline void Tile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y) {
  const int64_t nb = x.k() / 32;
  __m256 acc[C][2];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) acc[c][0] = acc[c][1] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* xq = x.q(m);
  const float* xd = x.d(m);
  for (int64_t b = 0; b < nb; ++b) {
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + b * 32));
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + b * kBlockBytes;
      const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qw, qw), _mm256_sign_epi8(qx, qw));
      const __m256i p = _mm256_madd_epi16(p16, ones);
      const __m256 s = _mm256_set1_ps(Half(blk) * xd[b]);
      acc[c][b & 1] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(p), acc[c][b & 1]);
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) y[c] = Reduce(acc[c][0], acc[c][1]);
}

inline __m256i Load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

/// [a x 8, b x 8] as int16.
inline __m256i Scales16(int a, int b) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(b)),
                          _mm_set1_epi16(static_cast<int16_t>(a)));
}

/// A Q4_K super-block's 6-bit scales and mins (model/quant.h).
inline void Q4KScales(const uint8_t* blk, int* sc, int* mn) {
  const uint8_t* s = blk + 4;
  for (int j = 0; j < 4; ++j) {
    sc[j] = s[j] & 63;
    mn[j] = s[j + 4] & 63;
    sc[j + 4] = (s[j + 8] & 15) | ((s[j] >> 6) << 4);
    mn[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 6) << 4);
  }
}

/// The sum of the 8 int32 lanes (exact; any order).
inline int32_t SumLanes(__m256i v) {
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
}

/// Q4_K: row m of X against C rows of W (the super-block totals I and M, model/int8_gemm.h).
template <int C>
inline void Q4KTile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y) {
  const int64_t nsb = x.k() / kQkK;
  float acc[C] = {};
  const __m256i low4 = _mm256_set1_epi8(15), ones16 = _mm256_set1_epi16(1);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const int8_t* qx = x.q(m) + sb * kQkK;
    const float dx = x.d(m)[sb];
    const __m256i s32 = _mm256_madd_epi16(Load32(x.sums(m) + sb * 16), ones16);
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + sb * kQ4KBlockBytes;
      int sc[8], mn[8];
      Q4KScales(blk, sc, mn);
      __m256i isum = _mm256_setzero_si256();
#pragma GCC unroll 16
      for (int u = 0; u < 4; ++u) {
        const __m256i v = Load32(blk + 16 + 32 * u);
        const __m256i plo = _mm256_maddubs_epi16(_mm256_and_si256(v, low4), Load32(qx + 64 * u));
        const __m256i phi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                                                 Load32(qx + 64 * u + 32));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(plo, _mm256_set1_epi16(
                                                                 static_cast<int16_t>(sc[2 * u]))));
        isum = _mm256_add_epi32(
            isum, _mm256_madd_epi16(phi, _mm256_set1_epi16(static_cast<int16_t>(sc[2 * u + 1]))));
      }
      const __m256i msum = _mm256_mullo_epi32(
          _mm256_setr_epi32(mn[0], mn[1], mn[2], mn[3], mn[4], mn[5], mn[6], mn[7]), s32);
      const float s1 = Half(blk) * dx, s2 = Half(blk + 2) * dx;
      acc[c] = std::fma(s1, static_cast<float>(SumLanes(isum)), acc[c]);
      acc[c] = std::fma(-s2, static_cast<float>(SumLanes(msum)), acc[c]);
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) y[c] = acc[c];
}

/// Q6_K: row m of X against C rows of W.
template <int C>
inline void Q6KTile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y) {
  const int64_t nsb = x.k() / kQkK;
  __m256 lo[C], hi[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) lo[c] = hi[c] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(15), low2 = _mm256_set1_epi8(3);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const int8_t* qx = x.q(m) + sb * kQkK;
    const float dx = x.d(m)[sb];
    const int16_t* sums = x.sums(m) + sb * 16;
    const __m256i sums_lo =
        _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sums)));
    const __m256i sums_hi =
        _mm256_cvtepi16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sums + 8)));
#pragma GCC unroll 4
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + sb * kQ6KBlockBytes;
      const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
      const __m256i sc_lo =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
      const __m256i sc_hi =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8)));
      // -32 sc_L S_L starts lane L (the codes' offset of 32).
      __m256i ilo = _mm256_sub_epi32(_mm256_setzero_si256(),
                                     _mm256_slli_epi32(_mm256_mullo_epi32(sc_lo, sums_lo), 5));
      __m256i ihi = _mm256_sub_epi32(_mm256_setzero_si256(),
                                     _mm256_slli_epi32(_mm256_mullo_epi32(sc_hi, sums_hi), 5));
#pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        const __m256i ql0 = Load32(blk + 64 * h), ql1 = Load32(blk + 64 * h + 32);
        const __m256i qh = Load32(blk + 128 + 32 * h);
#pragma GCC unroll 16
        for (int p = 0; p < 2; ++p) {
          const int u = 2 * h + p;
          // Parts 2p and 2p + 1 of the half: low (p = 0) or high (p = 1) nibbles of ql[0..31]
          // and ql[32..63], with qh's bits 4p + 0..1 and 4p + 2..3.
          const __m256i n0 = _mm256_and_si256(p == 0 ? ql0 : _mm256_srli_epi16(ql0, 4), low4);
          const __m256i n1 = _mm256_and_si256(p == 0 ? ql1 : _mm256_srli_epi16(ql1, 4), low4);
          const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(qh, 4 * p), low2);
          const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(qh, 4 * p + 2), low2);
          const __m256i c0 = _mm256_or_si256(n0, _mm256_slli_epi16(h0, 4));
          const __m256i c1 = _mm256_or_si256(n1, _mm256_slli_epi16(h1, 4));
          const __m256i p0 = _mm256_maddubs_epi16(c0, Load32(qx + 64 * u));
          const __m256i p1 = _mm256_maddubs_epi16(c1, Load32(qx + 64 * u + 32));
          ilo = _mm256_add_epi32(ilo, _mm256_madd_epi16(p0, Scales16(sc[4 * u], sc[4 * u + 1])));
          ihi =
              _mm256_add_epi32(ihi, _mm256_madd_epi16(p1, Scales16(sc[4 * u + 2], sc[4 * u + 3])));
        }
      }
      const __m256 s = _mm256_set1_ps(Half(blk + 208) * dx);
      lo[c] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(ilo), lo[c]);
      hi[c] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(ihi), hi[c]);
    }
  }
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) y[c] = Reduce(lo[c], hi[c]);
}

template <bool kQ4K>
void Drive(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
           int64_t ldy) {
  for (int64_t m = 0; m < x.rows(); ++m) {
    int64_t n = 0;
    for (; n + 4 <= n_rows; n += 4) {
      if constexpr (kQ4K) {
        Q4KTile<4>(x, m, w + static_cast<size_t>(n) * row_bytes, row_bytes, y + m * ldy + n);
      } else {
        Q6KTile<4>(x, m, w + static_cast<size_t>(n) * row_bytes, row_bytes, y + m * ldy + n);
      }
    }
    for (; n < n_rows; ++n) {
      if constexpr (kQ4K) {
        Q4KTile<1>(x, m, w + static_cast<size_t>(n) * row_bytes, row_bytes, y + m * ldy + n);
      } else {
        Q6KTile<1>(x, m, w + static_cast<size_t>(n) * row_bytes, row_bytes, y + m * ldy + n);
      }
    }
  }
}

}  // namespace

void Q8GemmAvx2(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                int64_t ldy) {
  for (int64_t m = 0; m < x.rows(); ++m) {
    int64_t n = 0;
    for (; n + 4 <= n_rows; n += 4) {
      Tile<4>(x, m, w + static_cast<size_t>(n) * row_bytes, row_bytes, y + m * ldy + n);
    }
    for (; n < n_rows; ++n) {
      Tile<1>(x, m, w + static_cast<size_t>(n) * row_bytes, row_bytes, y + m * ldy + n);
    }
  }
}

void QuantizeBlocksAvx2(const float* x, int64_t blocks, int64_t block, int8_t* q, float* d,
                        int16_t* sums) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < blocks; ++i) {
    const float* xb = x + i * block;
    __m256 m = _mm256_setzero_ps();
    for (int64_t t = 0; t < block; t += 8) {
      m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xb + t), abs_mask), m);  // NaN skipped
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float amax = _mm_cvtss_f32(m4);
    const float di = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(di != 0.0f ? 1.0f / di : 0.0f);
    for (int64_t t = 0; t < block; t += 32) {
      __m256i v[4];
      for (int j = 0; j < 4; ++j) {
        // cvtps2dq rounds to nearest even (the default MXCSR mode), as lrint; then the clamp.
        v[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + t + 8 * j), id));
        v[j] = _mm256_min_epi32(_mm256_max_epi32(v[j], lo), hi);
      }
      // packs interleave 128-bit halves; the permutation restores the value order.
      const __m256i b = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3])),
          order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i * block + t), b);
      for (int g = 0; g < 2; ++g) {
        const __m256i s = _mm256_add_epi32(v[2 * g], v[2 * g + 1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        sums[(i * block + t) / 16 + g] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
      }
    }
    d[i] = di;
  }
}

void Q4KGemmAvx2(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                 int64_t ldy) {
  Drive<true>(x, w, row_bytes, n_rows, y, ldy);
}

void Q6KGemmAvx2(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                 int64_t ldy) {
  Drive<false>(x, w, row_bytes, n_rows, y, ldy);
}

}  // namespace kvpush::gemm_internal
