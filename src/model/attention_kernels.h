// The two inner loops of one attention head (internal to llama_executor.cc), with a scalar
// (attention_kernels.cc), an AVX2+FMA (gemm_avx2.cc) and an AVX-512 (gemm_avx512.cc) version that
// give the same bits (the executor's P/D bit-identity and
// batch invariance rest on it).
//
// The canonical arithmetic:
//   Scores: score_s = Dot(q, k_s) * scale for each position s, where Dot is the fixed-order GEMM's
//     dot product (gemm_kernels.h): 16 lane accumulators, lane j = fma(q[i], k_s[i], lane j) over
//     i = j mod 16 in increasing i (a tail zero-padded), then lanes i + (i + 8), + 4, + 2, + 1.
//   Values: out[d] = fma(a_s, v_s[d], out[d]) for s in increasing order, per element d (a_s the
//     normalized softmax weight).
// Softmax itself (max, exp, sum) stays in the executor's scalar loop.
#pragma once

#include <cstdint>

namespace kvpush::gemm_internal {

/// scores[s] = Dot(q, k + s * stride, hd) * scale for s in [0, n). `k` rows may overlap nothing
/// in `scores`. Pure; thread-safe.
using AttnScoresFn = void (*)(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                              float scale, float* scores);
/// out[d] = fma(a[s], v[s * stride + d], out[d]) for s = 0 .. n - 1 in order, d in [0, hd).
/// Pure apart from `out`; thread-safe on distinct `out`.
using AttnValuesFn = void (*)(const float* a, const float* v, int64_t stride, int64_t n, int64_t hd,
                              float* out);

/// AttnValuesFn for `heads` heads that read the same V rows: out[g][d] = fma(a[g][s],
/// v[s * stride + d], out[g][d]) for s in order, each head exactly as AttnValuesFn computes it
/// (a GQA group: the heads' FMA chains run side by side). Thread-safe on distinct `out`.
using AttnValuesGroupFn = void (*)(const float* const* a, int64_t heads, const float* v,
                                   int64_t stride, int64_t n, int64_t hd, float* const* out);

void AttnScoresScalar(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                      float scale, float* scores);
void AttnValuesScalar(const float* a, const float* v, int64_t stride, int64_t n, int64_t hd,
                      float* out);
void AttnValuesGroupScalar(const float* const* a, int64_t heads, const float* v, int64_t stride,
                           int64_t n, int64_t hd, float* const* out);
/// Call only when the CPU has AVX2 and FMA.
void AttnScoresAvx2(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                    float scale, float* scores);
void AttnValuesAvx2(const float* a, const float* v, int64_t stride, int64_t n, int64_t hd,
                    float* out);
/// One AttnValuesAvx2 per head (call only when the CPU has AVX2 and FMA).
void AttnValuesGroupAvx2(const float* const* a, int64_t heads, const float* v, int64_t stride,
                         int64_t n, int64_t hd, float* const* out);
/// Call only when the CPU has AVX512F and AVX512DQ.
void AttnScoresAvx512(const float* q, const float* k, int64_t stride, int64_t n, int64_t hd,
                      float scale, float* scores);
void AttnValuesAvx512(const float* a, const float* v, int64_t stride, int64_t n, int64_t hd,
                      float* out);
void AttnValuesGroupAvx512(const float* const* a, int64_t heads, const float* v, int64_t stride,
                           int64_t n, int64_t hd, float* const* out);

}  // namespace kvpush::gemm_internal
