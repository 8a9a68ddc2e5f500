// AVX2 kernel of the Q8_0 integer GEMM (model/int8_gemm.h). Compiled with -mavx2 -mfma -mf16c and
// only called after a CPUID check.
//
// One 256-bit vector holds one block. maddubs multiplies unsigned by signed bytes, so it gets
// |qw| and qx with qw's sign (sign_epi8); its int16 pair sums (<= 2 * 127 * 128) cannot saturate,
// and madd with ones gives lane j = sum of values 4j .. 4j + 3, exactly. Even blocks accumulate in
// one vector (canonical lanes 0..7), odd blocks in another (lanes 8..15).
#include <immintrin.h>

#include "model/int8_gemm.h"

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

}  // namespace kvpush::gemm_internal
