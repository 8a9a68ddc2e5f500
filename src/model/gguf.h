// GGUF reader: parses a GGUF v2/v3 file (from memory or an mmap'ed file) into metadata and tensor
// descriptions, validating every field it reads.
//
// Format: GGUF spec (github.com/ggerganov/ggml/blob/master/docs/gguf.md). Little-endian:
//   "GGUF" magic, u32 version (2 or 3), u64 tensor_count, u64 kv_count,
//   kv_count x (string key, u32 value type, value), tensor_count x (string name, u32 n_dims,
//   n_dims x u64 ne, u32 ggml type, u64 offset), padding to `general.alignment` (default 32),
//   tensor data (each offset relative to the data start, aligned).
//   A string is u64 length + bytes; an array is u32 element type + u64 count + elements.
// Hostile input: every count and length is checked against the bytes that remain before anything
// is allocated, so a malformed file yields kDataLoss (or kUnimplemented for a valid but unsupported
// feature: GGUF v1, nested arrays, tensor types other than F32/F16/BF16/Q8_0/Q4_K/Q6_K) and never a
// crash. Thread-safety: a parsed GgufFile is immutable; concurrent const use is safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/dtype.h"

namespace kvpush {

/// GGUF metadata value types (spec numbering).
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

/// One metadata value. Scalars: integers/bools in `i` (u64 values above INT64_MAX are refused),
/// floats in `f`, strings in `s`. Arrays: `elem_type` and one of `ints`, `floats`, `strings`.
struct GgufValue {
  GgufType type = GgufType::kU8;
  int64_t i = 0;
  double f = 0.0;
  std::string s;
  GgufType elem_type = GgufType::kU8;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;

  bool is_integer() const;
  bool is_float() const { return type == GgufType::kF32 || type == GgufType::kF64; }
  /// Number of elements of an array (0 for scalars).
  size_t array_size() const;
};

/// One tensor: name, shape (GGUF order: ne[0] innermost, i.e. ne[1] rows of ne[0] values), type,
/// and its bytes inside the file's data section.
struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  ///< relative to the data section
  std::span<const uint8_t> data;

  int64_t num_elements() const;
};

class MappedFile;

/// A parsed GGUF file. Borrows the bytes it was parsed from (or owns the mapping when opened from a
/// path), so tensor data spans stay valid as long as this object lives.
class GgufFile {
 public:
  /// Parses `bytes`, which must outlive the result. Errors: kDataLoss (malformed/truncated),
  /// kUnimplemented (unsupported version or tensor type, named).
  static Result<GgufFile> Parse(std::span<const uint8_t> bytes);
  /// mmaps `path` read-only and parses it. Errors: kNotFound/kIoError, plus Parse's.
  static Result<GgufFile> Open(const std::string& path);

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  /// nullptr when absent.
  const GgufValue* Find(const std::string& key) const;
  const GgufTensorInfo* FindTensor(const std::string& name) const;

  /// Typed getters. Errors: kNotFound (absent key), kDataLoss (wrong type or out of range).
  Result<std::string> GetString(const std::string& key) const;
  Result<int64_t> GetInt(const std::string& key) const;
  Result<double> GetFloat(const std::string& key) const;  ///< accepts integer values too
  /// Like GetInt but returns `fallback` when absent.
  Result<int64_t> GetIntOr(const std::string& key, int64_t fallback) const;
  Result<double> GetFloatOr(const std::string& key, double fallback) const;

  /// The file mapping the tensor bytes live in when opened with Open(), else nullptr (Parse: the
  /// caller owns the bytes). Holding it keeps tensor data spans valid after this object is gone.
  std::shared_ptr<const MappedFile> mapping() const { return mapping_; }

  /// Dequantizes a whole tensor into f32 (ne[0] innermost). Errors: as DequantizeToF32.
  Result<std::vector<float>> ReadTensorF32(const GgufTensorInfo& tensor) const;

 private:
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  std::shared_ptr<MappedFile> mapping_;
};

}  // namespace kvpush
