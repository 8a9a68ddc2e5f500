// Activation quantization and the scalar reference of the Q8_0 integer GEMM (model/int8_gemm.h).
#include "model/int8_gemm.h"

#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/dtype.h"
#include "model/gemm_kernels.h"
#include "model/quant.h"

namespace kvpush::gemm_internal {

namespace {

uint16_t U16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

/// Codes (0..15) of the 32 values of sub-block j of a Q4_K super-block, and its scale and min.
void Q4KSub(const uint8_t* blk, int j, uint8_t* code, int* sc, int* m) {
  const uint8_t* s = blk + 4;
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
  const uint8_t* qs = blk + 16 + 32 * (j / 2);
  for (int t = 0; t < 32; ++t) code[t] = (j & 1) != 0 ? qs[t] >> 4 : qs[t] & 15;
}

/// sum_t code(v) * qx(v) over the 4 values v = 64 u + 4 lane + t of a super-block (the
/// K-quants' integer part of lane `lane` in part `u`, model/int8_gemm.h).
int32_t PartDot(const uint8_t* code, const int8_t* qx, int u, int lane) {
  int32_t p = 0;
  for (int t = 0; t < 4; ++t) {
    const int v = 64 * u + 4 * lane + t;
    p += int32_t{code[v]} * int32_t{qx[v]};
  }
  return p;
}

/// Codes (0..63) of the 32 values of sub-block j of a Q6_K super-block.
void Q6KSub(const uint8_t* blk, int j, uint8_t* code) {
  const uint8_t* ql = blk + 64 * (j / 4);
  const uint8_t* qh = blk + 128 + 32 * (j / 4);
  const int part = j % 4;  // values 32 part .. 32 part + 31 of the half
  for (int l = 0; l < 32; ++l) {
    const int low = part % 2 == 0 ? ql[l] : ql[l + 32];
    const int nib = part < 2 ? low & 15 : low >> 4;
    code[l] = static_cast<uint8_t>(nib | (((qh[l] >> (2 * part)) & 3) << 4));
  }
}

}  // namespace

bool CpuHasAvx512Vnni() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512dq")) {
    return false;  // these also tell that the OS saves the AVX-512 state
  }
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (c & (1u << 11)) != 0;  // AVX512_VNNI
}

bool CpuHasAvx2FmaF16c() {
  __builtin_cpu_init();
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & (1u << 29)) != 0;
  return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

void QuantizeBlocksScalar(const float* x, int64_t blocks, int64_t block, int8_t* q, float* d,
                          int16_t* sums) {
  for (int64_t i = 0; i < blocks; ++i) {
    const float* xb = x + i * block;
    float amax = 0.0f;
    for (int64_t t = 0; t < block; ++t) amax = std::max(amax, std::fabs(xb[t]));
    const float di = amax / 127.0f;
    const float id = di != 0.0f ? 1.0f / di : 0.0f;
    int8_t* qb = q + i * block;
    for (int64_t t = 0; t < block; ++t) {
      // lrint rounds to nearest even in the default rounding mode. The clamp guards
      // x * id = 127.00001 and non-finite activations (a NaN or an infinite x gives an unspecified
      // long, never undefined behaviour; such rows give garbage logits on every path).
      const long r = std::clamp(std::lrint(xb[t] * id), -127L, 127L);  // NOLINT(google-runtime-int)
      qb[t] = static_cast<int8_t>(r);
    }
    d[i] = di;
  }
  for (int64_t g = 0; g < blocks * block / 16; ++g) {
    int sum = 0;
    for (int t = 0; t < 16; ++t) sum += q[g * 16 + t];
    sums[g] = static_cast<int16_t>(sum);
  }
}

void Q8Rows::Quantize(const float* x, int64_t rows, int64_t k, int64_t block) {
  rows_ = rows;
  k_ = k;
  block_ = block;
  const int64_t nb = k / block;
  if (static_cast<int64_t>(q_.size()) < rows * k) q_.resize(static_cast<size_t>(rows * k));
  if (static_cast<int64_t>(d_.size()) < rows * nb) d_.resize(static_cast<size_t>(rows * nb));
  if (static_cast<int64_t>(sums_.size()) < rows * k / 16) {
    sums_.resize(static_cast<size_t>(rows * k / 16));
  }
  // Every version gives the same bytes (model_int8_gemm_test); the widest the CPU has runs.
  static const QuantizeBlocksFn kQuantize = CpuHasAvx512Vnni()    ? QuantizeBlocksAvx512
                                            : CpuHasAvx2FmaF16c() ? QuantizeBlocksAvx2
                                                                  : QuantizeBlocksScalar;
  kQuantize(x, rows * nb, block, q_.data(), d_.data(), sums_.data());
}

void Q8GemmScalar(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                  int64_t ldy) {
  const int64_t nb = x.k() / kQ8BlockValues;
  for (int64_t m = 0; m < x.rows(); ++m) {
    const int8_t* xq = x.q(m);
    const float* xd = x.d(m);
    for (int64_t n = 0; n < n_rows; ++n) {
      const uint8_t* row = w + static_cast<size_t>(n) * row_bytes;
      float acc[16] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = row + b * kQ8BlockBytes;
        uint16_t h;
        std::memcpy(&h, blk, 2);
        const float s = HalfToFloat(h) * xd[b];
        const auto* wq = reinterpret_cast<const int8_t*>(blk + 2);
        const int8_t* xb = xq + b * kQ8BlockValues;
        for (int j = 0; j < 8; ++j) {
          int32_t p = 0;
          for (int t = 4 * j; t < 4 * j + 4; ++t) p += int32_t{xb[t]} * int32_t{wq[t]};
          float& lane = acc[8 * (b & 1) + j];
          lane = std::fma(s, static_cast<float>(p), lane);
        }
      }
      y[m * ldy + n] = CanonicalTree(acc);
    }
  }
}

void Q4KGemmScalar(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                   int64_t ldy) {
  const int64_t nsb = x.k() / kQkK;
  for (int64_t m = 0; m < x.rows(); ++m) {
    for (int64_t n = 0; n < n_rows; ++n) {
      float acc = 0.0f;
      for (int64_t sb = 0; sb < nsb; ++sb) {
        const uint8_t* blk = w + static_cast<size_t>(n) * row_bytes + sb * kQ4KBlockBytes;
        uint8_t code[256];
        int sc[8], mn[8];
        for (int j = 0; j < 8; ++j) Q4KSub(blk, j, code + 32 * j, &sc[j], &mn[j]);
        const int8_t* qx = x.q(m) + sb * kQkK;
        const int16_t* sums = x.sums(m) + sb * 16;
        const float dx = x.d(m)[sb];
        const float s1 = HalfToFloat(U16(blk)) * dx, s2 = HalfToFloat(U16(blk + 2)) * dx;
        int32_t isum = 0, msum = 0;
        for (int v = 0; v < kQkK; ++v) isum += sc[v / 32] * int32_t{code[v]} * int32_t{qx[v]};
        for (int j = 0; j < 8; ++j) msum += mn[j] * (sums[2 * j] + sums[2 * j + 1]);
        acc = std::fma(s1, static_cast<float>(isum), acc);
        acc = std::fma(-s2, static_cast<float>(msum), acc);
      }
      y[m * ldy + n] = acc;
    }
  }
}

void Q6KGemmScalar(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                   int64_t ldy) {
  const int64_t nsb = x.k() / kQkK;
  for (int64_t m = 0; m < x.rows(); ++m) {
    for (int64_t n = 0; n < n_rows; ++n) {
      float acc[16] = {};
      for (int64_t sb = 0; sb < nsb; ++sb) {
        const uint8_t* blk = w + static_cast<size_t>(n) * row_bytes + sb * kQ6KBlockBytes;
        uint8_t code[256];
        for (int j = 0; j < 8; ++j) Q6KSub(blk, j, code + 32 * j);
        const auto* sc = reinterpret_cast<const int8_t*>(blk + 192);
        const int8_t* qx = x.q(m) + sb * kQkK;
        const int16_t* sums = x.sums(m) + sb * 16;
        const float s = HalfToFloat(U16(blk + 208)) * x.d(m)[sb];
        for (int lane = 0; lane < 16; ++lane) {
          int32_t isum = 0;
          for (int u = 0; u < 4; ++u) {
            isum += int32_t{sc[4 * u + lane / 4]} * PartDot(code, qx, u, lane);
          }
          isum -= 32 * int32_t{sc[lane]} * sums[lane];
          acc[lane] = std::fma(s, static_cast<float>(isum), acc[lane]);
        }
      }
      y[m * ldy + n] = CanonicalTree(acc);
    }
  }
}

}  // namespace kvpush::gemm_internal
