// MappedFile: a read-only memory mapping of a whole file (POSIX mmap).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace kvpush {

/// Owns a read-only, private mmap of a file; unmapped on destruction. An empty file maps to an
/// empty span. Thread-safety: immutable after Open; concurrent reads are safe.
class MappedFile {
 public:
  /// Errors: kNotFound (no such file), kIoError (open/stat/mmap failed, named with errno text).
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

}  // namespace kvpush
