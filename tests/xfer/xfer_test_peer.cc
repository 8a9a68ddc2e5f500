// xfer_test_peer: the target process of the multi-process xfer tests.
//
// Usage: xfer_test_peer <backend spec> <agent name> <region bytes>
// Creates an agent, allocates one region through it, writes its metadata as a frame to stdout,
// then serves command frames from stdin (first byte = command), replying with frames on stdout:
//   'L' <blob>             load peer metadata            -> 'k' | 'e' <message>
//   'F' <u64 seed>         fill region with pattern(seed) -> 'k'
//   'H' <u64 off> <u64 n>  xxh64 of region[off, off+n)    -> <u64>
//   'W' <u32 count>        for each of `count` notifications (payload: u64 off, len, seed, tag,
//                          stride, pieces) check that piece k, region[off + k*stride, +len),
//                          equals bytes [k*len, (k+1)*len) of pattern(seed)
//                                                         -> per notification 'k'|'b' <u64 tag>
//   'P'                    wait 300 ms, count notifications received -> <u32>
//   'Q'                    exit 0
#include <xxhash.h>

#include <cstdio>
#include <cstring>

#include "peer_channel.h"
#include "xfer/agent.h"
#include "xfer/backend_factory.h"

using namespace kvpush;
using namespace kvpush::xfer;
using namespace kvpush::xfer::testing;

namespace {

uint64_t Get64(const std::vector<uint8_t>& f, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, f.data() + at, 8);
  return v;
}
std::vector<uint8_t> U64Frame(uint8_t tag_byte, uint64_t v) {
  std::vector<uint8_t> out(9);
  out[0] = tag_byte;
  std::memcpy(out.data() + 1, &v, 8);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: xfer_test_peer <backend> <name> <bytes>\n");
    return 2;
  }
  auto backend = MakeBackend(argv[1]);
  if (!backend.ok()) {
    std::fprintf(stderr, "peer: %s\n", backend.status().ToString().c_str());
    return 3;
  }
  AgentOptions o;
  o.name = argv[2];
  auto agent = Agent::Create(o, std::move(backend).value());
  if (!agent.ok()) return 4;
  const uint64_t bytes = std::stoull(argv[3]);
  auto region = (*agent)->AllocateRegion(bytes, MemoryType::kHost);
  if (!region.ok()) return 5;
  uint8_t* base = reinterpret_cast<uint8_t*>(region->data);
  if (!SendFrame(1, (*agent)->ExportMetadata().value())) return 6;
  std::vector<uint8_t> scratch;
  while (true) {
    auto cmd = RecvFrame(0, 120000);
    if (!cmd.ok() || cmd->empty()) return 7;
    const std::vector<uint8_t>& f = *cmd;
    switch (f[0]) {
      case 'L': {
        auto r = (*agent)->LoadRemoteMetadata(std::span(f).subspan(1));
        std::string m = r.ok() ? "k" : "e" + r.status().ToString();
        SendFrame(1, std::vector<uint8_t>(m.begin(), m.end()));
        break;
      }
      case 'F':
        FillPattern(base, bytes, Get64(f, 1));
        SendFrame(1, {'k'});
        break;
      case 'H': {
        uint64_t off = Get64(f, 1), n = Get64(f, 9);
        SendFrame(1, U64Frame('h', XXH64(base + off, n, 0)));
        break;
      }
      case 'W': {
        uint32_t count = 0;
        std::memcpy(&count, f.data() + 1, 4);
        uint32_t seen = 0;
        while (seen < count) {
          auto got = (*agent)->WaitNotifications(1, SteadyClock::now() + std::chrono::seconds(20));
          if (got.empty()) return 8;
          for (const Notification& n : got) {
            if (n.payload.size() != 48) return 9;
            uint64_t v[6];  // off, len, seed, tag, stride, pieces
            std::memcpy(v, n.payload.data(), 48);
            const uint64_t off = v[0], len = v[1], seed = v[2], tag = v[3], stride = v[4];
            const uint64_t pieces = v[5];
            scratch.resize(len * pieces);
            FillPattern(scratch.data(), scratch.size(), seed);
            bool ok = true;
            for (uint64_t k = 0; k < pieces && ok; ++k)
              ok = off + k * stride + len <= bytes &&
                   std::memcmp(base + off + k * stride, scratch.data() + k * len, len) == 0;
            SendFrame(1, U64Frame(ok ? 'k' : 'b', tag));
            ++seen;
          }
        }
        break;
      }
      case 'P': {
        auto got =
            (*agent)->WaitNotifications(1, SteadyClock::now() + std::chrono::milliseconds(300));
        std::vector<uint8_t> out(4);
        uint32_t n = static_cast<uint32_t>(got.size());
        std::memcpy(out.data(), &n, 4);
        SendFrame(1, out);
        break;
      }
      case 'Q':
        return 0;
      default:
        return 10;
    }
  }
}
