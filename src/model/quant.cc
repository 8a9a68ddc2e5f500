#include "model/quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

namespace kvpush {

namespace {

uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

void StoreU16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v & 0xff);
  p[1] = static_cast<uint8_t>(v >> 8);
}

/// binary16 -> binary32 without branches on the common path (exact, as HalfToFloat): the
/// exponent is rebiased; subnormals are renormalised by one exact float subtraction.
inline float HalfToFloatFast(uint16_t h) {
  constexpr uint32_t kShiftedExp = 0x7c00u << 13;
  uint32_t u = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = u & kShiftedExp;
  u += (127u - 15u) << 23;
  float f;
  if (exp == kShiftedExp) {  // Inf / NaN
    f = std::bit_cast<float>(u + ((128u - 16u) << 23));
  } else if (exp == 0) {  // zero / subnormal: (1.m - 1) * 2^-14, exact
    f = std::bit_cast<float>(u + (1u << 23)) - std::bit_cast<float>(113u << 23);
  } else {
    f = std::bit_cast<float>(u);
  }
  return std::bit_cast<float>(std::bit_cast<uint32_t>(f) |
                              (static_cast<uint32_t>(h & 0x8000u) << 16));
}

/// Sub-block j's 6-bit scale and min of a Q4_K block (layout in quant.h).
inline void Q4KScaleMin(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

[[gnu::always_inline]] inline void DequantizeQ4K(const uint8_t* __restrict__ blk,
                                                 float* __restrict__ out) {
  const float d = HalfToFloatFast(LoadU16(blk));
  const float dmin = HalfToFloatFast(LoadU16(blk + 2));
  const uint8_t* scales = blk + 4;
  const uint8_t* qs = blk + 16;
  for (int i = 0; i < 4; ++i) {
    int sc0, m0, sc1, m1;
    Q4KScaleMin(scales, 2 * i, &sc0, &m0);
    Q4KScaleMin(scales, 2 * i + 1, &sc1, &m1);
    const float d0 = d * static_cast<float>(sc0), min0 = dmin * static_cast<float>(m0);
    const float d1 = d * static_cast<float>(sc1), min1 = dmin * static_cast<float>(m1);
    const uint8_t* q = qs + 32 * i;
    float* y = out + 64 * i;
    for (int l = 0; l < 32; ++l) y[l] = d0 * static_cast<float>(q[l] & 15) - min0;
    for (int l = 0; l < 32; ++l) y[32 + l] = d1 * static_cast<float>(q[l] >> 4) - min1;
  }
}

/// Two passes per half (codes, then scaled values) so that both loops vectorize.
[[gnu::always_inline]] inline void DequantizeQ6K(const uint8_t* __restrict__ blk,
                                                 float* __restrict__ out) {
  const uint8_t* ql = blk;
  const uint8_t* qh = blk + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
  const float d = HalfToFloatFast(LoadU16(blk + 208));
  for (int h = 0; h < 2; ++h) {
    const uint8_t* l4 = ql + 64 * h;
    const uint8_t* h2 = qh + 32 * h;
    uint8_t code[128];
    for (int l = 0; l < 32; ++l) {
      code[l] = static_cast<uint8_t>((l4[l] & 15) | ((h2[l] & 3) << 4));
      code[l + 32] = static_cast<uint8_t>((l4[l + 32] & 15) | (((h2[l] >> 2) & 3) << 4));
      code[l + 64] = static_cast<uint8_t>((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4));
      code[l + 96] = static_cast<uint8_t>((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4));
    }
    // Value p of the half has scale sc[8h + p / 16]: (d * scale) * (code - 32), as ggml.
    for (int j = 0; j < 8; ++j) {
      const float ds = d * static_cast<float>(sc[8 * h + j]);
      float* y = out + 128 * h + 16 * j;
      for (int i = 0; i < 16; ++i) {
        y[i] = ds * static_cast<float>(static_cast<int>(code[16 * j + i]) - 32);
      }
    }
  }
}

/// fp16-rounded value of `f` (what a block stores for its scales).
float RoundToHalf(float f) {
  return HalfToFloat(FloatToHalf(f));
}

int Nearest(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::lround(v)), lo, hi);
}

void QuantizeQ4KBlock(const float* x, uint8_t* blk) {
  float scale[8], mins[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    const float* v = x + 32 * j;
    float lo = 0.0f, hi = v[0];
    for (int l = 0; l < 32; ++l) {
      lo = std::min(lo, v[l]);
      hi = std::max(hi, v[l]);
    }
    scale[j] = std::max(hi - lo, 0.0f) / 15.0f;
    mins[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float d = RoundToHalf(max_scale / 63.0f), dmin = RoundToHalf(max_min / 63.0f);
  std::memset(blk, 0, static_cast<size_t>(kQ4KBlockBytes));
  StoreU16(blk, FloatToHalf(d));
  StoreU16(blk + 2, FloatToHalf(dmin));
  uint8_t* s = blk + 4;
  uint8_t* qs = blk + 16;
  for (int j = 0; j < 8; ++j) {
    const int ls = d > 0.0f ? Nearest(scale[j] / d, 0, 63) : 0;
    const int lm = dmin > 0.0f ? Nearest(mins[j] / dmin, 0, 63) : 0;
    if (j < 4) {
      s[j] = static_cast<uint8_t>(ls);
      s[j + 4] = static_cast<uint8_t>(lm);
    } else {
      s[j + 4] = static_cast<uint8_t>((ls & 15) | ((lm & 15) << 4));
      s[j - 4] = static_cast<uint8_t>(s[j - 4] | ((ls >> 4) << 6));
      s[j] = static_cast<uint8_t>(s[j] | ((lm >> 4) << 6));
    }
    const float step = d * static_cast<float>(ls), offset = dmin * static_cast<float>(lm);
    const float inv = step > 0.0f ? 1.0f / step : 0.0f;
    uint8_t* q = qs + 32 * (j / 2);
    for (int l = 0; l < 32; ++l) {
      const int code = Nearest((x[32 * j + l] + offset) * inv, 0, 15);
      q[l] = static_cast<uint8_t>(q[l] | (j % 2 == 0 ? code : code << 4));
    }
  }
}

void QuantizeQ6KBlock(const float* x, uint8_t* blk) {
  float scale[16];
  float max_scale = 0.0f;
  for (int j = 0; j < 16; ++j) {
    float amax = 0.0f;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * j + l]));
    scale[j] = amax / 31.0f;
    max_scale = std::max(max_scale, scale[j]);
  }
  const float d = RoundToHalf(max_scale / 127.0f);
  std::memset(blk, 0, static_cast<size_t>(kQ6KBlockBytes));
  auto* sc = reinterpret_cast<int8_t*>(blk + 192);
  uint8_t codes[256];
  for (int j = 0; j < 16; ++j) {
    const int ls = d > 0.0f ? Nearest(scale[j] / d, -128, 127) : 0;
    sc[j] = static_cast<int8_t>(ls);
    const float step = d * static_cast<float>(ls);
    const float inv = step != 0.0f ? 1.0f / step : 0.0f;
    for (int l = 0; l < 16; ++l) {
      codes[16 * j + l] = static_cast<uint8_t>(Nearest(x[16 * j + l] * inv, -32, 31) + 32);
    }
  }
  uint8_t* ql = blk;
  uint8_t* qh = blk + 128;
  for (int h = 0; h < 2; ++h) {
    const uint8_t* c = codes + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[64 * h + l] = static_cast<uint8_t>((c[l] & 15) | ((c[l + 64] & 15) << 4));
      ql[64 * h + l + 32] = static_cast<uint8_t>((c[l + 32] & 15) | ((c[l + 96] & 15) << 4));
      qh[32 * h + l] = static_cast<uint8_t>((c[l] >> 4) | ((c[l + 32] >> 4) << 2) |
                                            ((c[l + 64] >> 4) << 4) | ((c[l + 96] >> 4) << 6));
    }
  }
  StoreU16(blk + 208, FloatToHalf(d));
}

}  // namespace

// Compiled once per ISA (GCC function multi-versioning, dispatched at load) with the loops
// vectorized (CMakeLists.txt: -ftree-vectorize). Element-wise IEEE operations without contraction
// (-ffp-contract=off), so every version gives the same bits.
// `src` and `out` never overlap (__restrict__: lets the byte loads and float stores vectorize).
// Under ThreadSanitizer only the default version is built: TSan instruments the ifunc resolver
// that target_clones emits, which runs at load before TSan is initialised and crashed every TSan
// test binary linking this library.
#if defined(__SANITIZE_THREAD__)
#define KVP_ISA_CLONES
#else
#define KVP_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
KVP_ISA_CLONES void DequantizeRowUnchecked(
    GgmlType type, const uint8_t* __restrict__ src, int64_t n, float* __restrict__ out) {
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(out, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloatFast(LoadU16(src + 2 * i));
      return;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        out[i] = std::bit_cast<float>(static_cast<uint32_t>(LoadU16(src + 2 * i)) << 16);
      }
      return;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n / kQ8BlockValues; ++b) {
        const uint8_t* blk = src + b * kQ8BlockBytes;
        const float d = HalfToFloatFast(LoadU16(blk));
        float* y = out + b * kQ8BlockValues;
        for (int64_t j = 0; j < kQ8BlockValues; ++j) {
          y[j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
        }
      }
      return;
    case GgmlType::kQ4_K:
      for (int64_t b = 0; b < n / kQkK; ++b)
        DequantizeQ4K(src + b * kQ4KBlockBytes, out + b * kQkK);
      return;
    case GgmlType::kQ6_K:
      for (int64_t b = 0; b < n / kQkK; ++b)
        DequantizeQ6K(src + b * kQ6KBlockBytes, out + b * kQkK);
      return;
  }
}

void QuantizeRowQ4K(const float* x, int64_t n, uint8_t* dst) {
  for (int64_t b = 0; b < n / kQkK; ++b) QuantizeQ4KBlock(x + b * kQkK, dst + b * kQ4KBlockBytes);
}

void QuantizeRowQ6K(const float* x, int64_t n, uint8_t* dst) {
  for (int64_t b = 0; b < n / kQkK; ++b) QuantizeQ6KBlock(x + b * kQkK, dst + b * kQ6KBlockBytes);
}

}  // namespace kvpush
