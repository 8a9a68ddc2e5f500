// Batch-invariant matrix multiply for the executor's linear layers.
//
// Problem: OpenBLAS's sgemm result for one row of X depends on M, the number of rows in the call
// (measured with OpenBLAS 0.3.21's "Haswell" kernels on this machine: the M = 1 result differs from
// the same row inside an M >= 4 call, and within a 16-row call rows differ by position; see
// docs/model.md). A sequence's logits would then change with the batch it happens to share.
//
// Two batch-invariant backends:
//  * kFixedOrder (default): kvpush's own kernel with a canonical per-element summation order
//    (16 FMA lane accumulators over k, then a fixed reduction tree; model/gemm_kernels.h). Every
//    element is computed by the same sequence of IEEE operations whatever the number of rows or
//    columns, and the AVX-512, AVX2 and scalar versions give identical bits, so the result does not
//    even depend on the CPU's vector width.
//  * kOpenBlasTiles: cblas_sgemm always called with exactly 8 rows (the last tile zero-padded).
//    Row invariance then rests on OpenBLAS using one fixed path for that shape, which the unit test
//    checks on the machine that runs it (it held for 8 and failed for 16 here).
// tests/model/gemm_invariance_test.cc asserts both bit for bit.
//
// Weights in a stored type (WeightMatrix: F16, BF16, Q8_0, Q4_K, Q6_K) are dequantized tile by
// tile (a few rows of W at a time, into an L1/L2-sized f32 scratch) and each tile goes through the
// same kernel. A dequantized value depends only on its block's bytes and every output element is
// still computed by the canonical sequence of operations, so the result is bit-identical to the
// same GEMM on the fully dequantized f32 matrix, and row invariance holds as before
// (tests/model/quant_model_test.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/weight_matrix.h"

namespace kvpush {

enum class GemmBackend {
  kFixedOrder,        ///< own kernel, best ISA available (AVX-512F, AVX2+FMA, scalar fmaf)
  kFixedOrderScalar,  ///< own kernel, portable scalar version (reference for tests)
  kOpenBlasTiles,     ///< cblas_sgemm on fixed 8-row tiles
};

/// Computes Y[rows, n] = X[rows, k] * W[n, k]^T (W row-major [out = n, in = k], as nn.Linear).
/// Row m of Y depends only on row m of X and on W (bitwise), never on `rows` or on other rows.
/// Not thread-safe (owns scratch buffers); one per executor.
class InvariantGemm {
 public:
  static constexpr int64_t kTileRows = 8;  ///< rows per sgemm call for kOpenBlasTiles

  explicit InvariantGemm(GemmBackend backend = GemmBackend::kFixedOrder);

  void Run(const float* x, int64_t rows, int64_t k, const float* w, int64_t n, float* y);

  /// Y[rows, n] = X[rows, k] * W^T with W = `w` ([n = w.rows(), k = w.cols()]) in its stored type:
  /// F32 in place as above, other types dequantized WeightTileRows(k) rows at a time (see the
  /// file comment). Bit-identical to Run() on the dequantized f32 matrix.
  void Run(const float* x, int64_t rows, const WeightMatrix& w, float* y);

  /// Rows of W dequantized per tile for an input width of `k` values (a multiple of 8, 8..64;
  /// about 128 KiB of f32).
  static int64_t WeightTileRows(int64_t k);

  GemmBackend backend() const { return backend_; }
  /// "fixed-order avx512", "fixed-order avx2", "fixed-order scalar" or "openblas 8-row tiles".
  std::string name() const;

 private:
  /// Run() writing Y with row stride `ldy` (>= n).
  void RunStrided(const float* x, int64_t rows, int64_t k, const float* w, int64_t n, float* y,
                  int64_t ldy);

  GemmBackend backend_;
  int isa_ = 0;  // 0 scalar, 1 avx2, 2 avx512 (kFixedOrder only)
  std::vector<float> pad_x_;
  std::vector<float> pad_y_;
  std::vector<float> tile_;  ///< dequantized rows of W (stored-type Run)
};

/// Sets OpenBLAS's thread count (process-global) and returns the value OpenBLAS reports.
int SetBlasThreads(int threads);
/// OpenBLAS's core name for the kernels it selected (e.g. "Haswell").
const char* BlasCoreName();

}  // namespace kvpush
