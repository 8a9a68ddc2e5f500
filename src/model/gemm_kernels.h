// Fixed-order GEMM kernels (internal to gemm.cc): Y[m, n] = sum_k X[m, k] * W[n, k].
//
// The canonical arithmetic, identical in every kernel and for every element: 16 lane accumulators;
// lane j accumulates, in increasing k, fma(X[m, k], W[n, k], acc_j) over k = j mod 16 (a k tail is
// zero-padded to 16); then acc_j += acc_{j+8}, acc_j += acc_{j+4}, acc_j += acc_{j+2}, and
// y = acc_0 + acc_1. Results are therefore bit-identical between the AVX-512, AVX2 and scalar
// kernels and independent of how many rows or columns are computed together.
#pragma once

#include <cstdint>

namespace kvpush::gemm_internal {

/// Signature shared by the kernels: X [m_rows, k] (row stride k), W [n_rows, k] (row stride k),
/// Y [m_rows, n_rows] with row stride ldy.
using GemmFn = void (*)(const float* x, int64_t m_rows, int64_t k, const float* w, int64_t n_rows,
                        float* y, int64_t ldy);

/// The canonical tree above over 16 lane accumulators (acc is overwritten): acc[i] += acc[i + 8],
/// += acc[i + 4], += acc[i + 2], then acc[0] + acc[1]. The scalar form of every kernel's reduction
/// (the GEMM, the Q8_0 / Q6_K integer GEMMs and the attention softmax's sum).
float CanonicalTree(float* acc);

/// The canonical dot product of a[0, k) and b[0, k) above, one element at a time (the scalar
/// reference every vector kernel matches; also attention's scores).
float CanonicalDot(const float* a, const float* b, int64_t k);

/// 2 when the CPU has AVX512F and AVX512DQ (the AVX-512 kernels' flags), 1 with AVX2 and FMA, else
/// 0: which fixed-order kernels (GEMM and attention) may run.
int FixedOrderIsa();

void GemmScalar(const float* x, int64_t m_rows, int64_t k, const float* w, int64_t n_rows, float* y,
                int64_t ldy);
void GemmAvx2(const float* x, int64_t m_rows, int64_t k, const float* w, int64_t n_rows, float* y,
              int64_t ldy);
void GemmAvx512(const float* x, int64_t m_rows, int64_t k, const float* w, int64_t n_rows, float* y,
                int64_t ldy);

/// Stored weight types the fused AVX-512 kernel reads directly.
enum class StoredType { kQ8_0, kF16, kBF16 };

/// Fused kernel for a few rows of X (decode) against W stored as `type` (rows of `row_bytes`
/// bytes; k a multiple of 16, and of 32 for Q8_0): W's values are dequantized in registers exactly
/// as DequantizeRowUnchecked does and enter the canonical order above, so Y is bit-identical to
/// GemmAvx512 on the dequantized matrix (exception: an F16 signalling NaN comes out quiet here;
/// weights holding NaN are garbage either way).
void GemmStoredAvx512(StoredType type, const float* x, int64_t m_rows, int64_t k, const uint8_t* w,
                      size_t row_bytes, int64_t n_rows, float* y, int64_t ldy);

}  // namespace kvpush::gemm_internal
