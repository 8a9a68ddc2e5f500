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
// row pair. Q6_K's lanes enter its 16 f32 accumulators once per super-block. Q4_K needs only the
// lanes' totals (model/int8_gemm.h): 16 integer vectors at a time are summed into the 16 lanes of
// one (TransposeSum16), which for prefill are the 4 x 4 elements of a tile (Q4KQuadTile, over W
// rows unpacked once per thread and group into L2-sized quads) and for decode the I and M sums of
// 8 W rows (Q4KRowTile8).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

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

/// The 64 codes of Q4_K part u from its 32 bytes `qs`: the 32 low nibbles, then the 32 high.
inline __m512i Q4KCodes(const uint8_t* qs) {
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(v, low4)),
                            _mm256_and_si256(_mm256_srli_epi16(v, 4), low4), 1);
}

/// A super-block's eight 32-value sums (S_2j + S_2j+1) from its sixteen 16-value sums, as int32.
inline __m256i PairSums(const int16_t* sums) {
  const __m512i s =
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sums)));
  return _mm512_castsi512_si256(_mm512_madd_epi16(s, _mm512_set1_epi16(1)));
}

/// The exact sums of 16 int32 vectors v[i] in lane i of one vector (i = 4 r + c): pairs by
/// unpack, then 128-bit lanes by shuffle_i32x4.
inline __m512i TransposeSum16(const __m512i (&v)[16]) {
  __m512i a[8], b[4];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    a[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * j], v[2 * j + 1]),
                            _mm512_unpackhi_epi32(v[2 * j], v[2 * j + 1]));
  }
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    b[j] = _mm512_add_epi32(_mm512_unpacklo_epi64(a[2 * j], a[2 * j + 1]),
                            _mm512_unpackhi_epi64(a[2 * j], a[2 * j + 1]));
  }
  const __m512i c01 = _mm512_add_epi32(_mm512_shuffle_i32x4(b[0], b[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(b[0], b[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i c23 = _mm512_add_epi32(_mm512_shuffle_i32x4(b[2], b[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(b[2], b[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(c01, c23, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(c01, c23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/// One W row's Q4_K super-block `blk` against one X row's 64-value parts qx[0..3]: the 16 int32
/// lanes whose total is I (*isum) and the 8 whose total is M (*mprod; `s32` = PairSums).
inline void Q4KRowLanes(const uint8_t* blk, const __m512i (&qx)[4], __m256i s32, __m512i* isum,
                        __m256i* mprod) {
  __m512i sc16;
  __m256i mn32;
  Q4KScales(blk, &sc16, &mn32);
  __m512i acc = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u) {
    acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(Q4KCodes(blk + 16 + 32 * u), qx[u]),
                              _mm512_permutexvar_epi16(ScaleIndex<16, 2>(u), sc16));
  }
  *isum = acc;
  *mprod = _mm256_mullo_epi32(mn32, s32);
}

/// The 64-value parts of super-block sb of X row m.
inline void LoadParts(const Q8Rows& x, int64_t m, int64_t sb, __m512i (&qx)[4]) {
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u) qx[u] = Load64(x.q(m) + sb * kQkK + 64 * u);
}

/// Row m of X against one W row (the columns past the last multiple of 8 in decode): the totals
/// I and M of model/int8_gemm.h per super-block, reduced in the lanes.
inline float Q4KRowOne(const Q8Rows& x, int64_t m, const uint8_t* w) {
  const int64_t nsb = x.k() / kQkK;
  float acc = 0.0f;
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* blk = w + sb * kQ4KBlockBytes;
    const float dx = x.d(m)[sb];
    __m512i qx[4], isum;
    __m256i mprod;
    LoadParts(x, m, sb, qx);
    Q4KRowLanes(blk, qx, PairSums(x.sums(m) + sb * 16), &isum, &mprod);
    const int32_t itotal = _mm512_reduce_add_epi32(isum);
    const int32_t mtotal = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(mprod));
    acc = std::fma(Half(blk) * dx, static_cast<float>(itotal), acc);
    acc = std::fma(-(Half(blk + 2) * dx), static_cast<float>(mtotal), acc);
  }
  return acc;
}

/// Decode: row m of X against 8 W rows (from w). Per super-block, the 8 rows' I sums and their
/// 8 M products enter one TransposeSum16 (lanes 0..7 I_c, 8..15 M_c), and the f32 step runs on
/// 8 lanes at once.
inline void Q4KRowTile8(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes,
                        float* y) {
  const int64_t nsb = x.k() / kQkK;
  // [d_0, dmin_0, d_1, ...] -> [d_0 .. d_7, dmin_0 .. dmin_7]
  const __m512i split = _mm512_set_epi32(15, 13, 11, 9, 7, 5, 3, 1, 14, 12, 10, 8, 6, 4, 2, 0);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const __m256i s32 = PairSums(x.sums(m) + sb * 16);
    __m512i qx[4];
    LoadParts(x, m, sb, qx);
    __m512i v[16];
    alignas(32) uint32_t dd[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; ++c) {
      const uint8_t* blk = w + static_cast<size_t>(c) * row_bytes + sb * kQ4KBlockBytes;
      Prefetch(blk + 8 * row_bytes, kQ4KBlockBytes);
      std::memcpy(&dd[c], blk, 4);
      __m256i mprod;
      Q4KRowLanes(blk, qx, s32, &v[c], &mprod);
      v[8 + c] = _mm512_zextsi256_si512(mprod);
    }
    const __m512 totals = _mm512_cvtepi32_ps(TransposeSum16(v));
    const __m512 s = _mm512_mul_ps(
        _mm512_permutexvar_ps(split, _mm512_cvtph_ps(_mm256_load_si256(
                                         reinterpret_cast<const __m256i*>(dd)))),
        _mm512_set1_ps(x.d(m)[sb]));
    acc = _mm256_fmadd_ps(_mm512_castps512_ps256(s), _mm512_castps512_ps256(totals), acc);
    acc = _mm256_fnmadd_ps(_mm512_extractf32x8_ps(s, 1), _mm512_extractf32x8_ps(totals, 1), acc);
  }
  _mm256_storeu_ps(y, acc);
}

/// One super-block of 4 consecutive W rows (c = 0..3) unpacked for the prefill tile: per part u
/// and row c, the 64 codes as the tile multiplies them (32 low nibbles, then 32 high) and the
/// scales placed per int16 pair; the mins as the pairs the M sum multiplies (A_p below); d and
/// dmin. Rows past the matrix's end are zeros. 2,368 bytes.
struct alignas(64) Q4KQuad {
  struct Part {
    uint8_t code[64];
    int16_t scw[32];
  };
  Part part[4][4];        // [u][c]
  int32_t mins[4][16];    // [p]: lane 4 r + c = (m_c,2p, m_c,2p+1) as two int16
  float d[4], dmin[4];
};

/// Unpacks super-block sb of rows row[0..nc) (nc = 1..4) into q.
inline void UnpackQ4KQuad(const uint8_t* const* row, int nc, int64_t sb, Q4KQuad* q) {
  alignas(64) int16_t mins[4][8] = {};
  for (int c = 0; c < 4; ++c) {
    if (c >= nc) {
      for (int u = 0; u < 4; ++u) {
        _mm512_store_si512(q->part[u][c].code, _mm512_setzero_si512());
        _mm512_store_si512(q->part[u][c].scw, _mm512_setzero_si512());
      }
      q->d[c] = q->dmin[c] = 0.0f;
      continue;
    }
    const uint8_t* blk = row[c] + sb * kQ4KBlockBytes;
    __m512i sc16;
    __m256i mn32;
    Q4KScales(blk, &sc16, &mn32);
    alignas(32) int32_t mn[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(mn), mn32);
    for (int j = 0; j < 8; ++j) mins[c][j] = static_cast<int16_t>(mn[j]);
    q->d[c] = Half(blk);
    q->dmin[c] = Half(blk + 2);
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      _mm512_store_si512(q->part[u][c].code, Q4KCodes(blk + 16 + 32 * u));
      _mm512_store_si512(q->part[u][c].scw, _mm512_permutexvar_epi16(ScaleIndex<16, 2>(u), sc16));
    }
  }
  for (int p = 0; p < 4; ++p) {
    for (int lane = 0; lane < 16; ++lane) {
      const int c = lane % 4;
      q->mins[p][lane] = static_cast<int32_t>(static_cast<uint32_t>(mins[c][2 * p]) |
                                              (static_cast<uint32_t>(mins[c][2 * p + 1]) << 16));
    }
  }
}

/// Q4_K prefill: X rows m .. m + nr - 1 (nr = 1..4; a missing row repeats the last, its result
/// dropped) against the 4 W rows of the quads q[sb], of which the first nc are stored. Lane
/// 4 r + c of every vector below belongs to X row r and W row c.
inline void Q4KQuadTile(const Q8Rows& x, int64_t m, int nr, const Q4KQuad* q, int nc, float* y,
                        int64_t ldy) {
  const int64_t nsb = x.k() / kQkK;
  int64_t mr[4];
  for (int r = 0; r < 4; ++r) mr[r] = m + (r < nr ? r : nr - 1);
  const __m512i ones16 = _mm512_set1_epi16(1);
  const __m512i dx_index = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  // Word (r, p) of the packed pair sums below: X row r's 32-value sums 2p and 2p + 1.
  __m512i pair_index[4];
  for (int p = 0; p < 4; ++p) {
    alignas(64) int32_t idx[16];
    for (int lane = 0; lane < 16; ++lane) {
      const int r = lane / 4;
      idx[lane] = 4 * (2 * (r % 2) + p / 2) + 2 * (r / 2) + p % 2;
    }
    pair_index[p] = _mm512_load_si512(idx);
  }
  __m512 acc = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const Q4KQuad& g = q[sb];
    __m512i isum[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) isum[i] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      __m512i qx[4];
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) qx[r] = Load64(x.q(mr[r]) + sb * kQkK + 64 * u);
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m512i code = _mm512_load_si512(g.part[u][c].code);
        const __m512i scw = _mm512_load_si512(g.part[u][c].scw);
#pragma GCC unroll 4
        for (int r = 0; r < 4; ++r) {
          isum[4 * r + c] =
              _mm512_dpwssd_epi32(isum[4 * r + c], _mm512_maddubs_epi16(code, qx[r]), scw);
        }
      }
    }
    const __m512i itotal = TransposeSum16(isum);
    // M: the 32-value sums of rows 0, 1 (t01) and 2, 3 (t23), packed to int16 pairs.
    auto sums = [&](int r) {
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums(mr[r]) + sb * 16));
    };
    const __m512i t01 = _mm512_madd_epi16(
        _mm512_inserti64x4(_mm512_castsi256_si512(sums(0)), sums(1), 1), ones16);
    const __m512i t23 = _mm512_madd_epi16(
        _mm512_inserti64x4(_mm512_castsi256_si512(sums(2)), sums(3), 1), ones16);
    const __m512i pairs = _mm512_packs_epi32(t01, t23);
    __m512i mtotal = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int p = 0; p < 4; ++p) {
      mtotal = _mm512_dpwssd_epi32(mtotal, _mm512_load_si512(g.mins[p]),
                                   _mm512_permutexvar_epi32(pair_index[p], pairs));
    }
    const __m512 dx = _mm512_permutexvar_ps(
        dx_index, _mm512_castps128_ps512(_mm_setr_ps(x.d(mr[0])[sb], x.d(mr[1])[sb],
                                                     x.d(mr[2])[sb], x.d(mr[3])[sb])));
    const __m512 s1 = _mm512_mul_ps(_mm512_broadcast_f32x4(_mm_load_ps(g.d)), dx);
    const __m512 s2 = _mm512_mul_ps(_mm512_broadcast_f32x4(_mm_load_ps(g.dmin)), dx);
    acc = _mm512_fmadd_ps(s1, _mm512_cvtepi32_ps(itotal), acc);
    acc = _mm512_fnmadd_ps(s2, _mm512_cvtepi32_ps(mtotal), acc);
  }
  alignas(64) float out[16];
  _mm512_store_ps(out, acc);
  for (int r = 0; r < nr; ++r) {
    for (int c = 0; c < nc; ++c) y[r * ldy + c] = out[4 * r + c];
  }
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

/// The kernels that keep 16 canonical lanes per element (Q4_K has its own tiles: Q4KQuadTile,
/// Q4KRowTile8, Q4KRowOne).
enum class Kind { kQ8_0, kQ6K };

/// R rows of X (from row m) against C rows of W in the stored type `kKind`.
template <Kind kKind, int R, int C>
inline void KindTile(const Q8Rows& x, int64_t m, const uint8_t* w, size_t row_bytes, float* y,
                     int64_t ldy) {
  if constexpr (kKind == Kind::kQ8_0) {
    Tile<R, C>(x, m, w, row_bytes, y, ldy);
  } else {
    Q6KTile<R, C>(x, m, w, row_bytes, y, ldy);
  }
}

/// The Q8_0 and Q6_K kernels' order of tiles: column groups of 64 outer, rows inner, so that a group of W rows
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
  const int64_t rows = x.rows(), nsb = x.k() / kQkK;
  auto at = [&](int64_t n) { return w + static_cast<size_t>(n) * row_bytes; };
  if (rows < 4) {  // decode: W streams once, straight from the file's layout
    for (int64_t m = 0; m < rows; ++m) {
      int64_t n = 0;
      for (; n + 8 <= n_rows; n += 8) Q4KRowTile8(x, m, at(n), row_bytes, y + m * ldy + n);
      for (; n < n_rows; ++n) y[m * ldy + n] = Q4KRowOne(x, m, at(n));
    }
    return;
  }
  // Prefill: each group of W rows is unpacked once into a per-thread buffer of quads (kept within
  // ~256 KiB, so it stays in L2) and then read by every 4-row group of X.
  constexpr int64_t kScratchBytes = 256 * 1024;
  const int64_t quads = std::clamp<int64_t>(
      kScratchBytes / (nsb * static_cast<int64_t>(sizeof(Q4KQuad))), 1, 16);
  thread_local std::vector<Q4KQuad> scratch;
  if (static_cast<int64_t>(scratch.size()) < quads * nsb) {
    scratch.resize(static_cast<size_t>(quads * nsb));
  }
  for (int64_t n0 = 0; n0 < n_rows; n0 += 4 * quads) {
    const int64_t n1 = std::min(n0 + 4 * quads, n_rows);
    for (int64_t n = n0; n < n1; n += 4) {
      const int nc = static_cast<int>(std::min<int64_t>(4, n1 - n));
      const uint8_t* row[4] = {at(n), at(n + (nc > 1 ? 1 : 0)), at(n + (nc > 2 ? 2 : 0)),
                               at(n + (nc > 3 ? 3 : 0))};
      Q4KQuad* q = &scratch[static_cast<size_t>((n - n0) / 4 * nsb)];
      for (int64_t sb = 0; sb < nsb; ++sb) UnpackQ4KQuad(row, nc, sb, q + sb);
    }
    for (int64_t m = 0; m < rows; m += 4) {
      const int nr = static_cast<int>(std::min<int64_t>(4, rows - m));
      for (int64_t n = n0; n < n1; n += 4) {
        const int nc = static_cast<int>(std::min<int64_t>(4, n1 - n));
        Q4KQuadTile(x, m, nr, &scratch[static_cast<size_t>((n - n0) / 4 * nsb)], nc,
                    y + m * ldy + n, ldy);
      }
    }
  }
}

void Q6KGemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows,
                       float* y, int64_t ldy) {
  Drive<Kind::kQ6K>(x, w, row_bytes, n_rows, y, ldy);
}

}  // namespace kvpush::gemm_internal
