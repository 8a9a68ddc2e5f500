// Scalar reference of the attention inner loops (model/attention_kernels.h).
#include "model/attention_kernels.h"

#include <cmath>

namespace kvpush::gemm_internal {

void AttnScoresScalar(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                      float scale, float* scores) {
  for (int64_t s = 0; s < n; ++s) {
    const float* ks = k + s * stride;
    float acc[16] = {};
    for (int64_t i = 0; i < hd; ++i) acc[i % 16] = std::fma(q[i], ks[i], acc[i % 16]);
    for (int i = 0; i < 8; ++i) acc[i] += acc[i + 8];
    for (int i = 0; i < 4; ++i) acc[i] += acc[i + 4];
    for (int i = 0; i < 2; ++i) acc[i] += acc[i + 2];
    scores[s] = (acc[0] + acc[1]) * scale;
  }
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
