#include "bench/xfer/xfer_bench.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "xfer/agent.h"
#include "xfer/backend_factory.h"

namespace kvpush::xfer {
namespace {

// The KV shape of the posting-cost scenario: Llama-3.3-70B, bf16, 16-token blocks.
constexpr int kLayers = 80;
constexpr int kBlocksPerRequest = 118;
constexpr int kArenaBlocks = 2 * kBlocksPerRequest;    // room to scatter without adjacency
constexpr uint64_t kChunkBytes = 16ull * 8 * 128 * 2;  // tokens * kv_heads * head_dim * bf16
constexpr uint64_t kArenaBytes = uint64_t{kLayers} * 2 * kArenaBlocks * kChunkBytes;

uint64_t ChunkOffset(int layer, int kind, int block) {
  return ((uint64_t(layer) * 2 + kind) * kArenaBlocks + block) * kChunkBytes;
}

bool WriteAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w <= 0) return false;
    b += w;
    n -= size_t(w);
  }
  return true;
}
bool ReadAll(int fd, void* p, size_t n, int timeout_ms) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) <= 0) return false;
    ssize_t r = read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= size_t(r);
  }
  return true;
}

// Target process: allocate regions, publish metadata, serve until the pipe closes.
[[noreturn]] void TargetMain(const XferBenchConfig& c, int to_parent, int from_parent) {
  auto backend = MakeBackend(c.backend);
  if (!backend.ok()) _exit(3);
  AgentOptions o;
  o.name = "bench-target";
  auto agent = Agent::Create(o, std::move(backend).value());
  if (!agent.ok()) _exit(4);
  if (!(*agent)->AllocateRegion(2 * c.max_transfer_bytes, MemoryType::kHost).ok()) _exit(5);
  if (c.post_cost && !(*agent)->AllocateRegion(kArenaBytes, MemoryType::kHost).ok()) _exit(6);
  auto md = (*agent)->ExportMetadata();
  if (!md.ok()) _exit(7);
  uint32_t n = uint32_t(md->size());
  if (!WriteAll(to_parent, &n, 4) || !WriteAll(to_parent, md->data(), n)) _exit(8);
  char buf;
  while (read(from_parent, &buf, 1) > 0) {
  }
  agent->reset();
  _exit(0);
}

struct Point {
  std::string op;
  uint64_t block = 0;
  uint32_t batch = 0;
  int iters = 0;
  double median_us = 0, p99_us = 0;
  double gbps = 0;  // GB/s (1e9 bytes/s) at the median
};

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(std::llround(q * double(v.size() - 1))));
  return v[i];
}

Result<std::vector<double>> TimeTransfer(Agent& a, TransferHandle t, const XferBenchConfig& c,
                                         int warmup) {
  std::vector<double> us;
  Stopwatch total;
  for (int i = 0; i < warmup + c.min_iters || total.ElapsedMs() < c.min_seconds * 1000; ++i) {
    int64_t t0 = NowNs();
    KVP_RETURN_IF_ERROR(a.Post(t));
    KVP_ASSIGN_OR_RETURN(TransferStatus st,
                         a.Wait(t, SteadyClock::now() + std::chrono::seconds(30)));
    if (st.state != TransferState::kDone) return st.error.WithContext("bench transfer");
    if (i == warmup - 1) total.Reset();
    if (i >= warmup) us.push_back(double(NowNs() - t0) / 1e3);
    if (us.size() > 200000) break;
  }
  return us;
}

struct PostCost {
  size_t descriptors = 0, ops = 0, contiguous_ops = 0;
  double prepare_us = 0, post_us = 0, post_min_us = 0, issue_us = 0, complete_us = 0;
  double tiny_issue_us = 0, tiny_complete_us = 0;  // same request with 8-byte descriptors
  // The memory system's share: a plain memcpy loop over the same number of scattered 8-byte
  // copies between distinct pages, timed in the same conditions (right after preparing lists).
  double floor_us = 0;
  // The engine's share: 18,880 8-byte descriptors at a 64-byte stride (1.2 MB footprint, no two
  // adjacent, so nothing coalesces): per-descriptor cost without page-walk misses.
  double compact_issue_us = 0;
};

// Posts an 8-byte-descriptor WRITE `repeats` times (lists prepared each time) and returns the
// median backend issue-loop and post->complete times, microseconds.
Result<std::pair<double, double>> TimeTinyPosts(Agent& a, const std::vector<Desc>& ld,
                                                const std::vector<Desc>& rd, int repeats) {
  std::vector<double> issue, done;
  for (int r = 0; r < repeats; ++r) {
    KVP_ASSIGN_OR_RETURN(ListHandle ll, a.PrepareLocal(ld));
    KVP_ASSIGN_OR_RETURN(ListHandle rl, a.PrepareRemote("bench-target", rd));
    KVP_ASSIGN_OR_RETURN(TransferHandle t, a.CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}));
    int64_t t1 = NowNs();
    KVP_RETURN_IF_ERROR(a.Post(t));
    KVP_ASSIGN_OR_RETURN(TransferStatus st,
                         a.Wait(t, SteadyClock::now() + std::chrono::seconds(60)));
    if (st.state != TransferState::kDone) return st.error.WithContext("8-byte post-cost transfer");
    done.push_back(double(NowNs() - t1) / 1e3);
    issue.push_back(double(a.backend_stats().last_issue_ns) / 1e3);
    KVP_RETURN_IF_ERROR(a.ReleaseTransfer(t));
    KVP_RETURN_IF_ERROR(a.ReleaseList(ll));
    KVP_RETURN_IF_ERROR(a.ReleaseList(rl));
  }
  return std::pair{Percentile(issue, 0.5), Percentile(done, 0.5)};
}

Result<PostCost> MeasurePostCost(Agent& a, const AllocatedRegion& local, RegionId remote_arena,
                                 int repeats) {
  const RegionId local_arena = local.id;
  std::mt19937 rng(2026);
  std::vector<int> lblocks, rblocks;
  for (int b = 0; b < kArenaBlocks; b += 2) lblocks.push_back(b), rblocks.push_back(b);
  std::shuffle(lblocks.begin(), lblocks.end(), rng);
  std::shuffle(rblocks.begin(), rblocks.end(), rng);
  std::vector<Desc> ld, rd, lc, rc;
  for (int layer = 0; layer < kLayers; ++layer)
    for (int kind = 0; kind < 2; ++kind)
      for (int i = 0; i < kBlocksPerRequest; ++i) {
        ld.push_back({local_arena, ChunkOffset(layer, kind, lblocks[i]), kChunkBytes});
        rd.push_back({remote_arena, ChunkOffset(layer, kind, rblocks[i]), kChunkBytes});
        lc.push_back({local_arena, ChunkOffset(layer, kind, i), kChunkBytes});
        rc.push_back({remote_arena, ChunkOffset(layer, kind, i), kChunkBytes});
      }
  PostCost pc;
  pc.descriptors = ld.size();
  std::vector<double> prep, post, issue, done;
  for (int r = 0; r < repeats; ++r) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the progress thread idle
    int64_t t0 = NowNs();
    KVP_ASSIGN_OR_RETURN(ListHandle ll, a.PrepareLocal(ld));
    KVP_ASSIGN_OR_RETURN(ListHandle rl, a.PrepareRemote("bench-target", rd));
    KVP_ASSIGN_OR_RETURN(TransferHandle t, a.CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}));
    int64_t t1 = NowNs();
    KVP_RETURN_IF_ERROR(a.Post(t));
    int64_t t2 = NowNs();
    KVP_ASSIGN_OR_RETURN(TransferStatus st,
                         a.Wait(t, SteadyClock::now() + std::chrono::seconds(60)));
    int64_t t3 = NowNs();
    if (st.state != TransferState::kDone) return st.error.WithContext("post-cost transfer");
    prep.push_back(double(t1 - t0) / 1e3);
    post.push_back(double(t2 - t1) / 1e3);
    issue.push_back(double(a.backend_stats().last_issue_ns) / 1e3);
    done.push_back(double(t3 - t1) / 1e3);
    KVP_ASSIGN_OR_RETURN(pc.ops, a.TransferOpCount(t));
    KVP_RETURN_IF_ERROR(a.ReleaseTransfer(t));
    KVP_RETURN_IF_ERROR(a.ReleaseList(ll));
    KVP_RETURN_IF_ERROR(a.ReleaseList(rl));
  }
  pc.prepare_us = Percentile(prep, 0.5);
  pc.post_us = Percentile(post, 0.5);
  pc.post_min_us = *std::min_element(post.begin(), post.end());
  pc.issue_us = Percentile(issue, 0.5);
  pc.complete_us = Percentile(done, 0.5);
  // 8-byte descriptors at the same offsets: the per-descriptor cost without the data copy.
  for (Desc& d : ld) d.length = 8;
  for (Desc& d : rd) d.length = 8;
  KVP_ASSIGN_OR_RETURN(auto tiny, TimeTinyPosts(a, ld, rd, repeats));
  pc.tiny_issue_us = tiny.first;
  pc.tiny_complete_us = tiny.second;
  // Floor: the same scattered copies as a plain loop, source = the local chunks, destination = the
  // odd block after each remote block's id in the local arena (as many distinct pages as the
  // engine's destinations). Lists are prepared first so that the caches and TLB are in the state
  // the engine's loop met.
  std::vector<std::pair<const std::byte*, std::byte*>> copies;
  copies.reserve(ld.size());
  for (size_t i = 0; i < ld.size(); ++i)
    copies.emplace_back(local.data + ld[i].offset, local.data + rd[i].offset + kChunkBytes);
  std::vector<double> floor;
  for (int r = 0; r < repeats; ++r) {
    KVP_ASSIGN_OR_RETURN(ListHandle ll, a.PrepareLocal(ld));
    KVP_ASSIGN_OR_RETURN(ListHandle rl, a.PrepareRemote("bench-target", rd));
    const int64_t t0 = NowNs();
    for (const auto& [src, dst] : copies) std::memcpy(dst, src, 8);
    floor.push_back(double(NowNs() - t0) / 1e3);
    KVP_RETURN_IF_ERROR(a.ReleaseList(ll));
    KVP_RETURN_IF_ERROR(a.ReleaseList(rl));
  }
  pc.floor_us = Percentile(floor, 0.5);
  // Compact: the engine's own per-descriptor cost (no page walks).
  std::vector<Desc> lk, rk;
  for (size_t i = 0; i < ld.size(); ++i) {
    lk.push_back({local_arena, i * 64, 8});
    rk.push_back({remote_arena, i * 64, 8});
  }
  KVP_ASSIGN_OR_RETURN(auto compact, TimeTinyPosts(a, lk, rk, repeats));
  pc.compact_issue_us = compact.first;
  KVP_ASSIGN_OR_RETURN(ListHandle cl, a.PrepareLocal(lc));
  KVP_ASSIGN_OR_RETURN(ListHandle cr, a.PrepareRemote("bench-target", rc));
  KVP_ASSIGN_OR_RETURN(TransferHandle ct, a.CreateTransfer({Op::kWrite, cl, {}, cr, {}, {}}));
  KVP_ASSIGN_OR_RETURN(pc.contiguous_ops, a.TransferOpCount(ct));
  return pc;
}

Status RunInitiator(const XferBenchConfig& c, const std::vector<uint8_t>& target_md,
                    std::FILE* out) {
  KVP_ASSIGN_OR_RETURN(auto backend, MakeBackend(c.backend));
  AgentOptions o;
  o.name = "bench-initiator";
  o.stall_timeout = std::chrono::seconds(60);
  KVP_ASSIGN_OR_RETURN(auto agent, Agent::Create(o, std::move(backend)));
  KVP_ASSIGN_OR_RETURN(AllocatedRegion local,
                       agent->AllocateRegion(2 * c.max_transfer_bytes, MemoryType::kHost));
  std::memset(local.data, 0x5a, local.length);
  KVP_RETURN_IF_ERROR(agent->LoadRemoteMetadata(target_md).status());
  KVP_ASSIGN_OR_RETURN(AgentMetadata md, DecodeMetadata(target_md));
  RegionId remote = md.regions.at(0).id;

  std::vector<Point> points;
  std::fprintf(out, "xfer-bench backend=%s blocks=%s (initiator pid %d)\n", c.backend.c_str(),
               c.same_block ? "same" : "distinct", getpid());
  std::fprintf(out, "%-6s %10s %6s %8s %12s %12s %10s\n", "op", "block", "batch", "iters",
               "median_us", "p99_us", "GB/s");
  for (const std::string& op : c.grid ? c.ops : std::vector<std::string>{}) {
    for (uint64_t block : c.block_sizes) {
      for (uint32_t batch : c.batch_sizes) {
        if ((c.same_block ? block : block * batch) > c.max_transfer_bytes) continue;
        std::vector<Desc> ld, rd;
        for (uint32_t i = 0; i < batch; ++i) {
          uint64_t off = c.same_block ? 0 : 2 * block * i;
          ld.push_back({local.id, off, block});
          rd.push_back({remote, off, block});
        }
        KVP_ASSIGN_OR_RETURN(ListHandle ll, agent->PrepareLocal(ld));
        KVP_ASSIGN_OR_RETURN(ListHandle rl, agent->PrepareRemote(md.name, rd));
        KVP_ASSIGN_OR_RETURN(
            TransferHandle t,
            agent->CreateTransfer({op == "read" ? Op::kRead : Op::kWrite, ll, {}, rl, {}, {}}));
        KVP_ASSIGN_OR_RETURN(auto us, TimeTransfer(*agent, t, c, 3));
        Point p{op, block, batch, int(us.size()), Percentile(us, 0.5), Percentile(us, 0.99), 0};
        p.gbps = double(block) * batch / (p.median_us * 1e3);
        std::fprintf(out, "%-6s %10llu %6u %8d %12.2f %12.2f %10.2f\n", op.c_str(),
                     (unsigned long long)block, batch, p.iters, p.median_us, p.p99_us, p.gbps);
        std::fflush(out);
        points.push_back(p);
        KVP_RETURN_IF_ERROR(agent->ReleaseTransfer(t));
        KVP_RETURN_IF_ERROR(agent->ReleaseList(ll));
        KVP_RETURN_IF_ERROR(agent->ReleaseList(rl));
      }
    }
  }
  double lat_median = 0, lat_p99 = 0;
  if (c.latency) {
    KVP_ASSIGN_OR_RETURN(ListHandle ll, agent->PrepareLocal(std::vector<Desc>{{local.id, 0, 8}}));
    KVP_ASSIGN_OR_RETURN(ListHandle rl,
                         agent->PrepareRemote(md.name, std::vector<Desc>{{remote, 0, 8}}));
    KVP_ASSIGN_OR_RETURN(TransferHandle t, agent->CreateTransfer({Op::kWrite, ll, {}, rl, {}, {}}));
    XferBenchConfig lc = c;
    lc.min_seconds = std::max(c.min_seconds, 0.5);
    KVP_ASSIGN_OR_RETURN(auto us, TimeTransfer(*agent, t, lc, 100));
    lat_median = Percentile(us, 0.5);
    lat_p99 = Percentile(us, 0.99);
    std::fprintf(out, "8-byte WRITE post->complete: median %.2f us, p99 %.2f us (%zu iters)\n",
                 lat_median, lat_p99, us.size());
  }
  PostCost pc;
  if (c.post_cost) {
    KVP_ASSIGN_OR_RETURN(AllocatedRegion arena,
                         agent->AllocateRegion(kArenaBytes, MemoryType::kHost));
    KVP_ASSIGN_OR_RETURN(pc,
                         MeasurePostCost(*agent, arena, md.regions.at(1).id, c.post_cost_repeats));
    double n = double(pc.descriptors);
    std::fprintf(out,
                 "posting cost, %zu descriptors (80 layers x K/V x 118 scattered 32 KiB chunks), "
                 "%zu ops:\n"
                 "  prepare %.1f us (%.3f us/desc) | Post() call median %.1f us, min %.1f us "
                 "(%.5f us/desc) | backend issue loop %.1f us (%.3f us/desc) | post->complete "
                 "%.1f us\n"
                 "  same with 8-byte descriptors: issue loop %.1f us (%.4f us/desc), "
                 "post->complete %.1f us\n"
                 "    floor (plain memcpy loop, same number of scattered 8-byte copies): %.1f us; "
                 "issue loop / floor = %.2f\n"
                 "    8-byte descriptors at a 64-byte stride (engine cost, no page walks): issue "
                 "loop %.1f us (%.4f us/desc)\n"
                 "  same request, contiguous blocks: %zu ops\n",
                 pc.descriptors, pc.ops, pc.prepare_us, pc.prepare_us / n, pc.post_us,
                 pc.post_min_us, pc.post_min_us / n, pc.issue_us, pc.issue_us / n, pc.complete_us,
                 pc.tiny_issue_us, pc.tiny_issue_us / n, pc.tiny_complete_us, pc.floor_us,
                 pc.floor_us > 0 ? pc.tiny_issue_us / pc.floor_us : 0.0, pc.compact_issue_us,
                 pc.compact_issue_us / n, pc.contiguous_ops);
  }
  if (!c.json_path.empty()) {
    std::ostringstream j;
    j << "{\n  \"backend\": \"" << c.backend << "\",\n  \"points\": [\n";
    for (size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      j << "    {\"op\": \"" << p.op << "\", \"block_bytes\": " << p.block
        << ", \"batch\": " << p.batch << ", \"iters\": " << p.iters
        << ", \"median_us\": " << p.median_us << ", \"p99_us\": " << p.p99_us
        << ", \"gbps\": " << p.gbps << "}" << (i + 1 < points.size() ? ",\n" : "\n");
    }
    j << "  ],\n  \"latency_8b_us\": {\"median\": " << lat_median << ", \"p99\": " << lat_p99
      << "},\n  \"post_cost\": {\"descriptors\": " << pc.descriptors << ", \"ops\": " << pc.ops
      << ", \"prepare_us\": " << pc.prepare_us << ", \"post_us\": " << pc.post_us
      << ", \"post_min_us\": " << pc.post_min_us << ", \"tiny_issue_us\": " << pc.tiny_issue_us
      << ", \"tiny_complete_us\": " << pc.tiny_complete_us << ", \"issue_us\": " << pc.issue_us
      << ", \"complete_us\": " << pc.complete_us << ", \"floor_us\": " << pc.floor_us
      << ", \"compact_issue_us\": " << pc.compact_issue_us
      << ", \"contiguous_ops\": " << pc.contiguous_ops << "}\n}\n";
    std::FILE* f = std::fopen(c.json_path.c_str(), "w");
    if (f == nullptr) return IoError("cannot write " + c.json_path);
    std::fputs(j.str().c_str(), f);
    std::fclose(f);
    std::fprintf(out, "wrote %s\n", c.json_path.c_str());
  }
  return Status::Ok();
}

}  // namespace

Status RunXferBench(const XferBenchConfig& c, std::FILE* out) {
  if (c.backend == "loopback") return InvalidArgument("xfer-bench needs a cross-process backend");
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) return IoError("pipe failed");
  std::fflush(out);
  pid_t pid = fork();
  if (pid < 0) return IoError("fork failed");
  if (pid == 0) {
    close(up[0]);
    close(down[1]);
    TargetMain(c, up[1], down[0]);
  }
  close(up[1]);
  close(down[0]);
  uint32_t n = 0;
  std::vector<uint8_t> md;
  Status s;
  if (!ReadAll(up[0], &n, 4, 60000) || n > (16u << 20)) {
    s = Unavailable("bench target did not start (backend '" + c.backend + "')");
  } else {
    md.resize(n);
    if (!ReadAll(up[0], md.data(), n, 60000)) s = Unavailable("bench target metadata truncated");
  }
  if (s.ok()) s = RunInitiator(c, md, out);
  close(down[1]);  // target exits
  close(up[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return s;
}

}  // namespace kvpush::xfer
