// Activation quantization and the scalar reference of the Q8_0 integer GEMM (model/int8_gemm.h).
#include "model/int8_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/dtype.h"

namespace kvpush::gemm_internal {

void Q8Rows::Quantize(const float* x, int64_t rows, int64_t k) {
  rows_ = rows;
  k_ = k;
  const int64_t nb = k / kQ8BlockValues;
  if (static_cast<int64_t>(q_.size()) < rows * k) q_.resize(static_cast<size_t>(rows * k));
  if (static_cast<int64_t>(d_.size()) < rows * nb) d_.resize(static_cast<size_t>(rows * nb));
  for (int64_t i = 0; i < rows * nb; ++i) {
    const float* xb = x + i * kQ8BlockValues;
    float amax = 0.0f;
    for (int t = 0; t < kQ8BlockValues; ++t) amax = std::max(amax, std::fabs(xb[t]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int8_t* qb = q_.data() + i * kQ8BlockValues;
    for (int t = 0; t < kQ8BlockValues; ++t) {
      // nearbyint rounds to nearest even in the default rounding mode (as the SIMD kernels'
      // _MM_FROUND_TO_NEAREST_INT would); the clamp only guards x * id = 127.00001.
      const float r = std::clamp(std::nearbyint(xb[t] * id), -127.0f, 127.0f);
      qb[t] = static_cast<int8_t>(r);
    }
    d_[static_cast<size_t>(i)] = d;
  }
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
      for (int i = 0; i < 8; ++i) acc[i] += acc[i + 8];
      for (int i = 0; i < 4; ++i) acc[i] += acc[i + 4];
      for (int i = 0; i < 2; ++i) acc[i] += acc[i + 2];
      y[m * ldy + n] = acc[0] + acc[1];
    }
  }
}

}  // namespace kvpush::gemm_internal
