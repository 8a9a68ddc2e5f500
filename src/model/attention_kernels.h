// The inner loops of one attention head (internal to llama_executor.cc), with a scalar
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
//   Softmax, in place over one row of n scores: m = max_s w[s] (exact in any order); e_s =
//     CanonicalExp(w[s] - m); sum = 16 lane accumulators, lane j adding e_s for s = j mod 16 in
//     increasing s, then the same tree; w[s] = e_s * (1 / sum).
#pragma once

#include <cstdint>

namespace kvpush::gemm_internal {

/// The constants of CanonicalExp: Cephes' expf (S. L. Moshier, Cephes Math Library, expf.c:
/// ln 2 split in two parts, a degree-5 polynomial on [-ln2/2, ln2/2]).
inline constexpr float kExpMin = -87.0f;  // below: clamped (e^-87 = 1.6e-38, still normal)
inline constexpr float kExpLog2e = 1.44269504088896341f;
inline constexpr float kExpLn2Hi = 0.693359375f;
inline constexpr float kExpLn2Lo = -2.12194440e-4f;
inline constexpr float kExpP[6] = {5.0000001201e-1f, 1.6666665459e-1f, 4.1665795894e-2f,
                                   8.3334519073e-3f, 1.3981999507e-3f, 1.9875691500e-4f};

/// e^x for x <= 0 in fixed f32 steps that the vector softmax kernels repeat lane by lane (so the
/// bits agree): x = max(x, kExpMin); n = nearest-even(x * log2e); r = fma(n, -kExpLn2Hi, x);
/// r = fma(n, -kExpLn2Lo, r); p = Horner in fma over kExpP from P[5] down; y = fma(p, r * r, r)
/// + 1; result y * 2^n. About 1 ulp from e^x on [-87, 0]; a NaN gives a NaN. Pure.
float CanonicalExp(float x);

/// Softmax of w[0, n) in place, in the canonical order above (n >= 1). Pure apart from `w`;
/// thread-safe on distinct rows.
using AttnSoftmaxFn = void (*)(float* w, int64_t n);
void AttnSoftmaxScalar(float* w, int64_t n);
/// Call only when the CPU has AVX2 and FMA.
void AttnSoftmaxAvx2(float* w, int64_t n);
/// Call only when the CPU has AVX512F and AVX512DQ.
void AttnSoftmaxAvx512(float* w, int64_t n);

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
