// libFuzzer target: agent metadata (src/xfer/metadata.h), the blob a peer hands over in its
// handshake for this agent to import, then the import itself (Agent::LoadRemoteMetadata over the
// loopback backend: Connect parses the address, ImportRegion each region's key).
//
// Input: one mode byte, then the blob. Mode bit 0 set: the harness patches the length field and
// appends the XXH64 checksum, so mutations reach the body instead of dying at the checksum.
// Asserted:
//   * a refusal is kDataLoss, kUnimplemented or kInvalidArgument with a message;
//   * a decoded blob satisfies every documented limit (name/backend 1..255 bytes, incarnation != 0,
//     address <= 64 KiB, regions: known memory type, generation != 0, length > 0, base + length
//     does not wrap, unique index, key <= 4 KiB);
//   * it re-encodes to a blob of the same size that decodes to the same value (the only bytes the
//     decoder does not keep are each region's three padding bytes);
//   * importing it never crashes: accepted or refused with a Status, and the peer is then
//     invalidated so that the next input starts from the same state.
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <vector>

#include "fuzz_check.h"
#include "xfer/agent.h"
#include "xfer/backend_factory.h"
#include "xfer/metadata.h"

using namespace kvpush;
using namespace kvpush::xfer;

namespace {

bool SameMetadata(const AgentMetadata& a, const AgentMetadata& b) {
  if (a.name != b.name || a.incarnation != b.incarnation || a.backend != b.backend ||
      a.address != b.address || a.regions.size() != b.regions.size()) {
    return false;
  }
  for (size_t i = 0; i < a.regions.size(); ++i) {
    const RegionInfo& x = a.regions[i];
    const RegionInfo& y = b.regions[i];
    if (x.id.index != y.id.index || x.id.generation != y.id.generation ||
        x.memory_type != y.memory_type || x.length != y.length || x.base != y.base ||
        x.key != y.key) {
      return false;
    }
  }
  return true;
}

void CheckContract(const AgentMetadata& md) {
  Check(!md.name.empty() && md.name.size() <= 255);
  Check(!md.backend.empty() && md.backend.size() <= 255);
  Check(md.incarnation != 0);
  Check(md.address.size() <= kMaxAddressBytes);
  Check(md.regions.size() <= kMaxRegions);
  std::vector<uint32_t> seen;
  for (const RegionInfo& r : md.regions) {
    Check(r.memory_type == MemoryType::kHost || r.memory_type == MemoryType::kDevice);
    Check(r.id.generation != 0 && r.length != 0 && r.base + r.length >= r.base);
    Check(r.key.size() <= kMaxKeyBytes);
    seen.push_back(r.id.index);
  }
  std::sort(seen.begin(), seen.end());
  Check(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
}

/// The importing agent ("fuzz-importer") and a live loopback endpoint for blobs to connect to.
/// The exporter is created first, so its loopback address is endpoint 1: the seeds name it.
struct Agents {
  std::unique_ptr<Agent> exporter;
  std::unique_ptr<Agent> importer;
};

Agents& GetAgents() {
  static Agents* agents = [] {
    auto* a = new Agents;
    auto make = [](const char* name) {
      AgentOptions o;
      o.name = name;
      o.incarnation = 7;
      auto backend = MakeBackend("loopback");
      Check(backend.ok());
      auto agent = Agent::Create(o, std::move(*backend));
      Check(agent.ok());
      return std::move(*agent);
    };
    a->exporter = make("fuzz-exporter");
    a->importer = make("fuzz-importer");
    return a;
  }();
  return *agents;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool fix_up = (data[0] & 1) != 0;
  std::vector<uint8_t> blob(data + 1, data + size);
  if (fix_up && blob.size() >= 16) {
    const size_t total = blob.size() + 8;
    for (int i = 0; i < 4; ++i) blob[12 + i] = static_cast<uint8_t>(total >> (8 * i));
    const uint64_t sum = XXH64(blob.data(), blob.size(), 0);
    for (int i = 0; i < 8; ++i) blob.push_back(static_cast<uint8_t>(sum >> (8 * i)));
  }

  auto md = DecodeMetadata(blob);
  if (!md.ok()) {
    const StatusCode c = md.status().code();
    Check(c == StatusCode::kDataLoss || c == StatusCode::kUnimplemented ||
          c == StatusCode::kInvalidArgument);
    Check(!md.status().message().empty());
    return 0;
  }
  CheckContract(*md);
  auto again = EncodeMetadata(*md);
  Check(again.ok());
  Check(again->size() == blob.size());
  auto back = DecodeMetadata(*again);
  Check(back.ok() && SameMetadata(*md, *back));

  Agents& agents = GetAgents();
  auto loaded = agents.importer->LoadRemoteMetadata(blob);
  if (loaded.ok()) {
    auto peer = agents.importer->GetPeer(md->name);
    Check(peer.ok() && peer->alive && peer->regions == md->regions.size());
    if (!md->regions.empty()) {
      const RegionInfo& r = md->regions.front();
      Desc d{r.id, 0, std::min<uint64_t>(r.length, 4096)};
      auto list = agents.importer->PrepareRemote(md->name, std::span<const Desc>(&d, 1));
      Check(list.ok());
      Check(agents.importer->ReleaseList(*list).ok());
    }
    Check(agents.importer->InvalidatePeer(md->name, "fuzz: next input").ok());
  } else {
    Check(!loaded.status().message().empty());
  }
  return 0;
}
