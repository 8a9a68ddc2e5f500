// WeightMatrix: one [rows, cols] linear-layer weight (row-major, nn.Linear layout: row r holds the
// `cols` input weights of output r) kept in the ggml type it was stored in (F32, F16, BF16, Q8_0,
// Q4_K, Q6_K; formats in model/quant.h). The executor never holds an f32 copy of a quantized
// matrix: InvariantGemm dequantizes it tile by tile (model/gemm.h) and the embedding lookup one
// row at a time, so resident memory stays that of the file.
//
// The bytes are either borrowed from a read-only file mapping, which the matrix keeps alive through
// a shared owner, or owned by the matrix (copied from a buffer, or f32 values given to FromF32).
// Copies share the bytes. Thread-safety: immutable; concurrent const use is safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/status.h"
#include "model/dtype.h"

namespace kvpush {

class WeightMatrix {
 public:
  /// An empty matrix (0 x 0; e.g. a tied classifier).
  WeightMatrix() = default;

  /// Owns `values` ([rows * cols] f32). The caller guarantees the size (checked by Validate).
  static WeightMatrix FromF32(std::vector<float> values, int64_t rows, int64_t cols);

  /// A matrix over `data` (rows * GgmlRowBytes(type, cols) bytes). With an `owner` (e.g. the
  /// MappedFile the bytes live in) the bytes are used in place and `owner` is kept alive; without
  /// one they are copied. F32 data that is not 4-byte aligned is copied too.
  /// Errors: kDataLoss (size mismatch, row length not a multiple of the type's block),
  /// kUnimplemented (type).
  static Result<WeightMatrix> FromStored(GgmlType type, int64_t rows, int64_t cols,
                                         std::span<const uint8_t> data,
                                         std::shared_ptr<const void> owner);

  GgmlType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  /// Number of values, rows * cols.
  size_t size() const { return static_cast<size_t>(rows_ * cols_); }
  bool empty() const { return rows_ == 0 || cols_ == 0; }
  /// Stored bytes of one row and of the whole matrix.
  size_t row_bytes() const { return row_bytes_; }
  size_t bytes() const { return row_bytes_ * static_cast<size_t>(rows_); }
  /// Stored bytes of row `r` (row_bytes() of them).
  const uint8_t* row_data(int64_t r) const { return data_ + static_cast<size_t>(r) * row_bytes_; }
  /// The values as f32 when type() is F32, else nullptr.
  const float* f32() const {
    return type_ == GgmlType::kF32 ? reinterpret_cast<const float*>(data_) : nullptr;
  }

  /// Dequantizes rows [first, first + count) into out[count * cols] (row-major). Each value
  /// depends only on the stored bytes (bit-identical wherever and however often it is called).
  /// Preconditions (unchecked): 0 <= first, first + count <= rows().
  void DequantizeRows(int64_t first, int64_t count, float* out) const;

 private:
  GgmlType type_ = GgmlType::kF32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  size_t row_bytes_ = 0;
  const uint8_t* data_ = nullptr;
  std::shared_ptr<const void> owner_;  ///< the mapping, or the owned vector holding data_
};

}  // namespace kvpush
