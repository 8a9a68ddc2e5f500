// Scalar reference of the attention inner loops (model/attention_kernels.h).
#include "model/attention_kernels.h"

#include <cmath>

#include "model/gemm_kernels.h"

namespace kvpush::gemm_internal {

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
