#include "xfer/metadata.h"

#include <xxhash.h>

#include <set>

#include "xfer/byte_io.h"

namespace kvpush::xfer {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'P', 'X', 'M', 'E', 'T', 'A'};
// magic(8) version(2) flags(2) total_len(4) incarnation(8) = 24 bytes of fixed header.
constexpr size_t kFixedHeader = 24;
constexpr size_t kChecksumBytes = 8;

}  // namespace

Result<std::vector<uint8_t>> EncodeMetadata(const AgentMetadata& md) {
  if (md.name.empty() || md.name.size() > 255)
    return InvalidArgument("metadata: name must be 1..255 bytes");
  if (md.incarnation == 0) return InvalidArgument("metadata: incarnation must be non-zero");
  if (md.backend.empty() || md.backend.size() > 255)
    return InvalidArgument("metadata: backend name must be 1..255 bytes");
  if (md.address.size() > kMaxAddressBytes) return InvalidArgument("metadata: address too long");
  if (md.regions.size() > kMaxRegions) return InvalidArgument("metadata: too many regions");
  std::vector<uint8_t> out;
  ByteWriter w(&out);
  w.Bytes(kMagic, sizeof(kMagic));
  w.U16(kMetadataVersion);
  w.U16(0);  // flags
  w.U32(0);  // total length, patched below
  w.U64(md.incarnation);
  w.U16(static_cast<uint16_t>(md.name.size()));
  w.Bytes(md.name.data(), md.name.size());
  w.U16(static_cast<uint16_t>(md.backend.size()));
  w.Bytes(md.backend.data(), md.backend.size());
  w.U32(static_cast<uint32_t>(md.address.size()));
  w.Bytes(md.address.data(), md.address.size());
  w.U32(static_cast<uint32_t>(md.regions.size()));
  for (const RegionInfo& r : md.regions) {
    if (r.key.size() > kMaxKeyBytes) return InvalidArgument("metadata: region key too long");
    w.U32(r.id.index);
    w.U32(r.id.generation);
    w.U8(static_cast<uint8_t>(r.memory_type));
    w.U8(0);
    w.U16(0);
    w.U64(r.length);
    w.U64(r.base);
    w.U32(static_cast<uint32_t>(r.key.size()));
    w.Bytes(r.key.data(), r.key.size());
  }
  size_t total = out.size() + kChecksumBytes;
  if (total > kMaxMetadataBytes) return InvalidArgument("metadata: blob exceeds 16 MiB");
  for (int i = 0; i < 4; ++i) out[12 + i] = static_cast<uint8_t>(total >> (8 * i));
  w.U64(XXH64(out.data(), out.size(), 0));
  return out;
}

Result<AgentMetadata> DecodeMetadata(std::span<const uint8_t> blob) {
  if (blob.size() < kFixedHeader + kChecksumBytes)
    return DataLoss("metadata: truncated: " + std::to_string(blob.size()) + " bytes");
  if (blob.size() > kMaxMetadataBytes)
    return DataLoss("metadata: oversized: " + std::to_string(blob.size()) + " bytes");
  if (std::memcmp(blob.data(), kMagic, sizeof(kMagic)) != 0) return DataLoss("metadata: bad magic");
  ByteReader r(blob.subspan(sizeof(kMagic)));
  uint16_t version = 0, flags = 0;
  uint32_t total = 0;
  AgentMetadata md;
  (void)(r.U16(&version) && r.U16(&flags) && r.U32(&total) && r.U64(&md.incarnation));
  if (version != kMetadataVersion)
    return Unimplemented("metadata: version " + std::to_string(version) + " (supported: 1)");
  if (flags != 0) return Unimplemented("metadata: unknown flags " + std::to_string(flags));
  if (total != blob.size())
    return DataLoss("metadata: length field says " + std::to_string(total) + " bytes, blob has " +
                    std::to_string(blob.size()) + " (truncated or padded)");
  const size_t body = blob.size() - kChecksumBytes;
  uint64_t want = 0;
  for (int i = 0; i < 8; ++i) want |= static_cast<uint64_t>(blob[body + i]) << (8 * i);
  if (XXH64(blob.data(), body, 0) != want) return DataLoss("metadata: checksum mismatch");
  ByteReader b(blob.subspan(kFixedHeader, body - kFixedHeader));
  auto truncated = [](const char* what) {
    return DataLoss(std::string("metadata: truncated in ") + what);
  };
  uint16_t n16 = 0;
  uint32_t n32 = 0;
  if (!b.U16(&n16) || !b.String(n16, &md.name)) return truncated("name");
  if (!b.U16(&n16) || !b.String(n16, &md.backend)) return truncated("backend");
  if (!b.U32(&n32)) return truncated("address");
  if (n32 > kMaxAddressBytes)
    return InvalidArgument("metadata: address length " + std::to_string(n32));
  if (!b.Bytes(n32, &md.address)) return truncated("address");
  if (!b.U32(&n32)) return truncated("region count");
  if (n32 > kMaxRegions) return InvalidArgument("metadata: region count " + std::to_string(n32));
  if (md.name.empty() || md.name.size() > 255)
    return InvalidArgument("metadata: agent name must be 1..255 bytes");
  if (md.backend.empty() || md.backend.size() > 255)
    return InvalidArgument("metadata: backend name must be 1..255 bytes");
  if (md.incarnation == 0) return InvalidArgument("metadata: zero incarnation");
  std::set<uint32_t> seen;
  md.regions.resize(n32);
  for (uint32_t i = 0; i < n32; ++i) {
    RegionInfo& ri = md.regions[i];
    uint8_t type = 0, pad8 = 0;
    uint16_t pad16 = 0;
    uint32_t key_len = 0;
    if (!b.U32(&ri.id.index) || !b.U32(&ri.id.generation) || !b.U8(&type) || !b.U8(&pad8) ||
        !b.U16(&pad16) || !b.U64(&ri.length) || !b.U64(&ri.base) || !b.U32(&key_len))
      return truncated("region table");
    std::string where = "metadata: region #" + std::to_string(i) + ": ";
    if (type > static_cast<uint8_t>(MemoryType::kDevice))
      return InvalidArgument(where + "unknown memory type " + std::to_string(type));
    ri.memory_type = static_cast<MemoryType>(type);
    if (ri.id.generation == 0) return InvalidArgument(where + "zero generation");
    if (ri.length == 0) return InvalidArgument(where + "zero length");
    if (ri.base + ri.length < ri.base) return InvalidArgument(where + "base + length overflows");
    if (!seen.insert(ri.id.index).second)
      return InvalidArgument(where + "duplicate region index " + std::to_string(ri.id.index));
    if (key_len > kMaxKeyBytes)
      return InvalidArgument(where + "key length " + std::to_string(key_len));
    if (!b.Bytes(key_len, &ri.key)) return truncated("region key");
  }
  if (b.remaining() != 0)
    return DataLoss("metadata: " + std::to_string(b.remaining()) + " trailing bytes");
  return md;
}

}  // namespace kvpush::xfer
