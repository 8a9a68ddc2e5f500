// Structure-aware help for the JSON fuzz targets: the same document with one of its numbers
// replaced by a boundary value (0, -1, 2^31 - 1, 2^31, 2^53, INT64_MAX, INT64_MIN, UINT64_MAX,
// 1e300, -0.5), a change a byte mutator rarely makes in place. A target checks its property on
// both documents.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>

namespace kvpush::fuzz {

/// `j` with one number replaced: the ((seed / 10) mod count)-th, depth first, by boundary value
/// number (seed mod 10) of the list above. `j` unchanged when it holds no number.
inline nlohmann::json WithBoundaryNumber(const nlohmann::json& j, uint8_t seed) {
  nlohmann::json out = j;
  unsigned count = 0;
  auto counter = [&count](auto& self, const nlohmann::json& v) -> void {
    if (v.is_number()) ++count;
    if (v.is_structured()) {
      for (const auto& e : v) self(self, e);
    }
  };
  counter(counter, j);
  if (count == 0) return out;
  unsigned k = 0;
  const unsigned target = (seed / 10u) % count;
  auto walk = [&](auto& self, nlohmann::json& v) -> void {
    if (v.is_number() && k++ == target) {
      switch (seed % 10) {
        case 0:
          v = 0;
          break;
        case 1:
          v = -1;
          break;
        case 2:
          v = int64_t{0x7fffffff};
          break;
        case 3:
          v = int64_t{0x80000000};
          break;
        case 4:
          v = int64_t{1} << 53;
          break;
        case 5:
          v = std::numeric_limits<int64_t>::max();
          break;
        case 6:
          v = std::numeric_limits<int64_t>::min();
          break;
        case 7:
          v = std::numeric_limits<uint64_t>::max();
          break;
        case 8:
          v = 1e300;
          break;
        default:
          v = -0.5;
          break;
      }
    } else if (v.is_structured()) {
      for (auto& e : v) self(self, e);
    }
  };
  walk(walk, out);
  return out;
}

/// A byte that depends on every input byte (FNV-1a folded), to seed WithBoundaryNumber: the last
/// byte of a JSON document is nearly always '}' and would pick the same change every time.
inline uint8_t BoundarySeed(const uint8_t* data, size_t size) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 16777619u;
  return static_cast<uint8_t>(h ^ (h >> 8) ^ (h >> 16) ^ (h >> 24));
}

}  // namespace kvpush::fuzz
