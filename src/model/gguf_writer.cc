#include "model/gguf_writer.h"

#include <cstdio>
#include <cstring>

namespace kvpush {

namespace {

template <typename T>
void Put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void PutString(std::vector<uint8_t>& out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  const size_t at = out.size();
  out.resize(at + s.size());
  if (!s.empty()) std::memcpy(out.data() + at, s.data(), s.size());
}

}  // namespace

void GgufWriter::Key(const std::string& key, GgufType type) {
  PutString(kv_bytes_, key);
  Put<uint32_t>(kv_bytes_, static_cast<uint32_t>(type));
  ++kv_count_;
}

void GgufWriter::SetU32(const std::string& key, uint32_t v) {
  Key(key, GgufType::kU32);
  Put(kv_bytes_, v);
}
void GgufWriter::SetI32(const std::string& key, int32_t v) {
  Key(key, GgufType::kI32);
  Put(kv_bytes_, v);
}
void GgufWriter::SetF32(const std::string& key, float v) {
  Key(key, GgufType::kF32);
  Put(kv_bytes_, v);
}
void GgufWriter::SetBool(const std::string& key, bool v) {
  Key(key, GgufType::kBool);
  Put<uint8_t>(kv_bytes_, v ? 1 : 0);
}
void GgufWriter::SetString(const std::string& key, const std::string& v) {
  Key(key, GgufType::kString);
  PutString(kv_bytes_, v);
}
void GgufWriter::SetStringArray(const std::string& key, const std::vector<std::string>& v) {
  Key(key, GgufType::kArray);
  Put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::kString));
  Put<uint64_t>(kv_bytes_, v.size());
  for (const auto& s : v) PutString(kv_bytes_, s);
}
void GgufWriter::SetF32Array(const std::string& key, const std::vector<float>& v) {
  Key(key, GgufType::kArray);
  Put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::kF32));
  Put<uint64_t>(kv_bytes_, v.size());
  for (float f : v) Put(kv_bytes_, f);
}
void GgufWriter::SetI32Array(const std::string& key, const std::vector<int32_t>& v) {
  Key(key, GgufType::kArray);
  Put<uint32_t>(kv_bytes_, static_cast<uint32_t>(GgufType::kI32));
  Put<uint64_t>(kv_bytes_, v.size());
  for (int32_t i : v) Put(kv_bytes_, i);
}

Status GgufWriter::AddTensor(const std::string& name, const std::vector<int64_t>& ne, GgmlType type,
                             std::span<const float> values) {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  if (ne.empty() || n != static_cast<int64_t>(values.size())) {
    return InvalidArgument("tensor '" + name + "': shape does not match the value count");
  }
  auto row = GgmlRowBytes(type, ne[0]);
  if (!row.ok()) return InvalidArgument("tensor '" + name + "': " + row.status().message());
  std::vector<uint8_t> bytes(*row * static_cast<size_t>(n / ne[0]));
  const size_t rows = static_cast<size_t>(n / ne[0]);
  for (size_t r = 0; r < rows; ++r) {
    KVP_RETURN_IF_ERROR(QuantizeFromF32(
        type, values.subspan(r * static_cast<size_t>(ne[0]), static_cast<size_t>(ne[0])),
        std::span<uint8_t>(bytes).subspan(r * *row, *row)));
  }
  tensors_.push_back({name, ne, static_cast<uint32_t>(type), std::move(bytes)});
  return Status::Ok();
}

void GgufWriter::AddRawTensor(const std::string& name, const std::vector<int64_t>& ne,
                              uint32_t type, std::vector<uint8_t> bytes) {
  tensors_.push_back({name, ne, type, std::move(bytes)});
}

std::vector<uint8_t> GgufWriter::Serialize() const {
  std::vector<uint8_t> out;
  out.resize(4);
  std::memcpy(out.data(), "GGUF", 4);
  Put<uint32_t>(out, version_);
  Put<uint64_t>(out, tensors_.size());
  const bool write_alignment = alignment_ != 32;
  Put<uint64_t>(out, kv_count_ + (write_alignment ? 1 : 0));
  if (write_alignment) {
    PutString(out, "general.alignment");
    Put<uint32_t>(out, static_cast<uint32_t>(GgufType::kU32));
    Put<uint32_t>(out, alignment_);
  }
  const size_t kv_at = out.size();
  out.resize(kv_at + kv_bytes_.size());
  if (!kv_bytes_.empty()) std::memcpy(out.data() + kv_at, kv_bytes_.data(), kv_bytes_.size());
  const uint64_t align = alignment_ == 0 ? 1 : alignment_;
  auto aligned = [align](uint64_t v) { return (v + align - 1) / align * align; };
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(out, t.name);
    Put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) Put<uint64_t>(out, static_cast<uint64_t>(d));
    Put<uint32_t>(out, t.type);
    Put<uint64_t>(out, offset);
    offset = aligned(offset + t.bytes.size());
  }
  out.resize(aligned(out.size()), 0);
  const size_t data_start = out.size();
  for (const Tensor& t : tensors_) {
    const size_t at = out.size();
    out.resize(at + t.bytes.size());
    if (!t.bytes.empty()) std::memcpy(out.data() + at, t.bytes.data(), t.bytes.size());
    out.resize(data_start + aligned(out.size() - data_start), 0);
  }
  return out;
}

Status GgufWriter::WriteFile(const std::string& path) const {
  const std::vector<uint8_t> bytes = Serialize();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return IoError("cannot create '" + path + "'");
  const size_t written = std::fwrite(bytes.data(), 1, bytes.size(), f);
  const int closed = std::fclose(f);
  if (written != bytes.size() || closed != 0) return IoError("short write to '" + path + "'");
  return Status::Ok();
}

}  // namespace kvpush
