#include "peer_seeds.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "connector/block_list.h"
#include "connector/handshake.h"
#include "connector/messages.h"
#include "connector/transfer_status.h"
#include "xfer/byte_io.h"
#include "xfer/eager_frame.h"
#include "xfer/metadata.h"
#include "xfer/notification_frame.h"

namespace {

using namespace kvpush;

class SeedDir {
 public:
  SeedDir(const std::filesystem::path& root, const char* target) : dir_(root / target) {
    std::filesystem::create_directories(dir_);
  }
  bool Write(const std::vector<uint8_t>& bytes) {
    std::ofstream f(dir_ / ("seed" + std::to_string(n_++) + ".bin"), std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    return static_cast<bool>(f);
  }
  bool Write(const std::string& text) {
    return Write(std::vector<uint8_t>(text.begin(), text.end()));
  }

 private:
  std::filesystem::path dir_;
  int n_ = 0;
};

constexpr const char* kTid = "0123456789abcdef0123456789abcdef";

bool PdMessages(const std::filesystem::path& out) {
  using connector::MsgTag;
  SeedDir dir(out, "pd_message_fuzz");
  for (int tag = 1; tag <= 10; ++tag) {
    connector::PdMessage m;
    m.tag = static_cast<MsgTag>(tag);
    m.transfer_id = kTid;
    m.num_prompt_tokens = 37;
    m.prompt_hash = 0x1122334455667788ull;
    m.first_block = 1;
    m.num_blocks = 3;
    m.layer = 3;
    m.kv_digest = 0xabcdefull;
    m.token_id = 42;
    m.logprob = -0.5f;
    m.code = 8;
    m.message = "peer gone";
    if (m.tag == MsgTag::kPushTarget || m.tag == MsgTag::kPinned) m.block_ids = {4, 5, 6};
    if (m.tag == MsgTag::kKvReady || m.tag == MsgTag::kPinned)
      m.top_logprobs = {{42, -0.5f}, {7, -2.0f}};
    auto bytes = connector::EncodeMessage(m);
    if (!bytes.ok() || !dir.Write(*bytes)) {
      std::fprintf(stderr, "pd_message seed (tag %d): %s\n", tag,
                   bytes.status().ToString().c_str());
      return false;
    }
  }
  return true;
}

/// block_list_fuzz inputs: u32 count, budget byte, part-size byte, then the runs of a contiguous,
/// a scattered and a mixed list.
bool BlockLists(const std::filesystem::path& out) {
  SeedDir dir(out, "block_list_fuzz");
  std::vector<std::vector<int32_t>> lists(3);
  for (int32_t i = 0; i < 64; ++i) lists[0].push_back(100 + i);
  for (int32_t i = 0; i < 64; ++i) lists[1].push_back((i * 37) % 4096 + 70000);
  for (int32_t i = 0; i < 64; ++i) lists[2].push_back(i % 8 == 7 ? 5000 + i : 10 + i);
  for (const auto& ids : lists) {
    std::vector<uint8_t> b;
    for (int k = 0; k < 4; ++k) b.push_back(static_cast<uint8_t>(ids.size() >> (8 * k)));
    b.push_back(8);
    b.push_back(20);
    connector::AppendBlockRuns(b, ids);
    if (!dir.Write(b)) return false;
  }
  return true;
}

/// Metadata as the loopback backend exports it: address = endpoint id 1 (xfer_metadata_fuzz
/// creates its exporter first), region keys = u32.
std::vector<uint8_t> LoopbackMetadata(uint32_t regions) {
  xfer::AgentMetadata md;
  md.name = "peer-a";
  md.incarnation = 0x55;
  md.backend = "loopback";
  xfer::ByteWriter(&md.address).U64(1);
  for (uint32_t i = 0; i < regions; ++i) {
    xfer::RegionInfo r;
    r.id.index = i;
    r.id.generation = 1;
    r.length = 65536;
    r.base = 0x10000 * (i + 1);
    xfer::ByteWriter(&r.key).U32(i + 1);
    md.regions.push_back(r);
  }
  auto blob = xfer::EncodeMetadata(md);
  return blob.ok() ? *blob : std::vector<uint8_t>{};
}

bool Metadata(const std::filesystem::path& out) {
  SeedDir dir(out, "xfer_metadata_fuzz");
  bool ok = true;
  for (uint32_t regions : {0u, 1u, 3u}) {
    std::vector<uint8_t> blob = LoopbackMetadata(regions);
    // Mode 0: as is. Mode 1: the harness recomputes length and checksum (so drop the checksum).
    std::vector<uint8_t> raw{0};
    raw.insert(raw.end(), blob.begin(), blob.end());
    std::vector<uint8_t> fixed{1};
    fixed.insert(fixed.end(), blob.begin(), blob.end() - 8);
    ok = ok && !blob.empty() && dir.Write(raw) && dir.Write(fixed);
  }
  // A UCX-shaped one: the 24-byte "KVUX" header then a worker address; an rkey blob per region.
  xfer::AgentMetadata md;
  md.name = "peer-ucx";
  md.incarnation = 9;
  md.backend = "ucx";
  md.address = {'K', 'V', 'U', 'X', 1, 0, 0, 0, 1, 2, 0,    0,    0,    0,
                0,   0,   0,   0,   0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef};
  xfer::RegionInfo r;
  r.id.generation = 3;
  r.length = 1 << 20;
  r.key = {1, 2, 3, 4, 5, 6, 7, 8};
  md.regions.push_back(r);
  auto blob = xfer::EncodeMetadata(md);
  if (!blob.ok()) return false;
  std::vector<uint8_t> raw{0};
  raw.insert(raw.end(), blob->begin(), blob->end());
  return ok && dir.Write(raw);
}

bool Frames(const std::filesystem::path& out) {
  SeedDir dir(out, "notification_frame_fuzz");
  const std::vector<uint8_t> payload = {5, 'x', 'y'};
  for (uint8_t limit : {0xff, 0x01, 0x00}) {
    std::vector<uint8_t> in{limit};
    auto f = xfer::EncodeNotificationFrame("decode-0", 0x1234,
                                           limit == 0 ? std::vector<uint8_t>{} : payload);
    in.insert(in.end(), f.begin(), f.end());
    if (!dir.Write(in)) return false;
  }
  return true;
}

bool EagerFrames(const std::filesystem::path& out) {
  SeedDir dir(out, "eager_frame_fuzz");
  const std::vector<xfer::EagerRange> ranges = {{0, 1, 4096, 3}, {0, 1, 65536, 2}};
  std::vector<uint8_t> w;
  xfer::BeginEagerWrite("prefill-0", 0x1234, 0x5678, 7, ranges, 2, &w);
  for (uint8_t b : {1, 2, 3, 4, 5, 0x6f, 0x6b}) w.push_back(b);  // data, then "ok"
  std::vector<uint8_t> in{0};
  in.insert(in.end(), w.begin(), w.end());
  if (!dir.Write(in)) return false;
  const auto ack = xfer::EncodeEagerAck("decode-0", 0x5678, 7, StatusCode::kOk);
  in = {1};
  in.insert(in.end(), ack.begin(), ack.end());
  return dir.Write(in);
}

bool Handshakes(const std::filesystem::path& out) {
  SeedDir dir(out, "handshake_fuzz");
  connector::HandshakeInfo h;
  h.engine_id = "prefill-127.0.0.1:8100";
  h.incarnation = 0x0123456789abcdefull;
  h.role = "prefill";
  h.transfer_backend = "ucx:tcp";
  h.model_fingerprint = 0xfeedull;
  h.layout.num_layers = 5;
  h.layout.num_kv_heads = 4;
  h.layout.head_dim = 8;
  h.layout.block_size = 16;
  h.layout.num_blocks = 64;
  h.layout.dtype = KvDtype::kF16;
  h.kv_region_index = 0;
  h.kv_region_generation = 1;
  h.lease_ms = 30000;
  h.watchdog_ms = 10000;
  h.agent_metadata = LoopbackMetadata(1);
  bool ok = dir.Write(h.ToJson().dump());
  h.role = "decode";
  h.layout.dtype = KvDtype::kBF16;
  h.agent_metadata = {1, 2, 3, 4};
  ok = ok && dir.Write(h.ToJson().dump(1));
  // The field codecs on their own.
  return ok && dir.Write(std::string("AAEC/+8=")) && dir.Write(std::string("00ffABcd"));
}

bool TransferStatuses(const std::filesystem::path& out) {
  SeedDir dir(out, "transfer_status_fuzz");
  connector::TransferStatusQuery q;
  q.engine_id = "decode-127.0.0.1:8200";
  q.transfer_ids = {kTid, std::string(31, '0') + "1"};
  connector::TransferStatusAnswer a;
  a.settled = {{kTid, true}, {std::string(31, '0') + "1", false}};
  connector::TransferStatusAnswer fixed;  // an answer to the harness's own fixed query
  fixed.settled = {{std::string(32, '0'), true}};
  return dir.Write(q.ToJson().dump()) && dir.Write(a.ToJson().dump()) &&
         dir.Write(fixed.ToJson().dump()) && dir.Write(std::string("{\"transfers\":{}}"));
}

bool KvTransferParams(const std::filesystem::path& out) {
  SeedDir dir(out, "kv_transfer_params_fuzz");
  const std::string id = std::string("\"") + kTid + "\"";
  const std::string seeds[] = {
      "null",
      "{}",
      "{\"do_remote_decode\":true,\"transfer_mode\":\"push\",\"transfer_id\":" + id + "}",
      "{\"do_remote_decode\":true,\"transfer_id\":" + id +
          ",\"remote_engine_id\":\"decode-0\",\"remote_host\":\"127.0.0.1\",\"remote_port\":8200}",
      "{\"do_remote_prefill\":true,\"transfer_mode\":\"pull\",\"remote_request_id\":" + id +
          ",\"remote_engine_id\":\"prefill-0\",\"remote_host\":\"10.0.0.2\",\"remote_port\":8100,"
          "\"remote_block_ids\":[0,1,2,2147483647],\"num_prompt_tokens\":37,"
          "\"prompt_hash\":\"00ff00ff00ff00ff\",\"first_token_id\":42,\"first_token_logprob\":-0."
          "25,"
          "\"pull_profile\":\"fast\"}",
      "{\"do_remote_prefill\":true,\"transfer_mode\":\"push\",\"transfer_id\":" + id +
          ",\"remote_host\":\"h\",\"remote_port\":1,\"first_token_id\":-1,\"pull_profile\":"
          "\"vllm\"}",
  };
  for (const std::string& s : seeds) {
    if (!dir.Write(s)) return false;
  }
  return true;
}

bool SseStreams(const std::filesystem::path& out) {
  SeedDir dir(out, "sse_fuzz");
  const std::string seeds[] = {
      std::string(1, '\x07') +
          "data: {\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\","
          "\"content\":\"\"}}]}\n\n"
          "data: {\"id\":\"cmpl-1\",\"choices\":[{\"index\":0,\"text\":\"Once\","
          "\"finish_reason\":null}]}\n\n"
          "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n"
          "data: [DONE]\n\n",
      std::string(1, '\x10') +
          ": keep-alive\r\n\r\ndata: {\"error\":{\"message\":\"kv lost\","
          "\"code\":503}}\r\n\r\ndata: {\"choices\":[{\"text\":\"x\"}",
  };
  for (const std::string& s : seeds) {
    if (!dir.Write(s)) return false;
  }
  return true;
}

/// Buffered client bytes for request_head_fuzz: 2 limit bytes and a cut byte, then the bytes.
bool RequestHeads(const std::filesystem::path& out) {
  SeedDir dir(out, "request_head_fuzz");
  const std::string limits = std::string("\x40\x40\x20");
  const std::string seeds[] = {
      limits + "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /version HTTP/1.1\r\n\r\n",
      limits + "POST /v1/completions HTTP/1.1\r\nContent-Length: 11\r\n\r\n{\"prompt\":1}",
      limits + "POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello",
      limits + "POST /x HTTP/1.1\nExpect: 100-continue\ncontent-length: 99999\n\n",
      limits + "GET / HTTP/1.1\r\nX-Slow: 1\r\n",
  };
  for (const std::string& s : seeds) {
    if (!dir.Write(s)) return false;
  }
  return true;
}

bool PromptLists(const std::filesystem::path& out) {
  SeedDir dir(out, "prompt_list_fuzz");
  const std::string seeds[] = {
      std::string("\x01\x01") +
          "{\"model\":\"m\",\"prompt\":[\"a\",\"b c\"],\"n\":2,\"seed\":7,\"stream\":true}",
      std::string("\x00\x00") + "{\"prompt\":[[1,2,3],[4]],\"max_tokens\":4}",
      std::string("\x02\x01") +
          "{\"id\":\"cmpl-9\",\"choices\":[{\"index\":1,\"text\":\"x\",\"finish_reason\":"
          "\"length\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7,"
          "\"prompt_tokens_details\":{\"cached_tokens\":2}}}",
      std::string("\x03\x00") + "{\"choices\":[],\"usage\":{\"prompt_tokens\":1}}",
  };
  for (const std::string& s : seeds) {
    if (!dir.Write(s)) return false;
  }
  return true;
}

}  // namespace

bool WritePeerSeeds(const std::filesystem::path& out) {
  return PdMessages(out) && BlockLists(out) && Metadata(out) && Frames(out) && EagerFrames(out) &&
         Handshakes(out) && TransferStatuses(out) && KvTransferParams(out) && SseStreams(out) &&
         PromptLists(out) && RequestHeads(out);
}
