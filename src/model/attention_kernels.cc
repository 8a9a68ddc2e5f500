// Scalar reference of the attention inner loops (model/attention_kernels.h).
#include "model/attention_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "model/gemm_kernels.h"

namespace kvpush::gemm_internal {

float CanonicalExp(float x) {
  if (std::isnan(x)) return x;
  x = x < kExpMin ? kExpMin : x;
  const float n = std::nearbyint(x * kExpLog2e);  // the default rounding: nearest even
  float r = std::fma(n, -kExpLn2Hi, x);
  r = std::fma(n, -kExpLn2Lo, r);
  float p = kExpP[5];
  for (int i = 4; i >= 0; --i) p = std::fma(p, r, kExpP[i]);
  const float y = std::fma(p, r * r, r) + 1.0f;
  // n is in [-126, 0]: 2^n is a normal float.
  const auto bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return y * std::bit_cast<float>(bits);
}

void AttnSoftmaxScalar(float* w, int64_t n) {
  float max = w[0];
  for (int64_t s = 1; s < n; ++s) max = std::max(max, w[s]);
  float acc[16] = {};
  for (int64_t s = 0; s < n; ++s) {
    w[s] = CanonicalExp(w[s] - max);
    acc[s % 16] += w[s];
  }
  const float inv_sum = 1.0f / CanonicalTree(acc);
  for (int64_t s = 0; s < n; ++s) w[s] *= inv_sum;
}

void AttnScoresScalar(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                      float scale, float* scores) {
  for (int64_t s = 0; s < n; ++s) scores[s] = CanonicalDot(q, k + s * stride, hd) * scale;
}

void AttnValuesScalar(const float* a, const float* v, int64_t stride, int64_t n, int64_t hd,
                      float* out) {
  for (int64_t s = 0; s < n; ++s) {
    const float* vs = v + s * stride;
    for (int64_t d = 0; d < hd; ++d) out[d] = std::fma(a[s], vs[d], out[d]);
  }
}

void AttnValuesGroupScalar(const float* const* a, int64_t heads, const float* v, int64_t stride,
                           int64_t n, int64_t hd, float* const* out) {
  for (int64_t g = 0; g < heads; ++g) AttnValuesScalar(a[g], v, stride, n, hd, out[g]);
}

void AttnValuesGroupAvx2(const float* const* a, int64_t heads, const float* v, int64_t stride,
                         int64_t n, int64_t hd, float* const* out) {
  for (int64_t g = 0; g < heads; ++g) AttnValuesAvx2(a[g], v, stride, n, hd, out[g]);
}

}  // namespace kvpush::gemm_internal
