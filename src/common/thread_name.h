// Names of kvpush's threads, as `top -H`, `ps -L`, `perf sched` and gdb show them.
#pragma once

namespace kvpush {

/// Names the calling thread `name` (Linux keeps at most 15 bytes; longer names are cut). Call it
/// first thing in a thread's body; names in use: "kvp-engine", "kvp-connector", "kvp-http",
/// "kvp-listen", "kvp-<backend>" (a transfer backend's progress thread), "kvp-xfer-watch",
/// "kvp-rt-worker", "kvp-rt-health", "kvp-rt-abort", "kvp-etcd-*". Never fails (a refused name is
/// ignored). Thread-safety: affects the calling thread only.
void SetThreadName(const char* name);

}  // namespace kvpush
