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
//
// Q8_0, Q4_K and Q6_K weights by default take another path (QuantMath::kInt8): each row of X is
// quantized per 32-value block to int8 with an f32 scale and multiplied with integer dot products
// (model/int8_gemm.h). Its canonical order is again per element and fixed, so row invariance and
// the independence from the ISA hold exactly as above; the values differ from the f32 path by the
// activation rounding (docs/model.md, "Integer dot products").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/weight_matrix.h"

namespace kvpush {

enum class GemmBackend {
  kFixedOrder,        ///< own kernel, best ISA available (AVX-512F, AVX2+FMA, scalar fmaf)
  kFixedOrderScalar,  ///< own kernel, portable scalar version (reference for tests)
  kOpenBlasTiles,     ///< cblas_sgemm on fixed 8-row tiles
};

/// How a GEMM with Q8_0, Q4_K or Q6_K weights is computed (F16 / BF16 are always dequantized to
/// f32).
enum class QuantMath {
  kInt8,        ///< X quantized per 32-value block to int8 + f32 scale, int8 x int8 dot products
  kDequantF32,  ///< W dequantized to f32, then the f32 kernel: bit-identical to the f32-dequantized
                ///< model (the float reference path)
};

class WorkerPool;

namespace gemm_internal {
class Q8Rows;
using Q8GemmFn = void (*)(const Q8Rows& x, const uint8_t* w, size_t row_bytes, int64_t n_rows,
                          float* y, int64_t ldy);
}  // namespace gemm_internal

/// Computes Y[rows, n] = X[rows, k] * W[n, k]^T (W row-major [out = n, in = k], as nn.Linear).
/// Row m of Y depends only on row m of X and on W (bitwise), never on `rows` or on other rows.
/// Not thread-safe (owns scratch buffers); one per executor.
class InvariantGemm {
 public:
  static constexpr int64_t kTileRows = 8;  ///< rows per sgemm call for kOpenBlasTiles

  explicit InvariantGemm(GemmBackend backend = GemmBackend::kFixedOrder,
                         QuantMath quant = QuantMath::kInt8);
  ~InvariantGemm();
  InvariantGemm(InvariantGemm&&) noexcept;
  InvariantGemm& operator=(InvariantGemm&&) noexcept;

  void Run(const float* x, int64_t rows, int64_t k, const float* w, int64_t n, float* y);

  /// Y[rows, n] = X[rows, k] * W^T with W = `w` ([n = w.rows(), k = w.cols()]) in its stored type:
  /// F32 in place as above; Q8_0 / Q4_K / Q6_K with QuantMath::kInt8 through the integer kernel
  /// (for any `rows`, 1 included, so decode and prefill share one per-row order); other types
  /// dequantized WeightTileRows(k) rows at a time (see the file comment), bit-identical to Run() on
  /// the dequantized f32 matrix.
  void Run(const float* x, int64_t rows, const WeightMatrix& w, float* y);

  /// Splits every stored-type Run() over `pool`'s threads by output columns (W rows), except for
  /// kOpenBlasTiles; nullptr (default) = the calling thread only. Bits do not change with the
  /// thread count (each element keeps its canonical order). `pool` must outlive this object.
  void set_pool(WorkerPool* pool) { pool_ = pool; }

  /// Rows of W dequantized per tile for an input width of `k` values (a multiple of 8, 8..64;
  /// about 128 KiB of f32).
  static int64_t WeightTileRows(int64_t k);

  GemmBackend backend() const { return backend_; }
  QuantMath quant_math() const { return quant_; }
  /// "fixed-order avx512", "fixed-order avx2", "fixed-order scalar" or "openblas 8-row tiles",
  /// then "; q8_0/q4_k/q6_k int8 avx512-vnni" (or the avx2 / scalar variants) or
  /// "; q8_0/q4_k/q6_k dequantized f32".
  std::string name() const;

 private:
  std::string GemmName() const;  ///< name() without the quantized part
  /// The integer kernel for `type` under quant_, or nullptr (float path).
  gemm_internal::Q8GemmFn Int8Kernel(GgmlType type) const;
  /// Run() writing Y with row stride `ldy` (>= n).
  void RunStrided(const float* x, int64_t rows, int64_t k, const float* w, int64_t n, float* y,
                  int64_t ldy);

  GemmBackend backend_;
  QuantMath quant_;
  int isa_ = 0;     // 0 scalar, 1 avx2, 2 avx512 (kFixedOrder only)
  int q8_isa_ = 0;  // 0 scalar, 1 avx2, 2 avx512 vnni (kInt8; scalar for kFixedOrderScalar)
  std::unique_ptr<gemm_internal::Q8Rows> q8_;  ///< X quantized (QuantMath::kInt8)
  std::vector<float> pad_x_;
  std::vector<float> pad_y_;
  /// Y[:, n0:n1] of the stored-type Run() (written at y + n0, row stride w.rows()); `tile` is the
  /// calling part's dequantization scratch. Touches no other member for the fixed-order backends,
  /// so parts run concurrently.
  void RunColumns(const float* x, int64_t rows, const WeightMatrix& w, gemm_internal::Q8GemmFn int8,
                  int64_t n0, int64_t n1, float* y, std::vector<float>& tile);

  WorkerPool* pool_ = nullptr;
  std::vector<std::vector<float>> tiles_;  ///< per part: dequantized rows of W
};

/// Sets OpenBLAS's thread count (process-global) and returns the value OpenBLAS reports.
int SetBlasThreads(int threads);
/// OpenBLAS's core name for the kernels it selected (e.g. "Haswell").
const char* BlasCoreName();

}  // namespace kvpush
