#include "connector/block_list.h"

#include <algorithm>
#include <string>

namespace kvpush::connector {
namespace {

struct Run {
  uint32_t start = 0;
  uint32_t length = 0;
};

size_t VarintBytes(uint32_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void PutVarint(std::vector<uint8_t>& out, uint32_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

/// Reads a shortest-form LEB128 u32 at `pos`. False when truncated, longer than 5 bytes, above
/// 2^32 - 1 or not in its shortest form.
bool GetVarint(std::span<const uint8_t> b, size_t& pos, uint32_t& v) {
  uint64_t x = 0;
  for (int i = 0; i < 5; ++i) {
    if (pos >= b.size()) return false;
    const uint8_t byte = b[pos++];
    x |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
    if ((byte & 0x80) == 0) {
      if (i > 0 && byte == 0) return false;  // a trailing zero group: not the shortest form
      if (x > 0xffffffffull) return false;
      v = static_cast<uint32_t>(x);
      return true;
    }
  }
  return false;
}

/// Length of the run of consecutive ids at ids[i], at most `limit`.
size_t RunLength(std::span<const int32_t> ids, size_t i, size_t limit) {
  size_t j = i + 1;
  while (j < ids.size() && j - i < limit &&
         static_cast<int64_t>(ids[j]) == static_cast<int64_t>(ids[j - 1]) + 1) {
    ++j;
  }
  return j - i;
}

}  // namespace

size_t BlockRunsBytes(std::span<const int32_t> ids) {
  size_t bytes = 4;
  for (size_t i = 0; i < ids.size();) {
    const size_t len = RunLength(ids, i, ids.size());
    bytes += VarintBytes(static_cast<uint32_t>(ids[i])) + VarintBytes(static_cast<uint32_t>(len));
    i += len;
  }
  return bytes;
}

void AppendBlockRuns(std::vector<uint8_t>& out, std::span<const int32_t> ids) {
  const size_t count_at = out.size();
  out.resize(out.size() + 4);
  uint32_t nruns = 0;
  for (size_t i = 0; i < ids.size(); ++nruns) {
    const size_t len = RunLength(ids, i, ids.size());
    PutVarint(out, static_cast<uint32_t>(ids[i]));
    PutVarint(out, static_cast<uint32_t>(len));
    i += len;
  }
  for (int k = 0; k < 4; ++k) out[count_at + k] = static_cast<uint8_t>(nruns >> (8 * k));
}

Status DecodeBlockRuns(std::span<const uint8_t> bytes, uint32_t count, std::vector<int32_t>& out) {
  if (bytes.size() < 4) return InvalidArgument("block runs: truncated run count");
  uint32_t nruns = 0;
  for (int k = 0; k < 4; ++k) nruns |= static_cast<uint32_t>(bytes[k]) << (8 * k);
  // Each run takes at least 2 bytes and names at least one id.
  if (nruns > count || static_cast<uint64_t>(nruns) * 2 > bytes.size() - 4) {
    return InvalidArgument("block runs: " + std::to_string(nruns) + " runs for " +
                           std::to_string(count) + " ids in " + std::to_string(bytes.size()) +
                           " bytes");
  }
  std::vector<Run> runs(nruns);
  size_t pos = 4;
  uint64_t total = 0;
  for (uint32_t r = 0; r < nruns; ++r) {
    Run& run = runs[r];
    if (!GetVarint(bytes, pos, run.start) || !GetVarint(bytes, pos, run.length)) {
      return InvalidArgument("block runs: truncated or malformed varint in run " +
                             std::to_string(r));
    }
    if (run.length == 0) return InvalidArgument("block runs: empty run");
    if (static_cast<uint64_t>(run.start) + run.length > 0x80000000ull) {
      return InvalidArgument("block runs: block id beyond 2^31 - 1 (negative block id)");
    }
    if (r > 0 && run.start == runs[r - 1].start + runs[r - 1].length) {
      return InvalidArgument("block runs: a run continues the one before it (not canonical)");
    }
    total += run.length;
  }
  if (pos != bytes.size()) return InvalidArgument("block runs: trailing bytes");
  if (total != count) {
    return InvalidArgument("block runs: the runs name " + std::to_string(total) +
                           " ids, the header " + std::to_string(count));
  }
  std::vector<Run> sorted = runs;
  std::sort(sorted.begin(), sorted.end(), [](const Run& a, const Run& b) { return a.start < b.start; });
  for (size_t r = 1; r < sorted.size(); ++r) {
    if (static_cast<uint64_t>(sorted[r - 1].start) + sorted[r - 1].length > sorted[r].start) {
      return InvalidArgument("block runs: overlapping runs (a block named twice)");
    }
  }
  out.reserve(out.size() + count);
  for (const Run& run : runs) {
    for (uint32_t k = 0; k < run.length; ++k) out.push_back(static_cast<int32_t>(run.start + k));
  }
  return Status::Ok();
}

std::vector<std::pair<uint32_t, uint32_t>> SplitBlockList(std::span<const int32_t> ids,
                                                          size_t max_bytes, uint32_t max_part_ids) {
  std::vector<std::pair<uint32_t, uint32_t>> parts;
  if (ids.empty()) return {{0, 0}};
  size_t i = 0;
  while (i < ids.size()) {
    const size_t part_start = i;
    size_t bytes = 4;
    size_t count = 0;
    while (i < ids.size() && count < max_part_ids) {
      const size_t len = RunLength(ids, i, max_part_ids - count);
      const size_t run_bytes =
          VarintBytes(static_cast<uint32_t>(ids[i])) + VarintBytes(static_cast<uint32_t>(len));
      if (count > 0 && bytes + run_bytes > max_bytes) break;
      bytes += run_bytes;
      count += len;
      i += len;
    }
    parts.emplace_back(static_cast<uint32_t>(part_start), static_cast<uint32_t>(count));
  }
  return parts;
}

bool HasDuplicateBlocks(std::span<const int32_t> ids) {
  std::vector<int32_t> sorted(ids.begin(), ids.end());
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
}

Status BlockListAssembly::Add(uint32_t offset, std::span<const int32_t> ids) {
  if (ids.empty()) return InvalidArgument("an empty part of a block list");
  if (static_cast<uint64_t>(offset) + ids.size() > ids_.size()) {
    return InvalidArgument("part [" + std::to_string(offset) + ", +" + std::to_string(ids.size()) +
                           ") is beyond the " + std::to_string(ids_.size()) + "-block list");
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    if (have_[offset + k] != 0) {
      return InvalidArgument("part [" + std::to_string(offset) + ", +" +
                             std::to_string(ids.size()) + ") overlaps a part already received");
    }
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    ids_[offset + k] = ids[k];
    have_[offset + k] = 1;
  }
  received_ += static_cast<uint32_t>(ids.size());
  while (prefix_ < have_.size() && have_[prefix_] != 0) ++prefix_;
  return Status::Ok();
}

}  // namespace kvpush::connector
