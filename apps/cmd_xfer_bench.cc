// kvpush xfer-bench: transfer engine benchmark (initiator + forked target process). The logic is
// in src/xfer/xfer_bench.cc; this file only maps flags. Also linked into bench/xfer/xfer_bench.
#include <cstdio>

#include "apps/commands.h"
#include "bench/xfer/xfer_bench.h"

namespace kvpush::apps {

void RegisterXferBenchCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "xfer-bench",
      "Transfer engine benchmark: READ/WRITE bandwidth, 8-byte latency, posting cost");
  auto cfg = std::make_shared<xfer::XferBenchConfig>();
  cmd->add_option("--backend", cfg->backend, "ucx:shm | ucx:tcp | libfabric:tcp | libfabric:shm")
      ->capture_default_str();
  cmd->add_option("--ops", cfg->ops, "write and/or read")->capture_default_str();
  cmd->add_option("--block-sizes", cfg->block_sizes, "block sizes in bytes")->capture_default_str();
  cmd->add_option("--batch-sizes", cfg->batch_sizes, "blocks per transfer")->capture_default_str();
  cmd->add_option("--max-transfer-bytes", cfg->max_transfer_bytes,
                  "skip points with block*batch above this")
      ->capture_default_str();
  cmd->add_option("--min-seconds", cfg->min_seconds, "time per point")->capture_default_str();
  cmd->add_flag("--same-block", cfg->same_block,
                "all descriptors of a batch use the same block (ucx_perftest's footprint)");
  cmd->add_option("--json", cfg->json_path, "write results as JSON to this file");
  cmd->add_flag("!--no-grid", cfg->grid, "skip the READ/WRITE bandwidth grid");
  cmd->add_flag("!--no-latency", cfg->latency, "skip the 8-byte latency measurement");
  cmd->add_flag("!--no-post-cost", cfg->post_cost, "skip the 18,880-descriptor posting cost");
  cmd->callback([cfg] {
    Status s = xfer::RunXferBench(*cfg, stdout);
    if (!s.ok()) {
      std::fprintf(stderr, "kvpush xfer-bench: %s\n", s.ToString().c_str());
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace kvpush::apps
