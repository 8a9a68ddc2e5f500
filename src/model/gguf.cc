#include "model/gguf.h"

#include <cstring>
#include <limits>

#include "model/mapped_file.h"

namespace kvpush {

namespace {

constexpr uint64_t kMaxDims = 4;                       // ggml's GGML_MAX_DIMS
constexpr int64_t kMaxElements = int64_t{1} << 50;     // sanity cap on one tensor's element count
constexpr uint64_t kMaxAlignment = uint64_t{1} << 16;  // generous; real files use 32

/// Bounds-checked little-endian cursor over the file bytes.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  Status Need(size_t n, const char* what) const {
    if (n > remaining()) {
      return DataLoss(std::string("truncated GGUF: need ") + std::to_string(n) + " bytes for " +
                      what + " at offset " + std::to_string(pos_) + ", " +
                      std::to_string(remaining()) + " left");
    }
    return Status::Ok();
  }

  template <typename T>
  Result<T> Read(const char* what) {
    KVP_RETURN_IF_ERROR(Need(sizeof(T), what));
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));  // host is little-endian (x86-64/arm64)
    pos_ += sizeof(T);
    return v;
  }

  Result<std::string> ReadString(const char* what) {
    KVP_ASSIGN_OR_RETURN(uint64_t len, Read<uint64_t>(what));
    if (len > remaining()) {
      return DataLoss(std::string("GGUF string ") + what + " of length " + std::to_string(len) +
                      " at offset " + std::to_string(pos_) + " runs past the end of the file");
    }
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

/// Minimum encoded size of one element of a metadata type (used to cap counts).
Result<size_t> ElementMinBytes(uint32_t type) {
  switch (static_cast<GgufType>(type)) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
    case GgufType::kString:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return DataLoss("unknown GGUF metadata value type " + std::to_string(type));
}

bool IsIntegerType(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kBool:
      return true;
    default:
      return false;
  }
}

/// Reads one scalar of `type` into (i, f, s).
Status ReadScalar(Cursor& c, GgufType type, int64_t* i, double* f, std::string* s) {
  switch (type) {
    case GgufType::kU8: {
      KVP_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>("u8"));
      *i = v;
      break;
    }
    case GgufType::kI8: {
      KVP_ASSIGN_OR_RETURN(int8_t v, c.Read<int8_t>("i8"));
      *i = v;  // NOLINT(bugprone-signed-char-misuse): a GGUF i8 is a signed integer
      break;
    }
    case GgufType::kU16: {
      KVP_ASSIGN_OR_RETURN(uint16_t v, c.Read<uint16_t>("u16"));
      *i = v;
      break;
    }
    case GgufType::kI16: {
      KVP_ASSIGN_OR_RETURN(int16_t v, c.Read<int16_t>("i16"));
      *i = v;
      break;
    }
    case GgufType::kU32: {
      KVP_ASSIGN_OR_RETURN(uint32_t v, c.Read<uint32_t>("u32"));
      *i = v;
      break;
    }
    case GgufType::kI32: {
      KVP_ASSIGN_OR_RETURN(int32_t v, c.Read<int32_t>("i32"));
      *i = v;
      break;
    }
    case GgufType::kI64: {
      KVP_ASSIGN_OR_RETURN(int64_t v, c.Read<int64_t>("i64"));
      *i = v;
      break;
    }
    case GgufType::kU64: {
      KVP_ASSIGN_OR_RETURN(uint64_t v, c.Read<uint64_t>("u64"));
      // Values above INT64_MAX are clamped; no field kvpush reads can legitimately be that big.
      *i = v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(v);
      break;
    }
    case GgufType::kBool: {
      KVP_ASSIGN_OR_RETURN(uint8_t v, c.Read<uint8_t>("bool"));
      if (v > 1) return DataLoss("GGUF bool value " + std::to_string(v) + " is not 0 or 1");
      *i = v;
      break;
    }
    case GgufType::kF32: {
      KVP_ASSIGN_OR_RETURN(float v, c.Read<float>("f32"));
      *f = v;
      break;
    }
    case GgufType::kF64: {
      KVP_ASSIGN_OR_RETURN(double v, c.Read<double>("f64"));
      *f = v;
      break;
    }
    case GgufType::kString: {
      KVP_ASSIGN_OR_RETURN(*s, c.ReadString("string value"));
      break;
    }
    case GgufType::kArray:
      return Internal("ReadScalar called for an array");
  }
  return Status::Ok();
}

Result<GgufValue> ReadValue(Cursor& c, uint32_t raw_type) {
  KVP_RETURN_IF_ERROR(ElementMinBytes(raw_type).status());
  GgufValue v;
  v.type = static_cast<GgufType>(raw_type);
  if (v.type != GgufType::kArray) {
    KVP_RETURN_IF_ERROR(ReadScalar(c, v.type, &v.i, &v.f, &v.s));
    return v;
  }
  KVP_ASSIGN_OR_RETURN(uint32_t elem, c.Read<uint32_t>("array element type"));
  KVP_ASSIGN_OR_RETURN(size_t min_bytes, ElementMinBytes(elem));
  if (static_cast<GgufType>(elem) == GgufType::kArray) {
    return Unimplemented("GGUF nested arrays are not supported");
  }
  KVP_ASSIGN_OR_RETURN(uint64_t count, c.Read<uint64_t>("array length"));
  if (count > c.remaining() / min_bytes) {
    return DataLoss("GGUF array of " + std::to_string(count) + " elements at offset " +
                    std::to_string(c.pos()) + " cannot fit in the file");
  }
  v.elem_type = static_cast<GgufType>(elem);
  const auto n = static_cast<size_t>(count);
  if (v.elem_type == GgufType::kString) {
    v.strings.reserve(n);
  } else if (v.elem_type == GgufType::kF32 || v.elem_type == GgufType::kF64) {
    v.floats.reserve(n);
  } else {
    v.ints.reserve(n);
  }
  for (size_t k = 0; k < n; ++k) {
    int64_t i = 0;
    double f = 0;
    std::string s;
    KVP_RETURN_IF_ERROR(ReadScalar(c, v.elem_type, &i, &f, &s));
    if (v.elem_type == GgufType::kString) {
      v.strings.push_back(std::move(s));
    } else if (v.elem_type == GgufType::kF32 || v.elem_type == GgufType::kF64) {
      v.floats.push_back(f);
    } else {
      v.ints.push_back(i);
    }
  }
  return v;
}

}  // namespace

bool GgufValue::is_integer() const {
  return IsIntegerType(type);
}

size_t GgufValue::array_size() const {
  if (type != GgufType::kArray) return 0;
  return ints.size() + floats.size() + strings.size();
}

int64_t GgufTensorInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

Result<GgufFile> GgufFile::Parse(std::span<const uint8_t> bytes) {
  Cursor c(bytes);
  KVP_RETURN_IF_ERROR(c.Need(4, "magic"));
  if (std::memcmp(bytes.data(), "GGUF", 4) != 0) {
    return DataLoss("not a GGUF file (bad magic)");
  }
  KVP_RETURN_IF_ERROR(c.Read<uint32_t>("magic").status());
  GgufFile file;
  KVP_ASSIGN_OR_RETURN(file.version_, c.Read<uint32_t>("version"));
  if (file.version_ != 2 && file.version_ != 3) {
    return Unimplemented("GGUF version " + std::to_string(file.version_) +
                         " is not supported (only 2 and 3)");
  }
  KVP_ASSIGN_OR_RETURN(uint64_t n_tensors, c.Read<uint64_t>("tensor count"));
  KVP_ASSIGN_OR_RETURN(uint64_t n_kv, c.Read<uint64_t>("metadata count"));
  // Each KV needs >= 8 (key length) + 4 (type) + 1 bytes; each tensor info >= 8 + 4 + 4 + 8.
  if (n_kv > c.remaining() / 13) {
    return DataLoss("GGUF metadata count " + std::to_string(n_kv) + " cannot fit in the file");
  }
  if (n_tensors > c.remaining() / 24) {
    return DataLoss("GGUF tensor count " + std::to_string(n_tensors) + " cannot fit in the file");
  }

  for (uint64_t k = 0; k < n_kv; ++k) {
    KVP_ASSIGN_OR_RETURN(std::string key, c.ReadString("metadata key"));
    KVP_ASSIGN_OR_RETURN(uint32_t type, c.Read<uint32_t>("metadata value type"));
    auto value = ReadValue(c, type);
    if (!value.ok()) return value.status().WithContext("GGUF key '" + key + "'");
    if (!file.metadata_.emplace(key, std::move(*value)).second) {
      return DataLoss("GGUF key '" + key + "' appears twice");
    }
  }

  if (const GgufValue* a = file.Find("general.alignment")) {
    if (!a->is_integer() || a->i <= 0 || static_cast<uint64_t>(a->i) > kMaxAlignment ||
        (a->i & (a->i - 1)) != 0) {
      return DataLoss("general.alignment must be a power of two integer <= 65536");
    }
    file.alignment_ = static_cast<uint32_t>(a->i);
  }

  file.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo info;
    KVP_ASSIGN_OR_RETURN(info.name, c.ReadString("tensor name"));
    KVP_ASSIGN_OR_RETURN(uint32_t n_dims, c.Read<uint32_t>("tensor n_dims"));
    if (n_dims == 0 || n_dims > kMaxDims) {
      return DataLoss("tensor '" + info.name + "' has " + std::to_string(n_dims) +
                      " dimensions (1..4 allowed)");
    }
    int64_t elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      KVP_ASSIGN_OR_RETURN(uint64_t ne, c.Read<uint64_t>("tensor dimension"));
      if (ne == 0 || ne > static_cast<uint64_t>(kMaxElements) ||
          static_cast<int64_t>(ne) > kMaxElements / elements) {
        return DataLoss("tensor '" + info.name + "' has an invalid dimension " +
                        std::to_string(ne));
      }
      elements *= static_cast<int64_t>(ne);
      info.ne.push_back(static_cast<int64_t>(ne));
    }
    KVP_ASSIGN_OR_RETURN(uint32_t type, c.Read<uint32_t>("tensor type"));
    if (!IsSupportedGgmlType(type)) {
      return Unimplemented("tensor '" + info.name + "' has unsupported type " + GgmlTypeName(type) +
                           " (kvpush reads f32, f16, bf16, q8_0)");
    }
    info.type = static_cast<GgmlType>(type);
    KVP_ASSIGN_OR_RETURN(info.offset, c.Read<uint64_t>("tensor offset"));
    if (info.offset % file.alignment_ != 0) {
      return DataLoss("tensor '" + info.name + "' offset " + std::to_string(info.offset) +
                      " is not aligned to " + std::to_string(file.alignment_));
    }
    if (file.tensor_index_.count(info.name) != 0) {
      return DataLoss("tensor '" + info.name + "' appears twice");
    }
    file.tensor_index_[info.name] = file.tensors_.size();
    file.tensors_.push_back(std::move(info));
  }

  // Data section starts at the next multiple of the alignment.
  const uint64_t data_start =
      (static_cast<uint64_t>(c.pos()) + file.alignment_ - 1) / file.alignment_ * file.alignment_;
  if (data_start > bytes.size() && !file.tensors_.empty()) {
    return DataLoss("GGUF data section starts past the end of the file");
  }
  for (GgufTensorInfo& info : file.tensors_) {
    // Row size check also validates Q8_0 block divisibility.
    auto row = GgmlRowBytes(info.type, info.ne[0]);
    if (!row.ok()) return row.status().WithContext("tensor '" + info.name + "'");
    const uint64_t rows = static_cast<uint64_t>(info.num_elements() / info.ne[0]);
    const uint64_t row_bytes = *row;
    if (row_bytes != 0 && rows > std::numeric_limits<uint64_t>::max() / row_bytes) {
      return DataLoss("tensor '" + info.name + "' size overflows");
    }
    const uint64_t nbytes = rows * row_bytes;
    const uint64_t avail = bytes.size() - data_start;
    if (info.offset > avail || nbytes > avail - info.offset) {
      return DataLoss("tensor '" + info.name + "' data [" + std::to_string(info.offset) + ", +" +
                      std::to_string(nbytes) + ") runs past the end of the file");
    }
    info.data =
        bytes.subspan(static_cast<size_t>(data_start + info.offset), static_cast<size_t>(nbytes));
  }
  return file;
}

Result<GgufFile> GgufFile::Open(const std::string& path) {
  KVP_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> map, MappedFile::Open(path));
  std::shared_ptr<MappedFile> shared(std::move(map));
  auto parsed = Parse(shared->bytes());
  if (!parsed.ok()) return parsed.status().WithContext(path);
  parsed->mapping_ = std::move(shared);
  return parsed;
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<std::string> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound("GGUF key '" + key + "' is missing");
  if (v->type != GgufType::kString) return DataLoss("GGUF key '" + key + "' is not a string");
  return v->s;
}

Result<int64_t> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound("GGUF key '" + key + "' is missing");
  if (!v->is_integer()) return DataLoss("GGUF key '" + key + "' is not an integer");
  return v->i;
}

Result<double> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr) return NotFound("GGUF key '" + key + "' is missing");
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  return DataLoss("GGUF key '" + key + "' is not a number");
}

Result<int64_t> GgufFile::GetIntOr(const std::string& key, int64_t fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetInt(key);
}

Result<double> GgufFile::GetFloatOr(const std::string& key, double fallback) const {
  if (Find(key) == nullptr) return fallback;
  return GetFloat(key);
}

Result<std::vector<float>> GgufFile::ReadTensorF32(const GgufTensorInfo& tensor) const {
  std::vector<float> out(static_cast<size_t>(tensor.num_elements()));
  KVP_RETURN_IF_ERROR(DequantizeToF32(tensor.type, tensor.data, out));
  return out;
}

}  // namespace kvpush
