// libFuzzer target: the block lists of PUSH_TARGET and PINNED (src/connector/block_list.h).
// Input: u32 declared count, then run bytes. DecodeBlockRuns must refuse with kInvalidArgument
// or produce exactly `count` distinct ids < 2^31 that re-encode to the same bytes (the encoding
// is canonical). The ids are then split into parts under a byte budget taken from the input and
// put back together through a BlockListAssembly in reverse order: every part must fit the
// budget and the assembly must give the list back. Nothing may crash, leak or hit UB.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

#include "connector/block_list.h"

using namespace kvpush::connector;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 6) return 0;
  uint32_t count = 0;
  for (int k = 0; k < 4; ++k) count |= static_cast<uint32_t>(data[k]) << (8 * k);
  count &= 0xffff;  // what a message admits per part (kMaxPartBlocks)
  const size_t budget = 16 + static_cast<size_t>(data[4]) * 4;
  const uint32_t max_part = 1 + data[5];
  std::span<const uint8_t> runs(data + 6, size - 6);
  std::vector<int32_t> ids;
  kvpush::Status s = DecodeBlockRuns(runs, count, ids);
  if (!s.ok()) {
    if (s.code() != kvpush::StatusCode::kInvalidArgument || s.message().empty()) std::abort();
    return 0;
  }
  if (ids.size() != count) std::abort();
  for (int32_t id : ids) {
    if (id < 0) std::abort();
  }
  if (HasDuplicateBlocks(ids)) std::abort();
  std::vector<uint8_t> again;
  AppendBlockRuns(again, ids);
  if (again.size() != runs.size() || !std::equal(again.begin(), again.end(), runs.begin())) {
    std::abort();
  }
  if (BlockRunsBytes(ids) != again.size()) std::abort();
  if (ids.empty()) return 0;
  auto parts = SplitBlockList(ids, budget, max_part);
  BlockListAssembly assembly(static_cast<uint32_t>(ids.size()));
  uint32_t next = 0;
  for (const auto& [offset, n] : parts) {
    if (offset != next || n == 0 || n > max_part) std::abort();
    const std::span<const int32_t> part(ids.data() + offset, n);
    if (n > 1 && BlockRunsBytes(part) > budget) std::abort();
    next += n;
  }
  if (next != ids.size()) std::abort();
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (!assembly.Add(it->first, std::span<const int32_t>(ids.data() + it->first, it->second))
             .ok()) {
      std::abort();
    }
  }
  // A part given twice is refused.
  if (assembly.Add(parts[0].first, std::span<const int32_t>(ids.data(), parts[0].second)).ok()) {
    std::abort();
  }
  if (!assembly.complete() || assembly.Take() != ids) std::abort();
  return 0;
}
