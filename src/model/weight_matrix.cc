#include "model/weight_matrix.h"

#include <cstring>

#include "model/quant.h"

namespace kvpush {

WeightMatrix WeightMatrix::FromF32(std::vector<float> values, int64_t rows, int64_t cols) {
  auto owned = std::make_shared<std::vector<float>>(std::move(values));
  WeightMatrix m;
  m.type_ = GgmlType::kF32;
  m.rows_ = rows;
  m.cols_ = cols;
  m.row_bytes_ = static_cast<size_t>(cols) * sizeof(float);
  m.data_ = reinterpret_cast<const uint8_t*>(owned->data());
  m.owner_ = std::move(owned);
  return m;
}

Result<WeightMatrix> WeightMatrix::FromStored(GgmlType type, int64_t rows, int64_t cols,
                                              std::span<const uint8_t> data,
                                              std::shared_ptr<const void> owner) {
  if (rows < 0 || cols < 0) return DataLoss("negative matrix shape");
  KVP_ASSIGN_OR_RETURN(size_t row_bytes, GgmlRowBytes(type, cols));
  if (data.size() != row_bytes * static_cast<size_t>(rows)) {
    return DataLoss("matrix data is " + std::to_string(data.size()) + " bytes, expected " +
                    std::to_string(row_bytes * static_cast<size_t>(rows)));
  }
  WeightMatrix m;
  m.type_ = type;
  m.rows_ = rows;
  m.cols_ = cols;
  m.row_bytes_ = row_bytes;
  const bool misaligned =
      type == GgmlType::kF32 && reinterpret_cast<uintptr_t>(data.data()) % alignof(float) != 0;
  if (owner != nullptr && !misaligned) {
    m.data_ = data.data();
    m.owner_ = std::move(owner);
    return m;
  }
  // Owned copy; a float vector keeps f32 rows aligned.
  auto copy =
      std::make_shared<std::vector<float>>((data.size() + sizeof(float) - 1) / sizeof(float));
  if (!data.empty()) std::memcpy(copy->data(), data.data(), data.size());
  m.data_ = reinterpret_cast<const uint8_t*>(copy->data());
  m.owner_ = std::move(copy);
  return m;
}

void WeightMatrix::DequantizeRows(int64_t first, int64_t count, float* out) const {
  if (type_ == GgmlType::kF32) {
    std::memcpy(out, row_data(first), static_cast<size_t>(count) * row_bytes_);
    return;
  }
  for (int64_t r = 0; r < count; ++r) {
    DequantizeRowUnchecked(type_, row_data(first + r), cols_, out + r * cols_);
  }
}

}  // namespace kvpush
