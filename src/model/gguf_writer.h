// GgufWriter: builds a GGUF v3 (or v2) file in memory: metadata in insertion order, tensors
// encoded as F32/F16/BF16/Q8_0 from f32 values, data aligned to `general.alignment` (default 32).
// Format: see model/gguf.h. Used by `kvpush gen-model` and by tests (which also use the raw hooks
// to build malformed files). Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/dtype.h"
#include "model/gguf.h"

namespace kvpush {

class GgufWriter {
 public:
  /// GGUF version written in the header (2 or 3; tests may set others).
  void set_version(uint32_t v) { version_ = v; }
  /// Data alignment; also written as the general.alignment key when it is not 32.
  void set_alignment(uint32_t a) { alignment_ = a; }

  void SetU32(const std::string& key, uint32_t v);
  void SetI32(const std::string& key, int32_t v);
  void SetF32(const std::string& key, float v);
  void SetBool(const std::string& key, bool v);
  void SetString(const std::string& key, const std::string& v);
  void SetStringArray(const std::string& key, const std::vector<std::string>& v);
  void SetF32Array(const std::string& key, const std::vector<float>& v);
  void SetI32Array(const std::string& key, const std::vector<int32_t>& v);

  /// Adds a tensor with GGUF shape `ne` (ne[0] innermost) encoded as `type` from `values`
  /// (size = product of ne). Errors: kInvalidArgument (size mismatch, Q8_0 with ne[0] % 32 != 0).
  Status AddTensor(const std::string& name, const std::vector<int64_t>& ne, GgmlType type,
                   std::span<const float> values);
  /// Adds a tensor with an arbitrary type id and raw bytes, unchecked (for malformed test files).
  void AddRawTensor(const std::string& name, const std::vector<int64_t>& ne, uint32_t type,
                    std::vector<uint8_t> bytes);

  /// The complete file.
  std::vector<uint8_t> Serialize() const;
  /// Writes Serialize() to `path`. Errors: kIoError.
  Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> ne;
    uint32_t type;
    std::vector<uint8_t> bytes;
  };
  void Key(const std::string& key, GgufType type);

  uint32_t version_ = 3;
  uint32_t alignment_ = 32;
  uint64_t kv_count_ = 0;
  std::vector<uint8_t> kv_bytes_;
  std::vector<Tensor> tensors_;
};

}  // namespace kvpush
