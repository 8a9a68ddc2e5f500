// xfer-bench: the transfer engine's benchmark driver (used by `kvpush xfer-bench` and by the
// standalone bench/xfer/xfer_bench binary). It forks a target process (before any backend exists),
// exchanges metadata over a pipe, and measures from the initiator:
//   * bandwidth of READ/WRITE for each (block size, batch size): one transfer = `batch` blocks of
//     `block` bytes at a 2*block stride on both sides (so nothing coalesces), or all on the same
//     block with same_block (ucx_perftest's footprint), timed from Post to completion, repeated
//     for at least `min_seconds`;
//   * the 8-byte latency: Post -> completion of one 8-byte WRITE (a remote-completion round trip);
//   * the posting cost of the 18,880-descriptor Llama-3.3-70B request (80 layers x K/V x 118
//     scattered 32 KiB chunks): prepare (lists + transfer) and post (caller side), the backend's
//     issue loop, and completion; the same with 8-byte descriptors (descriptor overhead without
//     the data copy); and the op count of the same request with contiguous blocks.
// Prints one table and writes JSON (schema in docs/benchmarks/xfer.md).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/status.h"

namespace kvpush::xfer {

struct XferBenchConfig {
  std::string backend = "ucx:shm";  ///< a MakeBackend spec
  std::vector<std::string> ops = {"write", "read"};
  std::vector<uint64_t> block_sizes = {4096, 16384, 65536, 262144, 1048576, 4194304};
  std::vector<uint32_t> batch_sizes = {1, 16, 128, 1024};
  uint64_t max_transfer_bytes = 64ull << 20;  ///< points with batch*block above this are skipped
  double min_seconds = 0.2;                   ///< per point
  int min_iters = 5;
  /// Every descriptor of a batch names the same local and remote block (what ucx_perftest's
  /// put_bw does: one cache-resident buffer). Default: distinct blocks at a 2*block stride.
  bool same_block = false;
  bool grid = true;  ///< the READ/WRITE bandwidth grid
  bool latency = true;
  bool post_cost = true;
  int post_cost_repeats = 5;
  std::string json_path;  ///< empty: no JSON
};

/// Runs the benchmark; prints to `out`. Errors: backend/agent errors with context, kIoError (fork,
/// pipe, JSON file).
Status RunXferBench(const XferBenchConfig& config, std::FILE* out);

}  // namespace kvpush::xfer
