#include "pd/ids.h"

#include <xxhash.h>

#include "common/encoding.h"

namespace kvpush::pd {

bool IsValidTransferId(std::string_view id) {
  if (id.size() != 32) return false;
  for (char c : id) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool IsValidRequestId(std::string_view id) {
  return IsVisibleAsciiId(id);
}

uint64_t PromptHash(std::span<const int32_t> tokens) {
  return XXH3_64bits(tokens.data(), tokens.size() * sizeof(int32_t));
}

}  // namespace kvpush::pd
