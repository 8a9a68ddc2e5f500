// RaiseListenBacklog: works around a compile-time limit of Debian's libcpp-httplib (0.11), whose
// servers call listen(fd, CPPHTTPLIB_LISTEN_BACKLOG = 5): 32 clients connecting at once overflow
// that queue (SYNs dropped, ~1 s retransmit stalls, resets). Linux lets a listening socket call
// listen() again with a larger backlog, so after the library bound its socket we find it and do.
#pragma once

namespace kvpush {

/// Re-listens every listening TCP socket of this process bound to `port` with `backlog`
/// (clamped by the kernel to net.core.somaxconn). Returns how many sockets were changed (0 when
/// none matched). Thread-safe; scans /proc/self/fd.
int RaiseListenBacklog(int port, int backlog = 1024);

}  // namespace kvpush
