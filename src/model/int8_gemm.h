// Integer dot-product GEMM for Q8_0, Q4_K and Q6_K weights (internal to gemm.cc): Y[m, n] = sum_k
// X[m, k] W[n, k] with the activations X quantized per 32-value block to int8, as ggml pairs Q8_0
// weights with Q8_0 activations (the idea, not its code: here the activation scale stays f32).
//
// Activation quantization (Q8Rows::Quantize), per row m and block b of 32 values, depending only
// on those 32 values:  amax = max |x|,  dx = amax / 127 (f32 division),  id = dx != 0 ? 1 / dx : 0,
// qx = nearest-even(x * id) clamped to [-127, 127].
//
// The canonical arithmetic, identical in every kernel and for every element (so results are
// bit-identical between the AVX-512 VNNI, AVX2 and scalar kernels and independent of how many
// rows or columns are computed together, of the row's position and of the thread that computes
// it): 16 f32 lane accumulators, all +0. For each block b in increasing order,
//   s = dw_b * dx_b                      (f32 product; dw_b = the weight block's fp16 scale)
//   for j in 0..7:  P_j = sum_{t<4} qx[32b + 4j + t] * qw[32b + 4j + t]    (exact, int32)
//                   acc[8 (b mod 2) + j] = fma(s, float(P_j), acc[8 (b mod 2) + j])
// (even blocks feed lanes 0..7, odd blocks lanes 8..15; |P_j| <= 4 * 127 * 128 is exact in f32),
// then acc_i += acc_{i+8}, acc_i += acc_{i+4}, acc_i += acc_{i+2}, y = acc_0 + acc_1 (the same
// tree as the f32 kernels, gemm_kernels.h).
//
// Q4_K and Q6_K (formats in model/quant.h) pair with activations quantized per super-block of 256
// values instead (as ggml pairs its K-quants with Q8_K; the idea, not its code): the same formula
// with amax over the 256 values, one f32 scale dx per super-block, and S_g = the sum of the 16
// quantized values of group g (g = 0..15). Within a super-block everything is integer (exact,
// so any grouping of the additions gives the same sums). With code(v) the unsigned code of value
// v = 0..255 of the super-block:
//   Q4_K (code 0..15; sub-block j = v / 32 with 6-bit scale sc_j and min m_j; fp16 d, dmin): one
//   f32 accumulator acc = +0 per output element, and per super-block in increasing order
//     I = sum_v sc_{v/32} * code(v) * qx(v),   M = sum_j m_j * (S_2j + S_2j+1)
//     acc = fma(d * dx, float(I), acc);  acc = fma(-(dmin * dx), float(M), acc);  y = acc
//   (|I| <= 256 * 63 * 15 * 127 < 2^25: the conversion may round above 2^24, identically in every
//   kernel; |M| < 2^21 is exact.) No lanes and no tree: a kernel may sum the integers in any
//   order, so a tile of 4 X rows by 4 W rows keeps one f32 lane per element (model/
//   int8_gemm_avx512.cc), which is what makes the prefill tile cheap.
//   Q6_K (code 0..63 standing for code - 32; int8 scale sc_g per 16 values; fp16 d): 16 f32 lane
//   accumulators; with v = 64 u + 4 L + t (u = 0..3, lane L = 0..15, t = 0..3),
//     I_L = sum_u sc_{4u + L/4} * sum_t code(v) * qx(v)  -  32 * sc_L * S_L
//     acc_L = fma(d * dx, float(I_L), acc_L)
//   over super-blocks in increasing order, then the same tree as Q8_0 (|I_L| < 2^25).
// The products d * dx are f32. Every kernel (AVX-512 VNNI: maddubs then dpwssd; AVX2: maddubs then
// madd) computes these integers exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/gemm.h"

namespace kvpush::gemm_internal {

/// True when the CPU (and OS) support AVX512F, AVX512BW, AVX512DQ and AVX512_VNNI (CPUID leaf 7
/// ECX bit 11), which the *Avx512Vnni kernels need.
bool CpuHasAvx512Vnni();

/// True when the CPU supports AVX2, FMA and F16C (CPUID leaf 1 ECX bit 29), which Q8GemmAvx2
/// needs.
bool CpuHasAvx2FmaF16c();

/// Rows of X quantized per block of `block` values (32 for Q8_0, 256 for the K-quants; see the
/// file comment). k must be a multiple of the block. Not thread-safe while Quantize runs;
/// concurrent const use is safe.
class Q8Rows {
 public:
  /// Quantizes X [rows, k] (row stride k) in blocks of `block` (32 or 256) values, and sums each
  /// 16 quantized values. Reuses its buffers (no allocation once grown).
  void Quantize(const float* x, int64_t rows, int64_t k, int64_t block = 32);

  int64_t rows() const { return rows_; }
  int64_t k() const { return k_; }
  int64_t block() const { return block_; }
  /// The k int8 values of row m.
  const int8_t* q(int64_t m) const { return q_.data() + m * k_; }
  /// The k / block() f32 block scales of row m.
  const float* d(int64_t m) const { return d_.data() + m * (k_ / block_); }
  /// The k / 16 sums of 16 consecutive int8 values of row m (S_g of the file comment).
  const int16_t* sums(int64_t m) const { return sums_.data() + m * (k_ / 16); }

 private:
  int64_t rows_ = 0, k_ = 0, block_ = 32;
  std::vector<int8_t> q_;
  std::vector<float> d_;
  std::vector<int16_t> sums_;
};

/// Quantizes `blocks` consecutive blocks of `block` (32 or 256) values of x as the file comment
/// says: q [blocks * block], d [blocks], and sums [blocks * block / 16] (each 16 consecutive q).
/// The scalar reference and the AVX2 / AVX-512 versions (call those only when CpuHasAvx2FmaF16c /
/// CpuHasAvx512Vnni) give the same bytes. Pure; thread-safe.
using QuantizeBlocksFn = void (*)(const float* x, int64_t blocks, int64_t block, int8_t* q,
                                  float* d, int16_t* sums);
void QuantizeBlocksScalar(const float* x, int64_t blocks, int64_t block, int8_t* q, float* d,
                          int16_t* sums);
void QuantizeBlocksAvx2(const float* x, int64_t blocks, int64_t block, int8_t* q, float* d,
                        int16_t* sums);
void QuantizeBlocksAvx512(const float* x, int64_t blocks, int64_t block, int8_t* q, float* d,
                          int16_t* sums);

// Every kernel has the signature Q8GemmFn (declared in model/gemm.h): every row of `x` against W
// rows [0, n_rows) in the kernel's stored type (`row_bytes` per row), written to Y[m, n] at
// y[m * ldy + n]. Thread-safety: pure functions of their arguments.

/// Portable reference: exactly the canonical sequence above, one element at a time.
void Q8GemmScalar(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                  int64_t ldy);
/// AVX2 (maddubs / madd on 256-bit vectors); call only when the CPU has AVX2, FMA and F16C.
void Q8GemmAvx2(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                int64_t ldy);
/// AVX-512 VNNI (vpdpbusd on two blocks per 512-bit vector); call only when the CPU has
/// AVX512F, AVX512BW, AVX512DQ and AVX512_VNNI.
void Q8GemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                      int64_t ldy);

/// Q4_K / Q6_K weights (x.k() a multiple of 256, x quantized with block 256), same signature as
/// Q8GemmFn: the scalar reference, the AVX-512 VNNI kernels (same CPU requirements as
/// Q8GemmAvx512Vnni) and the AVX2 ones (same as Q8GemmAvx2).
void Q4KGemmScalar(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                   int64_t ldy);
void Q6KGemmScalar(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                   int64_t ldy);
void Q4KGemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows,
                       float* y, int64_t ldy);
void Q6KGemmAvx512Vnni(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows,
                       float* y, int64_t ldy);
void Q4KGemmAvx2(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                 int64_t ldy);
void Q6KGemmAvx2(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows, float* y,
                 int64_t ldy);

}  // namespace kvpush::gemm_internal
