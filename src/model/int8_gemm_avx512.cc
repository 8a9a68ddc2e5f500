// AVX-512 VNNI kernels of the integer GEMMs (model/int8_gemm.h) and the activation quantizer.
// Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vnni -mfma and only called after a CPUID
// check.
//
// Q8_0: one 512-bit vector holds two blocks: lanes 0..7 block b, lanes 8..15 block b + 1, which
// is the canonical lane assignment. vpdpbusd multiplies unsigned by signed bytes, so X enters as
// ux = qx + 128 (qx xor 0x80) and each lane starts from -128 * (sum of its 4 weights), making the
// lane exactly sum qx * qw.
//
// Q4_K and Q6_K (the canonical super-block sums): one 512-bit vector holds 64 consecutive values
// of a super-block (its part u = 0..3). vpmaddubsw multiplies the unsigned codes by the signed
// activations into 32 int16 pair sums, and vpdpwssd multiplies those by the scales (int16, one per
// value pair) into the 16 int32 lanes, so a super-block costs two instructions per 64 values and
// row pair; its lanes enter the f32 accumulators once.
#include <immintrin.h>

#include <cstring>

#include "model/int8_gemm.h"
#include "model/quant.h"

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

inline float Half(const uint8_t* p) {
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(p[0] | (p[1] << 8))));
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

/// Index vectors for vpermw: int16 lane h of part u takes scale entry `first(u) + h / width`.
template <int kWidth, int kPerPart>
inline __m512i ScaleIndex(int u) {
  alignas(64) int16_t idx[32];
  for (int h = 0; h < 32; ++h) idx[h] = static_cast<int16_t>(kPerPart * u + h / kWidth);
  return _mm512_load_si512(idx);
}

/// A Q4_K super-block's eight 6-bit scales and mins (model/quant.h), as int16 in the low 128 bits
/// (scales) and as int32 (mins).
inline void Q4KScales(const uint8_t* blk, __m512i* sc16, __m256i* mn32) {
  uint32_t u[3];
  std::memcpy(u, blk + 4, 12);
  const uint32_t sc_lo = u[0] & 0x3f3f3f3fu, m_lo = u[1] & 0x3f3f3f3fu;
  const uint32_t sc_hi = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  *sc16 = _mm512_castsi128_si512(
      _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(sc_hi), static_cast<int>(sc_lo))));
  *mn32 = _mm256_cvtepu8_epi32(_mm_set_epi32(0, 0, static_cast<int>(m_hi), static_cast<int>(m_lo)));
}

/// Q4_K: R rows of X (from row m) against C rows of W.
template <int R, int C>
inline void Q4KTile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y,
                    int64_t ldy) {
  const int64_t nsb = x.k() / kQkK;
  // The f32 lanes live in memory: they change once per super-block, while the R x C integer sums
  // need the registers.
  alignas(64) float acc[R][C][16] = {};
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m512i ones16 = _mm512_set1_epi16(1);
  const __m512i idx[4] = {ScaleIndex<16, 2>(0), ScaleIndex<16, 2>(1), ScaleIndex<16, 2>(2),
                          ScaleIndex<16, 2>(3)};
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m512i isum[R][C];
    __m512i sc16[C];
    __m256i mn32[C];
    __m512 dv[C], dmv[C];  // d and dmin, broadcast
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + sb * kQ4KBlockBytes;
      if constexpr (R == 1) Prefetch(blk + C * row_bytes, kQ4KBlockBytes);
      Q4KScales(blk, &sc16[c], &mn32[c]);
      dv[c] = _mm512_set1_ps(Half(blk));
      dmv[c] = _mm512_set1_ps(Half(blk + 2));
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) isum[r][c] = _mm512_setzero_si512();
    }
#pragma GCC unroll 16
    for (int u = 0; u < 4; ++u) {
      __m512i qx[R];
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) qx[r] = Load64(x.q(m + r) + sb * kQkK + 64 * u);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        const uint8_t* qs =
            w + static_cast<size_t>(c) * row_bytes + sb * kQ4KBlockBytes + 16 + 32 * u;
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
        const __m512i code = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low4)),
                                                _mm256_and_si256(_mm256_srli_epi16(v, 4), low4), 1);
        const __m512i scw = _mm512_permutexvar_epi16(idx[u], sc16[c]);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
          isum[r][c] = _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(code, qx[r]), scw);
        }
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(x.d(m + r)[sb]);
      // Sums of the eight 32-value sub-blocks (pairs of 16-value sums), as int32.
      const __m256i s32 = _mm512_castsi512_si256(_mm512_madd_epi16(
          _mm512_castsi256_si512(
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums(m + r) + sb * 16))),
          ones16));
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        const __m512 s1 = _mm512_mul_ps(dv[c], dx), s2 = _mm512_mul_ps(dmv[c], dx);
        const __m512i msum = _mm512_zextsi256_si512(_mm256_mullo_epi32(mn32[c], s32));
        __m512 a = _mm512_fmadd_ps(s1, _mm512_cvtepi32_ps(isum[r][c]), _mm512_load_ps(acc[r][c]));
        a = _mm512_fnmadd_ps(s2, _mm512_cvtepi32_ps(msum), a);
        _mm512_store_ps(acc[r][c], a);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) y[r * ldy + c] = Reduce(_mm512_load_ps(acc[r][c]));
}

/// Q6_K: R rows of X (from row m) against C rows of W.
template <int R, int C>
inline void Q6KTile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y,
                    int64_t ldy) {
  const int64_t nsb = x.k() / kQkK;
  // The f32 lanes live in memory: they change once per super-block, while the R x C integer sums
  // need the registers.
  alignas(64) float acc[R][C][16] = {};
  const __m512i low4 = _mm512_set1_epi8(15), low2 = _mm512_set1_epi8(3);
  const __m512i idx[4] = {ScaleIndex<8, 4>(0), ScaleIndex<8, 4>(1), ScaleIndex<8, 4>(2),
                          ScaleIndex<8, 4>(3)};
  for (int64_t sb = 0; sb < nsb; ++sb) {
    __m512i isum[R][C];
    __m512i sc16[C];
    __m512 dv[C];  // d, broadcast
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) {
      const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + sb * kQ6KBlockBytes;
      if constexpr (R == 1) Prefetch(blk + C * row_bytes, kQ6KBlockBytes);
      dv[c] = _mm512_set1_ps(Half(blk + 208));
      const __m256i s =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192)));
      sc16[c] = _mm512_castsi256_si512(s);
// -32 sc_L S_L starts lane L (the codes' offset of 32, model/int8_gemm.h).
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512i sums = _mm512_cvtepi16_epi32(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums(m + r) + sb * 16)));
        isum[r][c] = _mm512_sub_epi32(
            _mm512_setzero_si512(),
            _mm512_slli_epi32(_mm512_mullo_epi32(_mm512_cvtepi16_epi32(s), sums), 5));
      }
    }
#pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      // Codes of values 128 h .. 128 h + 63 (part u = 2 h) and 128 h + 64 .. 128 h + 127 (u = 2 h +
      // 1).
      __m512i code[2][C];
#pragma GCC unroll 16
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
#pragma GCC unroll 16
      for (int p = 0; p < 2; ++p) {
        const int u = 2 * h + p;
        __m512i qx[R];
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) qx[r] = Load64(x.q(m + r) + sb * kQkK + 64 * u);
#pragma GCC unroll 16
        for (int c = 0; c < C; ++c) {
          const __m512i scw = _mm512_permutexvar_epi16(idx[u], sc16[c]);
#pragma GCC unroll 16
          for (int r = 0; r < R; ++r) {
            isum[r][c] =
                _mm512_dpwssd_epi32(isum[r][c], _mm512_maddubs_epi16(code[p][c], qx[r]), scw);
          }
        }
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(x.d(m + r)[sb]);
#pragma GCC unroll 16
      for (int c = 0; c < C; ++c) {
        _mm512_store_ps(acc[r][c],
                        _mm512_fmadd_ps(_mm512_mul_ps(dv[c], dx), _mm512_cvtepi32_ps(isum[r][c]),
                                        _mm512_load_ps(acc[r][c])));
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) y[r * ldy + c] = Reduce(_mm512_load_ps(acc[r][c]));
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
      Prefetch(blk + C * row_bytes, 128);
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

enum class Kind { kQ8_0, kQ4K, kQ6K };

/// R rows of X (from row m) against C rows of W in the stored type `kKind`.
template <Kind kKind, int R, int C>
inline void KindTile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y,
                     int64_t ldy) {
  if constexpr (kKind == Kind::kQ8_0) {
    Tile<R, C>(x, m, w, row_bytes, y, ldy);
  } else if constexpr (kKind == Kind::kQ4K) {
    Q4KTile<R, C>(x, m, w, row_bytes, y, ldy);
  } else {
    Q6KTile<R, C>(x, m, w, row_bytes, y, ldy);
  }
}

/// Every kernel's order of tiles: column groups of 64 outer, rows inner, so that a group of W rows
/// (~70 KiB at k = 1024) stays in L2 while every row of X passes it; 4 x 4 tiles, and single rows
/// (decode) in 1 x 8 tiles.
template <Kind kKind>
void Drive(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
           int64_t ldy) {
  const int64_t rows = x.rows();
  auto at = [&](int64_t n) { return w + static_cast<size_t>(n) * row_bytes; };
  for (int64_t n0 = 0; n0 < n_rows; n0 += 64) {
    const int64_t n1 = n0 + 64 < n_rows ? n0 + 64 : n_rows;
    int64_t m = 0;
    for (; m + 4 <= rows; m += 4) {
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4)
        KindTile<kKind, 4, 4>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
      for (; n < n1; ++n) KindTile<kKind, 4, 1>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
    }
    for (; m < rows; ++m) {
      int64_t n = n0;
      for (; n + 8 <= n1; n += 8)
        KindTile<kKind, 1, 8>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
      for (; n < n1; ++n) KindTile<kKind, 1, 1>(x, m, at(n), row_bytes, y + m * ldy + n, ldy);
    }
  }
}

}  // namespace

void Q8GemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                      int64_t ldy) {
  Drive<Kind::kQ8_0>(x, w, row_bytes, n_rows, y, ldy);
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

void Q4KGemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows,
                       float* y, int64_t ldy) {
  Drive<Kind::kQ4K>(x, w, row_bytes, n_rows, y, ldy);
}

void Q6KGemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows,
                       float* y, int64_t ldy) {
  Drive<Kind::kQ6K>(x, w, row_bytes, n_rows, y, ldy);
}

}  // namespace kvpush::gemm_internal
