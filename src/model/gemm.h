// Batch-invariant matrix multiply for the executor's linear layers.
//
// Problem: OpenBLAS's sgemm result for one row of X depends on M, the number of rows in the call
// (M = 1..3 take a gemv-like path, other M use micro-kernel tails whose summation differs; measured
// on OpenBLAS 0.3.21 "Haswell" kernels, see docs/model.md). A sequence's logits would then change
// with the batch it happens to share. Fix: every sgemm call has exactly kTileRows rows. Rows are
// processed in tiles of kTileRows; the last partial tile is copied into a zero-padded buffer. So
// each row always goes through a call of identical shape, and its result is a function of that row
// and W only. tests/model/gemm_invariance_test.cc asserts this bit for bit on the machine that
// runs the tests, for every row position in the tile and 1 and 2 BLAS threads.
#pragma once

#include <cstdint>
#include <vector>

namespace kvpush {

/// Computes Y[rows, n] = X[rows, k] * W[n, k]^T (W row-major [out = n, in = k], as nn.Linear).
/// Row m of Y depends only on row m of X and on W (bitwise), never on `rows` or on other rows.
/// Not thread-safe (owns scratch buffers); one per executor.
class InvariantGemm {
 public:
  /// Rows per sgemm call. 8 is invariant for every tile position with the OpenBLAS in use here
  /// (16 and larger were not: the kernel's M tail handling leaks in).
  static constexpr int64_t kTileRows = 8;

  void Run(const float* x, int64_t rows, int64_t k, const float* w, int64_t n, float* y);

 private:
  std::vector<float> pad_x_;
  std::vector<float> pad_y_;
};

/// Sets OpenBLAS's thread count (process-global) and returns the value OpenBLAS reports.
int SetBlasThreads(int threads);
/// OpenBLAS's core name for the kernels it selected (e.g. "Haswell").
const char* BlasCoreName();

}  // namespace kvpush
